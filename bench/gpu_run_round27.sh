#!/usr/bin/env bash
# GPU evidence for the twenty-seventh round (issue 21): projects/eval_pair (apex initialized in a
# helper under a comment that described only that line; a warm-up weight computed after the forward
# pass, outside the autocast region; two evaluations in a row under one region).  The migrated entry
# point under `ampfix verify` (half-precision share, loss against fp32, syncs per step), the entry
# points run as a user would, and the project migrated with --dtype bfloat16 here.
# From the repo root on a CUDA machine with
# torch, click and pytest:
#   OUT=bench/results/round27 bash bench/gpu_run_round27.sh      (DEVICE=cpu to check the plumbing)
set -u
OUT=${OUT:-bench/results/round27}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ROOT=$PWD
DEVICE=${DEVICE:-auto}
nvidia-smi -L 2>/dev/null
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
P=eval_pair
cd "$ROOT/fixtures/projects/$P/after"
echo "== verify $P train.py --fp16"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
  --json "$J/${P}_fp16.json" train.py -- --fp16 --epochs 20 2>&1 | tail -9
echo "== the entry points"
for args in "train.py --epochs 2" "train.py --epochs 2 --fp16"; do
  echo "-- $P $args"; python $args 2>&1 | tail -2
done 2>&1 | tee "$J/${P}_entries.txt"
echo "== migrated with --dtype bfloat16 here, then verified"
BF=$(mktemp -d)
cp -r "$ROOT/fixtures/projects/$P/before/." "$BF/"
(cd "$BF" && PYTHONPATH=$ROOT python -m ampfix migrate --write -q --dtype bfloat16 --torch-version 2.4 . >/dev/null; \
  grep -n "autocast\|GradScaler\|backward\|bfloat16" *.py)
cd "$BF"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
  --json "$J/${P}_bf16.json" train.py -- --fp16 --epochs 20 2>&1 | tail -9
cd "$ROOT"; rm -rf "$BF"
