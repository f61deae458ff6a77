#!/usr/bin/env bash
# The misuse/performance fixtures under verify on one GPU: what the rules claim, measured.
#   OUT=bench/results/misuse bash bench/gpu_run_misuse.sh
set -u
OUT=${OUT:-bench/results/misuse}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
for f in step_bypasses_scaler step_bypasses_scaler_fixed syncs_in_loop syncs_in_loop_fixed; do
  echo "== verify fixtures/misuse/$f.py"
  python -m ampfix verify --steps 60 --no-profile "fixtures/misuse/$f.py" --json "$OUT/$f.json" \
    $(case $f in step_bypasses_scaler*) echo --plot "$OUT/$f.png";; esac)
done
python - "$OUT" <<'PY'
import json, os, sys
for f in sorted(os.listdir(sys.argv[1])):
    if f.endswith(".json"):
        p = os.path.join(sys.argv[1], f)
        d = json.load(open(p))
        for r in d["runs"].values():
            r.pop("output_tail", None)
        d["command"] = "OUT=bench/results/misuse bash bench/gpu_run_misuse.sh"
        json.dump(d, open(p, "w"), indent=1)
PY
