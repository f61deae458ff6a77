import libcst as cst

from ampfix.analysis import AUTOCAST, GRADSCALER, arg, autocast_dtype, method_call, walk
from ampfix.rule import Invalid, Rule, Valid


def _device(rule, call) -> str:
    """'cuda', 'cpu' or '?' for an autocast call."""
    if rule.qnames(call) & {"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"}:
        return "cuda"
    if rule.qnames(call) & {"torch.cpu.amp.autocast"}:
        return "cpu"
    a = arg(call, "device_type", 0)
    if a is not None and isinstance(a.value, cst.SimpleString):
        return a.value.evaluated_value.split(":")[0]
    return "?"


class ScalerDtype(Rule):
    """
    ## What it does
    Reports a GradScaler in a file whose autocast regions all use bfloat16 (the scaler is not
    needed), and a CUDA float16 autocast (the default dtype on CUDA) in a file that runs a
    backward pass but has no GradScaler at all.

    ## Why is this bad?
    float16 has a narrow exponent range: small gradients underflow to zero without loss
    scaling, and training quietly degrades.  bfloat16 has float32's range, so scaling only adds
    work (and skipped steps) for nothing.

    ## Example
    ```python
    with torch.autocast("cuda"):          # float16
        loss = model(x)
    loss.backward()                        # no scaler: gradients can underflow
    ```

    ## Use instead
    Either float16 with `torch.amp.GradScaler("cuda")`, or `dtype=torch.bfloat16` without one.
    """

    code = "AMP209"
    name = "scaler-dtype-mismatch"
    summary = "GradScaler with bfloat16 autocast (not needed), or float16 autocast with backward and no GradScaler"
    since = "1.10"
    triggers = ("autocast",)

    VALID = [
        Valid("import torch\ns = torch.amp.GradScaler('cuda')\nwith torch.autocast('cuda'):\n    l = m(x)\ns.scale(l).backward()\n"),
        Valid("import torch\nwith torch.autocast('cuda', dtype=torch.bfloat16):\n    l = m(x)\nl.backward()\n"),
        Valid("import torch\nwith torch.autocast('cuda'):\n    y = m(x)\n"),
        Valid("import torch\nwith torch.autocast('cpu'):\n    l = m(x)\nl.backward()\n"),
        Valid("import torch\nwith torch.autocast('cuda', enabled=False):\n    l = m(x)\nl.backward()\n"),
    ]
    INVALID = [
        Invalid(
            "import torch\nwith torch.autocast('cuda'):\n    loss = m(x)\nloss.backward()\n",
            message="no GradScaler",
        ),
        Invalid(
            "import torch\nscaler = torch.amp.GradScaler('cuda')\n"
            "with torch.autocast('cuda', dtype=torch.bfloat16):\n    l = m(x)\nscaler.scale(l).backward()\n",
            message="bfloat16",
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        calls = [n for n in walk(node, into_functions=True) if isinstance(n, cst.Call)]
        autocasts = [c for c in calls if self.qnames(c) & AUTOCAST]
        scalers = [c for c in calls if self.qnames(c) & GRADSCALER]
        if not autocasts:
            return
        dtypes = {autocast_dtype(self, c) for c in autocasts}
        if scalers and dtypes == {"bfloat16"}:
            for s in scalers:
                a = arg(s, "enabled")
                if a is None or not (isinstance(a.value, cst.Name) and a.value.value == "False"):
                    self.report(s, "GradScaler with bfloat16 autocast: bfloat16 has float32's range and needs no "
                                   "loss scaling; drop the scaler")
            return
        if scalers or not any(method_call(c, "backward") for c in calls):
            return
        for c in autocasts:
            a = arg(c, "enabled")
            disabled = a is not None and isinstance(a.value, cst.Name) and a.value.value == "False"
            if _device(self, c) == "cuda" and autocast_dtype(self, c) in (None, "float16") and not disabled:
                self.report(c, "float16 autocast with a backward pass and no GradScaler: small gradients underflow "
                               "to zero; add torch.amp.GradScaler(\"cuda\") or use dtype=torch.bfloat16")
                return
