#!/usr/bin/env bash
# GPU evidence for the forty-ninth round's shapes, from the repository root on a CUDA machine with
# torch, click and pathspec:  OUT=bench/results/round49 bash bench/gpu_run_round49.sh
#  - fp16_loader: FP16_Optimizer made in main.py; helpers.py made the model half under --fp16 (the
#    cast goes), sets the learning rate (plain optimizer, no scaler) and evaluates on token ids (its
#    call runs under autocast). verify with and without --fp16; then the script itself, which prints
#    the dtype its evaluation ran in: float16 with --fp16 (as the half model did), float32 without.
set -u
OUT=${OUT:-bench/results/round49}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
for flag in --fp16 ""; do
    name=${flag:-fp32}; name=${name#--}
    echo "== verify fixtures/projects/fp16_loader/after/main.py $flag"
    (cd fixtures/projects/fp16_loader/after && python -m ampfix verify --steps 60 main.py \
        --json "$OUT/verify_fp16_loader_$name.json" -- --epochs 40 $flag 2>&1 | tail -12)
done
echo "== the script itself: the evaluation's dtype"
(cd fixtures/projects/fp16_loader/after && python main.py --epochs 2 --fp16 && python main.py --epochs 1)
