"""A class that keeps the FP16_Optimizer it is handed (``Trainer(model, optimizer, args)``, with
``self.optimizer = optimizer`` in ``__init__`` and ``self.optimizer.backward(loss)`` in a
method).  The constructor takes the GradScaler too (keyword-only) and keeps it beside the
optimizer; the methods reach both on ``self``.

Found only where it can be followed whole: a top-level class of the project whose ``__init__``
stores the parameter once, in its own body; ``self.<attr>`` assigned nowhere else in the class;
no subclass among the files read; no instance's ``.<attr>`` read outside the class.  The fp16
flag the maker tests (``args.fp16``) is followed in too: ``self.args = args`` makes it
``self.args.fp16`` in the methods, so that their casts and warm-ups are found."""
from __future__ import annotations

import ast
from typing import List, Optional, Set

from ampfix.migration.groups import Refuse
from ampfix.model.semantic import dotted, walk


class Holder:
    """``cls`` keeps the optimizer its ``__init__`` receives as ``param`` in ``self.<attr>``; the
    scaler goes in ``self.<scaler>``."""

    def __init__(self, init, param: str, attr: str, store: ast.stmt, scaler: str) -> None:
        self.init = init
        self.cls = init.cls
        self.module = init.module
        self.param = param
        self.attr = attr
        self.store = store
        self.scaler = scaler
        #: the maker's fp16 flag and model names as the methods read them (set once the flag is known)
        self.flag: Optional[str] = None
        self.models: Set[str] = set()

    @property
    def opt(self) -> str:
        return "self." + self.attr

    def method_of(self, node) -> bool:
        """Whether ``node`` is in a method of the class (a closure in one counts)."""
        f = self.module.function_of(node)
        while f is not None and f.cls is None and f.outer is not None:
            f = f.outer
        return f is not None and f.cls is self.cls


def _self_attr(t) -> Optional[str]:
    return t.attr if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" else None


def holder_of(project, init, param: str, taken: Set[str], names=("scaler", "grad_scaler", "amp_scaler")) -> Holder:
    """The :class:`Holder` for the constructor ``init`` that receives the optimizer as ``param``,
    or :class:`Refuse` with the reason it cannot be followed."""
    cls, m = init.cls, init.module
    name = cls.name
    if cls not in m.tree.body:
        raise Refuse(f"`{name}` receives the optimizer and is not a top-level class of {m.path}: pass the scaler "
                     "there by hand")
    stores = [s for s in init.node.body if isinstance(s, ast.Assign) and len(s.targets) == 1
              and _self_attr(s.targets[0]) and isinstance(s.value, ast.Name) and s.value.id == param]
    if len(stores) != 1:
        raise Refuse(f"`{init.qualname}` does not keep `{param}` on self in one statement of its own body: pass the "
                     "scaler there by hand")
    store = stores[0]
    attr = _self_attr(store.targets[0])
    for n in walk(init.node, into_functions=True):
        if isinstance(n, ast.Name) and n.id == param and not isinstance(n.ctx, ast.Load):
            raise Refuse(f"`{init.qualname}` binds `{param}` again (line {n.lineno}): pass the scaler there by hand")
    attrs = set()
    for n in walk(cls, into_functions=True):
        if isinstance(n, ast.Attribute):
            attrs.add(n.attr)
            if n.attr == attr and not isinstance(n.ctx, ast.Load) and getattr(n, "_p", None) is not store:
                raise Refuse(f"`self.{attr}` is set again at line {n.lineno} of `{name}`: pass the scaler there "
                             "by hand")
    for other in list(project.modules.values()):
        for n in walk(other.tree, into_functions=True):
            if isinstance(n, ast.ClassDef) and any((dotted(b) or "").split(".")[-1] == name for b in n.bases):
                raise Refuse(f"`{n.name}` ({other.path} line {n.lineno}) subclasses `{name}`, which keeps the "
                             "optimizer: pass the scaler there by hand")
    scaler = next((x for x in names if x not in attrs), None)
    if scaler is None:
        raise Refuse(f"`{name}` already uses every attribute name the scaler could take: pass it there by hand")
    if any(isinstance(n, ast.Name) and n.id in taken for n in walk(init.node, into_functions=True)) or \
            any(t in init.positional or t in init.kwonly for t in taken):
        raise Refuse(f"`{init.qualname}` already has a `{sorted(taken)[0]}`: pass the scaler there by hand")
    return Holder(init, param, attr, store, scaler)


def instance_reads(holder: Holder, sites) -> List[ast.AST]:
    """``trainer.optimizer`` outside the class, where ``trainer`` is an instance the callers made:
    the optimizer reached around the class."""
    out = []
    for cs in sites:
        st = getattr(cs.node, "_p", None)
        if not (isinstance(st, ast.Assign) and st.value is cs.node):
            continue
        names = {t.id for t in st.targets if isinstance(t, ast.Name)}
        unit = cs.caller.node if cs.caller is not None else cs.module.tree
        for n in walk(unit, into_functions=True):
            if isinstance(n, ast.Attribute) and n.attr == holder.attr and isinstance(n.value, ast.Name) and \
                    n.value.id in names:
                out.append(n)
    return out


def name_in(holder: Holder, call, flag: Optional[str]) -> Optional[str]:
    """A name of the maker (the fp16 flag ``args.fp16``, the model) as the methods of the class
    read it (``self.args.fp16``, where ``__init__`` keeps the ``args`` the call hands it)."""
    if flag is None:
        return None
    head, _, rest = flag.partition(".")
    init = holder.init
    pos = init.positional[1:]
    param = None
    for i, a in enumerate(call.args):
        if isinstance(a, ast.Name) and a.id == head and i < len(pos):
            param = pos[i]
    for k in call.keywords:
        if isinstance(k.value, ast.Name) and k.value.id == head and k.arg:
            param = k.arg
    if param is None:
        return None
    for s in init.node.body:
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and _self_attr(s.targets[0]):
            if isinstance(s.value, ast.Name) and s.value.id == param:
                return "self." + _self_attr(s.targets[0]) + ("." + rest if rest else "")
            if rest and dotted(s.value) == param + "." + rest:
                return "self." + _self_attr(s.targets[0])
    return None
