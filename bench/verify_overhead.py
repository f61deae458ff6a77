"""verify's own overhead: one training loop timed bare and with verify's Recorder installed.

    python bench/verify_overhead.py --out overhead.json

Same process, same model, same data; bare / instrumented / bare / instrumented, each timed with
CUDA events over the steps after warm-up and the sync-counting window.  The instrumented loop's
median step time against the bare one's is the figure quoted in the notes.
"""
import argparse
import json
import statistics
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F

from ampfix.verify import runner

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=60)
args = p.parse_args()

dev = "cuda"
torch.manual_seed(0)
d, layers, seq, batch, vocab = 1024, 8, 512, 16, 8192
block = nn.TransformerEncoderLayer(d, 8, 4 * d, batch_first=True, norm_first=True, dropout=0.0)
model = nn.Sequential(nn.Embedding(vocab, d), nn.TransformerEncoder(block, layers, enable_nested_tensor=False),
                      nn.Linear(d, vocab)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
scaler = torch.amp.GradScaler("cuda")
tokens = torch.randint(0, vocab, (batch, seq + 1), device=dev)


def loop(n):
    """Step times (ms) of n steps: events between optimizer steps, like verify."""
    marks = []
    for _ in range(n):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(model(tokens[:, :-1]).reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        marks.append(ev)
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in zip(marks, marks[1:])]


skip = 5 + runner.SYNC_WINDOW + 1
loop(10)  # warm up kernels and the allocator
bare1 = loop(args.steps)[skip:]
rec = runner.Recorder(SimpleNamespace(mode="amp", steps=10**9, warmup=5, device="auto", profile=False,
                                      watch_dtypes=False))
rec.install()
inst1 = loop(args.steps)[skip:]
rec.steps = 0  # a second instrumented window with the hooks still installed
inst2 = loop(args.steps)[skip:]
res = {
    "bare_ms": statistics.median(bare1),
    "instrumented_ms": statistics.median(inst1 + inst2),
    "device": torch.cuda.get_device_name(),
    "torch": torch.__version__,
    "steps_timed_each": len(bare1),
}
res["overhead"] = res["instrumented_ms"] / res["bare_ms"] - 1
print(json.dumps(res, indent=2))
with open(args.out, "w") as fh:
    json.dump(res, fh, indent=2)
