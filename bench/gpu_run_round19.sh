#!/usr/bin/env bash
# GPU evidence for the nineteenth round (issue 21): the new project fixture, a GAN setup that returns
# (model, optimizers) when training and the model alone otherwise, its loss helper taking the loss
# terms as a parameter (projects/maker_returns), under `ampfix verify` (half-precision share, loss
# against fp32, syncs per step); its entry points on the GPU (fp32, O1, inference); and the same
# project migrated with --dtype bfloat16 on the spot, under verify too.
# From the repo root on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round19 bash bench/gpu_run_round19.sh      (DEVICE=cpu to check the plumbing)
set -u
OUT=${OUT:-bench/results/round19}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ROOT=$PWD
DEVICE=${DEVICE:-auto}
nvidia-smi -L 2>/dev/null
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
cd "$ROOT/fixtures/projects/maker_returns/after"
echo "== verify maker_returns (train.py --amp O1: the scaler made after create_model, handed to loss_backward)"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile train.py \
  --json "$J/maker_returns.json" -- --amp O1 --epochs 20 2>&1 | tail -9
echo "== its entry points"
for args in "train.py --epochs 2" "train.py --epochs 2 --amp O1" "infer.py"; do
  echo "-- $args"
  python $args 2>&1 | tail -2
done 2>&1 | tee "$J/maker_returns_entries.txt"
echo "== the same project migrated with --dtype bfloat16 here, then verified"
BF=$(mktemp -d)
cp -r "$ROOT/fixtures/projects/maker_returns/before/." "$BF/"
(cd "$BF" && PYTHONPATH=$ROOT python -m ampfix migrate --write -q --dtype bfloat16 --torch-version 2.4 . >/dev/null; \
  grep -n "use_amp\|autocast\|GradScaler" train.py losses.py models.py)
cd "$BF"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile train.py \
  --json "$J/maker_returns_bf16.json" -- --amp O1 --epochs 20 2>&1 | tail -9
rm -rf "$BF"
