#!/usr/bin/env bash
# GPU evidence for the thirty-ninth round (issue 21): projects/kfold_script (k-fold training written at
# the script's top level, a `continue` for the folds left out; each fold makes its GradScaler beside
# its optimizer, the fold's evaluation runs under autocast) under `ampfix verify` (half-precision
# share, loss against fp32, syncs per step), then the entry points run as a user would.
# From the repo root on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round39 bash bench/gpu_run_round39.sh      (DEVICE=cpu to check the plumbing)
set -u
OUT=${OUT:-bench/results/round39}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ROOT=$PWD
DEVICE=${DEVICE:-auto}
STEPS=${STEPS:-40}
nvidia-smi -L 2>/dev/null
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
cd "$ROOT/fixtures/projects/kfold_script/after"
echo "== verify kfold_script train.py --epochs 10 --fp16"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
  --json "$J/kfold_script.json" train.py -- --epochs 10 --fp16 2>&1 | tail -9
echo "== the entry points"
(
  for ARGS in "--epochs 3" "--epochs 3 --fp16" "--epochs 3 --fp16 --only 0 2"; do
    echo "-- kfold_script after/train.py $ARGS"; PYTHONPATH=$PWD python train.py $ARGS 2>&1 | tail -1
  done
) 2>&1 | tee "$J/entries.txt"
