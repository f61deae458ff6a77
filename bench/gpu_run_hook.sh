#!/usr/bin/env bash
# GPU evidence for the registry-built optimizer hook (issue 21, mmcv's DistOptimizerHook shape):
# after `migrate --write` the hook makes the GradScaler where `use_fp16` is set and the
# framework's `fp16_enabled` flag keeps the forward under autocast.  From the repo root on a CUDA
# machine with torch, click and pytest:
#   OUT=bench/results/round-hook bash bench/gpu_run_hook.sh
set -u
OUT=${OUT:-bench/results/round-hook}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
echo "== verify fixtures/projects/registry_hook/after/train.py --fp16"
(cd fixtures/projects/registry_hook/after && python -m ampfix verify --steps $STEPS --no-profile train.py \
  --json "$J/after_registry_hook.json" -- --epochs 100 --fp16 2>&1 | tail -8)
echo "== verify fixtures/projects/registry_hook/after/train.py (no --fp16: float32, as before)"
(cd fixtures/projects/registry_hook/after && python -m ampfix verify --steps $STEPS --no-profile train.py \
  --json "$J/after_registry_hook_off.json" -- --epochs 100 2>&1 | tail -8)
echo "== both entries, to the end (train, save, resume)"
(cd fixtures/projects/registry_hook/after && python train.py --epochs 3 --fp16 && python train.py --epochs 3) 2>&1 | tail -4
python -m pytest -q -p no:cacheprovider tests/test_registry_hooks.py tests/test_projects.py -k "registry or hook" 2>&1 | tail -2
