import libcst as cst

from ampfix.analysis import arg, dotted, kwarg, walk, with_args
from ampfix.rule import Fix, Invalid, Rule, Valid

CONV = {f"torch.nn.Conv{d}d" for d in (1, 2, 3)}
BN = {f"torch.nn.BatchNorm{d}d" for d in (1, 2, 3)} | {"torch.nn.SyncBatchNorm"}


def _no_bias(u):
    return u.with_changes(args=with_args(u.args, [kwarg("bias", cst.Name("False"))]))


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
        if not (isinstance(n, cst.Call) and self.qnames(n) & CONV) or any(a.star for a in n.args):
            return False
        b = arg(n, "bias", 7)
        return b is None or (isinstance(b.value, cst.Name) and b.value.value == "True")

    def _report(self, conv):
        b = arg(conv, "bias", 7)
        if b is None:
            fix = Fix("bias=False on the convolution", [(conv, _no_bias)], safe=False)
        else:
            fix = Fix("bias=False on the convolution", [(b.value, cst.Name("False"))], safe=False)
        self.report(conv, "convolution bias followed by BatchNorm is cancelled by its mean subtraction; "
                          "use bias=False (unsafe fix: old checkpoints have the bias)", fix)

    def visit_Call(self, node: cst.Call) -> None:
        if self.qnames(node) & {"torch.nn.Sequential"}:
            items = [a.value for a in node.args if not a.star]
            for a, b in zip(items, items[1:]):
                if self._biased_conv(a) and isinstance(b, cst.Call) and self.qnames(b) & BN:
                    self._report(a)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        methods = {f.name.value: f for f in node.body.body if isinstance(f, cst.FunctionDef)}
        if "__init__" not in methods or "forward" not in methods:
            return
        convs, bns = {}, set()
        for n in walk(methods["__init__"]):
            if isinstance(n, cst.Assign) and len(n.targets) == 1:
                name = dotted(n.targets[0].target)
                if name and self._biased_conv(n.value):
                    convs[name] = n.value
                elif name and isinstance(n.value, cst.Call) and self.qnames(n.value) & BN:
                    bns.add(name)
        if not convs or not bns:
            return
        hit = set()
        stmts = [s for s in walk(methods["forward"]) if isinstance(s, cst.SimpleStatementLine)]
        for n in walk(methods["forward"]):
            if isinstance(n, cst.Call) and dotted(n.func) in bns and n.args:
                inner = n.args[0].value
                if isinstance(inner, cst.Call) and dotted(inner.func) in convs:
                    hit.add(dotted(inner.func))
        for s1, s2 in zip(stmts, stmts[1:]):
            c1 = _assigned_call(s1)
            c2 = _assigned_call(s2)
            if c1 and c2 and dotted(c1[1].func) in convs and dotted(c2[1].func) in bns:
                if c2[1].args and dotted(c2[1].args[0].value) == c1[0]:
                    hit.add(dotted(c1[1].func))
        for name in sorted(hit):
            self._report(convs[name])


def _assigned_call(stmt):
    if len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign) and isinstance(stmt.body[0].value, cst.Call):
        return dotted(stmt.body[0].targets[0].target), stmt.body[0].value
    return None
