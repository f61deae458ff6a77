#!/usr/bin/env bash
# GPU evidence for the thirty-first round (issue 21): projects/partial_eval (the model bound into
# a functools.partial after apex O2, called by an evaluation helper and at the end: after the
# migration both calls run under autocast, so the embeddings come out in float16 as under apex)
# and projects/setattr_steps (an XLM-style trainer: modules fetched by name in each step, the
# region starting at the forward, the clip reusing the fp32 arm's parameter lists).  Each migrated
# entry point under `ampfix verify` (half-precision share, loss against fp32, syncs per step), and
# run as a user would.
# From the repo root on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round31 bash bench/gpu_run_round31.sh      (DEVICE=cpu to check the plumbing)
set -u
OUT=${OUT:-bench/results/round31}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ROOT=$PWD
DEVICE=${DEVICE:-auto}
nvidia-smi -L 2>/dev/null
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
for spec in "partial_eval|--epochs 30" "setattr_steps|--epochs 30"; do
  P=${spec%%|*}; ARGS=${spec#*|}
  cd "$ROOT/fixtures/projects/$P/after"
  echo "== verify $P train.py $ARGS"
  PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
    --json "$J/${P}.json" train.py -- $ARGS 2>&1 | tail -9
done
echo "== the entry points"
for spec in "partial_eval|train.py --epochs 3" "setattr_steps|train.py --epochs 3" \
            "setattr_steps|train.py --epochs 3 --amp -1"; do
  P=${spec%%|*}; ARGS=${spec#*|}
  echo "-- $P $ARGS"; (cd "$ROOT/fixtures/projects/$P/after" && python $ARGS 2>&1 | tail -3)
done 2>&1 | tee "$J/entries.txt"
