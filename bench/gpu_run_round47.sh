#!/usr/bin/env bash
# GPU evidence for the forty-seventh round's shapes, from the repository root on a CUDA machine with
# torch, click and pathspec:  OUT=bench/results/round47 bash bench/gpu_run_round47.sh
#  - twin_elsewhere: both paths, the apex wrapper class in a helper module beside a native twin of
#    another name; after the migration the class is gone and --apex_amp trains with native AMP.
#    verify with --apex_amp (mixed precision, loss on the fp32 curve) and without it (the native
#    path the script always had).
set -u
OUT=${OUT:-bench/results/round47}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
for flag in --apex_amp ""; do
    name=$([ -n "$flag" ] && echo apex_amp || echo native)
    echo "== verify fixtures/projects/twin_elsewhere/after/main.py $flag"
    (cd fixtures/projects/twin_elsewhere/after && PYTHONPATH=.:$PYTHONPATH python -m ampfix verify --steps 60 main.py \
        --json "$OUT/verify_twin_elsewhere_$name.json" -- --epochs 4 $flag 2>&1 | tail -12)
done
echo "== the script itself, --apex_amp"
(cd fixtures/projects/twin_elsewhere/after && PYTHONPATH=. python main.py --epochs 2 --apex_amp)
