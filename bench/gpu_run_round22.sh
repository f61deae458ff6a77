#!/usr/bin/env bash
# GPU evidence for the twenty-second round (issue 21): projects/gan_holder (a Trainer keeping the
# object that initializes apex in `self.GAN`, its losses scaled through a functools.partial of one
# helper, apex's state in its checkpoints) and projects/setup_routing (a setup that initializes
# apex for inference where the optimizer handed in is None and for training where it is not;
# evaluation inside the training function).  Each migrated training entry point under
# `ampfix verify` (half-precision share, loss against fp32, syncs per step), the entry points run
# as a user would, and both projects migrated with --dtype bfloat16 here.  From the repo root on a
# CUDA machine with torch, click and pytest:
#   OUT=bench/results/round22 bash bench/gpu_run_round22.sh      (DEVICE=cpu to check the plumbing)
set -u
OUT=${OUT:-bench/results/round22}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ROOT=$PWD
DEVICE=${DEVICE:-auto}
nvidia-smi -L 2>/dev/null
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
for project in gan_holder setup_routing; do
  cd "$ROOT/fixtures/projects/$project/after"
  echo "== verify $project train.py --fp16"
  PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
    --json "$J/${project}_fp16.json" train.py -- --fp16 --epochs 20 2>&1 | tail -9
done
echo "== the entry points"
cd "$ROOT/fixtures/projects/gan_holder/after"
for args in "train.py --epochs 2" "train.py --epochs 2 --fp16"; do
  echo "-- gan_holder $args"; python $args 2>&1 | tail -3
done 2>&1 | tee "$J/gan_holder_entries.txt"
cd "$ROOT/fixtures/projects/setup_routing/after"
CK=$(mktemp -d)
for args in "train.py --epochs 2" "train.py --epochs 3 --fp16 --save $CK/m.pt" "evaluate.py --load $CK/m.pt" \
    "evaluate.py --fp16 --load $CK/m.pt"; do
  echo "-- setup_routing $args"; python $args 2>&1 | tail -2
done 2>&1 | tee "$J/setup_routing_entries.txt"
rm -rf "$CK"
echo "== both projects migrated with --dtype bfloat16 here, then verified"
for project in gan_holder setup_routing; do
  BF=$(mktemp -d)
  cp -r "$ROOT/fixtures/projects/$project/before/." "$BF/"
  (cd "$BF" && PYTHONPATH=$ROOT python -m ampfix migrate --write -q --dtype bfloat16 --torch-version 2.4 . >/dev/null; \
    grep -n "autocast\|GradScaler\|backward\|bfloat16" *.py)
  cd "$BF"
  PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
    --json "$J/${project}_bf16.json" train.py -- --fp16 --epochs 20 2>&1 | tail -9
  cd "$ROOT"; rm -rf "$BF"
done
