#!/usr/bin/env bash
# GPU evidence for the apex migrations added with FP16_Optimizer and O3 (issue 3): the migrated
# fixtures train on a GPU. Run from the repo root on a CUDA machine; libcst is not needed.
#   OUT=bench/results/issue3 bash bench/gpu_run_issue3.sh
set -u
OUT=${OUT:-bench/results/issue3}
mkdir -p "$OUT" /tmp/ampfix-gpu
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
echo "== verify fixtures/apex/after/fp16_optimizer.py (amp vs the same script with AMP forced off)"
python -m ampfix verify --steps 60 fixtures/apex/after/fp16_optimizer.py --json /tmp/ampfix-gpu/fp16_optimizer.json \
  --plot "$OUT/verify_fp16_optimizer.png"
echo "== fixtures/apex/after/o3_pure_fp16.py (pure float16; verify's fp32 mode cannot undo .half(), so a plain run)"
/usr/bin/time -f "o3 wall %e s" python fixtures/apex/after/o3_pure_fp16.py --steps 60 2>&1 | tee /tmp/ampfix-gpu/o3.txt
python - "$OUT" <<'PY'
import json, re, sys, os
out = sys.argv[1]
v = json.load(open("/tmp/ampfix-gpu/fp16_optimizer.json"))
for r in v["runs"].values():
    r.pop("output_tail", None)
o3 = open("/tmp/ampfix-gpu/o3.txt").read()
losses = [float(x) for x in re.findall(r"loss ([0-9.]+)", o3)]
merged = {"command": "OUT=bench/results/issue3 bash bench/gpu_run_issue3.sh",
          "verify_fp16_optimizer": v, "o3_pure_fp16": {"losses_every_20_steps": losses, "stdout": o3}}
json.dump(merged, open(os.path.join(out, "gpu_results.json"), "w"), indent=1)
c = v["comparison"]
print(f"fp16_optimizer: pass={v['verdict']['pass']} speedup={c.get('speedup', 0):.2f} "
      f"mem={c.get('memory_ratio', 0):.2f} maxdev={c.get('max_relative_deviation', 0):.3f}")
print("o3 losses:", losses)
PY
