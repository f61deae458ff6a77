#!/usr/bin/env bash
# GPU evidence for the thirty-eighth round (issue 21): projects/closure_engine (ignite's shape: the
# step is a closure handed to an engine, `return Engine(_update)`; the factory takes the GradScaler,
# the closure reads it) under `ampfix verify` (half-precision share, loss against fp32, syncs per
# step), then the entry points run as a user would.
# From the repo root on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round38 bash bench/gpu_run_round38.sh      (DEVICE=cpu to check the plumbing)
set -u
OUT=${OUT:-bench/results/round38}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ROOT=$PWD
DEVICE=${DEVICE:-auto}
STEPS=${STEPS:-40}
nvidia-smi -L 2>/dev/null
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
cd "$ROOT/fixtures/projects/closure_engine/after"
echo "== verify closure_engine train.py --epochs 20 --fp16"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
  --json "$J/closure_engine.json" train.py -- --epochs 20 --fp16 2>&1 | tail -9
echo "== the entry points"
(
  for ARGS in "--epochs 3" "--epochs 3 --fp16"; do
    echo "-- closure_engine after/train.py $ARGS"; PYTHONPATH=$PWD python train.py $ARGS 2>&1 | tail -1
  done
) 2>&1 | tee "$J/entries.txt"
