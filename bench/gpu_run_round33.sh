#!/usr/bin/env bash
# GPU evidence for the thirty-third round (issue 21): projects/setup_chain (a setup choosing
# deepspeed, fairscale or apex in an if/elif chain; the migrated training caller makes the scaler
# enabled by the negated tests) and projects/false_flag (apex found by a flag set False before its
# guard) under `ampfix verify` (half-precision share, loss against fp32, syncs per step), then the
# entry points run as a user would.
# From the repo root on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round33 bash bench/gpu_run_round33.sh      (DEVICE=cpu to check the plumbing)
set -u
OUT=${OUT:-bench/results/round33}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ROOT=$PWD
DEVICE=${DEVICE:-auto}
STEPS=${STEPS:-40}
nvidia-smi -L 2>/dev/null
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
cd "$ROOT/fixtures/projects/setup_chain/after"
echo "== verify setup_chain main.py --do_train --epochs 20"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
  --json "$J/setup_chain.json" main.py -- --do_train --epochs 20 2>&1 | tail -9
cd "$ROOT/fixtures/projects/false_flag/after"
echo "== verify false_flag train.py --epochs 20"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
  --json "$J/false_flag.json" train.py -- --epochs 20 2>&1 | tail -9
echo "== the entry points"
(
  cd "$ROOT/fixtures/projects/setup_chain/after"
  for ARGS in "--do_train" "--do_train --amp_level 0" "--do_eval"; do
    echo "-- setup_chain main.py $ARGS"; python main.py $ARGS 2>&1 | tail -2
  done
  cd "$ROOT/fixtures/projects/false_flag/after"
  for ARGS in "train.py --epochs 3" "train.py --epochs 3 --opt_level O0" "predict.py"; do
    echo "-- false_flag $ARGS"; python $ARGS 2>&1 | tail -2
  done
) 2>&1 | tee "$J/entries.txt"
