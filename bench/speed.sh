#!/usr/bin/env bash
# ampfix check side by side with TorchFix, Fixit and Ruff on the same training-code files, on this
# machine, alternating tools, cold (no cache) and warm; the one-file (pre-commit) case; peak RSS.
#   python bench/corpus.py materialize --out /tmp/corpus      # the public corpus (manifest.json)
#   PEERS=/tmp/benchenv/bin bash bench/speed.sh /tmp/corpus bench/results/speed
# PEERS: a bin folder with torchfix, fixit and ruff (python -m venv E && E/bin/pip install torchfix fixit ruff)
set -u
CORPUS=${1:-/tmp/corpus}
OUT=${2:-bench/results/speed}
PEERS=${PEERS:-/tmp/benchenv/bin}
AMPFIX=${AMPFIX:-ampfix}
for tool in "$AMPFIX" "$PEERS/torchfix" "$PEERS/fixit" "$PEERS/ruff"; do
  command -v "$tool" > /dev/null || { echo "speed.sh: $tool not found (PATH, PEERS)" >&2; exit 2; }
done
mkdir -p "$OUT"
WORK=$(mktemp -d)
# training code: the corpus files that call backward or build an optimizer
(cd "$CORPUS" && grep -rl --include=*.py -E "backward\(|optimizer" . | sort) > "$WORK/list"
mkdir -p "$WORK/tree"
while read -r f; do mkdir -p "$WORK/tree/$(dirname "$f")"; cp "$CORPUS/$f" "$WORK/tree/$f"; done < "$WORK/list"
EDIT=ChenRocks+UNITER/train_vqa.py  # in the corpus's largest part of apex files that import one another
[ -f "$WORK/tree/$EDIT" ] || EDIT=$(head -1 "$WORK/list" | sed 's#^\./##')
ONE=$(ls -S $(sed "s#^#$WORK/tree/#" "$WORK/list") | awk 'NR==int(n/2)' n=$(wc -l < "$WORK/list"))
export AMPFIX_CACHE_DIR="$WORK/cache"
measure() {  # name, command...: wall seconds and peak RSS (KiB) of one run
  local name=$1; shift
  /usr/bin/time -f "%e %M" -o "$WORK/t" "$@" > /dev/null 2>&1
  read -r wall rss < <(tail -1 "$WORK/t")
  echo "$name $wall $rss" >> "$WORK/rows"
}
: > "$WORK/rows"
for round in 1 2; do
  rm -rf "$AMPFIX_CACHE_DIR"
  measure ampfix_cold "$AMPFIX" check --exit-zero -q "$WORK/tree"
  measure ampfix_warm "$AMPFIX" check --exit-zero -q "$WORK/tree"
  # one file of the largest planned part edited (a comment added), then checked again
  cp "$WORK/tree/$EDIT" "$WORK/saved"; echo "# edited" >> "$WORK/tree/$EDIT"
  measure ampfix_warm_one_edit "$AMPFIX" check --exit-zero -q "$WORK/tree"
  cp "$WORK/saved" "$WORK/tree/$EDIT"
  measure torchfix "$PEERS/torchfix" "$WORK/tree"
  measure fixit "$PEERS/fixit" lint "$WORK/tree"
  measure ruff "$PEERS/ruff" check --select ALL --no-cache --exit-zero -q "$WORK/tree"
  measure ampfix_one_file "$AMPFIX" check --no-cache --exit-zero -q "$ONE"
  measure torchfix_one_file "$PEERS/torchfix" "$ONE"
  measure fixit_one_file "$PEERS/fixit" lint "$ONE"
  measure ruff_one_file "$PEERS/ruff" check --select ALL --no-cache --exit-zero -q "$ONE"
done
python3 - "$WORK" "$OUT" "$ONE" <<'PY'
import json, os, platform, statistics, subprocess, sys
work, out, one = sys.argv[1:4]
rows = {}
for line in open(os.path.join(work, "rows")):
    name, wall, rss = line.split()
    rows.setdefault(name, []).append((float(wall), int(rss)))
files = open(os.path.join(work, "list")).read().split()
size = sum(os.path.getsize(os.path.join(work, "tree", f)) for f in files)
def ver(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True).stdout.strip().splitlines()[0]
    except Exception:
        return "?"
peers = os.environ.get("PEERS", "/tmp/benchenv/bin")
res = {"command": "PEERS=/tmp/benchenv/bin bash bench/speed.sh /tmp/corpus bench/results/speed",
       "machine": f"{os.cpu_count()} cores, {platform.python_version()}", "files": len(files), "bytes": size,
       "one_file": {"path": os.path.relpath(one, os.path.join(work, "tree")), "bytes": os.path.getsize(one)},
       "versions": {"ampfix": ver(["ampfix", "--version"]), "torchfix": ver([f"{peers}/pip", "show", "torchfix"]),
                    "fixit": ver([f"{peers}/fixit", "--version"]), "ruff": ver([f"{peers}/ruff", "--version"])},
       "runs": {k: {"wall_s": [w for w, _ in v], "median_wall_s": statistics.median(w for w, _ in v),
                    "peak_rss_mb": max(r for _, r in v) / 1024} for k, v in rows.items()}}
json.dump(res, open(os.path.join(out, "speed.json"), "w"), indent=1)
print(f"{len(files)} files, {size / 1e6:.1f} MB; one file: {res['one_file']}")
print(f"{'tool':20} {'median wall s':>14} {'peak RSS MB':>12}")
for k, v in res["runs"].items():
    print(f"{k:20} {v['median_wall_s']:14.2f} {v['peak_rss_mb']:12.0f}")
PY
rm -rf "$WORK"
