#!/usr/bin/env bash
# GPU evidence for the sixteenth round (issue 21): the new project fixture under `ampfix verify`
# (half-precision share, loss against fp32, syncs per step): a schedule class that owns the
# optimizer apex initialized, whose method now takes the GradScaler and steps through it
# (projects/optim_wrapper); the new inference golden (apex/inference_level_under_guard.py: autocast
# enabled by a level set under the guard) runs; then every migrated fixture's and project's
# script on the GPU, where autocast and GradScaler act (CI runs them on the CPU, where both
# disable themselves).
# From the repo root on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round16 bash bench/gpu_run_round16.sh      (DEVICE=cpu to check the plumbing)
# The last part takes about 9 minutes on an H100, past a 10-minute call with the rest: PART=verify
# runs the first two parts, PART=scripts the last (bench/results/round16 came from those two calls).
set -u
PART=${PART:-all}
OUT=${OUT:-bench/results/round16}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
ROOT=$PWD
DEVICE=${DEVICE:-auto}
nvidia-smi -L 2>/dev/null
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
if [ "$PART" != scripts ]; then
cd "$ROOT/fixtures/projects/optim_wrapper/after"
echo "== verify optim_wrapper (train.py --fp16: ScheduledOptim.step_and_update_lr(scaler=scaler) steps through the scaler)"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile train.py \
  --json "$J/optim_wrapper.json" -- --fp16 --epochs 20 2>&1 | tail -9
cd "$ROOT/fixtures/apex/after"
echo "== inference_level_under_guard.py (autocast enabled by bool(args.amp) and level != \"O0\")"
python inference_level_under_guard.py 2>&1 | tail -3 | tee "$J/inference_level_under_guard.txt"
fi
cd "$ROOT"
[ "$PART" = verify ] && exit 0
echo "== every migrated fixture's and project's script on the GPU"
PYTHONPATH=$ROOT python -m pytest -q -p no:cacheprovider tests/test_migrate_fixtures.py tests/test_projects.py \
  -k "test_after_scripts_run or test_project_after_runs" --durations=5 2>&1 | tail -12 | tee "$J/after_scripts_on_gpu.txt"
