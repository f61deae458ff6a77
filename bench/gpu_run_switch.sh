#!/usr/bin/env bash
# GPU evidence for the switched-trainer class (issue 21): a trainer that scales the loss under
# its own switch (`if self.use_amp:`), with apex initialized by a setup elsewhere; after
# `migrate --write` the trainer makes the GradScaler where the switch is set.  From the repo root
# on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round-switch bash bench/gpu_run_switch.sh
set -u
OUT=${OUT:-bench/results/round-switch}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
echo "== verify fixtures/projects/flag_trainer/after/train.py --amp O1"
(cd fixtures/projects/flag_trainer/after && python -m ampfix verify --steps $STEPS --no-profile train.py \
  --json "$J/after_flag_trainer.json" -- --epochs 200 --amp O1 2>&1 | tail -8)
echo "== verify fixtures/projects/flag_trainer/after/train.py (no --amp: AMP off, as before)"
(cd fixtures/projects/flag_trainer/after && python -m ampfix verify --steps $STEPS --no-profile train.py \
  --json "$J/after_flag_trainer_off.json" -- --epochs 200 2>&1 | tail -8)
python -m pytest -q -p no:cacheprovider tests/test_switches.py 2>&1 | tail -2
