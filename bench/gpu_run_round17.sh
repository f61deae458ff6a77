#!/usr/bin/env bash
# GPU evidence for the seventeenth round (issue 21): the new project fixture, an FP16_Optimizer
# handed to a trainer class that keeps it on self (projects/fp16_trainer_class: the class now takes
# the GradScaler and keeps it beside the optimizer), under `ampfix verify` (half-precision share,
# loss against fp32, syncs per step); its entry points on the GPU (fp32, fp16, fp16 with gradient
# accumulation); and the same project migrated with --dtype bfloat16 on the spot, under verify too.
# From the repo root on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round17 bash bench/gpu_run_round17.sh      (DEVICE=cpu to check the plumbing)
set -u
OUT=${OUT:-bench/results/round17}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ROOT=$PWD
DEVICE=${DEVICE:-auto}
nvidia-smi -L 2>/dev/null
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
cd "$ROOT/fixtures/projects/fp16_trainer_class/after"
echo "== verify fp16_trainer_class (main.py --fp16: Trainer(..., scaler=scaler) scales and steps through self.scaler)"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile main.py \
  --json "$J/fp16_trainer_class.json" -- --fp16 --epochs 20 2>&1 | tail -9
echo "== its entry points"
for args in "--epochs 2" "--epochs 2 --fp16" "--epochs 2 --fp16 --accum 2"; do
  echo "-- main.py $args"
  python main.py $args 2>&1 | tail -2
done 2>&1 | tee "$J/fp16_trainer_class_entries.txt"
echo "== the same project migrated with --dtype bfloat16 here, then verified"
BF=$(mktemp -d)
cp -r "$ROOT/fixtures/projects/fp16_trainer_class/before/." "$BF/"
(cd "$BF" && PYTHONPATH=$ROOT python -m ampfix migrate --write -q --dtype bfloat16 --torch-version 2.4 . >/dev/null; \
  grep -n "use_amp\|autocast" main.py trainer.py)
cd "$BF"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile main.py \
  --json "$J/fp16_trainer_class_bf16.json" -- --fp16 --epochs 20 2>&1 | tail -9
rm -rf "$BF"
