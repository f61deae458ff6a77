#!/usr/bin/env bash
# GPU evidence for the forty-sixth round's shapes, from the repository root on a CUDA machine with
# torch, click and pathspec:  OUT=bench/results/round46 bash bench/gpu_run_round46.sh
#  - resume_setup: the setup's loss-scale choice moved to the caller's GradScaler; the resume's
#    question to apex folded. verify with --apex (mixed precision, loss on the fp32 curve); then the
#    scaler state each run leaves in its checkpoint: dynamic (2**16, grows) by default, static 128
#    with --apex-loss-scale 128 (growth_interval 2**31 - 1), and a resumed run carries the scale on.
set -u
OUT=${OUT:-bench/results/round46}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
echo "== verify fixtures/projects/resume_setup/after/train.py --apex"
python -m ampfix verify --steps 60 fixtures/projects/resume_setup/after/train.py \
    --json "$OUT/verify_resume_setup.json" -- --epochs 3 --batches 40 --apex 2>&1 | tail -12
CK=$(mktemp -d)/ck.pt
show() {
    python - "$CK" <<'PY'
import sys, torch
s = torch.load(sys.argv[1], weights_only=False)
a = s.get("amp", {})
print(f"epoch {s['epoch']}: scale {a.get('scale')}, growth_interval {a.get('growth_interval')}, growth_tracker {a.get('_growth_tracker')}")
PY
}
cd fixtures/projects/resume_setup/after
echo "== dynamic loss scale (default), then resumed"
PYTHONPATH=. python train.py --apex --epochs 2 --batches 1100 --checkpoint "$CK" | tail -2; show
PYTHONPATH=. python train.py --apex --epochs 1 --batches 1100 --resume --checkpoint "$CK" | tail -1; show
echo "== static loss scale 128"
rm -f "$CK"
PYTHONPATH=. python train.py --apex --epochs 1 --batches 300 --apex-loss-scale 128 --checkpoint "$CK" | tail -1; show
echo "== without --apex: float32, the scaler disabled"
rm -f "$CK"
PYTHONPATH=. python train.py --epochs 1 --batches 20 --checkpoint "$CK" | tail -1
python - "$CK" <<'PY'
import sys, torch
print("amp entry:", "amp" in torch.load(sys.argv[1], weights_only=False))
PY
