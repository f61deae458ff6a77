#!/usr/bin/env bash
# GPU evidence for the tenth and eleventh rounds' shapes (issue 21): a trainer whose back end is
# picked by an option, with a subclass in another module (projects/backend_trainer: the Trainer of
# Hugging Face transformers 4.x and its copies), and a back end read from a configuration's "type"
# (apex/after/config_type.py: SegmentationBLWX/sssegmentation).  Each migrated script runs under
# `ampfix verify` (half-precision share, loss against fp32, syncs per step) with the choice that
# used to mean apex.  From the repo root on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round10 bash bench/gpu_run_round10.sh
set -u
OUT=${OUT:-bench/results/round10}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
nvidia-smi -L
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
cd "$ROOT/fixtures/projects/backend_trainer/after"
echo "== verify backend_trainer (--fp16-backend apex: the trainer's native path)"
python -m ampfix verify --steps $STEPS --no-profile train.py --json "$J/backend_trainer_apex.json" -- --epochs 100 --fp16 --fp16-backend apex 2>&1 | tail -9
echo "== verify backend_trainer (--weighted: the subclass of another module, backend auto)"
python -m ampfix verify --steps $STEPS --no-profile train.py --json "$J/backend_trainer_weighted.json" -- --epochs 100 --fp16 --weighted 2>&1 | tail -9
cd "$ROOT/fixtures/apex/after"
echo "== verify config_type.py (--config apex: routed to the native path, its keyword groups defaulted)"
python -m ampfix verify --steps $STEPS --no-profile config_type.py --json "$J/config_type_apex.json" -- --config apex --steps 200 2>&1 | tail -9
echo "== verify config_type.py (--config pytorch: the project's own native configuration)"
python -m ampfix verify --steps $STEPS --no-profile config_type.py --json "$J/config_type_pytorch.json" -- --config pytorch --steps 200 2>&1 | tail -9
cd "$ROOT"
python -m pytest -q -p no:cacheprovider tests/test_round10_shapes.py 2>&1 | tail -2
