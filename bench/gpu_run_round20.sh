#!/usr/bin/env bash
# GPU evidence for the twentieth round (issue 21): projects/args_amp, where apex's amp is kept on
# `args` (`args.amp = amp`) and read by a training step the scripts share through
# `from common import *` (one script shadows it), a trainer picked from a dict of classes, and an
# adversarial second backward before the step (scaled too after the migration).  Each migrated
# entry point under `ampfix verify` (half-precision share, loss against fp32, syncs per step), the
# entry points run as a user would, and the same project migrated with --dtype bfloat16 here.
# From the repo root on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round20 bash bench/gpu_run_round20.sh      (DEVICE=cpu to check the plumbing)
set -u
OUT=${OUT:-bench/results/round20}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ROOT=$PWD
DEVICE=${DEVICE:-auto}
nvidia-smi -L 2>/dev/null
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
cd "$ROOT/fixtures/projects/args_amp/after"
for entry in "classify.py --fp16 --adv" "regress.py --fp16" "pretrain.py --fp16"; do
  set -- $entry
  script=$1
  shift
  echo "== verify $entry"
  PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
    --json "$J/args_amp_${script%.py}.json" "$script" -- "$@" --epochs 20 2>&1 | tail -9
done
echo "== its entry points"
for args in "classify.py --epochs 2" "classify.py --epochs 2 --fp16 --adv" "regress.py --epochs 2 --fp16" \
    "pretrain.py --epochs 2 --fp16"; do
  echo "-- $args"
  python $args 2>&1 | tail -2
done 2>&1 | tee "$J/args_amp_entries.txt"
echo "== the same project migrated with --dtype bfloat16 here, then verified"
BF=$(mktemp -d)
cp -r "$ROOT/fixtures/projects/args_amp/before/." "$BF/"
(cd "$BF" && PYTHONPATH=$ROOT python -m ampfix migrate --write -q --dtype bfloat16 --torch-version 2.4 . >/dev/null; \
  grep -n "use_amp\|autocast\|GradScaler\|backward" common.py classify.py)
cd "$BF"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
  --json "$J/args_amp_bf16.json" classify.py -- --fp16 --adv --epochs 20 2>&1 | tail -9
rm -rf "$BF"
