#!/usr/bin/env bash
# GPU evidence for the twenty-first round (issue 21): projects/attack_trainer, where apex's amp is
# None where apex is missing (`amp is not None` folds), AMP is set up in a base class's method for
# a grandchild's own training step, an attack helper's scaled backward is for its input's gradient
# (no step of its own), and amp.initialize takes its options from a dict (`**amp_args`).  Each
# migrated entry point under `ampfix verify` (half-precision share, loss against fp32, syncs per
# step), the entry points run as a user would, and the same project migrated with --dtype
# bfloat16 here.  From the repo root on a CUDA machine with torch, click and pytest:
#   OUT=bench/results/round21 bash bench/gpu_run_round21.sh      (DEVICE=cpu to check the plumbing)
set -u
OUT=${OUT:-bench/results/round21}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ROOT=$PWD
DEVICE=${DEVICE:-auto}
nvidia-smi -L 2>/dev/null
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
cd "$ROOT/fixtures/projects/attack_trainer/after"
for entry in "train.py --fp16" "train.py --fp16 --robust" "fast.py"; do
  set -- $entry
  script=$1
  shift
  name=$(echo "${script%.py}$*" | tr -d ' -')
  echo "== verify $entry"
  PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
    --json "$J/attack_trainer_$name.json" "$script" -- "$@" --epochs 20 2>&1 | tail -9
done
echo "== its entry points"
for args in "train.py --epochs 2" "train.py --epochs 2 --fp16" "train.py --epochs 2 --fp16 --robust" \
    "fast.py --epochs 2" "fast.py --epochs 2 --opt-level O0"; do
  echo "-- $args"
  python $args 2>&1 | tail -2
done 2>&1 | tee "$J/attack_trainer_entries.txt"
echo "== the same project migrated with --dtype bfloat16 here, then verified"
BF=$(mktemp -d)
cp -r "$ROOT/fixtures/projects/attack_trainer/before/." "$BF/"
(cd "$BF" && PYTHONPATH=$ROOT python -m ampfix migrate --write -q --dtype bfloat16 --torch-version 2.4 . >/dev/null; \
  grep -n "use_amp\|autocast\|GradScaler\|backward\|bfloat16" base.py robust.py fast.py)
cd "$BF"
PYTHONPATH=$ROOT:$PWD python -m ampfix verify --device "$DEVICE" --steps $STEPS --no-profile \
  --json "$J/attack_trainer_bf16.json" train.py -- --fp16 --robust --epochs 20 2>&1 | tail -9
rm -rf "$BF"
