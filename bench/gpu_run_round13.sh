#!/usr/bin/env bash
# GPU evidence for the thirteenth round's shapes (issue 21): each migrated fixture under
# `ampfix verify` (half-precision share, loss against fp32, syncs per step) with the options that
# used to run apex, and the evaluation-only script run as it is.  From the repo root on a CUDA
# machine with torch, click and pytest:
#   OUT=bench/results/round13 bash bench/gpu_run_round13.sh
set -u
OUT=${OUT:-bench/results/round13}
mkdir -p "$OUT"
J=$(cd "$OUT" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
nvidia-smi -L
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
cd "$ROOT/fixtures/apex/after"
echo "== verify accumulate_branches.py (--accumulation-steps 2: the step and update of the accumulating branch)"
python -m ampfix verify --steps $STEPS --no-profile accumulate_branches.py --json "$J/accumulate_branches_accum2.json" -- --accumulation-steps 2 --steps 40 2>&1 | tail -9
echo "== verify accumulate_branches.py (--accumulation-steps 1: the other branch)"
python -m ampfix verify --steps $STEPS --no-profile accumulate_branches.py --json "$J/accumulate_branches_accum1.json" -- --accumulation-steps 1 --steps 40 2>&1 | tail -9
echo "== verify accumulate_clip_branches.py (--accumulation-steps 2 --clip 1: the forward's own region, the clip of every micro-batch on scaled gradients)"
python -m ampfix verify --steps $STEPS --no-profile accumulate_clip_branches.py --json "$J/accumulate_clip_branches_clip.json" -- --accumulation-steps 2 --clip 1 --steps 40 2>&1 | tail -9
echo "== verify accumulate_clip_branches.py (--accumulation-steps 2 --clip 0: the norm of every micro-batch under _unscaled_grads)"
python -m ampfix verify --steps $STEPS --no-profile accumulate_clip_branches.py --json "$J/accumulate_clip_branches_norm.json" -- --accumulation-steps 2 --clip 0 --steps 40 2>&1 | tail -9
echo "== verify accumulate_clip_branches.py (--accumulation-steps 1 --clip 1: the other branch)"
python -m ampfix verify --steps $STEPS --no-profile accumulate_clip_branches.py --json "$J/accumulate_clip_branches_accum1.json" -- --accumulation-steps 1 --clip 1 --steps 40 2>&1 | tail -9
echo "== verify ifexp_unpack.py (--fp16: the setup's unpacked initialize, its loss scale chosen at run time)"
python -m ampfix verify --steps $STEPS --no-profile ifexp_unpack.py --json "$J/ifexp_unpack.json" -- --fp16 --steps 200 2>&1 | tail -9
echo "== verify ifexp_unpack.py (--fp16 --loss_scale 128: a static loss scale)"
python -m ampfix verify --steps $STEPS --no-profile ifexp_unpack.py --json "$J/ifexp_unpack_static.json" -- --fp16 --loss_scale 128 --steps 200 2>&1 | tail -9
echo "== verify try_except_log.py (--amp_type O1: the try that only logged goes)"
python -m ampfix verify --steps $STEPS --no-profile try_except_log.py --json "$J/try_except_log.json" -- --amp_type O1 --steps 200 2>&1 | tail -9
echo "== verify eval_after_training.py (--fp16: evaluation during and after training under autocast)"
python -m ampfix verify --steps $STEPS --no-profile eval_after_training.py --json "$J/eval_after_training.json" -- --fp16 --steps 200 2>&1 | tail -9
echo "== run main_guard_eval.py (evaluation only: no optimizer step for verify to count)"
python - <<'PY' 2>&1 | tail -4
import runpy, sys, torch
seen = []
orig = torch.nn.Linear.forward
def forward(self, x):
    out = orig(self, x)
    seen.append(str(out.dtype))
    return out
torch.nn.Linear.forward = forward
sys.argv = ["main_guard_eval.py"]
runpy.run_path("main_guard_eval.py", run_name="__main__")
print("linear output dtypes:", sorted(set(seen)), "calls:", len(seen))
PY
cd "$ROOT"
python -m pytest -q -p no:cacheprovider tests/test_migrate_fixtures.py -k "accumulate_branches or accumulate_clip_branches or ifexp_unpack or try_except_log or eval_after_training or main_guard_eval" 2>&1 | tail -2
