#!/usr/bin/env bash
# GPU evidence for the forty-fourth round's shape, from the repository root on a CUDA machine with
# torch, click and pathspec:  OUT=bench/results/round44 bash bench/gpu_run_round44.sh
#  - trainer_eval: a trainer class set up in __init__ trains in mixed precision with its loss on the
#    fp32 curve (verify), and its evaluation loop (through the step method it shares with training)
#    and its prediction method run in float16 under the regions the migration wrote; with O0 all is
#    float32.
set -u
OUT=${OUT:-bench/results/round44}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
echo "== verify fixtures/projects/trainer_eval/after/train.py"
python -m ampfix verify --steps 60 fixtures/projects/trainer_eval/after/train.py \
    --json "$OUT/verify_trainer_eval.json" -- --epochs 4 --batches 40 2>&1 | tail -12
echo "== the evaluation and the prediction: float16 with O1, float32 with O0"
(cd fixtures/projects/trainer_eval/after && PYTHONPATH=. python train.py --epochs 2 \
    && PYTHONPATH=. python train.py --epochs 1 --opt-level O0) 2>&1 | tail -6
