#!/usr/bin/env bash
# GPU evidence for issues 9 and 16: the migrated shapes train on a GPU in mixed precision (verify's
# proof figures: half-precision FLOP share, autocast regions, GradScaler calls), verify --migrate
# runs the before scripts through the migration, a never-half program FAILS, and the multi-module
# projects run.  From the repo root on a CUDA machine with torch and click:
#   OUT=bench/results/issue16 bash bench/gpu_run_issue16.sh
set -u
OUT=${OUT:-bench/results/issue16}
mkdir -p "$OUT" /tmp/ampfix-gpu
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
STEPS=${STEPS:-40}
for f in step_hack_accum bert_finetune closure_accum_clip gan_losses_first optional_imports checkpoint_resume function_api \
         bert_fp16_optimizer; do
  echo "== verify fixtures/apex/after/$f.py"
  python -m ampfix verify --steps $STEPS --no-profile fixtures/apex/after/$f.py --json /tmp/ampfix-gpu/after_$f.json -- --steps 200 2>&1 | tail -6
done
for f in step_hack_accum bert_finetune; do
  echo "== verify --migrate fixtures/apex/before/$f.py (apex is not installed: the migration runs in memory)"
  python -m ampfix verify --steps $STEPS --no-profile --migrate --json /tmp/ampfix-gpu/migrate_$f.json \
    fixtures/apex/before/$f.py -- --steps 200 2>&1 | tail -6
done
echo "== verify fixtures/verify/never_half.py (must FAIL)"
python -m ampfix verify --steps 20 --no-profile fixtures/verify/never_half.py --json /tmp/ampfix-gpu/never_half.json 2>&1 | tail -6
echo "== projects (migrated), run as their users would"
(cd fixtures/projects/launcher_engine/after && PYTHONPATH=. python tools/train_net.py --steps 20) 2>&1 | tail -3
(cd fixtures/projects/dual_path/after && python train.py --steps 20 --amp-impl apex) 2>&1 | tail -3
(cd fixtures/projects/setup_returns/after && python train.py --steps 20 && python embed.py) 2>&1 | tail -4
echo "== fused SGD with momentum under GradScaler (why AMP104 does not suggest fused=True for SGD)"
python - <<'PY' 2>&1 | tee /tmp/ampfix-gpu/fused_sgd.txt
import torch
torch.manual_seed(0)
res = {}
for fused in (False, True):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, fused=fused)
    sc = torch.amp.GradScaler("cuda")
    x = torch.randn(512, 256, device="cuda"); y = torch.randint(0, 10, (512,), device="cuda")
    for _ in range(50):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(m(x), y)
        opt.zero_grad(set_to_none=True)
        sc.scale(loss).backward(); sc.step(opt); sc.update()
    res[fused] = [p.detach().float().clone() for p in m.parameters()]
    print("fused" if fused else "foreach", "final loss", float(loss))
d = max(float((a - b).abs().max()) for a, b in zip(res[False], res[True]))
print("max |param difference| fused vs foreach after 50 steps:", d)
PY
python - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
summary = {"command": "OUT=bench/results/issue16 bash bench/gpu_run_issue16.sh", "runs": {}}
for path in sorted(glob.glob("/tmp/ampfix-gpu/*.json")):
    v = json.load(open(path))
    for r in v["runs"].values():
        r.pop("output_tail", None); r.pop("traceback", None)
    name = os.path.basename(path)[:-5]
    a = v["runs"]["amp"]
    c = v["comparison"]
    summary["runs"][name] = {
        "pass": v["verdict"]["pass"], "mixed_precision": v["verdict"].get("mixed_precision"),
        "reasons": v["verdict"].get("reasons"), "speedup": c.get("speedup"), "memory_ratio": c.get("memory_ratio"),
        "max_relative_deviation": c.get("max_relative_deviation"), "half_flop_fraction": a.get("half_flop_fraction"),
        "amp_counts": a.get("amp_counts"), "syncs_per_step": a.get("syncs_per_step"), "device": a.get("device"),
        "torch": a.get("torch"), "status": a.get("status"), "error": a.get("error")}
summary["fused_sgd"] = open("/tmp/ampfix-gpu/fused_sgd.txt").read()
json.dump(summary, open(os.path.join(out, "gpu_results.json"), "w"), indent=1)
for k, r in summary["runs"].items():
    sp = r["speedup"] or 0
    hf = r["half_flop_fraction"]
    print(f"{k:32} pass={r['pass']!s:5} mp={r['mixed_precision']!s:5} half={hf if hf is None else round(hf, 3)} "
          f"speedup={sp:.2f} dev={r['max_relative_deviation'] or 0:.3f} {r['error'] or ''}")
PY
