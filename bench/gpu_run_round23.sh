#!/usr/bin/env bash
# GPU evidence for the twenty-third round (issue 21): projects/box_factory (a training box, an
# nn.Module computing its loss in forward and scaling it in update_params, got from a factory:
# autocast goes in the box's forward) and projects/unbound_amp (apex's amp imported inside
# __init__ only and read as an unbound global by the step: the fp16 path raised NameError before
# the migration).  Each migrated entry point under `ampfix verify` (half-precision share, loss
# against fp32, syncs per step), the entry points run as a user would, and both projects migrated
# with --dtype bfloat16 here.  From the repo root on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round23 bash bench/gpu_run_round23.sh      (DEVICE=cpu to check the plumbing)
set -u
OUT=${OUT:-bench/results/round23}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ROOT=$PWD
DEVICE=${DEVICE:-auto}
nvidia-smi -L 2>/dev/null
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
declare -A ENTRY=([box_factory]=train.py [unbound_amp]=run.py)
for project in box_factory unbound_amp; do
  cd "$ROOT/fixtures/projects/$project/after"
  echo "== verify $project ${ENTRY[$project]} --fp16"
  PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
    --json "$J/${project}_fp16.json" ${ENTRY[$project]} -- --fp16 --epochs 20 2>&1 | tail -9
done
echo "== the entry points"
cd "$ROOT/fixtures/projects/box_factory/after"
for args in "train.py --epochs 2" "train.py --epochs 2 --fp16" "train.py --epochs 2 --fp16 --accum 2"; do
  echo "-- box_factory $args"; python $args 2>&1 | tail -2
done 2>&1 | tee "$J/box_factory_entries.txt"
cd "$ROOT/fixtures/projects/unbound_amp/after"
for args in "run.py --epochs 2" "run.py --epochs 2 --fp16" "run.py --epochs 2 --fp16 --fp16_opt_level O0"; do
  echo "-- unbound_amp $args"; python $args 2>&1 | tail -2
done 2>&1 | tee "$J/unbound_amp_entries.txt"
echo "== both projects migrated with --dtype bfloat16 here, then verified"
for project in box_factory unbound_amp; do
  BF=$(mktemp -d)
  cp -r "$ROOT/fixtures/projects/$project/before/." "$BF/"
  (cd "$BF" && PYTHONPATH=$ROOT python -m ampfix migrate --write -q --dtype bfloat16 --torch-version 2.4 . >/dev/null; \
    grep -n "autocast\|GradScaler\|backward\|bfloat16" *.py)
  cd "$BF"
  PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
    --json "$J/${project}_bf16.json" ${ENTRY[$project]} -- --fp16 --epochs 20 2>&1 | tail -9
  cd "$ROOT"; rm -rf "$BF"
done
