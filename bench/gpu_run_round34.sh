#!/usr/bin/env bash
# GPU evidence for the thirty-fourth round (issue 21): projects/callback_trainer (a trainer whose
# apex and fp32 branches became one assignment, its apex flag attribute gone) and
# apex/fp16_model_clip (FP16_Optimizer's backward then a clip of the model's parameters: migrated
# with --unsafe-fixes, unscale_ before the clip) under `ampfix verify` (half-precision share, loss
# against fp32, syncs per step), then the entry points run as a user would.
# From the repo root on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round34 bash bench/gpu_run_round34.sh      (DEVICE=cpu to check the plumbing)
set -u
OUT=${OUT:-bench/results/round34}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ROOT=$PWD
DEVICE=${DEVICE:-auto}
STEPS=${STEPS:-40}
nvidia-smi -L 2>/dev/null
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
cd "$ROOT/fixtures/projects/callback_trainer/after"
echo "== verify callback_trainer train.py --epochs 20 --apex_opt_level O1"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
  --json "$J/callback_trainer.json" train.py -- --epochs 20 --apex_opt_level O1 2>&1 | tail -9
cd "$ROOT/fixtures/apex/after"
echo "== verify fp16_model_clip.py --fp16 --steps 64"
PYTHONPATH=$ROOT python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
  --json "$J/fp16_model_clip.json" fp16_model_clip.py -- --fp16 --steps 64 2>&1 | tail -9
echo "== the entry points"
(
  cd "$ROOT/fixtures/projects/callback_trainer/after"
  for ARGS in "--epochs 3" "--epochs 3 --apex_opt_level O1" "--epochs 3 --apex_opt_level O0"; do
    echo "-- callback_trainer train.py $ARGS"; python train.py $ARGS 2>&1 | tail -2
  done
  cd "$ROOT/fixtures/apex/after"
  for ARGS in "--steps 16" "--steps 16 --fp16"; do
    echo "-- fp16_model_clip.py $ARGS"; python fp16_model_clip.py $ARGS 2>&1 | tail -2
  done
) 2>&1 | tee "$J/entries.txt"
