"""How long `ampfix server` takes to publish diagnostics after a change, past its debounce.

    python bench/server_latency.py bench/results/server_latency.json

A training script of about 300 lines (several loops, a few problems) is opened; then 30 edits,
each after the previous diagnostics arrived; for each, the time from sending didChange to
receiving publishDiagnostics, less the server's debounce (what a person waits for beyond the
pause the server waits on purpose).  Also the first diagnostics after didOpen (no debounce)."""
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from lsp_client import LspClient  # noqa: E402

from ampfix.server import DEBOUNCE  # noqa: E402


def script(n_blocks: int = 18, marker: int = 0) -> str:
    head = "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader\n\n"
    block = '''
def train_{i}(model, loader, opt, scaler, epochs={m}):
    model.train()
    for epoch in range(epochs):
        for step, (x, y) in enumerate(loader):
            x, y = x.cuda(), y.cuda()
            with torch.autocast("cuda", dtype=torch.float16):
                out = model(x)
                loss = nn.functional.cross_entropy(out, y)
            opt.zero_grad(set_to_none=False)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            noise = torch.zeros(4).cuda()
            if step % 10 == 0:
                print(epoch, step, loss.item())
    return model
'''
    return head + "".join(block.format(i=i, m=marker) for i in range(n_blocks)) + "\n"


def main(out: str) -> None:
    work = Path(tempfile.mkdtemp())
    f = work / "train.py"
    f.write_text(script())
    c = LspClient(str(work))
    c.initialize(work.as_uri())
    uri = f.as_uri()
    t0 = time.monotonic()
    c.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                       "text": f.read_text()}})
    c.diagnostics(uri)
    first = time.monotonic() - t0
    waits = []
    for k in range(30):
        text = script(marker=k + 1)
        sent = time.monotonic()
        c.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": k + 2},
                                            "contentChanges": [{"text": text}]})
        m = c.diagnostics(uri)
        assert m["params"]["version"] == k + 2
        waits.append(m["_t"] - sent - DEBOUNCE)
    c.close()
    waits.sort()
    fig = {"lines": script().count("\n"), "diagnostics": len(m["params"]["diagnostics"]),
           "debounce_s": DEBOUNCE, "first_open_ms": round(first * 1000, 1),
           "after_debounce_ms": {"median": round(statistics.median(waits) * 1000, 1),
                                 "p95": round(waits[int(0.95 * (len(waits) - 1))] * 1000, 1),
                                 "max": round(max(waits) * 1000, 1)},
           "edits": len(waits), "python": platform.python_version(), "machine": "2 cores",
           "command": "python bench/server_latency.py bench/results/server_latency.json"}
    Path(out).write_text(json.dumps(fig, indent=1) + "\n")
    print(json.dumps(fig))


if __name__ == "__main__":
    main(sys.argv[1])
