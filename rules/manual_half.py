import ast
import re

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
        # an input has no gradients to unscale: the scaler's reason is not given for it
        Invalid(
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            for x in loader:
                x = x.cuda().half()
                net = net.half()
            """,
            count=2,
            message="beside GradScaler",
        ),
        Invalid(
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            if args.fp16:
                trainer.model.half()
            """,
            message="of a model with GradScaler",
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
            if "scaler" in related and self._casts_a_model(c, calls):
                why = "of a model with GradScaler (it cannot unscale float16 gradients)"
            elif "autocast" in related:
                why = "under autocast"
            else:
                why = "beside GradScaler"
            self.report(c, f"{what} {why}: keep float32 and let autocast cast per op")

    @staticmethod
    def _casts_a_model(cast: ast.Call, calls) -> bool:
        """Whether the cast converts a module (its weights): the receiver, under its chained
        calls (``Net().cuda().half()``), is a class being built, or the name it is, or is
        assigned to, is named as a model (``trainer.model``, ``self.net``) or has its parameters,
        state or mode read in the file (``model.parameters()``, ``model.eval()``).  An input
        (``x.half()``) has no weights to unscale."""
        base = cast.func.value
        while isinstance(base, ast.Call) and isinstance(base.func, ast.Attribute):
            base = base.func.value
        if isinstance(base, ast.Call):
            name = base.func.attr if isinstance(base.func, ast.Attribute) else getattr(base.func, "id", "")
            if name[:1].isupper():
                return True
        names = {ast.unparse(base)}
        p = getattr(cast, "_p", None)
        while isinstance(p, (ast.Call, ast.Attribute)):  # `model = Net().half().cuda()`
            p = getattr(p, "_p", None)
        if isinstance(p, ast.Assign) and len(p.targets) == 1:
            names.add(ast.unparse(p.targets[0]))
        # `trainer.model.half()`, `self.net.half()`: named as a model
        if any(re.search(r"(?i)(model|net|network|encoder|decoder)$", n.rsplit(".", 1)[-1]) for n in names):
            return True
        return any(method_call(c, "parameters", "named_parameters", "state_dict", "eval", "train")
                   and ast.unparse(c.func.value) in names for c in calls)
