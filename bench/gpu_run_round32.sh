#!/usr/bin/env bash
# GPU evidence for the thirty-second round (issue 21): projects/two_loops (a warm-up loop and the
# task's loop stepping one optimizer; before this round the migrated script had one
# scaler.update() after both loops and its second iteration raised) under `ampfix verify`
# (half-precision share, loss against fp32, syncs per step), then both entry points run as a user
# would, and the output of the previous migration (one update after both loops) run to show the
# failure it fixes.
# From the repo root on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round32 bash bench/gpu_run_round32.sh      (DEVICE=cpu to check the plumbing)
set -u
OUT=${OUT:-bench/results/round32}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ROOT=$PWD
DEVICE=${DEVICE:-auto}
STEPS=${STEPS:-40}
nvidia-smi -L 2>/dev/null
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
cd "$ROOT/fixtures/projects/two_loops/after"
echo "== verify two_loops train.py --epochs 20 --fp16"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
  --json "$J/two_loops.json" train.py -- --epochs 20 --fp16 2>&1 | tail -9
echo "== the entry points"
for ARGS in "--epochs 3" "--epochs 3 --fp16"; do
  echo "-- two_loops train.py $ARGS"; python train.py $ARGS 2>&1 | tail -3
done 2>&1 | tee "$J/entries.txt"
echo "== the previous output: one scaler.update() after both loops"
TMP=$(mktemp -d)
cp utils.py "$TMP/"
python - "$TMP/train.py" <<'PY'
import sys
text = open("train.py").read()
first = "            scaler.step(optim)\n            scaler.update()\n"
assert text.count(first) == 2
text = text.replace(first, "            scaler.step(optim)\n")
text = text.replace('        print(f"epoch {epoch} loss {loss.item():.4f}")\n',
                    '        print(f"epoch {epoch} loss {loss.item():.4f}")\n    scaler.update()\n')
open(sys.argv[1], "w").write(text)
PY
(cd "$TMP" && python train.py --epochs 1 --fp16 2>&1 | tail -2) | tee "$J/previous_output.txt"
rm -rf "$TMP"
