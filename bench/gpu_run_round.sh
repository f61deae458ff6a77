#!/usr/bin/env bash
# GPU evidence for this round's migration changes: the fixtures whose migration changed (a clip
# on every micro-batch moved to the optimizer step: no host sync) train in mixed precision with
# their loss on the fp32 curve, verify --migrate --unsafe-fixes runs their apex originals, and the
# project whose migration changed runs.  From the repo root on a CUDA machine with torch and click:
#   OUT=bench/results/round-frontier bash bench/gpu_run_round.sh
set -u
OUT=${OUT:-bench/results/round-frontier}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
for f in bert_finetune closure_accum_clip step_hack_accum fp16_optimizer; do
  echo "== verify fixtures/apex/after/$f.py"
  python -m ampfix verify --steps $STEPS --no-profile fixtures/apex/after/$f.py --json "$OUT/after_$f.json" -- --steps 200 2>&1 | tail -8
done
for f in bert_finetune closure_accum_clip; do
  echo "== verify --migrate --unsafe-fixes fixtures/apex/before/$f.py"
  python -m ampfix verify --steps $STEPS --no-profile --migrate --unsafe-fixes --json "$OUT/migrate_$f.json" \
    fixtures/apex/before/$f.py -- --steps 200 2>&1 | tail -8
done
echo "== project setup_returns (migrated), run as its users would"
(cd fixtures/projects/setup_returns/after && python train.py --steps 20 && python embed.py) 2>&1 | tail -4
