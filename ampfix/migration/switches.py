"""A scaled backward under its object's own switch, with no ``amp.initialize`` on any path to it.

::

    class Trainer:                                  # trainer.py
        def __init__(self, ..., use_amp=None):
            self.use_amp = use_amp
        def backward(self, loss):
            if self.use_amp:
                with amp.scale_loss(loss, self.optimizer) as scaled_loss: ...

    def build_optimizer(model, ..., use_amp=None):  # optimization.py
        if use_amp:
            model, optimizer = amp.initialize(model, optimizer, opt_level=use_amp)
        return model, optimizer

The caller hands the same setting to both; nothing carries a value from the initialize to the
trainer.  apex raises in ``scale_loss`` unless ``initialize`` ran, so in every run that worked
the switch *is* "AMP on": the GradScaler is made where the switch is set (``__init__``, enabled
by it), every method of the class reaches it as ``self.scaler``, and the initialize of the setup
goes: one group, planned as a whole.  Paired only when every use that needs the scaler then
reaches one, and some initialize in the project has no scaled backward of its own (else the
initialize is in code not given, and the trainer is left alone).
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ampfix.migration.flow import ancestors_stmts, block_of, guards, stmt_of
from ampfix.migration.seeds import Seed, Use
from ampfix.model.semantic import dotted, walk


class SwitchSeed(Seed):
    """Where the scaler of a switched trainer is made: right after ``self.<switch> = ...`` in
    ``__init__``; ``switch`` is what the guard of the scaled backward reads (``self.use_amp``)."""

    def __init__(self, use: Use, idx: int, init, stmt: ast.stmt, switch: str) -> None:
        super().__init__(use, idx)
        self.module = init.module
        self.func = init
        self.call = None
        self.stmt = stmt
        self.switch = switch
        self.training = True


def switch_test(use: Use) -> Optional[Tuple[ast.If, str]]:
    """The ``if self.<attr>:`` (or ``if <parameter>:``) that alone guards the ``with
    amp.scale_loss`` of ``use`` in its function: (the if, what it tests), or None."""
    f = use.func
    if f is None or use.call is None:
        return None
    w = stmt_of(use.node)
    if not isinstance(w, (ast.With, ast.AsyncWith)):
        return None
    gs = guards(w, f.node)
    if len(gs) != 1 or any(isinstance(a, ast.If) and a is not gs[0] for a in ancestors_stmts(w, f.node)):
        return None
    test = gs[0].test
    if isinstance(test, ast.Call) and dotted(test.func) == "bool" and len(test.args) == 1 and not test.keywords:
        test = test.args[0]
    if isinstance(test, ast.Name) and test.id in [*f.positional[1 if f.is_method else 0:], *f.kwonly]:
        return gs[0], test.id
    chain = dotted(test) if isinstance(test, ast.Attribute) and f.is_method else None
    if not chain or not chain.startswith(f.positional[0] + "."):
        return None
    return gs[0], chain


def _homes(project, func, test: str, depth: int = 0) -> Optional[List[tuple]]:
    """Where the switch ``test`` (``self.<attr>...`` or a parameter of ``func``) is set: a list
    of (the __init__, its statement, the switch there), one per class; None where a caller
    passes the switch other than from its own object (or its own parameter, followed up)."""
    if "." in test:
        home = switch_home(project, func, test)
        return None if home is None else [(*home, home[0].positional[0] + "." + test.split(".", 1)[1])]
    sites = project.callers(func)
    if depth > 2 or not sites or project.references(func):
        return None
    out: List[tuple] = []
    for cs in sites:
        a = cs.argument(test)
        if cs.caller is None or a is None:
            return None
        if isinstance(a, ast.Name) and a.id in [*cs.caller.positional, *cs.caller.kwonly]:
            got = _homes(project, cs.caller, a.id, depth + 1)
        elif isinstance(a, ast.Attribute) and cs.caller.is_method and \
                (dotted(a) or "").startswith(cs.caller.positional[0] + "."):
            got = _homes(project, cs.caller, dotted(a), depth + 1)
        else:
            return None
        if got is None:
            return None
        out.extend(got)
    return out


def _stores(cls: ast.ClassDef, attr: str, self_name: str) -> List[ast.AST]:
    """Every store to ``self.<attr>`` in the methods of ``cls``."""
    out = []
    for n in walk(cls, into_functions=True):
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and n.attr == attr and \
                isinstance(n.value, ast.Name) and n.value.id == self_name:
            out.append(n)
    return out


def switch_home(project, f, chain: str):
    """``self.<attr> = ...`` as a statement of its own at the top of the class's ``__init__``
    (its own or a project base's), the only store to it in the class of the method ``f``: (the
    __init__, the statement), or None."""
    if not f.is_method:
        return None
    attr = chain.split(".")[1]
    init = project.method(f.module, f.cls, "__init__")
    if init is None or not init.is_method:
        return None
    me = init.positional[0]
    top = [s for s in init.node.body if isinstance(s, ast.Assign) and len(s.targets) == 1
           and isinstance(s.targets[0], ast.Attribute) and s.targets[0].attr == attr
           and isinstance(s.targets[0].value, ast.Name) and s.targets[0].value.id == me]
    if len(top) != 1:
        return None
    for cls in {id(init.cls): init.cls, id(f.cls): f.cls}.values():
        stores = _stores(cls, attr, me if cls is init.cls else f.positional[0])
        if any(n is not top[0].targets[0] for n in stores):
            return None
    return init, top[0]


def find_switches(project, failing: List[Use], first_idx: int,
                  unswitched: Optional[List[Use]] = None) -> Optional[List[SwitchSeed]]:
    """The switch seeds for the scaled backwards no initialize reaches: one per ``__init__``;
    None unless every one of them is switched that way.  With ``unswitched`` (a list), a scaled
    backward with no switch of its own (another project of the repository, an apex loss-scaler
    class of a classifier beside a detector) is put there instead, and the others still get
    theirs; the caller decides whether they are apart enough."""
    scaled = [u for u in failing if u.kind == "scale_loss"]
    if not scaled:
        return None
    by_init: Dict[int, SwitchSeed] = {}
    idx = first_idx
    for u in scaled:
        got = switch_test(u)
        homes = _homes(project, u.func, got[1]) if got is not None else None
        if not homes:
            if unswitched is None:
                return None
            unswitched.append(u)
            continue
        for init, stmt, switch in homes:
            known = by_init.get(id(stmt))
            if known is not None:
                if known.switch != switch:
                    return None
                continue
            by_init[id(stmt)] = SwitchSeed(u, idx, init, stmt, switch)
            idx += 1
    return list(by_init.values()) or None


def _names_in(expr) -> List[str]:
    """The names an argument hands over: itself, or the values of a ``dict(...)`` / ``{...}`` /
    list / tuple literal it builds."""
    if isinstance(expr, ast.Name):
        return [expr.id]
    if isinstance(expr, ast.Call) and dotted(expr.func) == "dict" and not expr.args:
        return [n for k in expr.keywords for n in _names_in(k.value)]
    if isinstance(expr, ast.Dict):
        return [n for v in expr.values for n in _names_in(v)]
    if isinstance(expr, (ast.List, ast.Tuple)):
        return [n for e in expr.elts for n in _names_in(e)]
    return []


def handed_to_framework(project, s: Seed) -> bool:
    """``build_runner(cfg.runner, default_args=dict(model=model, optimizer=optimizer))``: after
    the initialize, the optimizer it made is handed to code outside the project (a framework's
    runner), which drives the steps from then on."""
    names = s.target_names
    if s.func is None:
        return False
    model, opt = (names[0], names[1]) if len(names) > 1 else (None, None)
    if not opt or not model or "." in opt or "." in model:
        return False
    for n in walk(s.func.node):
        if not isinstance(n, ast.Call) or n.lineno <= s.stmt.end_lineno:
            continue
        # the model (or what wraps it) and the optimizer go to one object: a runner, not a scheduler
        handed = [x for a in [*n.args, *(k.value for k in n.keywords)] for x in _names_in(a)]
        if opt in handed and model in handed and project.resolve(s.module, n.func)[0] is None:
            return True
    return False


def framework_autocast(s: Seed) -> bool:
    """``for m in model.modules(): if hasattr(m, "fp16_enabled"): m.fp16_enabled = True`` right
    after the initialize, in its block: a framework's own mixed-precision switch (mmcv's
    ``auto_fp16`` runs the decorated forward passes under ``torch.autocast`` when it is set, from
    mmcv 1.3 on)."""
    models = {n for n in s.target_names if n}
    block = block_of(s.stmt)[2]
    if not any(x is s.stmt for x in block or ()):
        return False
    after = block[next(i for i, x in enumerate(block) if x is s.stmt) + 1:]
    for st in after:
        if not (isinstance(st, ast.For) and isinstance(st.target, ast.Name) and isinstance(st.iter, ast.Call)
                and isinstance(st.iter.func, ast.Attribute) and st.iter.func.attr == "modules"
                and dotted(st.iter.func.value) in models and not st.orelse):
            continue
        var = st.target.id
        body = st.body
        if len(body) == 1 and isinstance(body[0], ast.If) and not body[0].orelse:
            body = body[0].body
        if len(body) == 1 and isinstance(body[0], ast.Assign) and len(body[0].targets) == 1 and \
                dotted(body[0].targets[0]) == f"{var}.fp16_enabled" and \
                isinstance(body[0].value, ast.Constant) and body[0].value.value is True:
            return True
    return False


def built_by_configuration(project, seeds: List[SwitchSeed]) -> bool:
    """No call in the project builds the classes whose __init__ makes the scaler (a registry
    builds them from the configuration): nothing can hand their scaler to other code."""
    return bool(seeds) and all(not project.callers(s.func) and not project.references(s.func) for s in seeds)


def low_mmcv_floors(project, paths: List[str]) -> List[tuple]:
    """``mmcv_minimum_version = '1.2.4'`` at the top of a module (the package ``__init__`` that
    checks the installed mmcv at import), below 1.3: there mmcv's ``auto_fp16`` casts the inputs
    to float16 without autocast, so a forward migrated onto it would stop on a dtype mismatch.
    (module, statement) pairs; the top packages of ``paths`` are read for them."""
    for path in paths:
        d, top = Path(path).parent, None
        while (d / "__init__.py").is_file():
            top, d = d.name, d.parent
        if top:
            project.module_named(top)
    out = []
    for m in list(project.modules.values()):
        for st in m.tree.body:
            if not (isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name)
                    and st.targets[0].id == "mmcv_minimum_version" and isinstance(st.value, ast.Constant)
                    and isinstance(st.value.value, str)):
                continue
            parts = st.value.value.split(".")
            if all(x.isdigit() for x in parts) and tuple(int(x) for x in parts[:2]) < (1, 3):
                out.append((m, st))
    return out
