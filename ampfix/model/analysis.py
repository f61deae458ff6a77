"""Analysis helpers shared by rules: name tables, loops, autocast regions, tensor names.

These know PyTorch's API, not any rule: rules combine them.  Everything here works on Python's
``ast`` with the semantic model of :mod:`ampfix.model.semantic`; what depends on a function's own
names is computed per function (each function's locals are its own).
"""
from __future__ import annotations

import ast
from typing import Dict, Iterator, List, Optional, Set, Tuple

from ampfix.model.semantic import DEFS, LOOPS, base_name, block_of, dotted, walk

AUTOCAST = {
    "torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast",
    "torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast",
    "torch.cpu.amp.autocast", "torch.cpu.amp.autocast_mode.autocast",
}
CUDA_AMP_AUTOCAST = {"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"}
GRADSCALER = {
    "torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler",
    "torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler",
    "torch.cpu.amp.GradScaler", "torch.cpu.amp.grad_scaler.GradScaler",
}
CUDA_AMP_GRADSCALER = {"torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler"}
CPU_AMP_AUTOCAST = {"torch.cpu.amp.autocast", "torch.cpu.amp.autocast_mode.autocast"}
CPU_AMP_GRADSCALER = {"torch.cpu.amp.GradScaler", "torch.cpu.amp.grad_scaler.GradScaler"}
DATAPARALLEL = {"torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                "torch.nn.parallel.data_parallel.DataParallel"}
DDP = {"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"}
CLIP = {"torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_value_",
        "torch.nn.utils.clip_grad.clip_grad_norm_", "torch.nn.utils.clip_grad.clip_grad_value_",
        "torch.nn.utils.clip_grad_norm", "torch.nn.utils.clip_grad.clip_grad_norm"}
DATALOADER = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
FLOAT16 = {"torch.float16", "torch.half"}
BFLOAT16 = {"torch.bfloat16"}

#: what ``from X import *`` binds, for modules whose names rules look for (a star import is
#: otherwise opaque to a static analysis)
STAR_EXPORTS: Dict[str, Tuple[str, ...]] = {
    "apex.fp16_utils": ("FP16_Optimizer", "network_to_half", "BN_convert_float", "FP16Model", "tofp16",
                        "prep_param_lists", "master_params_to_model_params", "model_grads_to_master_grads",
                        "to_python_float", "clip_grad_norm", "convert_module", "convert_network", "LossScaler",
                        "DynamicLossScaler"),
    "apex.parallel": ("DistributedDataParallel", "SyncBatchNorm", "convert_syncbn_model", "Reducer"),
    "apex.optimizers": ("FusedAdam", "FusedSGD", "FusedLAMB", "FusedNovoGrad", "FusedAdagrad",
                        "FusedMixedPrecisionLamb", "FP16_Optimizer"),
    "apex.normalization": ("FusedLayerNorm", "FusedRMSNorm", "MixedFusedLayerNorm", "MixedFusedRMSNorm"),
    "torch.cuda.amp": ("autocast", "GradScaler", "custom_fwd", "custom_bwd"),
}


# --------------------------------------------------------------------------- calls
def arg(call: ast.Call, keyword: Optional[str] = None, position: Optional[int] = None) -> Optional[ast.expr]:
    """The value of the argument given by keyword, or at a position among the positional ones
    (None after a ``*args``, whose positions are unknown)."""
    if keyword is not None:
        for k in call.keywords:
            if k.arg == keyword:
                return k.value
    if position is not None:
        for i, a in enumerate(call.args):
            if isinstance(a, ast.Starred):
                return None
            if i == position:
                return a
    return None


def arg_node(call: ast.Call, keyword: Optional[str] = None, position: Optional[int] = None):
    """The node (keyword or positional expression) that holds an argument: what to delete."""
    if keyword is not None:
        for k in call.keywords:
            if k.arg == keyword:
                return k
    return arg(call, None, position)


def kwargs(call: ast.Call) -> Dict[str, ast.expr]:
    return {k.arg: k.value for k in call.keywords if k.arg is not None}


def has_star(call: ast.Call) -> bool:
    return any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)


