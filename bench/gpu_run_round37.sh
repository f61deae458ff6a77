#!/usr/bin/env bash
# GPU evidence for the thirty-seventh round (issue 21): projects/star_package (the shared backward
# reached through `from utils import *`; an actor and a critic whose setups share one GradScaler)
# and projects/trainer_choice (the trainer class picked by a conditional expression, the AMP one
# built through its base's __init__) under `ampfix verify` (half-precision share, loss against
# fp32, syncs per step), then the entry points run as a user would.
# From the repo root on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round37 bash bench/gpu_run_round37.sh      (DEVICE=cpu to check the plumbing)
set -u
OUT=${OUT:-bench/results/round37}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ROOT=$PWD
DEVICE=${DEVICE:-auto}
STEPS=${STEPS:-40}
nvidia-smi -L 2>/dev/null
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
cd "$ROOT/fixtures/projects/star_package/after"
echo "== verify star_package train.py --epochs 20 --fp16"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
  --json "$J/star_package.json" train.py -- --epochs 20 --fp16 2>&1 | tail -9
cd "$ROOT/fixtures/projects/trainer_choice/after"
echo "== verify trainer_choice train.py --iters 400 --fp16"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
  --json "$J/trainer_choice.json" train.py -- --iters 400 --fp16 2>&1 | tail -9
echo "== the entry points"
(
  cd "$ROOT/fixtures/projects/star_package/after"
  for ARGS in "--epochs 3" "--epochs 3 --fp16"; do
    echo "-- star_package after/train.py $ARGS"; PYTHONPATH=$PWD python train.py $ARGS 2>&1 | tail -1
  done
  cd "$ROOT/fixtures/projects/trainer_choice/after"
  for ARGS in "--iters 40" "--iters 40 --fp16 --save /tmp/trainer_choice.pt"; do
    echo "-- trainer_choice after/train.py $ARGS"; python train.py $ARGS 2>&1 | tail -1
  done
  python -c "import torch; print('checkpoint keys:', sorted(torch.load('/tmp/trainer_choice.pt')))"
) 2>&1 | tee "$J/entries.txt"
