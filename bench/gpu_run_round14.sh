#!/usr/bin/env bash
# GPU evidence for the fourteenth round (issue 21): the fixture of Hugging Face's einsum
# registration under `ampfix verify` (half-precision share, loss against fp32, syncs per step),
# then every migrated fixture's script run on the GPU, where autocast and GradScaler act (CI runs
# them on the CPU, where both disable themselves).  From the repo root on a CUDA machine with
# torch, click and pytest:
#   OUT=bench/results/round14 bash bench/gpu_run_round14.sh
set -u
OUT=${OUT:-bench/results/round14}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
nvidia-smi -L
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
cd "$ROOT/fixtures/apex/after"
echo "== verify einsum_registration.py (--fp16 --gradient_accumulation_steps 2: the registration went, autocast runs einsum in float16)"
python -m ampfix verify --steps $STEPS --no-profile einsum_registration.py --json "$J/einsum_registration.json" -- --fp16 --steps 200 2>&1 | tail -9
echo "== verify einsum_registration.py (--fp16 --gradient_accumulation_steps 1)"
python -m ampfix verify --steps $STEPS --no-profile einsum_registration.py --json "$J/einsum_registration_accum1.json" -- --fp16 --gradient_accumulation_steps 1 --steps 200 2>&1 | tail -9
echo "== verify streaming_batches.py (--opt_level O1: the forward's region without the data fetch, the evaluation on the side under autocast)"
python -m ampfix verify --steps $STEPS --no-profile streaming_batches.py --json "$J/streaming_batches.json" -- --steps 200 2>&1 | tail -9
cd "$ROOT"
echo "== every migrated fixture's script on the GPU"
python -m pytest -q -p no:cacheprovider tests/test_migrate_fixtures.py -k "test_after_scripts_run" 2>&1 | tail -4 | tee "$J/after_scripts_on_gpu.txt"