class Spread:
    """``f(a, **opts)`` where ``opts`` is a dict the code builds right before the call's statement
    (fast_adversarial: ``amp_args = dict(opt_level=..., loss_scale=...)``, then
    ``if level == 'O2': amp_args['master_weights'] = ...``, then ``initialize(m, o, **amp_args)``).

    ``keywords``: the call's keywords with ``**opts`` spelt out (the values are the dict's own
    nodes); ``statements``: those that build ``opts`` (they go with the call); ``conditional``:
    keys set only under an ``if`` or set more than once (their value is not one expression)."""

    def __init__(self, keywords: List[ast.keyword], statements: List[ast.stmt], conditional: Set[str]) -> None:
        self.keywords = keywords
        self.statements = statements
        self.conditional = conditional


def _key_store(stmt, name: str) -> Optional[Tuple[str, ast.expr]]:
    """``name["key"] = value`` -> (key, value)."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Subscript)):
        return None
    t = stmt.targets[0]
    if not (isinstance(t.value, ast.Name) and t.value.id == name and isinstance(t.slice, ast.Constant)
            and isinstance(t.slice.value, str) and t.slice.value.isidentifier()):
        return None
    return t.slice.value, stmt.value


def _dict_built(stmt, name: str) -> Optional[List[Tuple[str, ast.expr]]]:
    """``name = dict(k=v, ...)`` or ``name = {"k": v, ...}`` -> [(k, v)]."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
            and stmt.targets[0].id == name):
        return None
    v = stmt.value
    if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "dict" and not v.args and \
            all(k.arg is not None for k in v.keywords):
        return [(k.arg, k.value) for k in v.keywords]
    if isinstance(v, ast.Dict) and all(isinstance(k, ast.Constant) and isinstance(k.value, str)
                                       and k.value.isidentifier() for k in v.keys):
        return [(k.value, x) for k, x in zip(v.keys, v.values)]
    return None


def spread_kwargs(call: ast.Call, stmt: ast.stmt, unit) -> Optional[Spread]:
    """The dict behind a call's one ``**name``, when the statements right before ``stmt`` in its
    block build it (a ``dict(...)``/``{...}`` with literal keys, then ``name["key"] = value``
    stores, each alone or under an ``if`` with no ``else`` and nothing else in it) and nothing
    else in ``unit`` mentions ``name``; None otherwise (a dict that comes from elsewhere, is
    read again or is changed in ways these statements do not show)."""
    stars = [k for k in call.keywords if k.arg is None]
    if len(stars) != 1 or not isinstance(stars[0].value, ast.Name) or \
            any(isinstance(a, ast.Starred) for a in call.args):
        return None
    name = stars[0].value.id
    _, _, block = block_of(stmt)
    i = next((k for k, x in enumerate(block) if x is stmt), None)
    if i is None:
        return None
    stores: List[Tuple[str, ast.expr, bool]] = []
    built: Optional[List[Tuple[str, ast.expr]]] = None
    statements: List[ast.stmt] = []
    for x in reversed(block[:i]):
        one = _key_store(x, name)
        if one is not None:
            stores.append((*one, False))
            statements.append(x)
            continue
        if isinstance(x, ast.If) and not x.orelse and all(_key_store(y, name) for y in x.body) and \
                not any(isinstance(n, ast.Name) and n.id == name for n in walk(x.test)):
            stores += [(*_key_store(y, name), True) for y in x.body]
            statements.append(x)
            continue
        built = _dict_built(x, name)
        if built is not None:
            statements.append(x)
        break
    if built is None:
        return None
    inside = {id(n) for st in statements for n in walk(st)} | {id(stars[0].value)}
    if any(isinstance(n, ast.Name) and n.id == name and id(n) not in inside for n in walk(unit, into_functions=True)):
        return None
    explicit = {k.arg for k in call.keywords if k.arg is not None}
    values: Dict[str, ast.expr] = {}
    conditional: Set[str] = set()
    for key, value in built:
        if key in values:
            conditional.add(key)
        values[key] = value
    for key, value, under_if in reversed(stores):
        if key in values or under_if:
            conditional.add(key)
        values[key] = value
    if explicit & set(values):
        return None  # TypeError at run time: not ours to read
    keywords = [k for k in call.keywords if k.arg is not None]
    for key, value in values.items():
        kw = ast.keyword(arg=key, value=value)
        ast.copy_location(kw, value)
        keywords.append(kw)
    return Spread(keywords, list(reversed(statements)), conditional)


