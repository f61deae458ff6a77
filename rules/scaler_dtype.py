import ast

from ampfix.model.analysis import (
    AUTOCAST, GRADSCALER, arg, autocast_dtype, functions_and_module, is_const, method_call, receiver, scalers_for,
    string_value, unit_nodes,
)
from ampfix.rule import Invalid, Rule, Valid
from ampfix.model.semantic import dotted, walk


def _device(rule, call) -> str:
    """'cuda', 'cpu' or '?' for an autocast call."""
    if rule.qnames(call) & {"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"}:
        return "cuda"
    if rule.qnames(call) & {"torch.cpu.amp.autocast"}:
        return "cpu"
    a = arg(call, "device_type", 0)
    s = string_value(a)
    return s.split(":")[0] if s is not None else "?"


WRAPPERS = ("optim", "opt", "scaler", "accelerator", "engine", "trainer", "amp", "fabric")


def _tensor_backward(call) -> bool:
    """``loss.backward()``, not a wrapper's ``optimizer.backward(loss)`` (FP16_Optimizer, an
    accelerator, an optimizer class that scales inside)."""
    if not method_call(call, "backward"):
        return False
    name = (dotted(receiver(call)) or "").split(".")[-1].lower()
    return not any(w in name for w in WRAPPERS)


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

    def visit_Module(self, node: ast.Module) -> None:
        all_calls = [n for n in walk(node, into_functions=True) if isinstance(n, ast.Call)]
        if not any(self.qnames(c) & AUTOCAST for c in all_calls):
            return
        all_scalers = [c for c in all_calls if self.qnames(c) & GRADSCALER]
        all_dtypes = {autocast_dtype(self.sem, c) for c in all_calls if self.qnames(c) & AUTOCAST}
        reported = set()
        for unit in functions_and_module(node):
            calls = [n for n in unit_nodes(unit) if isinstance(n, ast.Call)]
            autocasts = [c for c in calls if self.qnames(c) & AUTOCAST]
            made = [c for c in calls if self.qnames(c) & GRADSCALER]
            dtypes = {autocast_dtype(self.sem, c) for c in autocasts}
            # a GradScaler next to bfloat16 autocast only (in its function, or in the whole file)
            if made and (dtypes == {"bfloat16"} or (not autocasts and all_dtypes == {"bfloat16"})):
                for s in made:
                    if not is_const(arg(s, "enabled"), False) and id(s) not in reported:
                        reported.add(id(s))
                        self.report(s, "GradScaler with bfloat16 autocast: bfloat16 has float32's range and needs no "
                                       "loss scaling; drop the scaler")
                continue
            if not autocasts or not any(_tensor_backward(c) for c in calls):
                continue
            # a scaler made here, passed in, or kept on self counts; so does one the file makes
            # at module level (seen by every function)
            scalers = scalers_for(self.ctx, unit)
            uses_scaler = any(method_call(c, "scale", "unscale_") and dotted(receiver(c)) in scalers for c in calls)
            if made or uses_scaler or (unit is node and all_scalers):
                continue
            for c in autocasts:
                if _device(self, c) == "cuda" and autocast_dtype(self.sem, c) in (None, "float16") \
                        and not is_const(arg(c, "enabled"), False):
                    self.report(c, "float16 autocast with a backward pass and no GradScaler: small gradients "
                                   "underflow to zero; add torch.amp.GradScaler(\"cuda\") or use dtype=torch.bfloat16")
                    break
