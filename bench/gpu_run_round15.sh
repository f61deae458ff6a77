#!/usr/bin/env bash
# GPU evidence for the fifteenth round (issue 21): the two new project fixtures under `ampfix
# verify` (half-precision share, loss against fp32, syncs per step): a library epoch function that
# now takes the GradScaler from its caller (projects/library_entry, driven by drive.py as the
# report tells callers to write it), and an FP16_Optimizer handed into another module's train()
# (projects/fp16_engine); then every migrated fixture's and project's script on the GPU, where
# autocast and GradScaler act (CI runs them on the CPU, where both disable themselves).
# From the repo root on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round15 bash bench/gpu_run_round15.sh
set -u
OUT=${OUT:-bench/results/round15}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
ROOT=$PWD
DEVICE=${DEVICE:-auto}
nvidia-smi -L 2>/dev/null
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
cd "$ROOT/fixtures/projects/library_entry/after"
echo "== verify library_entry (drive.py --use-amp: train_epoch(..., scaler=GradScaler(enabled=config.use_amp)))"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile ../drive.py \
  --json "$J/library_entry.json" -- --use-amp --epochs 20 --batches 20 2>&1 | tail -9
cd "$ROOT/fixtures/projects/fp16_engine/after"
echo "== verify fp16_engine (main.py --fp16: the scaler made in main.py, backward and step in engine.train)"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile main.py \
  --json "$J/fp16_engine.json" -- --fp16 --steps 400 2>&1 | tail -9
cd "$ROOT"
echo "== every migrated fixture's and project's script on the GPU"
PYTHONPATH=$ROOT python -m pytest -q -p no:cacheprovider tests/test_migrate_fixtures.py tests/test_projects.py \
  -k "test_after_scripts_run or test_project_after_runs" 2>&1 | tail -4 | tee "$J/after_scripts_on_gpu.txt"
