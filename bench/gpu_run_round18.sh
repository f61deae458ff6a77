#!/usr/bin/env bash
# GPU evidence for the eighteenth round (issue 21): the new project fixture, an FP16_Optimizer made
# under a script's `if __name__ == "__main__":` and handed to a trainer class, the fp32 path's
# LambdaLR now scheduling both paths (projects/fp16_script_trainer), under `ampfix verify`
# (half-precision share, loss against fp32, syncs per step); its entry points on the GPU (fp32,
# fp16); and the same project migrated with --dtype bfloat16 on the spot, under verify too.
# From the repo root on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round18 bash bench/gpu_run_round18.sh      (DEVICE=cpu to check the plumbing)
set -u
OUT=${OUT:-bench/results/round18}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ROOT=$PWD
DEVICE=${DEVICE:-auto}
nvidia-smi -L 2>/dev/null
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
cd "$ROOT/fixtures/projects/fp16_script_trainer/after"
echo "== verify fp16_script_trainer (train.py --fp16: the scaler made under __main__, Trainer(..., scaler=scaler))"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile train.py \
  --json "$J/fp16_script_trainer.json" -- --fp16 --epochs 20 2>&1 | tail -9
echo "== its entry points"
for args in "--epochs 2" "--epochs 2 --fp16"; do
  echo "-- train.py $args"
  python train.py $args 2>&1 | tail -2
done 2>&1 | tee "$J/fp16_script_trainer_entries.txt"
echo "== the same project migrated with --dtype bfloat16 here, then verified"
BF=$(mktemp -d)
cp -r "$ROOT/fixtures/projects/fp16_script_trainer/before/." "$BF/"
(cd "$BF" && PYTHONPATH=$ROOT python -m ampfix migrate --write -q --dtype bfloat16 --torch-version 2.4 . >/dev/null; \
  grep -n "use_amp\|autocast" train.py trainer.py)
cd "$BF"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile train.py \
  --json "$J/fp16_script_trainer_bf16.json" -- --fp16 --epochs 20 2>&1 | tail -9
rm -rf "$BF"
