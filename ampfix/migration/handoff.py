"""Where a call hands the optimizer: the parameter that receives it, and the objects that only
read it (a learning-rate schedule), shared by the apex.amp and FP16_Optimizer planners."""
from __future__ import annotations

import ast
import re
from typing import Optional

from ampfix.model.semantic import dotted, walk

#: a schedule, by its name (``CosineLRScheduler``, ``LambdaLR``, ``WarmupLinearSchedule``,
#: ``get_linear_schedule_with_warmup``): handed the optimizer, it sets learning rates and trains nothing
SCHEDULE = re.compile(r"(?i:sched)|LR(?:[A-Z]|$)")


def param_given(call: ast.Call, arg, f, bound) -> Optional[str]:
    """The parameter of ``f`` that ``call`` gives ``arg`` (a node of its arguments); None where
    ``f`` is unknown or the argument lands in ``*args``."""
    if f is None:
        return None
    for k in call.keywords:
        if k.value is arg:
            return k.arg
    pos = f.positional[1:] if bound else f.positional
    for i, a in enumerate(call.args):
        if a is arg:
            return pos[i] if i < len(pos) and not isinstance(a, ast.Starred) else None
    return None


def schedule_class(f) -> bool:
    """``f`` is the ``__init__`` of a project class named as a schedule (``WarmupLinearSchedule``,
    a copy of transformers' ``optimization.py``) none of whose code trains: no backward, no
    ``scale_loss``, no ``step`` of an optimizer.  Handed the optimizer, it keeps it to set its
    learning rate, and takes the plain optimizer as it took apex's."""
    if f is None or f.node.name != "__init__" or f.cls is None or not SCHEDULE.search(f.cls.name):
        return False
    return not any(isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute) and (
        x.func.attr in ("backward", "scale_loss") or x.func.attr == "step" and "optim" in (
            dotted(x.func.value) or "").lower()) for x in walk(f.cls, into_functions=True))


#: what a plain optimizer and apex's wrappers do alike: the learning rates, zeroing, and the
#: state a checkpoint keeps (what it holds changes, and the plan's note says so, wherever it is read)
_PLAIN_ATTRS = ("param_groups", "zero_grad", "state_dict", "load_state_dict")


def reads_plain_optimizer(f, param: str) -> bool:
    """Every read of ``param`` in ``f`` is ``param.param_groups`` or a call of ``param.zero_grad()``,
    ``.state_dict()``, ``.load_state_dict(...)`` (a learning-rate setter, ``set_lr(optimizer, step,
    ...)``; a checkpoint helper): ``f`` takes the plain optimizer as it took the wrapper, and a
    scaler handed to it would be a parameter nothing reads.  False where ``param`` is stored,
    rebound or handed on, or read in a nested function."""
    seen = False
    for x in walk(f.node, into_functions=True):
        if isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and x is not f.node:
            if any(isinstance(y, ast.Name) and y.id == param for y in walk(x, into_functions=True)):
                return False
            continue
        if not (isinstance(x, ast.Name) and x.id == param):
            continue
        parent = getattr(x, "_p", None)
        if not isinstance(x.ctx, ast.Load) or not (isinstance(parent, ast.Attribute) and parent.value is x
                                                    and parent.attr in _PLAIN_ATTRS):
            return False
        if parent.attr != "param_groups" and not (isinstance(getattr(parent, "_p", None), ast.Call)
                                               and parent._p.func is parent):
            return False
        seen = True
    return seen
