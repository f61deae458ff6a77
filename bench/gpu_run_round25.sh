#!/usr/bin/env bash
# GPU evidence for the twenty-fifth round (issue 21): projects/nested_rescale (a trainer whose
# `_forward` divides the loss for accumulation in one branch and scales it in another, nested one;
# the forward pass before both gets autocast, and evaluation through the same `_forward` runs under
# it too).  The migrated entry point under `ampfix verify` (half-precision share, loss against fp32,
# syncs per step), the entry points run as a user would, and the project migrated with --dtype
# bfloat16 here.  From the repo root on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round25 bash bench/gpu_run_round25.sh      (DEVICE=cpu to check the plumbing)
set -u
OUT=${OUT:-bench/results/round25}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ROOT=$PWD
DEVICE=${DEVICE:-auto}
nvidia-smi -L 2>/dev/null
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
P=nested_rescale
cd "$ROOT/fixtures/projects/$P/after"
for accum in 1 2; do
  echo "== verify $P run.py --fp16 --gradient_accumulation_steps $accum"
  PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
    --json "$J/${P}_fp16_accum$accum.json" run.py -- --fp16 --epochs 20 --gradient_accumulation_steps $accum \
    2>&1 | tail -9
done
echo "== the entry points"
for args in "run.py --epochs 2" "run.py --epochs 2 --fp16" "run.py --epochs 2 --fp16 --gradient_accumulation_steps 2" \
            "run.py --epochs 2 --fp16 --fp16_opt_level O0"; do
  echo "-- $P $args"; python $args 2>&1 | tail -2
done 2>&1 | tee "$J/${P}_entries.txt"
echo "== migrated with --dtype bfloat16 here, then verified"
BF=$(mktemp -d)
cp -r "$ROOT/fixtures/projects/$P/before/." "$BF/"
(cd "$BF" && PYTHONPATH=$ROOT python -m ampfix migrate --write -q --dtype bfloat16 --torch-version 2.4 . >/dev/null; \
  grep -n "autocast\|GradScaler\|backward\|bfloat16" *.py)
cd "$BF"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
  --json "$J/${P}_bf16.json" run.py -- --fp16 --epochs 20 2>&1 | tail -9
cd "$ROOT"; rm -rf "$BF"
