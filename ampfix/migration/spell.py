"""How the native API is spelled in the code a migration writes, for the torch it runs on.

Each rewrite uses only what exists in the declared torch release (read in PyTorch's source):

* ``torch.cuda.amp.autocast`` / ``torch.cuda.amp.GradScaler``: 1.6 (native AMP's first release);
* ``torch.autocast("cuda", dtype=...)``: 1.10 (``torch/autocast_mode.py`` moved to
  ``torch.autocast``);
* ``torch.amp.GradScaler("cuda")``: 2.3 (``torch/amp/grad_scaler.py``, device-generic);
* ``torch.amp.custom_fwd(device_type=...)``: 2.4;
* ``fused=True`` for ``torch.optim.Adam``/``AdamW``: 2.0 (AdamW's in 2.0; Adam's in 1.13 as a
  prototype); for ``torch.optim.SGD``: 2.3;
* ``torch.nn.RMSNorm``: 2.4.

``target`` picks the spelling: ``torch.amp`` where the release has it, ``torch.cuda.amp``
below 2.3 (the default follows the declared release unless ``target`` is set).
"""
from __future__ import annotations

import ast
from typing import List, Optional

NATIVE_AMP = (1, 6)
TORCH_AUTOCAST = (1, 10)
TORCH_AMP_SCALER = (2, 3)
CUSTOM_FWD_DEVICE = (2, 4)
FUSED_ADAM = (2, 0)
FUSED_SGD = (2, 3)
RMSNORM = (2, 4)

#: generated lines longer than this get one argument a line
MAX_LINE = 100
STATIC_NOTE = ("static loss scale: GradScaler starts at it and never grows (growth_interval=2**31-1); it still skips "
               "a step whose gradients overflow and halves the scale, where apex applied it")


def target(settings) -> str:
    """``torch.amp`` or ``torch.cuda.amp``: as configured, else what the torch release has."""
    return settings.target


def scaler_call(settings, args: List[str], indent: int = 0, head: str = "", one_line: bool = False) -> str:
    """``torch.amp.GradScaler("cuda", ...)``, or ``torch.cuda.amp.GradScaler(...)``; one argument
    a line when the statement (``head`` + call, at ``indent``) would be long (never ``one_line``:
    for a message)."""
    if target(settings) == "torch.cuda.amp":
        func = "torch.cuda.amp.GradScaler"
    else:
        func, args = "torch.amp.GradScaler", ['"cuda"', *args]
    one = f"{func}({', '.join(args)})"
    if one_line or indent + len(head) + len(one) <= MAX_LINE or len(args) < 2:
        return one
    return f"{func}(\n" + "".join(f"    {a},\n" for a in args) + ")"


def bf16(settings) -> bool:
    """``--dtype bfloat16``: autocast to bfloat16 and no GradScaler (bfloat16 has float32's range:
    gradients do not underflow, so nothing scales the loss)."""
    return getattr(settings, "dtype", "float16") == "bfloat16"


def autocast_call(settings, enabled: str = "True", dtype: Optional[str] = None) -> str:
    if dtype is None:
        dtype = "torch.bfloat16" if bf16(settings) else "torch.float16"
    extra = "" if enabled == "True" else f", enabled={enabled}"
    if target(settings) == "torch.cuda.amp" or settings.torch_version < TORCH_AUTOCAST:
        return f"torch.cuda.amp.autocast(dtype={dtype}{extra})" if settings.torch_version >= (1, 10) \
            else f"torch.cuda.amp.autocast({extra[2:]})"
    return f'torch.autocast("cuda", dtype={dtype}{extra})'


def autocast_off(settings) -> str:
    if target(settings) == "torch.cuda.amp" or settings.torch_version < TORCH_AUTOCAST:
        return "torch.cuda.amp.autocast(enabled=False)"
    return 'torch.autocast("cuda", enabled=False)'


def description(settings) -> str:
    if bf16(settings):
        return "torch.autocast(bfloat16), no GradScaler"
    if target(settings) == "torch.cuda.amp":
        return "torch.cuda.amp.autocast + torch.cuda.amp.GradScaler"
    return "torch.autocast + torch.amp.GradScaler"


def check_release(settings) -> Optional[str]:
    """Why native AMP cannot be written for this torch release (None when it can)."""
    if bf16(settings) and settings.torch_version < TORCH_AUTOCAST:
        return (f"torch {settings.torch_version[0]}.{settings.torch_version[1]} has no bfloat16 autocast on CUDA (it "
                "came in 1.10): use --dtype float16, or upgrade torch first")
    if settings.torch_version < NATIVE_AMP:
        return (f"torch {settings.torch_version[0]}.{settings.torch_version[1]} has no native AMP (it came in 1.6); "
                "upgrade torch first")
    if getattr(settings, "target", None) == "torch.amp" and settings.torch_version < TORCH_AMP_SCALER:
        return None  # target asked for explicitly; the rules that write it say so
    return None


