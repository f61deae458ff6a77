#!/usr/bin/env bash
# GPU evidence for the seventh round's shapes (issue 21): the optimizer built inside the epoch
# loop (epoch_setup), an apex fallback below torch 1.6 beside a native path (version_fallback),
# and a `_training_step` method whose caller steps (hf2_trainer).  Each fixture's migrated
# script runs under `ampfix verify` (half-precision share, loss against fp32, syncs per step).
# From the repo root on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round7 bash bench/gpu_run_round7.sh
set -u
OUT=${OUT:-bench/results/round7}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
cd fixtures/apex/after
echo "== verify epoch_setup.py (optimizer and scaler made at the start epoch, inside the epoch loop)"
python -m ampfix verify --steps $STEPS --no-profile epoch_setup.py --json "$J/epoch_setup.json" -- --epochs 20 2>&1 | tail -8
echo "== verify epoch_setup.py --loss_scale 128 (the static scale of the loss_scale choice)"
python -m ampfix verify --steps $STEPS --no-profile epoch_setup.py --json "$J/epoch_setup_static.json" -- --epochs 20 --loss_scale 128 2>&1 | tail -8
echo "== verify version_fallback.py (the native path that stays)"
python -m ampfix verify --steps $STEPS --no-profile version_fallback.py --json "$J/version_fallback.json" -- --steps 200 2>&1 | tail -8
echo "== verify hf2_trainer.py (the caller steps after _training_step)"
python -m ampfix verify --steps $STEPS --no-profile hf2_trainer.py --json "$J/hf2_trainer.json" -- --steps 200 2>&1 | tail -8
cd ../../..
python -m pytest -q -p no:cacheprovider tests/test_migrate_fixtures.py tests/test_loss_scale.py 2>&1 | tail -2
