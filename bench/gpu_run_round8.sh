#!/usr/bin/env bash
# GPU evidence for the eighth round's shapes (issue 21): apex's amp handed to a setup helper as an
# argument (amp_argument), initialize in both branches of an if with a checkpoint helper that an
# evaluation entry reaches with no scaler (branch_initialize), a trainer class whose wrap_up()
# initializes apex and a momentum encoder (trainer_wrap_up), and an initialize inside a try that
# returns on failure (try_initialize).  Each fixture's migrated script runs under `ampfix verify`
# (half-precision share, loss against fp32, syncs per step), then once more resuming from the
# checkpoint it wrote where it writes one.  From the repo root on a CUDA machine with torch,
# click and pytest:
#   OUT=bench/results/round8 bash bench/gpu_run_round8.sh
set -u
OUT=${OUT:-bench/results/round8}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
T=$(mktemp -d)
cd fixtures/apex/after
if [ "${ONLY:-}" != "late" ]; then
echo "== verify amp_argument.py (the scaler made before the setup helper and passed to it)"
python -m ampfix verify --steps $STEPS --no-profile amp_argument.py --json "$J/amp_argument.json" -- --steps 200 --output "$T/a.pt" 2>&1 | tail -8
echo "== amp_argument.py resumes from its checkpoint (the scaler's state through the helper)"
python amp_argument.py --steps 20 --output "$T/a.pt" > /dev/null && python amp_argument.py --steps 20 --resume "$T/a.pt" --output "$T/a2.pt" 2>&1 | tail -2
python -c "import torch; s = torch.load('$T/a2.pt', weights_only=False)['amp']; print('saved scaler state:', {k: s[k] for k in ('scale', '_growth_tracker')})"
echo "== verify branch_initialize.py (one scaler for both branches of the GPU-count test)"
python -m ampfix verify --steps $STEPS --no-profile branch_initialize.py --json "$J/branch_initialize.json" -- --steps 200 --output "$T/b.pt" 2>&1 | tail -8
echo "== branch_initialize.py --eval (the checkpoint helper with no scaler)"
python branch_initialize.py --steps 20 --output "$T/b.pt" > /dev/null && python branch_initialize.py --eval --resume "$T/b.pt" 2>&1 | tail -1
echo "== verify trainer_wrap_up.py (the scaler on the trainer, the momentum encoder under the step's autocast)"
python -m ampfix verify --steps $STEPS --no-profile trainer_wrap_up.py --json "$J/trainer_wrap_up.json" -- --steps 200 --output "$T/c.pt" 2>&1 | tail -8
echo "== verify try_initialize.py (the scaler hoisted out of the try)"
python -m ampfix verify --steps $STEPS --no-profile try_initialize.py --json "$J/try_initialize.json" -- --steps 200 2>&1 | tail -8
fi
# added later in the round (ONLY=late runs these alone)
echo "== verify objectives_loop.py (one scaler before the loop of objectives, one update per step)"
python -m ampfix verify --steps $STEPS --no-profile objectives_loop.py --json "$J/objectives_loop.json" -- --steps 200 2>&1 | tail -8
echo "== verify bert_fp16_optimizer.py (the fp16 path's own warm-up gone with its helper and counter)"
python -m ampfix verify --steps $STEPS --no-profile bert_fp16_optimizer.py --json "$J/bert_fp16_optimizer.json" -- --steps 200 2>&1 | tail -8
[ "${ONLY:-}" = "late" ] && exit 0
cd ../../..
python -m pytest -q -p no:cacheprovider tests/test_migrate_fixtures.py tests/test_amp_argument.py 2>&1 | tail -2
