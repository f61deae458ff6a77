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
