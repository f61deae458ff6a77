"""Run ``ampfix migrate`` over the public corpus as a user would, and tabulate each module.

    python bench/corpus.py materialize --out /tmp/corpus       # once, from fetched mirrors
    python bench/migrate_corpus.py /tmp/corpus --out bench/results/corpus

For each repository a copy is migrated with ``migrate --write``; then every module that used
apex.amp or an FP16_Optimizer is classified: *migrated* (no such use left) or *refused* (with
the reason ampfix gives).  Also recorded for every written file: whether it compiles (a file whose
original did not compile either, a keyword given twice, is counted apart), whether a
second ``migrate`` changes anything (it must not), which self-check problems (AMP106, AMP203-207,
AMP211-214) appear that the original did not have, and host syncs the rewrite added
(``.get_scale()``, ``.item()``, ``.cpu()``, ``.tolist()`` calls more than the original had).
A migrated module is *right* when its file compiles, adds no self-check problem, no host sync
no call of a GradScaler method on a name that is also bound to None with no test of it around
the call (``scaler = None`` on the path without AMP: an AttributeError there), no tensor of a
bfloat16 autocast region handed to numpy (``--dtype bfloat16``: numpy has no bfloat16), and no undefined
name pyflakes did not find in the original (with ruff installed); otherwise it is *broken*.
Unused locals, imports and redefinitions the rewrite added are counted as debris.  Files where the
rewrite left a GradScaler that nothing reads (dead code) are counted too.  The summary is given for
the whole corpus and for its two sides (the manifest's holdout, and the rest).  A parameter the
rewrite made required that a call found in the repository does not pass (matched as Python binds
names: a script's own function of that name is not the one) makes the module broken; one with no
call found at all is counted apart: nothing here can say it is passed.  Writes ``corpus.json`` and
``corpus.md``.

    python bench/migrate_corpus.py merge RUN/corpus.json LATE/corpus.json --out DIR

joins runs of one snapshot over disjoint repositories (a batch added while the rest was measured)
into one summary, holdout and batches read from the manifest.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Optional

MANIFEST = Path(__file__).resolve().parent / "corpus" / "manifest.json"
#: host syncs a rewrite might add (apex's own to_python_float(x) is one too: it becomes x.item())
SYNCS = (".get_scale()", ".item()", ".cpu()", ".tolist()", "to_python_float(")

AMP = ("AMP101",)
FP16 = ("AMP102",)
SELF = ("AMP106", "AMP203", "AMP204", "AMP205", "AMP206", "AMP207", "AMP211", "AMP212", "AMP213", "AMP214")


def steps_without_update(text: str) -> list:
    """Lines of a ``scaler.step(opt)`` in a loop whose body calls no scaler's ``update()``: its next
    iteration steps again before an update, and GradScaler raises ("step() has already been called
    since the last update()").  A step of each optimizer in a loop over them (``for opt in opts:
    scaler.step(opt)``, the update after the loop) is not one."""
    import ast

    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    parent = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}

    def scaler_call(n, attr) -> bool:
        return isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == attr and \
            "scaler" in ast.unparse(n.func.value).lower()

    out = []
    for n in ast.walk(tree):
        if not scaler_call(n, "step"):
            continue
        p = parent.get(n)
        while p is not None and not isinstance(p, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef,
                                                   ast.AsyncFunctionDef, ast.Lambda)):
            p = parent.get(p)
        if not isinstance(p, (ast.For, ast.AsyncFor, ast.While)):
            continue
        if isinstance(p, (ast.For, ast.AsyncFor)):
            targets = {x.id for x in ast.walk(p.target) if isinstance(x, ast.Name)}
            if any(isinstance(x, ast.Name) and x.id in targets for a in n.args for x in ast.walk(a)):
                continue  # one step per optimizer of a loop over them
        if not any(scaler_call(x, "update") for st in p.body for x in ast.walk(st)):
            out.append(n.lineno)
    return out


def half_models(text: str) -> list:
    """Lines where a function (or the module) that scales with a GradScaler also makes a model it
    optimizes float16: ``model.half()``, ``model = model.half()``, ``model = network_to_half(model)``
    (any call named *half*/*fp16* given the model), the model being a name whose ``.parameters()`` the
    same unit reads.  GradScaler cannot unscale float16 gradients: where such a line runs on the AMP
    path the step raises (read each: a line on another path is not one)."""
    import ast
    import re

    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    out = []
    for unit in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        nodes = [x for st in unit.body for x in ast.walk(st)]
        if not any(isinstance(x, ast.Call) and ast.unparse(x.func).endswith("GradScaler") for x in nodes) and not any(
                isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute) and x.func.attr == "scale"
                and "scaler" in ast.unparse(x.func.value).lower() for x in nodes):
            continue
        models = {ast.unparse(x.func.value) for x in nodes if isinstance(x, ast.Call)
                  and isinstance(x.func, ast.Attribute) and x.func.attr in ("parameters", "named_parameters")}
        # `model = Net().cuda().half()`: the assignment's target is the model
        assigned = {id(v): ast.unparse(a.targets[0]) for a in nodes if isinstance(a, ast.Assign)
                    and len(a.targets) == 1 for v in ast.walk(a.value)}
        for x in nodes:
            if not isinstance(x, ast.Call):
                continue
            if isinstance(x.func, ast.Attribute) and x.func.attr == "half" and not x.args:
                base = x.func.value
                while isinstance(base, ast.Call) and isinstance(base.func, ast.Attribute):
                    base = base.func.value
                if ast.unparse(base) in models or assigned.get(id(x)) in models:
                    out.append(x.lineno)
            elif re.search(r"(?i)half|fp16", name := ast.unparse(x.func).rsplit(".", 1)[-1]) and x.args and \
                    ast.unparse(x.args[0]) in models and not re.search(r"(?i)load|save|state", name):
                # `load_state_dict_flexible_with_fp16(model, sd)` loads weights into the model: no cast
                out.append(x.lineno)
    return sorted(set(out))


def module_names(text: str) -> set:
    """The names a module binds at its top level (also inside a top-level ``try``/``if``/``with``):
    what another module may import from it."""
    import ast

    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    out = set()
    todo = list(tree.body)
    while todo:
        st = todo.pop()
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(st.name)
        elif isinstance(st, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in st.names if a.name != "*"}
        elif isinstance(st, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in (st.targets if isinstance(st, ast.Assign) else [st.target]):
                out |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                todo.extend(x for x in getattr(st, field, []) or [] if isinstance(x, ast.AST))
    return out


def importers_of_removed(rel: str, before: str, after: str, others: dict) -> list:
    """``file: from X import name`` in the other files (``others``: path -> text, after the
    migration) for each top-level name of ``rel`` that the migration removed, where ``X`` names
    ``rel`` (its dotted name is a tail of ``rel``'s dotted path, or a relative import reaches its file): that
    import now raises ImportError."""
    import ast
    import posixpath

    gone = module_names(before) - module_names(after)
    if not gone:
        return []
    rel = rel.replace("\\", "/")
    # the file's dotted path: an absolute import names it by a tail of it (`pkg.modeling` for
    # src/pkg/modeling.py; not `lxrt.modeling`, another package's module of that name)
    dotted = (posixpath.dirname(rel) if rel.endswith("/__init__.py") else posixpath.splitext(rel)[0]).split("/")
    out = []
    for other, text in others.items():
        if other == rel or not any(n in text for n in gone):
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for st in ast.walk(tree):
            if not isinstance(st, ast.ImportFrom):
                continue
            hit = sorted({a.name for a in st.names} & gone)
            if not hit:
                continue
            if st.level:
                folder = posixpath.dirname(other)
                for _ in range(st.level - 1):
                    folder = posixpath.dirname(folder)
                parts = (st.module or "").split(".") if st.module else []
                target = posixpath.join(folder, *parts)
                if target + ".py" != rel and posixpath.join(target, "__init__.py") != rel:
                    continue
            elif not st.module or dotted[-len(st.module.split(".")):] != st.module.split("."):
                continue
            out.extend(f"{other} line {st.lineno}: {n}" for n in hit)
    return out


def _keyword_calls(tree) -> "Counter":
    """(called name, keyword) of every call with a keyword argument (``f(x, scaler=s)`` and
    ``obj.f(x, scaler=s)`` both give ("f", "scaler"))."""
    import ast

    out = Counter()
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            name = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", None)
            if name:
                for k in n.keywords:
                    if k.arg:
                        out[(name, k.arg)] += 1
    return out


def unaccepted_keywords(before: str, after: str, others: dict) -> list:
    """``f(..., kw=...)`` calls the migration added (a (name, keyword) pair more often after than
    before) where ``f`` is defined in the project (``others``: path -> text, after the migration)
    and no definition of that name takes ``kw`` (nor ``**kwargs``): a TypeError when it runs (a
    callee whose file was not rewritten with its callers)."""
    import ast

    try:
        new = _keyword_calls(ast.parse(after)) - _keyword_calls(ast.parse(before))
    except SyntaxError:
        return []
    if not new:
        return []
    names = {f for f, _ in new}
    defs: dict = {}
    for text in others.values():
        if not any(f"def {n}(" in text for n in names):
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for d in ast.walk(tree):
            if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) and d.name in names:
                a = d.args
                takes = None if a.kwarg else {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
                defs.setdefault(d.name, []).append(takes)
    out = []
    for (f, kw), _ in sorted(new.items()):
        seen = defs.get(f)
        if seen and all(t is not None and kw not in t for t in seen):
            out.append(f"`{f}(..., {kw}=...)`: no `{f}` of the project takes `{kw}`")
    return out


def unused_scalers(text: str) -> list:
    """Lines where a GradScaler is bound to a name that its function (or module) never reads: dead
    code a migration must not leave (issue 21 §3)."""
    import ast

    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    out = []
    for unit in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        body = unit.body
        loads = {n.id for st in body for n in ast.walk(st) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        for st in body:
            for n in ast.walk(st):
                if (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
                        and isinstance(n.value, ast.Call)
                        and (ast.unparse(n.value.func).endswith("GradScaler"))
                        and n.targets[0].id not in loads):
                    if unit is tree or not any(isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef)) and
                                               x is not unit and n in ast.walk(x) for x in ast.walk(unit)):
                        out.append(n.lineno)
    # a scaler made and, right after, made again in its place: the first one is dead, and the
    # second decides alone whether AMP runs (two initialize calls in the branches of an if)
    def made(st):
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.value, ast.Call) and \
                ast.unparse(st.value.func).endswith("GradScaler"):
            return ast.unparse(st.targets[0])
        return None

    for n in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(n, field, None)
            if isinstance(block, list):
                for a, b in zip(block, block[1:]):
                    if made(a) is not None and made(a) == made(b):
                        out.append(a.lineno)
    return sorted(set(out))


SCALER_METHODS = {"scale", "unscale_", "step", "update", "get_scale", "is_enabled", "state_dict", "load_state_dict"}


def bf16_numpy(text: str) -> list:
    """Lines where a tensor a bfloat16 ``torch.autocast`` region computed (not a loss: autocast
    computes those in float32) reaches ``.numpy()`` through calls that keep its dtype
    (``logits.detach().cpu().numpy()``): numpy has no bfloat16, so the call fails at run time.

    A name bound again after the regions, on the straight way to the call (a statement of a block
    that holds the call, or of a ``with`` body there), from nothing the regions made or through a
    conversion that fixes its dtype (``x = x.cuda().float()``), holds a new value: the evaluation
    loop's ``logits = model(...)`` under ``torch.no_grad()``.  It counts unless a binding from the
    region's values comes between it and the call."""
    import ast

    from ampfix.migration.flow import assigned, loss_call, read, same_dtype_root

    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    parent = {}
    for n in ast.walk(tree):
        for c in ast.iter_child_nodes(n):
            parent[c] = n

    def fixed_dtype(expr) -> bool:
        """``x.float()``, ``x.cuda().long()``: a conversion that leaves no bfloat16."""
        while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
            if expr.func.attr in ("float", "double", "long", "int", "bool"):
                return True
            expr = expr.func.value
        return False

    def home(st):
        """The statement that stands for `st` in the blocks around it: a ``with`` body runs whole."""
        while isinstance(parent.get(st), ast.With) and st in parent[st].body:
            st = parent[st]
        return st

    def blocks_to(node):
        """(block, index) of each statement holding `node`, innermost first."""
        out, cur = [], node
        while cur in parent:
            up = parent[cur]
            for field in ("body", "orelse", "finalbody", "handlers"):
                block = getattr(up, field, None)
                if isinstance(block, list) and cur in block:
                    out.append((id(block), block.index(cur)))
            cur = up
        return out

    def on_the_way(k, call) -> bool:
        """Whether every way to `call` goes through `k`: it stands before the call's statement in
        a block that holds it."""
        k = home(k)
        up = parent.get(k)
        for field in ("body", "orelse", "finalbody"):
            block = getattr(up, field, None)
            if isinstance(block, list) and k in block:
                at = block.index(k)
                return any(b == id(block) and i > at for b, i in blocks_to(call))
        return False

    out = []
    for fn in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        body = [n for st in fn.body for n in ast.walk(st)] if fn is not tree else [
            n for st in tree.body if not isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            for n in ast.walk(st)]
        made, losses, end = set(), set(), None
        for w in body:
            if isinstance(w, ast.With) and any("autocast" in ast.unparse(i.context_expr) and "bfloat16" in
                                               ast.unparse(i.context_expr) for i in w.items):
                for st in ast.walk(w):
                    if isinstance(st, (ast.Assign, ast.AugAssign)):
                        got = assigned(st)
                        if loss_call(st.value) or (got <= losses and read(st.value) & losses):
                            losses |= got
                        else:
                            made |= got
                end = max(end or 0, w.end_lineno)
        made -= losses
        if not made:
            continue
        gens, kills = [], []
        for n in sorted((n for n in body if getattr(n, "lineno", 0) > end), key=lambda n: (n.lineno, n.col_offset)):
            if isinstance(n, ast.Assign) and same_dtype_root(n.value) in made:
                made |= assigned(n)
                gens.append(n)
            elif isinstance(n, ast.Assign) and (not read(n.value) & made or fixed_dtype(n.value)):
                kills.append(n)
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "numpy" and \
                    same_dtype_root(n.func.value) in made:
                name = same_dtype_root(n.func.value)
                fresh = [k for k in kills if name in assigned(k) and k.lineno < n.lineno and on_the_way(k, n)]
                if fresh and not any(name in assigned(g) and fresh[-1].lineno < g.lineno < n.lineno for g in gens):
                    continue
                out.append(n.lineno)
    return sorted(set(out))


def none_scaler_calls(text: str) -> list:
    """Lines that call a GradScaler method on a name its function (or the module) also binds to
    None (``scaler = None`` / ``amp, scaler = None, None``), outside any ``if`` that tests that
    name: on the path where it stays None the call raises AttributeError."""
    import ast

    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    parent = {}
    for n in ast.walk(tree):
        for c in ast.iter_child_nodes(n):
            parent[c] = n

    def unit_of(n):
        p = parent.get(n)
        while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            p = parent.get(p)
        return p or tree

    nones = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                pairs = zip(t.elts, n.value.elts) if isinstance(t, ast.Tuple) and isinstance(n.value, ast.Tuple) \
                    and len(t.elts) == len(n.value.elts) else [(t, n.value)]
                for a, v in pairs:
                    if isinstance(a, ast.Name) and isinstance(v, ast.Constant) and v.value is None:
                        nones.add((id(unit_of(n)), a.id))
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = n.args
            for a, d in zip(args.args[len(args.args) - len(args.defaults):], args.defaults):
                if isinstance(d, ast.Constant) and d.value is None:
                    nones.add((id(n), a.arg))
            for a, d in zip(args.kwonlyargs, args.kw_defaults):
                if isinstance(d, ast.Constant) and d.value is None:
                    nones.add((id(n), a.arg))
    def guarded(node, name) -> bool:
        """Under a test of ``name`` (``if scaler is not None:``, ``scaler and ...``)."""
        p = parent.get(node)
        while p is not None:
            if isinstance(p, (ast.If, ast.IfExp, ast.While)) and any(
                    isinstance(x, ast.Name) and x.id == name for x in ast.walk(p.test)):
                return True
            if isinstance(p, ast.BoolOp) and any(isinstance(x, ast.Name) and x.id == name
                                                 for v in p.values for x in ast.walk(v)):
                return True
            p = parent.get(p)
        return False

    # one call deep: `train(..., scaler)` from a function where `scaler` may be None
    defs = {d.name: d for d in tree.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in defs:
            d = defs[n.func.id]
            params = [a.arg for a in [*d.args.posonlyargs, *d.args.args]]
            given = [*zip(params, n.args), *((k.arg, k.value) for k in n.keywords if k.arg)]
            for param, v in given:
                if isinstance(v, ast.Name) and (id(unit_of(n)), v.id) in nones and not guarded(n, v.id):
                    nones.add((id(d), param))
    # `if scaler is None: scaler = GradScaler(enabled=False)` in the function's own body: after
    # it the name is never None
    defaulted = {}
    for d in ast.walk(tree):
        if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for st in d.body:
                t = st.test if isinstance(st, ast.If) else None
                if isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and len(t.ops) == 1 and \
                        isinstance(t.ops[0], ast.Is) and isinstance(t.comparators[0], ast.Constant) and \
                        t.comparators[0].value is None and not st.orelse and any(
                            isinstance(b, ast.Assign) and isinstance(b.value, ast.Call) and any(
                                isinstance(x, ast.Name) and x.id == t.left.id for x in b.targets) for b in st.body):
                    defaulted.setdefault((id(d), t.left.id), st.end_lineno)
    out = []
    for n in ast.walk(tree):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in SCALER_METHODS
                and isinstance(n.func.value, ast.Name)):
            continue
        name = n.func.value.id
        if defaulted.get((id(unit_of(n)), name), n.lineno) < n.lineno:
            continue
        if (id(unit_of(n)), name) in nones and not guarded(n, name):
            out.append(n.lineno)
    return sorted(set(out))


def _defs(tree):
    """(qualified name, def node, class name or None) of every function."""
    import ast

    out = []

    def walk(body, prefix, cls):
        for n in body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((prefix + n.name, n, cls))
                walk(n.body, prefix + n.name + ".", None)
            elif isinstance(n, ast.ClassDef):
                walk(n.body, prefix + n.name + ".", n.name)
            elif isinstance(n, (ast.If, ast.Try, ast.With)):
                walk([*n.body, *getattr(n, "orelse", []), *getattr(n, "finalbody", []),
                      *(x for h in getattr(n, "handlers", []) for x in h.body)], prefix, cls)

    walk(tree.body, "", None)
    return out


def _required(d) -> list:
    a = d.args
    pos = [*a.posonlyargs, *a.args]
    req = [x.arg for x in pos[:len(pos) - len(a.defaults)]]
    return req + [x.arg for x, dflt in zip(a.kwonlyargs, a.kw_defaults) if dflt is None]


def added_required(text_before: str, text_after: str) -> list:
    """Functions whose signature gained a parameter with no default: (name callers use, class or
    None, the def's parameters, the new parameter)."""
    import ast

    try:
        before, after = ast.parse(text_before), ast.parse(text_after)
    except SyntaxError:
        return []
    old = {q: set(_required(d)) | {x.arg for x in [*d.args.posonlyargs, *d.args.args, *d.args.kwonlyargs]}
           for q, d, _ in _defs(before)}
    out = []
    for q, d, cls in _defs(after):
        if q not in old:
            continue
        for name in _required(d):
            if name not in old[q]:
                params = [x.arg for x in [*d.args.posonlyargs, *d.args.args]]
                out.append((d.name, cls, params, name))
    return out


def _import_target(root: Path, f: Path, node) -> Optional[Path]:
    """The file ``from <module> import name`` in ``f`` loads: the module path looked up from the
    script's own folder upwards (as Python puts a script's folder first), or relative to the
    package for ``from .m import``; None when it is not in the repository."""
    if node.level:
        base = f.parent
        for _ in range(node.level - 1):
            base = base.parent
        bases = [base]
    else:
        bases = [f.parent, *[d for d in f.parent.parents if d == root or root in d.parents]]
    rel = Path(*node.module.split(".")) if node.module else None
    if rel is None:
        return None
    for b in bases:
        for cand in (b / rel.with_suffix(".py"), b / rel / "__init__.py"):
            if cand.exists():
                return cand.resolve()
    return None


def _receiver_binds(entry, recv, klass, brought: dict, modules: dict) -> bool:
    """Whether ``recv.<name>(...)`` calls the function of ``entry`` (name, class, params, new,
    home): through its module (``m.f``), ``self``/``cls`` in its class or a subclass, ``super()``
    in a subclass, or its class's name; any other object is not told."""
    import ast

    fname, cls, _, _, home = entry
    bases = {getattr(b, "id", getattr(b, "attr", None)) for b in (klass.bases if klass is not None else [])}
    if isinstance(recv, ast.Name) and recv.id in modules:
        target = modules[recv.id]
        return cls is None and target is not None and home is not None and Path(home).resolve() == target
    if cls is None:
        return False
    if isinstance(recv, ast.Name) and recv.id in ("self", "cls"):
        return klass is not None and (cls == klass.name or cls in bases)
    if isinstance(recv, ast.Call):
        return getattr(recv.func, "id", None) == "super" and cls in bases
    return isinstance(recv, ast.Name) and brought.get(recv.id, (None, recv.id))[1] == cls


def unpassed(root: Path, added: list) -> tuple:
    """Call sites in the migrated repository that do not pass a parameter the migration made
    required (a TypeError when they run), as (key, text), and the keys of added parameters no call
    of which was found (their callers are outside what can be read: a framework, a registry, an
    object whose class cannot be told).  Calls are bound as Python binds them: a function by its
    name in its own file or where an import brings it (the file looked up as Python would); a
    method through ``self``/``cls`` in its class, ``super()`` in a subclass, or its class's name;
    ``obj.method(...)`` on any other object is not counted either way."""
    import ast

    from ampfix.project.graph import dispatch_pattern

    if not added:
        return [], set()
    names = {}
    for fname, cls, params, new, *home in added:
        called = cls if fname == "__init__" and cls else fname
        # the file that defines it (None: not known)
        names.setdefault(called, []).append((fname, cls, params, new, home[0] if home else None))
    missing, found = [], set()
    for f in sorted(root.rglob("*.py")):
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        if not any(n in text for n in names):
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        here = f.resolve()
        # name -> (the file it comes from or None, the name there)
        brought, modules = {}, {}
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom):
                target = _import_target(root.resolve(), here, n)
                for a in n.names:
                    brought[a.asname or a.name] = (target, a.name)
            elif isinstance(n, ast.Import):
                for a in n.names:
                    if a.asname or "." not in a.name:  # `import m`, `import a.b as m`: m.f(...) calls a.b's f
                        modules[a.asname or a.name] = _import_target(root.resolve(), here,
                                                                     ast.ImportFrom(module=a.name, level=0))
        own = {d.name for d in tree.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        parent = {}
        for n in ast.walk(tree):
            for c in ast.iter_child_nodes(n):
                parent[c] = n

        def enclosing_class(node):
            p = parent.get(node)
            while p is not None and not isinstance(p, ast.ClassDef):
                p = parent.get(p)
            return p

        def choices(e):
            # `(AMPTrainer if fp16 else SimpleTrainer)(...)` calls whichever the test picks
            return [*choices(e.body), *choices(e.orelse)] if isinstance(e, ast.IfExp) else [e]

        calls = [(c, func) for c in ast.walk(tree) if isinstance(c, ast.Call) for func in choices(c.func)]
        for c, func in calls:
            if isinstance(func, ast.Name):
                source, callee = brought.get(func.id, (None, func.id))
                if func.id in own:
                    source = here
                elif func.id not in brought:
                    continue  # a builtin, a star import, a global set elsewhere: not told
                if source is None:
                    continue
                entries = [e for e in names.get(callee, []) if e[4] is not None and Path(e[4]).resolve() == source
                           and (e[1] is None or e[0] == "__init__")]
            elif dispatch_pattern(c) is not None and func is c.func:
                # `globals().get("train_" + args.target)(...)`: each function of this file it may pick
                pre, suf = dispatch_pattern(c)
                entries = [e for es in names.values() for e in es if e[1] is None and e[4] is not None
                           and Path(e[4]).resolve() == here and e[0].startswith(pre) and e[0].endswith(suf)
                           and len(e[0]) > len(pre) + len(suf)]
            elif isinstance(func, ast.Attribute):
                if not isinstance(func.value, (ast.Name, ast.Call)):
                    continue
                klass = enclosing_class(c)
                entries = [e for e in (e for es in names.values() for e in es) if e[0] == func.attr
                           and _receiver_binds(e, func.value, klass, brought, modules)]
            else:
                continue
            for fname, cls, params, new, home in entries:
                found.add((fname, cls, new, home))
                if any(isinstance(a, ast.Starred) for a in c.args) or any(k.arg is None for k in c.keywords):
                    continue
                if any(k.arg == new for k in c.keywords):
                    continue
                implicit = cls and params and params[0] in ("self", "cls") and not (
                    fname == "__init__" and isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                    and func.value.id not in ("self", "cls"))  # Base.__init__(self, ...) passes it
                bound = params[1:] if implicit else params
                if new in bound and bound.index(new) < len(c.args):
                    continue
                where = f"{os.path.relpath(f, root)}:{c.lineno}"
                missing.append(((fname, cls, new, home), f"{where} {getattr(func, 'id', None) or getattr(func, 'attr', None) or fname}(...) "
                                                         f"without `{new}`"))
    unseen = {(fname, cls, new, home) for fname, cls, _, new, home in (e for es in names.values() for e in es)
              if (fname, cls, new, home) not in found}
    return missing, unseen


def unbound_calls(root: Path, unseen: set) -> list:
    """For added parameters no bound call of which was found: calls anywhere in the repository
    that name the function (``f(...)``, ``obj.f(...)``, ``Cls(...)`` for ``__init__``) with an
    argument and without the new parameter, as (key, text).  Not bound, so not counted broken: a
    reader checks each (a method a decorator attaches is called as ``self.f(...)``, which the
    binding above does not tell)."""
    import ast

    by_name = {}
    for fname, cls, new, home in unseen:
        by_name.setdefault(cls if fname == "__init__" and cls else fname, []).append((fname, cls, new, home))
    out = []
    for f in sorted(root.rglob("*.py")):
        try:
            text = f.read_text(errors="replace")
            if not any(n in text for n in by_name):
                continue
            tree = ast.parse(text)
        except (OSError, SyntaxError):
            continue
        for c in ast.walk(tree):
            if not isinstance(c, ast.Call) or not (c.args or c.keywords):
                continue
            name = c.func.id if isinstance(c.func, ast.Name) else c.func.attr if isinstance(c.func, ast.Attribute) \
                else None
            for key in by_name.get(name, ()):
                if any(isinstance(a, ast.Starred) for a in c.args) or any(k.arg in (None, key[2]) for k in c.keywords):
                    continue
                out.append((key, f"{os.path.relpath(f, root)}:{c.lineno} {name}(...) without `{key[2]}` (not bound)"))
    return out


#: pyflakes' findings (through ruff, when it is installed: `pip install ruff`) that a rewrite must
#: not add: an undefined name or one read before it is bound is a broken file; an unused local, an
#: unused import or a redefinition is debris a reviewer would not merge
RUFF = shutil.which("ruff", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
BROKEN_FLAKES = {"F821", "F823"}
#: "`X` may be undefined, or defined from star imports": with `from apex.fp16_utils import *` gone,
#: pyflakes says F821 of the same names; the original did not define them either
STAR_UNDEFINED = re.compile(r"`(\w+)` may be undefined, or defined from star imports")
DEBRIS_FLAKES = {"F841", "F811", "F401"}


def flakes(text: str) -> Counter:
    if RUFF is None:
        return Counter()
    r = subprocess.run([RUFF, "check", "--isolated", "--no-cache", "--exit-zero", "--output-format", "json",
                        "--select", ",".join(sorted(BROKEN_FLAKES | DEBRIS_FLAKES | {"F405"})), "--stdin-filename",
                        "m.py", "-"],
                       input=text, capture_output=True, text=True)
    try:
        found = json.loads(r.stdout or "[]")
    except ValueError:
        return Counter()
    # the apex imports a rewrite removes are not its debris, whatever becomes of them
    out = Counter()
    for d in found:
        code, msg = d["code"], d["message"]
        if code == "F401" and "apex" in msg:
            continue
        star = STAR_UNDEFINED.search(msg)
        if code == "F405":
            if not star:
                continue
            code, msg = "F821", f"Undefined name `{star.group(1)}`"
        # "redefinition of unused X from line N": N moves when lines above go; the finding is the same
        out[(code, re.sub(r"line \d+", "line N", msg))] += 1
    return out


def ampfix(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "ampfix", *args], capture_output=True, text=True, cwd=cwd)


#: options every check of the corpus takes (--dtype)
EXTRA: list = []


def check_json(path):
    r = ampfix("check", "--select", "ALL", "--output-format", "json", "--exit-zero", "--no-respect-gitignore", *EXTRA,
               str(path))
    if r.returncode not in (0, 1):
        raise RuntimeError(r.stderr)
    return json.loads(r.stdout)["diagnostics"]


def kind(d):
    # a module that uses apex (the planner also reports on files it edits without an apex use:
    # a caller that now makes the scaler; those are not counted)
    if d["code"] in AMP and d["message"].startswith("`apex.amp"):
        return "apex.amp"
    if (d["code"] in FP16 or (d["code"] == "AMP104" and "FP16_Optimizer" in d["message"])) and \
            d["message"].startswith("`apex."):
        return "FP16_Optimizer"
    return None


def side(mods, fls):
    return {
        "repositories": len({r["repo"] for r in mods}),
        "apex.amp modules": sum(r["kind"] == "apex.amp" for r in mods),
        "apex.amp migrated right": sum(r["kind"] == "apex.amp" and r["status"] == "migrated" for r in mods),
        "FP16_Optimizer modules": sum(r["kind"] == "FP16_Optimizer" for r in mods),
        "FP16_Optimizer migrated right": sum(r["kind"] == "FP16_Optimizer" and r["status"] == "migrated"
                                             for r in mods),
        "refused": sum(r["status"] == "refused" for r in mods),
        "broken": sum(r["status"] == "broken" for r in mods),
        "right %": round(100 * sum(r["status"] == "migrated" for r in mods) / max(1, len(mods)), 1),
        "files written": sum(f.get("changed", False) for f in fls),
        "written files that do not compile": sum(f.get("changed", False) and not f["compiles"]
                                                 and f.get("compiled_before", True) for f in fls),
        "written files that did not compile before either (not counted above)": sum(
            f.get("changed", False) and f.get("compiled_before") is False for f in fls),
        "repos where a second migrate changes something": sum(f.get("idempotent") is False for f in fls),
        "files with new self-check problems": sum(bool(f.get("new_self_check")) for f in fls),
        "host syncs added": sum(f.get("added_syncs", 0) for f in fls),
        "files with a GradScaler nothing uses": sum(bool(f.get("unused_scalers")) for f in fls),
        "files keeping a float16 model beside a GradScaler (read each)": sum(bool(f.get("half_models")) for f in fls),
        "files whose removed names another file imports (ImportError there)":
            sum(bool(f.get("imports_of_removed_names")) for f in fls),
        "files passing a keyword no function of that name takes (TypeError there)":
            sum(bool(f.get("unaccepted_keywords")) for f in fls),
        "files calling a scaler that may be None": sum(bool(f.get("scaler_calls_on_none")) for f in fls),
        "files where a loop steps the scaler again before its update":
            sum(bool(f.get("steps_without_update")) for f in fls),
        "files handing a bfloat16 output to numpy": sum(bool(f.get("bf16_to_numpy")) for f in fls),
        "files with an undefined name added": sum(bool(f.get("undefined_names")) for f in fls),
        "files with debris added (unused local, import, redefinition)": sum(bool(f.get("debris")) for f in fls),
        "files with a required parameter added that a caller does not pass":
            sum(bool(f.get("required_not_passed")) for f in fls),
        "files with a required parameter added whose callers were not found":
            sum(bool(f.get("required_callers_not_found")) for f in fls),
        "of those, files where a call by the same name does not pass it (not bound: read each)":
            sum(bool(f.get("required_maybe_not_passed")) for f in fls),
    }



def summarize(modules: list, files: list, rows: list, holdout: set, batch: dict) -> dict:
    """The summary of one run: all modules, the holdout, the tuned ones and each batch."""
    summary = side(modules, files)
    summary["holdout"] = side([r for r in modules if r["holdout"]], [f for f in files if f["repo"] in holdout])
    summary["tuned"] = side([r for r in modules if not r["holdout"]], [f for f in files if f["repo"] not in holdout])
    for b in sorted(set(batch.values())):  # repositories added together (measured before any fix for them)
        summary["batch " + b] = side([r for r in modules if r["batch"] == b],
                                     [f for f in files if batch.get(f["repo"]) == b])
    summary["errors"] = [r for r in rows if "error" in r]
    summary["pyflakes checks (undefined names, debris)"] = "run" if RUFF is not None else "NOT RUN (--no-flakes)"
    return summary


def write(out: Optional[Path], summary: dict, modules: list, files: list) -> None:
    print(json.dumps(summary, indent=1))
    if not out:
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / "corpus.json").write_text(json.dumps({"summary": summary, "modules": modules, "files": files},
                                                indent=1))
    lines = ["| repository | module | kind | uses | result | why left |", "|---|---|---|---|---|---|"]
    for r in modules:
        name = r["repo"] + (" (holdout)" if r["holdout"] else "")
        lines.append(f"| {name} | {r['path']} | {r['kind']} | {r['uses']} | {r['status']} | "
                     f"{(r['reason'] or '').replace('|', '/')} |")
    (out / "corpus.md").write_text("\n".join(lines) + "\n")


def merge(runs: list, out: Optional[Path]) -> int:
    """One summary of runs over disjoint sets of repositories made by the same ampfix (a batch
    added while the rest was being measured): holdout and batches are read from the manifest."""
    modules, files = [], []
    seen = set()
    for run in runs:
        d = json.loads(Path(run).read_text())
        repos = {r["repo"] for r in d["modules"]} | {f["repo"] for f in d["files"]}
        if repos & seen:
            raise SystemExit(f"{run}: repositories measured twice: {sorted(repos & seen)[:3]}")
        seen |= repos
        modules += d["modules"]
        files += d["files"]
    entries = json.loads(MANIFEST.read_text())["repos"]
    holdout = {e["repo"].replace("/", "+") for e in entries if e.get("holdout")}
    batch = {e["repo"].replace("/", "+"): e["batch"] for e in entries if e.get("batch")}
    for r in modules:
        r["holdout"], r["batch"] = r["repo"] in holdout, batch.get(r["repo"])
    write(out, summarize(modules, files, [], holdout, batch), modules, files)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["merge"]:
        # `merge RUN/corpus.json ... --out DIR`: runs over disjoint repositories, one summary
        mp = argparse.ArgumentParser(prog="migrate_corpus.py merge")
        mp.add_argument("runs", nargs="+", type=Path)
        mp.add_argument("--out", type=Path, default=None)
        margs = mp.parse_args(argv[1:])
        return merge(margs.runs, margs.out)
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--unsafe-fixes", action="store_true",
                    help="migrate with --unsafe-fixes (what a user who opts in gets)")
    ap.add_argument("--dtype", choices=["float16", "bfloat16"], default=None,
                    help="migrate (and check) with --dtype (bfloat16: autocast alone, no GradScaler)")
    ap.add_argument("--no-flakes", action="store_true",
                    help="measure without ruff: undefined names and debris go unchecked (the summary says so)")
    args = ap.parse_args(argv)
    if RUFF is None and not args.no_flakes:
        # without it the undefined-name and debris checks would read 0 whatever the rewrite did
        ap.error("ruff is not installed beside this Python nor on PATH (pip install ruff): undefined names and "
                 "debris would go unchecked; pass --no-flakes to measure without them")
    unsafe = ["--unsafe-fixes"] if args.unsafe_fixes else []
    if args.dtype:
        unsafe.append(f"--dtype={args.dtype}")
        EXTRA.append(f"--dtype={args.dtype}")
    rows, files = [], []
    entries = json.loads(MANIFEST.read_text())["repos"]
    holdout = {e["repo"].replace("/", "+") for e in entries if e.get("holdout")}
    batch = {e["repo"].replace("/", "+"): e["batch"] for e in entries if e.get("batch")}
    for repo in sorted(p for p in args.corpus.iterdir() if p.is_dir()):
        tmp = Path(tempfile.mkdtemp()) / repo.name
        shutil.copytree(repo, tmp)
        # a user runs ampfix in a checkout, whose `.git` marks the project root (the corpus copies
        # have none: without it a root with no setup.py/pyproject.toml is read as a folder of
        # separate checkouts, and imports across its top-level folders are not followed)
        (tmp / ".git").mkdir(exist_ok=True)
        before = check_json(tmp)
        w = ampfix("migrate", "--write", *unsafe, "--no-respect-gitignore", str(tmp))
        if w.returncode not in (0, 1):
            rows.append({"repo": repo.name, "error": w.stderr.strip()[-300:]})
            continue
        after = check_json(tmp)
        again = ampfix("migrate", *unsafe, "--no-respect-gitignore", str(tmp))
        by = defaultdict(list)
        for d in before:
            by[d["path"]].append(d)
        after_by = defaultdict(list)
        for d in after:
            after_by[d["path"]].append(d)
        required = {}  # file -> parameters the migration made required there
        for path in sorted(set(by) | set(after_by)):
            rel = os.path.relpath(path, tmp)
            if (repo / rel).exists() and Path(path).exists():
                required[path] = added_required((repo / rel).read_text(errors="replace"),
                                                Path(path).read_text(errors="replace"))
        missing, unseen = unpassed(tmp, [(*a, p) for p, v in required.items() for a in v])
        by_name_only = unbound_calls(tmp, unseen)
        others = None  # the repository's files after the migration, read once where needed
        for path in sorted(set(by) | set(after_by)):
            rel = os.path.relpath(path, tmp)
            text_before = (repo / rel).read_text(errors="replace") if (repo / rel).exists() else ""
            text_after = Path(path).read_text(errors="replace") if Path(path).exists() else ""
            changed = text_before != text_after
            compiles = compiled_before = True
            if changed:
                try:
                    compile(text_after, rel, "exec")
                except SyntaxError:
                    compiles = False
                if not compiles:
                    # a file that never compiled (a keyword given twice) is not one the migration broke
                    try:
                        compile(text_before, rel, "exec")
                    except SyntaxError:
                        compiled_before = False
            self_before = {(d["code"], d["message"]) for d in by[path] if d["code"] in SELF}
            new_self = [f"{d['code']} line {d['location']['line']}: {d['message']}" for d in after_by[path]
                        if d["code"] in SELF and (d["code"], d["message"]) not in self_before]
            syncs = sum(text_after.count(s) - text_before.count(s) for s in SYNCS) if changed else 0
            dead = [n for n in unused_scalers(text_after)] if changed and compiles else []
            dead = dead if len(dead) > len(unused_scalers(text_before)) else []
            maybe_none = none_scaler_calls(text_after) if changed and compiles else []
            maybe_none = maybe_none if len(maybe_none) > len(none_scaler_calls(text_before)) else []
            if changed and compiles and others is None:
                others = {}
                for q in Path(tmp).rglob("*.py"):
                    try:
                        others[q.relative_to(tmp).as_posix()] = q.read_text(errors="replace")
                    except OSError:
                        continue
            gone_imports = importers_of_removed(Path(rel).as_posix(), text_before, text_after, others) \
                if changed and compiles else []
            unaccepted = unaccepted_keywords(text_before, text_after, others) if changed and compiles else []
            halves = half_models(text_after) if changed and compiles else []
            halves = halves if len(halves) > len(half_models(text_before)) else []
            restep = steps_without_update(text_after) if changed and compiles else []
            restep = restep if len(restep) > len(steps_without_update(text_before)) else []
            to_numpy = bf16_numpy(text_after) if changed and compiles and args.dtype == "bfloat16" else []
            to_numpy = to_numpy if len(to_numpy) > len(bf16_numpy(text_before)) else []
            added = (flakes(text_after) - flakes(text_before)) if changed and compiles else Counter()
            # a name already undefined in the original (one more read of it) is not the rewrite's
            undefined = sorted({m for (c, m) in added if c in BROKEN_FLAKES} - set(m for (c, m) in flakes(text_before)))
            debris = sorted(m for (c, m) in added if c in DEBRIS_FLAKES)
            mine = {(f, c, new, path) for f, c, _, new in required.get(path, [])}
            not_passed = [m for k, m in missing if k in mine]
            not_found = sorted(f"{c + '.' if c else ''}{f}({new})" for f, c, new, _ in mine & unseen)
            named_not_passed = [m for k, m in by_name_only if k in mine]
            files.append({"repo": repo.name, "path": rel, "changed": changed, "compiles": compiles,
                          "compiled_before": compiled_before,
                          "new_self_check": new_self, "added_syncs": max(0, syncs), "unused_scalers": dead,
                          "scaler_calls_on_none": maybe_none, "undefined_names": undefined, "debris": debris,
                          "required_not_passed": not_passed, "required_callers_not_found": not_found,
                          "required_maybe_not_passed": named_not_passed, "bf16_to_numpy": to_numpy,
                          "steps_without_update": restep, "half_models": halves,
                          "imports_of_removed_names": gone_imports, "unaccepted_keywords": unaccepted})
            ok = (compiles and not new_self and syncs <= 0 and not maybe_none and not undefined
                  and not not_passed and not to_numpy and not restep and not gone_imports and not unaccepted)
            for k in ("apex.amp", "FP16_Optimizer"):
                had = [d for d in by[path] if kind(d) == k]
                if not had:
                    continue
                left = [d for d in after_by[path] if kind(d) == k]
                reason = next((d["message"].split("(not rewritten", 1)[1].strip(" :)") for d in left
                               if "not rewritten" in d["message"]), None)
                if reason is None:  # an unsafe fix, left for --unsafe-fixes: its description says why
                    reason = next(("needs --unsafe-fixes: " + (d["fix"]["message"] or "").partition("(unsafe fix: ")[2]
                                   .rstrip(")") for d in left if d.get("fix") and d["fix"]["applicability"] == "unsafe"),
                                  None)
                if reason:
                    reason = reason.replace(str(tmp) + os.sep, "").replace(str(tmp.parent) + os.sep, "")
                status = "refused" if left else ("migrated" if ok else "broken")
                rows.append({"repo": repo.name, "path": rel, "kind": k, "uses": len(had),
                             "status": status, "left": len(left), "reason": reason if left else None,
                             "holdout": repo.name in holdout, "batch": batch.get(repo.name)})
        files.append({"repo": repo.name, "idempotent": again.stdout.strip() == ""})
        shutil.rmtree(tmp.parent, ignore_errors=True)
    modules = [r for r in rows if "kind" in r]

    write(args.out, summarize(modules, files, rows, holdout, batch), modules, files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
