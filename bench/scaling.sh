#!/usr/bin/env bash
# Cost against input size (issue 14 #7): generated files of the shapes real repositories hold, at
# three sizes each; wall seconds and peak RSS of `ampfix check --no-cache FILE`.
#   bash bench/scaling.sh bench/results/scaling.json
set -u
OUT=${1:-bench/results/scaling.json}
W=$(mktemp -d)
rows=()
run() {  # shape, size, file
  /usr/bin/time -f "%e %M" -o "$W/t" ampfix check --no-cache -q --exit-zero "$3" > /dev/null 2>&1
  read -r wall rss < <(tail -1 "$W/t")
  rows+=("{\"shape\": \"$1\", \"n\": $2, \"bytes\": $(stat -c %s "$3"), \"wall_s\": $wall, \"peak_rss_mb\": $((rss / 1024))}")
  echo "$1 n=$2 bytes=$(stat -c %s "$3") wall=${wall}s rss=$((rss / 1024))MB"
}
for n in 5000 10000 20000; do
  python3 -c "print('x = ' + ' + '.join(f'a{i}' for i in range($n)))" > "$W/sum.py"; run long_sum $n "$W/sum.py"
done
for n in 50000 100000 200000; do
  python3 -c "print('import torch'); print('DATA = [' + ', '.join(str(i) for i in range($n)) + ']')" > "$W/line.py"
  run one_line_list $n "$W/line.py"
done
for n in 15000 30000 60000; do
  python3 -c "
print('import torch')
for i in range($n): print(f'x{i} = torch.zeros({i}).cuda() + y{i}')" > "$W/gen.py"; run generated_lines $n "$W/gen.py"
done
( IFS=,; echo "{\"command\": \"bash bench/scaling.sh $OUT\", \"rows\": [${rows[*]}]}" ) | python3 -m json.tool > "$OUT"
rm -rf "$W"
