#!/usr/bin/env bash
# GPU evidence for `migrate --dtype bfloat16`: apex originals of the goldens migrated to bfloat16
# autocast with no GradScaler train on the GPU with their loss on the fp32 curve and bfloat16
# matmul FLOPs.  From the repo root on a CUDA machine (Ampere or newer) with torch and click:
#   OUT=bench/results/round-bf16 bash bench/gpu_run_bf16.sh
set -u
OUT=${OUT:-bench/results/round-bf16}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name(), 'bf16', torch.cuda.is_bf16_supported())"
STEPS=${STEPS:-40}
W=$(mktemp -d)
NAMES="trainer_class transformer_lm bert_finetune split_step_trainer fp16_opt_callee grad_reads"
for f in $NAMES; do cp "fixtures/apex/before/$f.py" "$W/"; done
python -m ampfix migrate --dtype bfloat16 --write "$W" 2>&1 | tail -3
grep -c "GradScaler" "$W"/*.py
for f in $NAMES; do
  echo "== verify (migrated with --dtype bfloat16) $f.py"
  python -m ampfix verify --steps $STEPS --no-profile "$W/$f.py" --json "$OUT/bf16_$f.json" -- --steps 200 2>&1 | tail -8
done
