#!/usr/bin/env bash
# GPU evidence for the forty-eighth round's shapes, from the repository root on a CUDA machine with
# torch, click and pathspec:  OUT=bench/results/round48 bash bench/gpu_run_round48.sh
#  - installed_else: `if amp is None: <warn, AMP off> else: <initialize the model and its moving
#    average>` (MoCo), a clip after the optimizer step: after the migration the `if` is gone, the
#    scaler is enabled by the opt level. verify with --amp-opt-level O1 (mixed precision, loss on the
#    fp32 curve) and O0 (float32, as before).
set -u
OUT=${OUT:-bench/results/round48}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
for level in O1 O0; do
    echo "== verify fixtures/projects/installed_else/after/train.py --amp-opt-level $level"
    (cd fixtures/projects/installed_else/after && python -m ampfix verify --steps 60 train.py \
        --json "$OUT/verify_installed_else_$level.json" -- --epochs 4 --amp-opt-level $level 2>&1 | tail -12)
done
echo "== the script itself, O1"
(cd fixtures/projects/installed_else/after && python train.py --epochs 2 --amp-opt-level O1)