def all_args(call: ast.Call) -> List[ast.AST]:
    """Positional and keyword argument nodes in source order."""
    return sorted([*call.args, *call.keywords], key=lambda n: (n.lineno, n.col_offset))


def method_call(node, *names: str) -> bool:
    """``<anything>.name(...)`` for one of names."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names


def receiver(call) -> Optional[ast.expr]:
    return call.func.value if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) else None


def casts_one_of(cast: ast.Call, names) -> bool:
    """``cast`` (a ``.half()``-like method call) converts one of the dotted ``names``: its receiver
    (``model.half()``), the start of its chain (``model.cuda().half()``) or the target it is assigned
    to (``model = Net().cuda().half()``)."""
    base = receiver(cast)
    first = base
    while isinstance(base, ast.Call) and isinstance(base.func, ast.Attribute):
        base = base.func.value
    st = cast
    while st is not None and not isinstance(st, ast.stmt):
        st = getattr(st, "_p", None)
    target = dotted(st.targets[0]) if isinstance(st, ast.Assign) and len(st.targets) == 1 else None
    return dotted(base) in names or target in names or dotted(first) in names


def is_const(node, *values) -> bool:
    return isinstance(node, ast.Constant) and any(node.value is v or (type(node.value) is type(v) and node.value == v)
                                                  for v in values)


def string_value(node) -> Optional[str]:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def number_value(node) -> Optional[float]:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = number_value(node.operand)
        return None if v is None else -v
    return None


#: the methods of a logger (and ``warnings.warn``) that only say something
LOG_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "critical", "exception", "log"})


def is_log_call(st) -> bool:
    """``print(...)``, ``logger.info(...)``, ``warnings.warn(...)`` as a statement."""
    if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call)):
        return False
    name = dotted(st.value.func) or ""
    return name == "print" or name.rsplit(".", 1)[-1] in LOG_METHODS


#: builtins that compute a number from numbers (and ``len``, ``str``)
_SCALAR_CALLS = {"int", "float", "len", "round", "min", "max", "str", "abs"}


def scalar_assignment(st) -> bool:
    """``names = <arithmetic>`` on names, attributes, constants and ``int`` / ``len`` / ``min``
    ... (``alpha = min(1, step / warmup)``): nothing there runs a tensor operation of its own
    that autocast would change, nor fails in practice."""
    if not (isinstance(st, ast.Assign) and all(isinstance(t, ast.Name) for t in st.targets)):
        return False
    for n in ast.walk(st.value):
        if isinstance(n, ast.Call):
            if not (isinstance(n.func, ast.Name) and n.func.id in _SCALAR_CALLS) or n.keywords:
                return False
        elif not isinstance(n, (ast.Name, ast.Attribute, ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator,
                                ast.unaryop, ast.Load, ast.expr_context)):
            return False
    return True


def is_optimizer_step(call) -> bool:
    """``<opt>.step()`` on something named like an optimizer or a scaler."""
    if not method_call(call, "step"):
        return False
    name = (dotted(receiver(call)) or "").lower()
    return any(k in name for k in ("optim", "opt", "scaler")) and "sched" not in name


# --------------------------------------------------------------------------- loops and units
def loop_body_nodes(loop, nested_loops: bool = False) -> Iterator[ast.AST]:
    """Nodes in a loop's body (not its else), optionally skipping nested loops' bodies."""
    stack = list(reversed(loop.body))
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, (*DEFS, ast.Lambda)):
            continue
        if not nested_loops and isinstance(n, LOOPS):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(n))))


def is_training_loop(loop) -> bool:
    """A loop whose own body (not a nested loop) runs a backward pass or an optimizer step."""
    for n in loop_body_nodes(loop):
        if method_call(n, "backward") or is_optimizer_step(n):
            return True
        if isinstance(n, ast.Call) and dotted(n.func) == "torch.autograd.backward":
            return True
    return False


def enclosing_loop(node) -> Optional[ast.AST]:
    """The nearest For/While whose body holds ``node`` (stopping at function boundaries)."""
    child = node
    p = getattr(node, "_p", None)
    while p is not None:
        if isinstance(p, (*DEFS, ast.Lambda)):
            return None
        if isinstance(p, LOOPS) and any(child is s for s in p.body):
            return p
        child = p
        p = getattr(p, "_p", None)
    return None


def in_loop_body(node, loop) -> bool:
    """Whether node lies in ``loop``'s body (not its else or its header)."""
    child = node
    p = getattr(node, "_p", None)
    while p is not None:
        if p is loop:
            return any(child is s for s in loop.body)
        child = p
        p = getattr(p, "_p", None)
    return False


