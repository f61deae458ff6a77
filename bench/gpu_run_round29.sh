#!/usr/bin/env bash
# GPU evidence for the twenty-ninth round (issue 21): projects/inline_eval (training and an inline
# evaluation in one function after apex O1; after the migration the evaluation's forward and loss
# run under autocast, as apex had run them in float16; apex's DDP pre-division argument and the
# import it alone read are gone).  The migrated entry point under `ampfix verify` (half-precision
# share, loss against fp32, syncs per step), and the entry points run as a user would: the
# evaluation's output dtype is float16 with O1, float32 with O0.
# From the repo root on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round29 bash bench/gpu_run_round29.sh      (DEVICE=cpu to check the plumbing)
set -u
OUT=${OUT:-bench/results/round29}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ROOT=$PWD
DEVICE=${DEVICE:-auto}
nvidia-smi -L 2>/dev/null
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
P=inline_eval
cd "$ROOT/fixtures/projects/$P/after"
echo "== verify $P train.py (O1: native AMP now)"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
  --json "$J/${P}_O1.json" train.py -- --epochs 60 2>&1 | tail -9
echo "== the entry points (the evaluation's output dtype)"
for args in "train.py" "train.py --opt_level O0"; do
  echo "-- $P $args"; python $args 2>&1 | tail -2
done 2>&1 | tee "$J/${P}_entries.txt"
