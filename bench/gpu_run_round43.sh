#!/usr/bin/env bash
# GPU evidence for the forty-third round's shapes, from the repository root on a CUDA machine with
# torch, click and pathspec:  OUT=bench/results/round43 bash bench/gpu_run_round43.sh
#  - optional_scaler: the migrated pass function trains in mixed precision with its loss on the
#    fp32 curve (verify), and a caller outside the project that passes no scaler still trains;
#  - setup_returns: the retrieval script's encoder runs in float16 under the one region the
#    migration wrote (the vectors it returns are float16), with either retriever.
set -u
OUT=${OUT:-bench/results/round43}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
echo "== verify fixtures/projects/optional_scaler/after/main.py -- --apex"
python -m ampfix verify --steps 60 fixtures/projects/optional_scaler/after/main.py \
    --json "$OUT/verify_optional_scaler.json" -- --apex --epochs 4 --batches 40 2>&1 | tail -12
echo "== the outside caller, no scaler (float32), and the project's own paths"
(cd fixtures/projects/optional_scaler/after && PYTHONPATH=. python ../drive.py && PYTHONPATH=. python main.py --apex \
    && PYTHONPATH=. python main.py && PYTHONPATH=. python main.py --predict) 2>&1 | tail -8
echo "== setup_returns/after/retrieve.py (local and remote retriever)"
(cd fixtures/projects/setup_returns/after && PYTHONPATH=. python retrieve.py && PYTHONPATH=. python retrieve.py --url x \
    && PYTHONPATH=. python retrieve.py --fp16_opt_level O0) 2>&1 | tail -4
