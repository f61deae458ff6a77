#!/usr/bin/env bash
# GPU evidence for the refusal classes this round solved as classes (issue 21 §1): each new
# fixture, migrated, trains in mixed precision with its loss on the fp32 curve, and
# verify --migrate runs its apex original through the migration.  From the repo root on a CUDA
# machine with torch and click:
#   OUT=bench/results/round-shapes bash bench/gpu_run_shapes.sh
set -u
OUT=${OUT:-bench/results/round-shapes}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
for f in nested_guards lazy_setup split_step_trainer fp16_opt_callee; do
  echo "== verify fixtures/apex/after/$f.py"
  python -m ampfix verify --steps $STEPS --no-profile fixtures/apex/after/$f.py --json "$OUT/after_$f.json" -- --steps 200 2>&1 | tail -8
done
for f in nested_guards lazy_setup split_step_trainer fp16_opt_callee; do
  echo "== verify --migrate fixtures/apex/before/$f.py"
  python -m ampfix verify --steps $STEPS --no-profile --migrate --json "$OUT/migrate_$f.json" \
    fixtures/apex/before/$f.py -- --steps 200 2>&1 | tail -8
done
