#!/usr/bin/env bash
# GPU evidence for the thirty-fifth round (issue 21): projects/iteration_hook (an mmcv optimizer
# hook whose loss the runner computed: the hook enters autocast in the before_train_iter it
# gained and leaves it first thing in after_train_iter) and projects/apex_shim (a GAN trainer that
# called apex through the project's own forwarding module) under `ampfix verify` (half-precision
# share, loss against fp32, syncs per step), then the entry points run as a user would.
# From the repo root on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round35 bash bench/gpu_run_round35.sh      (DEVICE=cpu to check the plumbing)
set -u
OUT=${OUT:-bench/results/round35}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ROOT=$PWD
DEVICE=${DEVICE:-auto}
STEPS=${STEPS:-40}
nvidia-smi -L 2>/dev/null
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
cd "$ROOT/fixtures/projects/iteration_hook/after"
echo "== verify iteration_hook train.py --epochs 20 --fp16"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
  --json "$J/iteration_hook.json" train.py -- --epochs 20 --fp16 2>&1 | tail -9
cd "$ROOT/fixtures/projects/apex_shim/after"
echo "== verify apex_shim train.py --steps 200"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
  --json "$J/apex_shim.json" train.py -- --steps 200 2>&1 | tail -9
echo "== the entry points"
(
  cd "$ROOT/fixtures/projects/iteration_hook/after"
  for ARGS in "--epochs 3" "--epochs 3 --fp16"; do
    echo "-- iteration_hook after/train.py $ARGS"; python train.py $ARGS 2>&1 | tail -2
  done
  cd "$ROOT/fixtures/projects/iteration_hook/before"
  echo "-- iteration_hook before/train.py --epochs 3 (no apex here: float32)"; python train.py --epochs 3 2>&1 | tail -1
  cd "$ROOT/fixtures/projects/apex_shim/after"
  for ARGS in "--steps 20" "--steps 20 --opt-level O0"; do
    echo "-- apex_shim after/train.py $ARGS"; python train.py $ARGS 2>&1 | tail -1
  done
  cd "$ROOT/fixtures/projects/apex_shim/before"
  echo "-- apex_shim before/train.py --steps 20 (no apex here: amp_support trains in float32)"
  python train.py --steps 20 2>&1 | tail -1
) 2>&1 | tee "$J/entries.txt"
