import ast

from ampfix.model.analysis import arg, is_const, is_training_loop
from ampfix.rule import Invalid, Rule, Valid
from ampfix.model.semantic import walk

ANOMALY_SET = {"torch.autograd.set_detect_anomaly", "torch.autograd.anomaly_mode.set_detect_anomaly"}
ANOMALY_CTX = {"torch.autograd.detect_anomaly", "torch.autograd.anomaly_mode.detect_anomaly"}
GRADCHECK = {"torch.autograd.gradcheck", "torch.autograd.gradgradcheck", "torch.autograd.gradcheck.gradcheck"}
PROFILERS = {"torch.profiler.profile", "torch.autograd.profiler.profile", "torch.autograd.profiler.emit_nvtx",
             "torch.cuda.profiler.profile", "torch.autograd.profiler_legacy.profile"}
LOOPS = (ast.For, ast.AsyncFor, ast.While)


class DebugApi(Rule):
    """
    ## What it does
    Reports debugging APIs left in training code: `torch.autograd.set_detect_anomaly(True)`,
    `torch.autograd.detect_anomaly()`, `gradcheck`/`gradgradcheck` in a file that trains, and a
    profiler (`torch.profiler.profile`, `emit_nvtx`) wrapped around a whole training loop
    without a `schedule=`.

    ## Why is this bad?
    Anomaly detection records a traceback for every op and checks every backward output for
    NaN: training runs several times slower.  A profiler without a schedule records every op of
    every step, slowing the run and growing memory without bound.

    ## Example
    ```python
    torch.autograd.set_detect_anomaly(True)
    with torch.profiler.profile():
        for batch in loader:
            train_step(batch)
    ```

    ## Use instead
    Turn anomaly detection on only while debugging; profile a few steps with
    `torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, active=3))`.
    """

    code = "AMP309"
    name = "debug-api-in-training"
    summary = "anomaly detection, gradcheck or a whole-run profiler left in training code"
    since = "1.0"
    triggers = ("anomaly", "gradcheck", "profile", "emit_nvtx")

    VALID = [
        Valid("import torch\ntorch.autograd.set_detect_anomaly(False)\n"),
        Valid("import torch\nfrom torch.autograd import gradcheck\nassert gradcheck(f, (x,))\n"),
        Valid(
            """
            import torch
            with torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, active=2)) as p:
                for x in loader:
                    model(x).sum().backward()
                    opt.step()
                    p.step()
            """
        ),
    ]
    INVALID = [
        Invalid("import torch\ntorch.autograd.set_detect_anomaly(True)\n"),
        Invalid(
            """
            import torch
            with torch.autograd.profiler.profile(use_cuda=True):
                for x in loader:
                    model(x).sum().backward()
                    opt.step()
            """
        ),
        Invalid(
            """
            from torch import autograd
            for x in loader:
                with autograd.detect_anomaly():
                    loss = model(x)
                    loss.backward()
                optimizer.step()
            """
        ),
    ]

    def visit_Module(self, node: ast.Module) -> None:
        nodes = list(walk(node, into_functions=True))
        trains = any(isinstance(n, LOOPS) and is_training_loop(n) for n in nodes)
        for n in nodes:
            if isinstance(n, ast.Call):
                names = self.qnames(n)
                if names & ANOMALY_SET:
                    if is_const(arg(n, "mode", 0), True):
                        self.report(n, "anomaly detection slows every op and backward several times; "
                                       "enable it only while debugging")
                elif names & ANOMALY_CTX and trains:
                    self.report(n, "detect_anomaly() slows every op and backward several times; remove it from "
                                   "training code")
                elif names & GRADCHECK and trains:
                    self.report(n, "gradcheck in training code runs the function many times in float64; move it "
                                   "to a test")
            elif isinstance(n, (ast.With, ast.AsyncWith)):
                for item in n.items:
                    c = item.context_expr
                    if isinstance(c, ast.Call) and self.qnames(c) & PROFILERS and arg(c, "schedule") is None:
                        if any(isinstance(m, LOOPS) and is_training_loop(m) for s in n.body for m in [s, *walk(s)]):
                            self.report(c, "a profiler records every op of the whole training loop; profile a few "
                                           "steps with schedule=torch.profiler.schedule(...)")
