import ast

from ampfix.model.analysis import arg, has_star, is_const
from ampfix.rule import Fix, Invalid, Rule, Valid
from ampfix.model.semantic import dotted, walk

CONV = {f"torch.nn.Conv{d}d" for d in (1, 2, 3)}
BN = {f"torch.nn.BatchNorm{d}d" for d in (1, 2, 3)} | {"torch.nn.SyncBatchNorm"}


def _assigned_call(stmt):
    if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and len(stmt.targets) == 1:
        return dotted(stmt.targets[0]), stmt.value
    return None


class ConvBiasBeforeBn(Rule):
    """
    ## What it does
    Reports a convolution with a bias (the default) directly followed by batch norm: in an
    `nn.Sequential(...)`, or as `self.bn(self.conv(x))` / `x = self.conv(x); x = self.bn(x)`
    in `forward`, with both layers built in `__init__`.

    ## Why is this bad?
    Batch norm subtracts the per-channel mean, so the conv's bias is cancelled exactly: it is
    a parameter that costs memory, an add in every forward and a gradient in every backward,
    and learns nothing.

    ## Example
    ```python
    nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU())
    ```

    ## Use instead
    ```python
    nn.Sequential(nn.Conv2d(3, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
    ```
    The fix is *unsafe*: checkpoints saved with the bias no longer load with `strict=True`.
    """

    code = "AMP311"
    name = "conv-bias-before-batchnorm"
    summary = "convolution bias directly followed by BatchNorm is redundant"
    fix_kind = "unsafe"
    since = "1.0"
    triggers = ("BatchNorm",)

    VALID = [
        Valid("import torch.nn as nn\nnn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8))\n"),
        Valid("import torch.nn as nn\nnn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.BatchNorm2d(8))\n"),
    ]
    INVALID = [
        Invalid("import torch.nn as nn\nnet = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))\n", unsafe=True,
                expected="import torch.nn as nn\nnet = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8))\n"),
        Invalid(
            """
            import torch.nn as nn
            class Block(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 8, 3, bias=True)
                    self.bn = nn.BatchNorm2d(8)
                def forward(self, x):
                    x = self.conv(x)
                    x = self.bn(x)
                    return self.bn(self.conv(x))
            """,
            unsafe=True,
            expected="""
            import torch.nn as nn
            class Block(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 8, 3, bias=False)
                    self.bn = nn.BatchNorm2d(8)
                def forward(self, x):
                    x = self.conv(x)
                    x = self.bn(x)
                    return self.bn(self.conv(x))
            """,
        ),
    ]

    def _biased_conv(self, n) -> bool:
        if not (isinstance(n, ast.Call) and self.qnames(n) & CONV) or has_star(n):
            return False
        b = arg(n, "bias", 7)
        return b is None or is_const(b, True)

    def _report(self, conv):
        b = arg(conv, "bias", 7)
        if b is None:
            fix = Fix("bias=False on the convolution", [self.edits.insert_arg(conv, "bias=False")], safe=False)
        else:
            fix = Fix("bias=False on the convolution", [self.edits.replace(b, "False")], safe=False)
        self.report(conv, "convolution bias followed by BatchNorm is cancelled by its mean subtraction; "
                          "use bias=False (unsafe fix: old checkpoints have the bias)", fix)

    def visit_Call(self, node: ast.Call) -> None:
        if self.qnames(node) & {"torch.nn.Sequential"}:
            items = [a for a in node.args if not isinstance(a, ast.Starred)]
            for a, b in zip(items, items[1:]):
                if self._biased_conv(a) and isinstance(b, ast.Call) and self.qnames(b) & BN:
                    self._report(a)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        methods = {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}
        if "__init__" not in methods or "forward" not in methods:
            return
        convs, bns = {}, set()
        for n in walk(methods["__init__"]):
            if isinstance(n, ast.Assign) and len(n.targets) == 1:
                name = dotted(n.targets[0])
                if name and self._biased_conv(n.value):
                    convs[name] = n.value
                elif name and isinstance(n.value, ast.Call) and self.qnames(n.value) & BN:
                    bns.add(name)
        if not convs or not bns:
            return
        hit = set()
        forward = methods["forward"]
        stmts = [s for s in walk(forward) if isinstance(s, ast.stmt)]
        for n in walk(forward):
            if isinstance(n, ast.Call) and dotted(n.func) in bns and n.args:
                inner = n.args[0]
                if isinstance(inner, ast.Call) and dotted(inner.func) in convs:
                    hit.add(dotted(inner.func))
        for s1, s2 in zip(stmts, stmts[1:]):
            c1 = _assigned_call(s1)
            c2 = _assigned_call(s2)
            if c1 and c2 and dotted(c1[1].func) in convs and dotted(c2[1].func) in bns:
                if c2[1].args and dotted(c2[1].args[0]) == c1[0]:
                    hit.add(dotted(c1[1].func))
        for name in sorted(hit):
            self._report(convs[name])