def as_bool(code: str, expr) -> str:
    """autocast(enabled=...) takes a bool only: comparisons, `not`, and/or of those and
    True/False are; the rest is wrapped in bool()."""
    def is_bool(e) -> bool:
        if isinstance(e, ast.Compare) or (isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not)):
            return True
        if isinstance(e, ast.Constant) and isinstance(e.value, bool):
            return True
        if isinstance(e, ast.BoolOp):
            return all(is_bool(v) for v in e.values)
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id in ("bool", "isinstance", "hasattr"):
            return True
        return False

    return code if is_bool(expr) else f"bool({code})"


def conj(a: str, b: str) -> str:
    """``a and b`` for enabled expressions, simplified (a test both already make is said once)."""
    if a == "True":
        return b
    if b == "True":
        return a
    if "False" in (a, b):
        return "False"
    try:
        have = {ast.dump(x) for x in _conjuncts(ast.parse(a, mode="eval").body)}
        mine = _conjuncts(ast.parse(b, mode="eval").body)
        extra = [x for x in mine if ast.dump(x) not in have]
    except SyntaxError:
        mine = extra = None
    if extra is not None and len(extra) < len(mine):
        if not extra:
            return a
        parts = [ast.get_source_segment(b, x) or ast.unparse(x) for x in extra]
        b = " and ".join(f"({p})" if isinstance(x, ast.BoolOp) else p for p, x in zip(parts, extra))
    return f"{_and_operand(a)} and {_and_operand(b)}"


def _and_operand(code: str) -> str:
    """``code`` as an operand of ``and``: an ``or``, a conditional expression, a lambda or a
    walrus binds looser, so it is parenthesized (``x if c else y and z`` reads as
    ``x if c else (y and z)``)."""
    try:
        e = ast.parse(code.strip(), mode="eval").body
    except SyntaxError:
        return f"({code})"
    if isinstance(e, (ast.IfExp, ast.Lambda, ast.NamedExpr)) or (isinstance(e, ast.BoolOp) and isinstance(e.op, ast.Or)):
        return f"({code})"
    return code


def operand(code: str, node) -> str:
    """``code`` (the source of ``node``) as the left side of a comparison: anything that binds
    looser than ``!=`` is parenthesized (``('O2' if mp else 'O0') != "O0"``)."""
    if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript, ast.Call, ast.Constant, ast.List, ast.Tuple,
                         ast.Dict, ast.Set, ast.JoinedStr)) or code.startswith("("):
        return code
    return f"({code})"


def _conjuncts(e) -> list:
    if isinstance(e, ast.BoolOp) and isinstance(e.op, ast.And):
        return [y for v in e.values for y in _conjuncts(v)]
    return [e]


def disj(a: str, b: str) -> str:
    """``a or b`` for the enabled= of one scaler that two exclusive initialize calls made:
    ``t and x`` / ``not t and x`` (the two branches of ``if t: ... else: ...``) is ``x``."""
    ea, eb = ast.parse(a, mode="eval").body, ast.parse(b, mode="eval").body
    ca, cb = _conjuncts(ea), _conjuncts(eb)
    da, db = [ast.dump(_plain(x)) for x in ca], [ast.dump(_plain(x)) for x in cb]
    ra = [x for x, d in zip(ca, da) if d not in db]
    rb = [x for x, d in zip(cb, db) if d not in da]
    common = [x for x, d in zip(ca, da) if d in db]
    if len(ra) == 1 and len(rb) == 1 and _opposite(ra[0], rb[0]):
        return " and ".join(ast.get_source_segment(a, x) or ast.unparse(x) for x in common) if common else "True"
    if a == b or not ra:  # `x or (x and y)` is `x`
        return a
    if not rb:
        return b
    return f"({a}) or ({b})"


def _plain(x):
    """``bool(t)`` as ``t`` (a condition's truth is the same), ``not bool(t)`` as ``not t``."""
    if isinstance(x, ast.Call) and isinstance(x.func, ast.Name) and x.func.id == "bool" and len(x.args) == 1 \
            and not x.keywords:
        return _plain(x.args[0])
    if isinstance(x, ast.UnaryOp) and isinstance(x.op, ast.Not):
        return ast.UnaryOp(op=ast.Not(), operand=_plain(x.operand))
    return x


def _opposite(x, y) -> bool:
    """``t`` and ``not t``, or a comparison and its inverse (``n > 1`` / ``n <= 1``)."""
    x, y = _plain(x), _plain(y)
    for p, q in ((x, y), (y, x)):
        if isinstance(q, ast.UnaryOp) and isinstance(q.op, ast.Not) and ast.dump(q.operand) == ast.dump(p):
            return True
    inverse = {ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Eq: ast.NotEq,
               ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
    if isinstance(x, ast.Compare) and isinstance(y, ast.Compare) and len(x.ops) == len(y.ops) == 1:
        return (ast.dump(x.left) == ast.dump(y.left) and ast.dump(x.comparators[0]) == ast.dump(y.comparators[0])
                and inverse.get(type(x.ops[0])) is type(y.ops[0]))
    return False