def enclosing_function(node) -> Optional[ast.AST]:
    p = getattr(node, "_p", None)
    while p is not None:
        if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return p
        p = getattr(p, "_p", None)
    return None


def unit_of(node) -> ast.AST:
    """The function (or the module) whose code ``node`` is part of."""
    p = getattr(node, "_p", None)
    last = node
    while p is not None:
        if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return p
        last = p
        p = getattr(p, "_p", None)
    return last


def functions_and_module(module) -> List[ast.AST]:
    """The module and every function in it: the units rules reason about, each on its own."""
    return [module, *(n for n in walk(module, into_functions=True) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]


def unit_nodes(unit) -> Iterator[ast.AST]:
    """The nodes of a unit (a function's body, or a module) without nested functions."""
    if isinstance(unit, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for s in unit.body:
            yield s
            yield from walk(s)
    else:
        yield from walk(unit)


# --------------------------------------------------------------------------- autocast
def autocast_call(sem, node) -> Optional[ast.Call]:
    """The autocast call of a with-item / decorator expression, or None."""
    if isinstance(node, ast.withitem):
        node = node.context_expr
    if isinstance(node, ast.Call) and sem.qnames(node) & AUTOCAST:
        return node
    return None


def autocast_dtype(sem, call: ast.Call) -> Optional[str]:
    """'float16', 'bfloat16', 'other' or None (not given: the device default)."""
    a = arg(call, "dtype")
    if a is None:
        return "bfloat16" if sem.qnames(call) & {"torch.cpu.amp.autocast", "torch.cpu.amp.autocast_mode.autocast"} else None
    names = sem.qnames(a)
    if names & FLOAT16:
        return "float16"
    if names & BFLOAT16:
        return "bfloat16"
    return "other"


def autocast_enabled_literal(call: ast.Call) -> Optional[bool]:
    a = arg(call, "enabled")
    if a is None:
        return True
    if isinstance(a, ast.Constant) and isinstance(a.value, bool):
        return a.value
    return None  # a variable: unknown


def enclosing_autocast(sem, node) -> Optional[ast.Call]:
    """The autocast call of the innermost ``with`` (in this function) that holds node."""
    for anc in sem.ancestors(node):
        if isinstance(anc, (*DEFS, ast.Lambda)):
            return None
        if isinstance(anc, (ast.With, ast.AsyncWith)):
            for item in anc.items:
                c = autocast_call(sem, item)
                if c is not None:
                    return c
    return None


def is_modulo_guarded(node, stop) -> bool:
    """Inside an ``if`` (body, not else) whose test uses ``%``, below stop."""
    child = node
    p = getattr(node, "_p", None)
    while p is not None:
        if p is stop:
            return False
        if isinstance(p, ast.If) and any(child is s for s in p.body):
            if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in [p.test, *walk(p.test)]):
                return True
        child = p
        p = getattr(p, "_p", None)
    return False


def bound_by_imports(tree, top: str) -> Set[str]:
    """Local names that imports of package ``top`` bind (``import torch.cuda.amp as amp`` -> amp)."""
    out: Set[str] = set()
    for n in walk(tree, into_functions=True):
        if isinstance(n, ast.Import):
            for a in n.names:
                if a.name.split(".")[0] == top:
                    out.add(a.asname or a.name.split(".")[0])
        elif isinstance(n, ast.ImportFrom) and not n.level and n.module is not None:
            if n.module.split(".")[0] == top:
                out.update(a.asname or a.name for a in n.names if a.name != "*")
    return out


# --------------------------------------------------------------------------- tensors
_NOT_TENSOR_TORCH = ("torch.cuda.", "torch.device", "torch.no_grad", "torch.enable_grad", "torch.autocast",
                     "torch.amp.", "torch.is_", "torch.get_", "torch.set_", "torch.manual_seed", "torch.save",
                     "torch.load", "torch.utils.", "torch.nn.", "torch.optim.", "torch.distributed.",
                     "torch.backends.", "torch.inference_mode", "torch.compile", "torch.jit.")
_TENSOR_METHODS = {"sum", "mean", "max", "min", "norm", "abs", "sqrt", "float", "half", "double", "detach",
                   "to", "cuda", "clone", "view", "reshape", "argmax", "argmin", "eq", "ne", "gt", "lt",
                   "any", "all", "exp", "log", "pow", "squeeze", "unsqueeze", "softmax", "std", "var"}


def _model_like(name: str) -> bool:
    last = name.split(".")[-1].lower()
    return last in ("net", "network", "encoder", "decoder", "criterion", "loss_fn", "model") or last.endswith("model")


class Tensors:
    """Names (dotted) that hold tensors in one unit (a function or the module), by a light
    forward inference: backward()'s receiver, results of torch functions, of a model or loss
    call (something with .parameters()/.train()/.eval(), or built from torch.nn), of a tensor
    method of a tensor, of arithmetic on tensors."""

    def __init__(self, sem, unit) -> None:
        self.sem = sem
        self.modules: Set[str] = set()
        self.names: Set[str] = set()
        assigns = []
        for n in unit_nodes(unit):
            if method_call(n, "parameters", "train", "eval", "named_parameters", "zero_grad") and receiver(n) is not None:
                d = dotted(receiver(n))
                if d and not any(k in d.lower() for k in ("optim", "opt", "scaler")):
                    self.modules.add(d)
            if method_call(n, "backward") and dotted(receiver(n)):
                self.names.add(dotted(receiver(n)))
            if isinstance(n, ast.Assign):
                assigns.append((n.targets[0], n.value))
                if isinstance(n.value, ast.Call) and any(q.startswith("torch.nn.") for q in sem.qnames(n.value)):
                    d = dotted(n.targets[0])
                    if d:
                        self.modules.add(d)
            elif isinstance(n, (ast.AnnAssign, ast.AugAssign)) and n.value is not None:
                assigns.append((n.target, n.value))
        for _ in range(3):  # a few rounds reach a fixed point for straight-line code
            for target, value in assigns:
                if self.is_tensor(value):
                    for t in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]):
                        d = dotted(t)
                        if d:
                            self.names.add(d)

    def is_tensor(self, expr) -> bool:
        sem = self.sem
        depth = 0
        while True:  # walk down subscripts, unary ops and tensor-method chains iteratively
            depth += 1
            if depth > 10_000:
                return False
            if dotted(expr) in self.names:
                return True
            if isinstance(expr, ast.Subscript):
                expr = expr.value
                continue
            if isinstance(expr, ast.UnaryOp):
                expr = expr.operand
                continue
            if isinstance(expr, ast.Call) and method_call(expr, *_TENSOR_METHODS):
                expr = receiver(expr)
                continue
            break
        if isinstance(expr, ast.BinOp):
            stack = [expr]
            while stack:
                e = stack.pop()
                if isinstance(e, ast.BinOp):
                    stack.extend((e.left, e.right))
                elif self.is_tensor(e):
                    return True
            return False
        if isinstance(expr, ast.Compare):
            if any(isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for op in expr.ops):
                return False
            return any(self.is_tensor(e) for e in [expr.left, *expr.comparators])
        if isinstance(expr, ast.Call):
            if method_call(expr, "item", "tolist", "numpy", "cpu", "size", "dim", "numel"):
                return False
            names = sem.qnames(expr)
            if any(q.startswith(("torch.nn.functional.", "torch.special.", "torch.linalg.", "torch.fft."))
                   or (q.startswith("torch.") and not q.startswith(_NOT_TENSOR_TORCH)) for q in names):
                return True
            d = dotted(expr.func)
            if d and (d in self.modules or _model_like(d)):
                return True
        return False


