"""Analysis helpers shared by rules: name tables, loops, autocast regions, tensor names.

These know PyTorch's API, not any rule: rules combine them.
"""
from __future__ import annotations

from typing import Iterator, List, Optional, Set

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import ImportAssignment, ScopeProvider

from ampfix.rule import ImportSpec, Rule

AUTOCAST = {
    "torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast",
    "torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast",
    "torch.cpu.amp.autocast", "torch.cpu.amp.autocast_mode.autocast",
}
CUDA_AMP_AUTOCAST = {"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"}
GRADSCALER = {
    "torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler",
    "torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler",
    "torch.cpu.amp.GradScaler",
}
CUDA_AMP_GRADSCALER = {"torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler"}
DATAPARALLEL = {"torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                "torch.nn.parallel.data_parallel.DataParallel"}
DDP = {"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"}
CLIP = {"torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_value_",
        "torch.nn.utils.clip_grad.clip_grad_norm_", "torch.nn.utils.clip_grad.clip_grad_value_",
        "torch.nn.utils.clip_grad_norm", "torch.nn.utils.clip_grad.clip_grad_norm"}
DATALOADER = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
FLOAT16 = {"torch.float16", "torch.half"}
BFLOAT16 = {"torch.bfloat16"}


def kwarg(name: str, value: cst.BaseExpression) -> cst.Arg:
    """``name=value`` (no spaces around '=', no trailing comma)."""
    return cst.Arg(value, keyword=cst.Name(name),
                   equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))


def with_args(args, extra, first: bool = False) -> list:
    """``args`` with ``extra`` appended (or put first), ', ' between them.  An original last
    argument keeps its own trailing comma; an added last one gets none."""
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    seq = [*extra, *args] if first else [*args, *extra]
    added = {id(a) for a in extra}
    out = [a.with_changes(comma=comma) for a in seq[:-1]]
    if seq:
        last = seq[-1]
        out.append(last.with_changes(comma=cst.MaybeSentinel.DEFAULT) if id(last) in added else last)
    return out


def dotted(node: cst.CSTNode) -> Optional[str]:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    if isinstance(node, (cst.Name, cst.Attribute)):
        return get_full_name_for_node(node)
    return None


def arg(call: cst.Call, keyword: Optional[str] = None, position: Optional[int] = None) -> Optional[cst.Arg]:
    """The argument given by keyword, or at a position among the positional ones."""
    if keyword is not None:
        for a in call.args:
            if a.keyword is not None and a.keyword.value == keyword:
                return a
    if position is not None:
        pos = [a for a in call.args if a.keyword is None and not a.star]
        if position < len(pos):
            return pos[position]
    return None


def method_call(node: cst.CSTNode, *names: str) -> bool:
    """``<anything>.name(...)`` for one of names."""
    return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
            and node.func.attr.value in names)


def receiver(call: cst.Call) -> Optional[cst.BaseExpression]:
    return call.func.value if isinstance(call.func, cst.Attribute) else None


