import ast

from ampfix.model.analysis import AUTOCAST, FLOAT16, GRADSCALER, arg, exclusive, method_call, unit_of
from ampfix.rule import Invalid, Rule, Valid
from ampfix.model.semantic import walk


class ManualHalf(Rule):
    """
    ## What it does
    In a file that uses autocast or a GradScaler, reports manual float16 casts of inputs or
    models: `.half()`, `.to(torch.float16)`, `.to(dtype=torch.half)`, `.type(torch.HalfTensor)`
    Reported most strongly: `model.half()` together with a GradScaler.

    ## Why is this bad?
    Autocast chooses the precision per op (matmuls in float16, softmax/norms/losses in float32).
    Casting by hand forces float16 where autocast would have kept float32, and a model cast to
    half keeps float16 *weights*: the optimizer then updates float16 parameters (updates below
    the float16 resolution vanish) and `GradScaler.unscale_` raises "Attempting to unscale FP16
    gradients".

    ## Example
    ```python
    model = Net().cuda().half()
    scaler = torch.amp.GradScaler("cuda")
    x = x.half()
    ```

    ## Use instead
    Keep the model and inputs in float32 and let `torch.autocast` cast per op.
    """

    code = "AMP208"
    name = "manual-half-with-autocast"
    summary = "manual .half()/.to(float16) casts in code that uses autocast or GradScaler"
    since = "1.6"
    triggers = (".half(", "float16", ".half", "HalfTensor")

    VALID = [
        Valid("import torch\nx = x.half()\n"),
        Valid("import torch\nwith torch.autocast('cuda'):\n    y = model(x)\nz = y.float()\n"),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            model = Net().cuda().half()
            scaler = torch.amp.GradScaler("cuda")
            """,
            message="GradScaler",
        ),
        Invalid(
            """
            import torch
            for x, y in loader:
                x = x.to(torch.float16)
                with torch.autocast("cuda"):
                    loss = model(x)
            """
        ),
    ]

    def visit_Module(self, node: ast.Module) -> None:
        calls = [n for n in walk(node, into_functions=True) if isinstance(n, ast.Call)]
        amp_uses = [(c, "scaler" if self.qnames(c) & GRADSCALER else "autocast") for c in calls
                    if self.qnames(c) & (AUTOCAST | GRADSCALER)]
        if not amp_uses:
            return
        module_level = [(c, k) for c, k in amp_uses if unit_of(c) is node]
        for c in calls:
            if method_call(c, "half") and not c.args:
                what = "manual `.half()`"
            elif method_call(c, "to", "type"):
                a = arg(c, "dtype", 0)
                if a is None or not (self.qnames(a) & (FLOAT16 | {"torch.cuda.HalfTensor", "torch.HalfTensor"})):
                    continue
                what = "manual cast to float16"
            else:
                continue
            unit = unit_of(c)
            # the AMP uses this cast can meet: its own function's (unless they run on another
            # branch), and the module's; a cast at module level meets every use in the file
            related = [k for u, k in amp_uses if unit_of(u) is unit and not exclusive(c, u, unit)]
            related += [k for _, k in module_level] if unit is not node else [k for _, k in amp_uses]
            if not related:
                continue
            why = "with GradScaler (it cannot unscale float16 gradients)" if "scaler" in related else "under autocast"
            self.report(c, f"{what} {why}: keep float32 and let autocast cast per op")