def tensors(ctx, unit) -> Tensors:
    """The tensor names of a unit, computed once per file for all rules."""
    return ctx.cached(("tensors", id(unit)), lambda: Tensors(ctx.sem, unit))


# --------------------------------------------------------------------------- GradScaler objects
def scaler_names(sem, unit) -> Set[str]:
    """Dotted names that hold a GradScaler in a unit (a function: also the module's own and
    ``self.x`` of its class): assigned from the constructor, or the receiver of ``.scale(x)`` /
    ``.unscale_(opt)`` / ``.step(opt)`` on a name that says scaler, or a parameter so named."""
    names: Set[str] = set()
    nodes = list(unit_nodes(unit))
    for n in nodes:
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and isinstance(n.value, ast.Call):
            if sem.qnames(n.value) & GRADSCALER:
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                names.update(d for d in map(dotted, targets) if d)
        if method_call(n, "scale", "unscale_") and "scaler" in (dotted(receiver(n)) or "").lower():
            names.add(dotted(receiver(n)))
    if isinstance(unit, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for a in [*unit.args.args, *unit.args.kwonlyargs]:
            if "scaler" in a.arg.lower():
                names.add(a.arg)
    return names


def module_scalers(ctx) -> Set[str]:
    """GradScaler names anywhere in the module (module level and ``self.x`` in methods)."""
    def compute():
        out: Set[str] = set()
        for unit in functions_and_module(ctx.tree):
            out |= scaler_names(ctx.sem, unit)
        return out
    return ctx.cached("module_scalers", compute)


def is_scaler_call(node, scalers: Set[str], *methods: str) -> bool:
    return method_call(node, *methods) and dotted(receiver(node)) in scalers


def scaled_backward(node, scalers: Set[str]) -> bool:
    """``scaler.scale(loss).backward()``."""
    return method_call(node, "backward") and is_scaler_call(receiver(node), scalers, "scale")


def names_in(node) -> Set[str]:
    """Every dotted name read or written in ``node`` (nested functions included)."""
    out = set()
    for n in [node, *walk(node, into_functions=True)]:
        if isinstance(n, (ast.Name, ast.Attribute)):
            d = dotted(n)
            if d:
                out.add(d)
    return out


def first_name(node) -> Optional[str]:
    b = base_name(node)
    return b.id if b is not None else None


def scalers_for(ctx, unit) -> Set[str]:
    """GradScaler names a unit can see: its own, the module's, and ``self.x`` scalers of its class."""
    def compute():
        sem = ctx.sem
        names = set(scaler_names(sem, unit))
        if unit is not ctx.tree:
            names |= scaler_names(sem, ctx.tree)
            cls = getattr(unit, "_p", None)
            if isinstance(cls, ast.ClassDef):
                for m in cls.body:
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m is not unit:
                        names |= {n for n in scaler_names(sem, m) if n.startswith("self.")}
        return names
    return ctx.cached(("scalers", id(unit)), compute)


def import_spec(sem, name_node, relative: bool = False):
    """The ImportSpec of the import that binds ``name_node`` where it is read (None if none);
    ``relative``: a relative ``from .x import y`` too (``.x`` as the spec's module)."""
    from ampfix.rule import ImportSpec

    for b in sem.bindings_of(name_node):
        if b.kind != "import":
            continue
        imp = b.node
        for a in imp.names:
            if isinstance(imp, ast.Import):
                if (a.asname or a.name.split(".")[0]) == name_node.id:
                    return ImportSpec(a.name if a.asname else a.name.split(".")[0], None, a.asname)
            elif (a.asname or a.name) == name_node.id and (imp.module if not imp.level else relative):
                return ImportSpec("." * imp.level + (imp.module or ""), a.name, a.asname)
    return None


def exclusive(a, b, unit) -> bool:
    """Whether ``a`` and ``b`` (nodes of one unit) never run in the same call: they sit in
    different branches of one ``if``, or ``a``'s branch ends in return/raise before ``b``."""
    chain_a = [a, *_ancestors_until(a, unit)]
    ids_b = {id(x): x for x in [b, *_ancestors_until(b, unit)]}
    common = next((x for x in chain_a if id(x) in ids_b), None)
    if common is None:
        return False
    child_a = chain_a[chain_a.index(common) - 1] if chain_a.index(common) else None
    chain_b = [b, *_ancestors_until(b, unit)]
    idx_b = next(i for i, x in enumerate(chain_b) if x is common)
    child_b = chain_b[idx_b - 1] if idx_b else None
    if isinstance(common, ast.If) and child_a is not None and child_b is not None:
        in_body = lambda c: any(c is s for s in common.body)
        if in_body(child_a) != in_body(child_b) and child_a is not common.test and child_b is not common.test:
            return True
    # a's enclosing branch below `common` ends in return/raise, and b comes after it
    for x in chain_a[: chain_a.index(common)]:
        p = getattr(x, "_p", None)
        if isinstance(p, ast.If) and isinstance(x, ast.stmt):
            block = p.body if any(x is s for s in p.body) else p.orelse
            if block and isinstance(block[-1], (ast.Return, ast.Raise)) and b.lineno > block[-1].end_lineno:
                return True
    return False


def _ancestors_until(node, stop):
    p = getattr(node, "_p", None)
    while p is not None:
        yield p
        if p is stop:
            return
        p = getattr(p, "_p", None)


def torch_version_test(e) -> Optional[bool]:
    """``version.parse(torch.__version__) < version.parse("1.6")`` (or ``LooseVersion``,
    ``float(torch.__version__[:3]) >= 1.6``...): a comparison of the torch version with a 0.x or 1.x
    release, as it comes out on torch 2, which native AMP (``torch.amp.GradScaler("cuda")``)
    needs; None for anything else."""
    if not (isinstance(e, ast.Compare) and len(e.ops) == 1
            and isinstance(e.ops[0], (ast.Lt, ast.LtE, ast.Gt, ast.GtE))):
        return None
    sides = [e.left, e.comparators[0]]
    has_torch = [any(dotted(x) == "torch.__version__" for x in ast.walk(side)) for side in sides]
    if sorted(has_torch) != [False, True]:
        return None
    other = sides[has_torch.index(False)]
    lits = [x.value for x in ast.walk(other) if isinstance(x, ast.Constant) and not isinstance(x.value, bool)]
    if len(lits) != 1:
        return None
    major = str(lits[0]).strip().split(".")[0]
    if major not in ("0", "1"):
        return None
    below = isinstance(e.ops[0], (ast.Lt, ast.LtE))  # torch (left) is below the release
    return (not below) if has_torch[0] else below
