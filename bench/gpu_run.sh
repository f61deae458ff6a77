#!/usr/bin/env bash
# One GPU session's worth of evidence for `ampfix verify` (run from the repo root on a CUDA
# machine; $OUT is where results go, default bench/results/gpu). libcst is not needed here.
#   OUT=bench/results/gpu bash bench/gpu_run.sh
set -u
OUT=${OUT:-bench/results/gpu}
mkdir -p "$OUT" /tmp/ampfix-gpu
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
for f in transformer_lm cnn_checkpoint gan trainer_class; do
  echo "== verify fixtures/apex/after/$f.py"
  python -m ampfix verify --steps 60 "fixtures/apex/after/$f.py" --json "/tmp/ampfix-gpu/$f.json" --plot "$OUT/verify_$f.png"
done
echo "== verify overhead"
python bench/verify_overhead.py --out /tmp/ampfix-gpu/overhead.json
echo "== gpu tests"
python -m pytest -q -m gpu tests/test_verify.py -p no:cacheprovider 2>&1 | tail -5
python - "$OUT" <<'PY'
import json, glob, os, sys
out = sys.argv[1]
merged = {"command": "OUT=bench/results/gpu bash bench/gpu_run.sh", "verify": {}}
for f in sorted(glob.glob("/tmp/ampfix-gpu/*.json")):
    name = os.path.basename(f)[:-5]
    data = json.load(open(f))
    if name == "overhead":
        merged["overhead"] = data
    else:
        for r in data["runs"].values():
            r.pop("output_tail", None)
        merged["verify"][name] = data
json.dump(merged, open(os.path.join(out, "gpu_results.json"), "w"), indent=1)
print("summary:")
for k, v in merged["verify"].items():
    c = v["comparison"]
    print(f"  {k}: pass={v['verdict']['pass']} speedup={c.get('speedup', 0):.2f} mem={c.get('memory_ratio', 0):.2f} "
          f"maxdev={c.get('max_relative_deviation', 0):.3f} syncs={v['runs']['amp'].get('syncs_per_step')}")
if "overhead" in merged:
    print(f"  verify overhead: {merged['overhead']['overhead']:+.1%}")
PY
