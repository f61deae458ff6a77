#!/usr/bin/env bash
# GPU evidence for the twenty-eighth round (issue 21): projects/twin_backends (a trainer with two
# mixed-precision back ends chosen by options, apex imported with importlib onto the trainer; after
# the migration apex's path joins the native path's autocast through its enabled=, and helper
# methods that read the gradients get them unscaled).  The migrated entry point under `ampfix
# verify` on both paths (half-precision share, loss against fp32, syncs per step), the entry points
# run as a user would; with --dtype bfloat16 the apex path is refused (the native autocast is float16).
# From the repo root on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round28 bash bench/gpu_run_round28.sh      (DEVICE=cpu to check the plumbing)
set -u
OUT=${OUT:-bench/results/round28}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ROOT=$PWD
DEVICE=${DEVICE:-auto}
nvidia-smi -L 2>/dev/null
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
P=twin_backends
cd "$ROOT/fixtures/projects/$P/after"
echo "== verify $P train.py --fp16 --apex_opt_lvl O1 (apex's path, native now)"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
  --json "$J/${P}_apex_path.json" train.py -- --fp16 --apex_opt_lvl O1 --steps 200 2>&1 | tail -9
echo "== verify $P train.py --fp16 (the native path it had)"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
  --json "$J/${P}_native_path.json" train.py -- --fp16 --steps 200 2>&1 | tail -9
echo "== the entry points"
for args in "train.py" "train.py --fp16" "train.py --fp16 --apex_opt_lvl O1" "train.py --fp16 --apex_opt_lvl O0"; do
  echo "-- $P $args"; python $args 2>&1 | tail -2
done 2>&1 | tee "$J/${P}_entries.txt"
echo "== with --dtype bfloat16 the apex path is refused: the native path's autocast is float16"
(cd "$ROOT/fixtures/projects/$P/before" && PYTHONPATH=$ROOT python -m ampfix migrate --dtype bfloat16 \
  --torch-version 2.4 . 2>&1 | grep "not rewritten") | tee "$J/${P}_bf16_refusal.txt"
