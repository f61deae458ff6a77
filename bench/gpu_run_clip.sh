#!/usr/bin/env bash
# GPU evidence for this round's classes (issue 21): the micro-batch clip that stays in place
# (_clip_scaled_grad_norm_: same gradients as clipping the unscaled partial sums, no host sync
# under torch.cuda.set_sync_debug_mode("error")), and apex's amp kept on the object
# (amp_attribute).  Each migrated fixture trains in mixed precision with its loss on the fp32
# curve; verify --migrate runs its apex original through the migration.  From the repo root on a
# CUDA machine with torch, click and pytest:
#   OUT=bench/results/round-clip bash bench/gpu_run_clip.sh
set -u
OUT=${OUT:-bench/results/round-clip}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
python -m pytest -q -p no:cacheprovider -m gpu tests/test_clip_scaled.py 2>&1 | tail -3
STEPS=${STEPS:-40}
for f in closure_accum_clip bert_finetune amp_attribute else_branch_init gan_setup_lists; do
  echo "== verify fixtures/apex/after/$f.py"
  python -m ampfix verify --steps $STEPS --no-profile fixtures/apex/after/$f.py --json "$OUT/after_$f.json" -- --steps 200 2>&1 | tail -8
  echo "== verify --migrate fixtures/apex/before/$f.py"
  python -m ampfix verify --steps $STEPS --no-profile --migrate --json "$OUT/migrate_$f.json" \
    fixtures/apex/before/$f.py -- --steps 200 2>&1 | tail -8
done