def walk(node: cst.CSTNode, into_functions: bool = False) -> Iterator[cst.CSTNode]:
    """Every node below ``node`` (pre-order), not entering nested defs/classes/lambdas."""
    stack = list(reversed(node.children))
    while stack:
        n = stack.pop()
        yield n
        if not into_functions and isinstance(n, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        stack.extend(reversed(n.children))


def loop_body_nodes(loop: cst.CSTNode, nested_loops: bool = False) -> Iterator[cst.CSTNode]:
    """Nodes in a loop's body (not its else), optionally skipping nested loops' bodies."""
    stack = [loop.body]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        if not nested_loops and isinstance(n, (cst.For, cst.While)) and n is not loop:
            continue
        stack.extend(reversed(n.children))


def is_optimizer_step(call: cst.CSTNode) -> bool:
    """``<opt>.step()`` on something named like an optimizer or a scaler."""
    if not method_call(call, "step"):
        return False
    name = (dotted(receiver(call)) or "").lower()
    return any(k in name for k in ("optim", "opt", "scaler")) and "sched" not in name


def is_training_loop(loop: cst.CSTNode) -> bool:
    """A loop whose own body (not a nested loop) runs a backward pass or an optimizer step."""
    for n in loop_body_nodes(loop):
        if method_call(n, "backward") or is_optimizer_step(n):
            return True
        if isinstance(n, cst.Call) and dotted(n.func) in ("torch.autograd.backward",):
            return True
    return False


def enclosing_loop(rule: Rule, node: cst.CSTNode) -> Optional[cst.CSTNode]:
    """The nearest For/While whose body holds ``node`` (stopping at function boundaries)."""
    child = node
    for anc in rule.ancestors(node):
        if isinstance(anc, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return None
        if isinstance(anc, (cst.For, cst.While)) and child is anc.body:
            return anc
        child = anc
    return None


def enclosing_function(rule: Rule, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
    for anc in rule.ancestors(node):
        if isinstance(anc, cst.FunctionDef):
            return anc
    return None


def autocast_call(rule: Rule, item_or_call: cst.CSTNode) -> Optional[cst.Call]:
    """The autocast call of a with-item / decorator, or None."""
    node = item_or_call.item if isinstance(item_or_call, cst.WithItem) else item_or_call
    if isinstance(node, cst.Decorator):
        node = node.decorator
    if isinstance(node, cst.Call) and rule.qnames(node) & AUTOCAST:
        return node
    return None


def autocast_dtype(rule: Rule, call: cst.Call) -> Optional[str]:
    """'float16', 'bfloat16', 'other' or None (not given: the device default)."""
    a = arg(call, "dtype")
    if a is None:
        return "bfloat16" if rule.qnames(call) & {"torch.cpu.amp.autocast"} else None
    names = rule.qnames(a.value)
    if names & FLOAT16:
        return "float16"
    if names & BFLOAT16:
        return "bfloat16"
    return "other"


def autocast_enabled_literal(call: cst.Call) -> Optional[bool]:
    a = arg(call, "enabled")
    if a is None:
        return True
    if isinstance(a.value, cst.Name) and a.value.value in ("True", "False"):
        return a.value.value == "True"
    return None  # a variable: unknown


def enclosing_autocast(rule: Rule, node: cst.CSTNode) -> Optional[cst.Call]:
    """The autocast call of the innermost ``with`` (in this function) that holds node."""
    for anc in rule.ancestors(node):
        if isinstance(anc, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return None
        if isinstance(anc, cst.With):
            for item in anc.items:
                c = autocast_call(rule, item)
                if c is not None:
                    return c
    return None


def is_modulo_guarded(rule: Rule, node: cst.CSTNode, stop: cst.CSTNode) -> bool:
    """Inside an ``if`` (body, not else) whose test uses ``%`` or compares a step counter, below stop."""
    child = node
    for anc in rule.ancestors(node):
        if anc is stop:
            return False
        if isinstance(anc, cst.If) and child is anc.body:
            for n in [anc.test, *walk(anc.test)]:
                if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Modulo):
                    return True
        child = anc
    return False


def import_of(rule: Rule, name: cst.Name) -> Optional[ImportSpec]:
    """The import statement that binds ``name`` where it is used, as an ImportSpec."""
    scope = rule.get_metadata(ScopeProvider, name, None)
    if scope is None:
        return None
    for a in scope[name.value]:
        if not isinstance(a, ImportAssignment):
            continue
        imp = a.node
        for alias in imp.names if not isinstance(imp.names, cst.ImportStar) else []:
            bound = alias.evaluated_alias or alias.evaluated_name
            if isinstance(imp, cst.Import):
                if bound == name.value:
                    return ImportSpec(alias.evaluated_name, None, alias.evaluated_alias)
            elif bound == name.value and imp.module is not None and not imp.relative:
                return ImportSpec(get_full_name_for_node(imp.module), alias.evaluated_name, alias.evaluated_alias)
    return None


def bound_by_imports(module: cst.Module, top: str) -> Set[str]:
    """Local names that imports of package ``top`` bind (``import torch.cuda.amp as amp`` -> amp)."""
    out: Set[str] = set()
    for n in walk(module, into_functions=True):
        if isinstance(n, cst.Import):
            for a in n.names:
                full = a.evaluated_name
                if full.split(".")[0] == top:
                    out.add(a.evaluated_alias or full.split(".")[0])
        elif isinstance(n, cst.ImportFrom) and not n.relative and n.module is not None:
            mod = get_full_name_for_node(n.module) or ""
            if mod.split(".")[0] == top and not isinstance(n.names, cst.ImportStar):
                out.update(a.evaluated_alias or a.evaluated_name for a in n.names)
    return out


def base_name(node: cst.CSTNode) -> Optional[cst.Name]:
    while isinstance(node, cst.Attribute):
        node = node.value
    return node if isinstance(node, cst.Name) else None


# --------------------------------------------------------------------------- tensors
_NOT_TENSOR_TORCH = ("torch.cuda.", "torch.device", "torch.no_grad", "torch.enable_grad", "torch.autocast",
                     "torch.amp.", "torch.is_", "torch.get_", "torch.set_", "torch.manual_seed", "torch.save",
                     "torch.load", "torch.utils.", "torch.nn.", "torch.optim.", "torch.distributed.",
                     "torch.backends.", "torch.inference_mode", "torch.compile", "torch.jit.")
_TENSOR_METHODS = {"sum", "mean", "max", "min", "norm", "abs", "sqrt", "float", "half", "double", "detach",
                   "to", "cuda", "clone", "view", "reshape", "argmax", "argmin", "eq", "ne", "gt", "lt",
                   "any", "all", "exp", "log", "pow", "squeeze", "unsqueeze", "softmax", "std", "var"}


def tensor_names(rule: Rule, scope_node: cst.CSTNode) -> Set[str]:
    """Names (dotted) that hold tensors in a function or loop, by a light forward inference.

    A name is a tensor if it is backward()'s receiver, or it is assigned from a torch function,
    from a call of a model or loss (something with .parameters()/.train()/.eval(), or built from
    torch.nn), from a tensor method of a tensor, or from arithmetic on tensors.
    """
    modules: Set[str] = set()
    tensors: Set[str] = set()
    assigns = []
    for n in walk(scope_node):
        if method_call(n, "parameters", "train", "eval", "named_parameters", "zero_grad") and receiver(n) is not None:
            d = dotted(receiver(n))
            if d and not any(k in d.lower() for k in ("optim", "opt", "scaler")):
                modules.add(d)
        if method_call(n, "backward") and dotted(receiver(n)):
            tensors.add(dotted(receiver(n)))
        if isinstance(n, cst.Assign):
            assigns.append((n.targets[0].target, n.value))
            if isinstance(n.value, cst.Call) and any(q.startswith("torch.nn.") for q in rule.qnames(n.value)):
                d = dotted(n.targets[0].target)
                if d:
                    modules.add(d)
        elif isinstance(n, (cst.AnnAssign, cst.AugAssign)) and n.value is not None:
            assigns.append((n.target, n.value))
    for _ in range(3):  # a few rounds reach fixed point for straight-line code
        for target, value in assigns:
            if is_tensor_expr(rule, value, tensors, modules):
                targets = target.elements if isinstance(target, (cst.Tuple, cst.List)) else [target]
                for t in targets:
                    el = t.value if isinstance(t, cst.Element) else t
                    d = dotted(el)
                    if d:
                        tensors.add(d)
    return tensors


def _model_like(name: str) -> bool:
    last = name.split(".")[-1].lower()
    return last in ("net", "network", "encoder", "decoder", "criterion", "loss_fn", "model") or last.endswith("model")


def is_tensor_expr(rule: Rule, expr: cst.CSTNode, tensors: Set[str], modules: Set[str] = frozenset()) -> bool:
    if dotted(expr) in tensors:
        return True
    if isinstance(expr, cst.Subscript):
        return is_tensor_expr(rule, expr.value, tensors, modules)
    if isinstance(expr, cst.BinaryOperation):
        return is_tensor_expr(rule, expr.left, tensors, modules) or is_tensor_expr(rule, expr.right, tensors, modules)
    if isinstance(expr, cst.UnaryOperation):
        return is_tensor_expr(rule, expr.expression, tensors, modules)
    if isinstance(expr, cst.Comparison):
        if any(isinstance(c.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn)) for c in expr.comparisons):
            return False
        return any(is_tensor_expr(rule, e, tensors, modules)
                   for e in [expr.left, *(c.comparator for c in expr.comparisons)])
    if isinstance(expr, cst.Call):
        if method_call(expr, *_TENSOR_METHODS):
            return is_tensor_expr(rule, receiver(expr), tensors, modules)
        if method_call(expr, "item", "tolist", "numpy", "cpu", "size", "dim", "numel"):
            return False
        names = rule.qnames(expr)
        if any(q.startswith(("torch.nn.functional.", "torch.special.", "torch.linalg.", "torch.fft."))
               or (q.startswith("torch.") and not q.startswith(_NOT_TENSOR_TORCH)) for q in names):
            return True
        d = dotted(expr.func)
        if d and (d in modules or _model_like(d)):
            return True
    return False


# --------------------------------------------------------------------------- GradScaler objects
def scaler_names(rule: Rule, module: cst.Module) -> Set[str]:
    """Dotted names that hold a GradScaler: assigned from its constructor, or the receiver of
    ``.scale(x)`` / ``.unscale_(opt)`` whose name says scaler."""
    names: Set[str] = set()
    for n in walk(module, into_functions=True):
        if isinstance(n, (cst.Assign, cst.AnnAssign)) and isinstance(n.value, cst.Call):
            if rule.qnames(n.value) & GRADSCALER:
                targets = [t.target for t in n.targets] if isinstance(n, cst.Assign) else [n.target]
                names.update(d for d in map(dotted, targets) if d)
        if method_call(n, "scale", "unscale_") and "scaler" in (dotted(receiver(n)) or "").lower():
            names.add(dotted(receiver(n)))
    return names


def is_scaler_call(node: cst.CSTNode, scalers: Set[str], *methods: str) -> bool:
    return method_call(node, *methods) and dotted(receiver(node)) in scalers


def scaled_backward(node: cst.CSTNode, scalers: Set[str]) -> bool:
    """``scaler.scale(loss).backward()``."""
    return method_call(node, "backward") and is_scaler_call(receiver(node), scalers, "scale")


def statement_of(rule: Rule, node: cst.CSTNode) -> Optional[cst.CSTNode]:
    """The simple statement line that holds node."""
    for anc in [node, *rule.ancestors(node)]:
        if isinstance(anc, cst.SimpleStatementLine):
            return anc
    return None


def line_of(rule: Rule, node: cst.CSTNode) -> int:
    from libcst.metadata import PositionProvider

    return rule.get_metadata(PositionProvider, node).start.line


def functions_and_module(module: cst.Module) -> List[cst.CSTNode]:
    """The module and every function in it: the units rules reason about, each on its own."""
    return [module, *(n for n in walk(module, into_functions=True) if isinstance(n, cst.FunctionDef))]
