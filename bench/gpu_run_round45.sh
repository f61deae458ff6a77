#!/usr/bin/env bash
# GPU evidence for the forty-fifth round's shapes, from the repository root on a CUDA machine with
# torch, click and pathspec:  OUT=bench/results/round45 bash bench/gpu_run_round45.sh
#  - inference_loader: a loader that set apex up with an optimizer made only for it; after the
#    migration the caller's sampling runs under autocast: float16 logits with --fp16, float32 without.
#  - eval_loss_after: trains in mixed precision with its loss on the fp32 curve (verify); its
#    validation loss, computed right after the no_grad block of the forward, is in the region:
#    float16 output, float32 loss (autocast runs cross-entropy in float32, as apex O1 did).
set -u
OUT=${OUT:-bench/results/round45}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
echo "== inference_loader: sampling with and without --fp16"
(cd fixtures/projects/inference_loader/after && PYTHONPATH=. python generate.py --fp16 \
    && PYTHONPATH=. python generate.py) 2>&1 | tail -6
echo "== verify fixtures/projects/eval_loss_after/after/train.py"
python -m ampfix verify --steps 60 fixtures/projects/eval_loss_after/after/train.py \
    --json "$OUT/verify_eval_loss_after.json" -- --epochs 3 --batches 40 2>&1 | tail -12
echo "== eval_loss_after: the validation's output and loss dtypes, O1 and O0"
(cd fixtures/projects/eval_loss_after/after && PYTHONPATH=. python train.py --epochs 2 \
    && PYTHONPATH=. python train.py --epochs 1 --opt-level O0) 2>&1 | tail -6
