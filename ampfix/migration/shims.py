"""A project's own module that forwards to apex's amp when apex imports and does nothing otherwise.

``amp_support.py``::

    try:
        from apex import amp
    except ImportError:
        amp = None

    def scale_loss(*args, **kwargs):
        if amp:
            return amp.scale_loss(*args, **kwargs)
        else:
            return dummy_scale_loss(*args, **kwargs)

and ``import amp_support as amp`` in the trainer, whose ``amp.initialize(...)`` and ``with
amp.scale_loss(...)`` are apex's own calls under another name (caffeinism/StyleGAN-pytorch; the
``@contextmanager`` form that yields the loss unchanged without apex is delira's).  The migration
takes apex to be installed, as it does for ``try: from apex import amp / except: amp = None``, so
each call of such a forwarder is a use of apex's function (:func:`mark`): the planners see it as
one.  A group that rewrites every call of a forwarder also removes the forwarder, the helpers only
it called, and the imports only they read (:func:`forwarders_go`); the caller's import of the
module goes when nothing reads it.  A forwarder called other than by a call, or named by a file
the run did not read, is left as it is, and its calls stay apex's (not rewritten).
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import List, Optional

from ampfix.migration.seeds import apex_import_specs
from ampfix.model.analysis import import_spec, is_log_call
from ampfix.model.apex import apex_qname, stands_for_apex
from ampfix.model.edits import Edit
from ampfix.model.semantic import dotted, walk
from ampfix.rule import ImportSpec

#: apex.amp's functions a forwarder may stand for (its own name is the function's)
KINDS = ("initialize", "scale_loss", "state_dict", "load_state_dict", "master_params")


class Shim:
    """A forwarder ``func`` (a Function of ``module``) to ``apex.amp.<kind>``; ``sites``: the calls
    of it in the project (CallSites)."""

    def __init__(self, module, func, kind: str, sites) -> None:
        self.module, self.func, self.kind, self.sites = module, func, kind, list(sites)
        #: why it stays although its calls are rewritten (another module takes its name)
        self.kept: Optional[str] = None


def _is_amp(sem, node) -> bool:
    return isinstance(node, ast.Name) and apex_qname(sem, node) == "apex.amp"


def _apex_branch(sem, test) -> Optional[bool]:
    """True when ``test`` holds where apex's amp imported (``amp``, ``amp is not None``), False
    where it holds without it (``amp is None``, ``not amp``), None for any other test."""
    if _is_amp(sem, test):
        return True
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and _is_amp(sem, test.operand):
        return False
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and _is_amp(sem, test.left) and \
            isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None:
        if isinstance(test.ops[0], ast.IsNot):
            return True
        if isinstance(test.ops[0], ast.Is):
            return False
    return None


def _forwards(fn: ast.FunctionDef, call: ast.Call) -> bool:
    """``call`` passes ``fn``'s parameters through unchanged: its positional ones in order (or
    each by its own name), its ``*args`` and ``**kwargs`` (this one may be dropped), and nothing
    else."""
    a = fn.args
    if a.posonlyargs or a.kwonlyargs:
        return False
    params = [x.arg for x in a.args]
    pos = list(call.args)
    star = [x for x in pos if isinstance(x, ast.Starred)]
    plain = [x for x in pos if not isinstance(x, ast.Starred)]
    if any(not isinstance(x, ast.Name) for x in plain) or [x.id for x in plain] != params[:len(plain)]:
        return False
    if (a.vararg is None) != (not star) or (star and (len(star) != 1 or pos[-1] is not star[0] or not isinstance(
            star[0].value, ast.Name) or star[0].value.id != a.vararg.arg)):
        return False
    rest = params[len(plain):]
    named = {k.arg: k.value for k in call.keywords if k.arg is not None}
    spread = [k.value for k in call.keywords if k.arg is None]
    if sorted(named) != sorted(rest) or any(not isinstance(v, ast.Name) or v.id != k for k, v in named.items()):
        return False
    # a ``**kwargs`` the forwarder drops (delira's "reserved" one) may stay unpassed: a caller's
    # extra keyword is then one apex's function does not take, which its rewrite refuses
    if spread and (a.kwarg is None or len(spread) != 1 or not isinstance(spread[0], ast.Name)
                   or spread[0].id != a.kwarg.arg):
        return False
    return True


def forwarded_call(module, fn) -> Optional[ast.Call]:
    """apex's call a forwarder makes (``return amp.scale_loss(*args, **kwargs)``, or ``with
    amp.scale_loss(loss=loss, ...) as scaled: yield scaled`` in a ``@contextmanager``), where
    its body is one ``if`` on apex's amp with that call alone on apex's side; else None."""
    if not isinstance(fn, ast.FunctionDef) or fn.name not in KINDS:
        return None
    body = fn.body[1:] if fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(
        fn.body[0].value, ast.Constant) and isinstance(fn.body[0].value.value, str) else fn.body
    if len(body) != 1 or not isinstance(body[0], ast.If):
        return None
    side = _apex_branch(module.sem, body[0].test)
    if side is None:
        return None
    apex_side = body[0].body if side else body[0].orelse
    other = body[0].orelse if side else body[0].body
    if len(apex_side) != 1 or not other:
        return None
    st = apex_side[0]
    managed = any(dotted(d) in ("contextmanager", "contextlib.contextmanager") for d in fn.decorator_list)
    if isinstance(st, ast.Return) and isinstance(st.value, ast.Call) and not managed:
        call = st.value
    elif managed and isinstance(st, ast.With) and len(st.items) == 1 and isinstance(st.items[0].context_expr, ast.Call) \
            and isinstance(st.items[0].optional_vars, ast.Name) and len(st.body) == 1 \
            and isinstance(st.body[0], ast.Expr) and isinstance(st.body[0].value, ast.Yield) \
            and isinstance(st.body[0].value.value, ast.Name) and st.body[0].value.value.id == st.items[0].optional_vars.id:
        call = st.items[0].context_expr
    else:
        return None
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == fn.name and _is_amp(module.sem, call.func.value)):
        return None
    if any(isinstance(n, ast.Name) and _is_amp(module.sem, n) for st in other for n in walk(st)):
        return None  # apex again on the other side: not a fallback
    return call if _forwards(fn, call) else None


def find(project) -> List[Shim]:
    """The forwarders of the project's modules, each with its calls."""
    out: List[Shim] = []
    for m in list(project.modules.values()):
        if not m.editable or "apex" not in m.src.text:
            continue
        m.index()
        for st in m.tree.body:
            if forwarded_call(m, st) is None:
                continue
            f = next((x for x in m.functions.values() if x.node is st), None)
            if f is None or project.references(f) or project.mentioned_elsewhere(st.name):
                continue
            out.append(Shim(m, f, st.name, project.callers(f)))
    return out


def mark(project) -> List[Shim]:
    """Each call of a forwarder becomes a use of apex's function for every planner (read by
    :func:`ampfix.model.apex.apex_qname`), apex's use inside the forwarder none (the forwarder
    goes with its calls, or stays as it is), and the caller's import of it one the tidy removes
    once nothing reads it."""
    shims = find(project)
    for s in shims:
        project.skip.update(id(n) for n in walk(s.func.node) if isinstance(n, (ast.Name, ast.Attribute)))
        for cs in s.sites:
            base = cs.node.func
            while isinstance(base, ast.Attribute):
                base = base.value
            spec = import_spec(cs.module.sem, base, relative=True) if isinstance(base, ast.Name) else None
            stands_for_apex(cs.module.sem, cs.node.func, "apex.amp." + s.kind, spec)
    return shims


def _rewrites(g, cs) -> bool:
    """The group ``g`` holds the call ``cs`` of a forwarder as one of its uses."""
    return any(n is cs.node.func for n in g.uses.get(cs.module.path, ()))


def forwarders_go(project, g) -> None:
    """A forwarder every call of which this group rewrites goes (before the group's files are
    finished), with the module's functions only it called and the imports only they read, unless
    another module takes its name for something else than those calls (a re-export).  A module
    left with nothing but imports and apex's import guard, from which no other module takes
    anything, is emptied, and the note says to delete it."""
    by_module = {}
    for s in getattr(project, "apex_shims", ()):
        if s.sites and not g.uses.get(s.module.path) and all(_rewrites(g, cs) for cs in s.sites):
            by_module.setdefault(s.module.path, []).append(s)
    for path, shims in by_module.items():
        module = shims[0].module
        taken = _taken(project, module, {id(cs.node.func) for s in shims for cs in s.sites})
        for s in shims:
            if s.func.node.name in taken:
                s.kept = (f"its calls are rewritten, but another module takes `{s.func.node.name}` from {path} for "
                          "something else (a re-export, a callback): remove it once nothing does")
        shims = [s for s in shims if s.func.node.name not in taken]
        if not shims:
            continue
        fc = g.file(module)
        gone = [s.func.node for s in shims]
        for s in shims:
            gone += [h for h in _helpers_only_of(project, module, s.func.node) if h not in gone and h.name not in taken]
        rest = [st for st in module.tree.body if st not in gone and not _import_only(st)]
        if not rest and not taken and not project.mentioned_elsewhere(Path(path).stem):
            fc.edits.append(Edit(0, len(module.src.text), ""))
            g.notes.add(f"{path} only forwarded to apex's amp: nothing in it is used now, delete it")
        else:
            for st in gone:
                if id(st) not in fc.touched:
                    fc.remove(st)
            fc.removes.extend(apex_import_specs(module))
            fc.removes.extend(_imports_read_in(module, gone))
        for s in shims:
            g.anchors.setdefault(path, []).append(
                (s.func.node, f"`{s.func.node.name}` forwards to apex's amp.{s.kind}; its calls are native AMP now"))
            g.notes.add(f"`{s.func.qualname}` of {path} forwarded to apex's amp.{s.kind}: its calls were rewritten "
                        "as apex's")


def _import_only(st) -> bool:
    """An import, or a ``try`` of imports whose handlers only bind None, pass or report."""
    if isinstance(st, (ast.Import, ast.ImportFrom)):
        return True
    if not isinstance(st, ast.Try) or st.orelse or st.finalbody:
        return False
    if not all(isinstance(x, (ast.Import, ast.ImportFrom)) for x in st.body):
        return False
    for h in st.handlers:
        for x in h.body:
            if isinstance(x, ast.Pass) or is_log_call(x):
                continue
            if isinstance(x, ast.Assign) and isinstance(x.value, ast.Constant) and x.value.value is None:
                continue
            return False
    return True


def _taken(project, module, calls) -> set:
    """The names of ``module`` that another module takes (``from m import name``, ``m.name``)
    for something else than the calls whose callee nodes are ``calls``: a re-export, a callback,
    another function; ``"*"`` for a star import or the module read as a whole."""
    out = set()
    for m in list(project.modules.values()):
        if m is module:
            continue
        loads = {}  # name -> its reads in the module (computed once, where the module imports ours)
        for imp in m.sem.imports:
            if isinstance(imp, ast.ImportFrom):
                if project.module_named(project.absolute(m, "." * imp.level + (imp.module or "")), near=m) is not module:
                    continue
                for a in imp.names:
                    reads = _loads(m, loads).get(a.asname or a.name, [])
                    if a.name == "*" or not reads or any(id(n) not in calls for n in reads):
                        out.add(a.name)
                continue
            for a in imp.names:
                if project.module_named(a.name, near=m) is not module:
                    continue
                if a.asname is None and "." in a.name:
                    out.add("*")
                    continue
                for n in _loads(m, loads).get(a.asname or a.name, []):
                    parent = getattr(n, "_p", None)
                    if not (isinstance(parent, ast.Attribute) and parent.value is n):
                        out.add("*")
                    elif id(parent) not in calls:
                        out.add(parent.attr)
    return out


def _loads(m, cache: dict) -> dict:
    """The module's reads of names, by name (filled into ``cache`` the first time)."""
    if not cache:
        for n in walk(m.tree, into_functions=True):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                cache.setdefault(n.id, []).append(n)
        cache.setdefault("", [])  # (walked: a module that reads no name is not walked again)
    return cache


def _helpers_only_of(project, module, fn) -> List[ast.stmt]:
    """Top-level functions of ``module`` that only ``fn`` calls (``dummy_scale_loss``)."""
    out = []
    called = {n.func.id for n in walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    for st in module.tree.body:
        if not isinstance(st, ast.FunctionDef) or st.name not in called:
            continue
        elsewhere = [n for x in module.tree.body if x is not st and x is not fn
                     for n in walk(x) if isinstance(n, ast.Name) and n.id == st.name]
        if elsewhere or project.named_elsewhere(module, st.name):
            continue
        out.append(st)
    return out


def _imports_read_in(module, stmts) -> List[ImportSpec]:
    """The module's top-level imports whose names ``stmts`` read (the tidy removes those that
    nothing reads any more)."""
    read = {n.id for st in stmts for n in walk(st) if isinstance(n, ast.Name)}
    read |= {(dotted(d) or "").split(".")[0] for st in stmts if isinstance(st, ast.FunctionDef)
             for d in st.decorator_list}
    out = []
    for st in module.tree.body:
        if isinstance(st, ast.Import):
            out += [ImportSpec(a.name, None, a.asname) for a in st.names if (a.asname or a.name.split(".")[0]) in read]
        elif isinstance(st, ast.ImportFrom) and not any(a.name == "*" for a in st.names):
            out += [ImportSpec("." * st.level + (st.module or ""), a.name, a.asname) for a in st.names
                    if (a.asname or a.name) in read]
    return out


def kept_forwarders_say_why(project, groups, out) -> None:
    """A forwarder that stays (a call of it is not rewritten) says why at its apex use: the
    reason of the first of its calls' groups that was refused."""
    from ampfix.model.apex import apex_uses
    from ampfix.project.plan import FilePlan

    for s in getattr(project, "apex_shims", ()):
        why = s.kept  # (set only where every call's group was planned: a refusal below says more)
        for cs in s.sites:
            g = next((g for g in groups if _rewrites(g, cs)), None)
            if g is None or g.refusal is not None:
                why = f"its call at {cs.module.path} line {cs.node.lineno} is not rewritten" + (
                    f": {g.refusal}" if g is not None else "")
                break
        if why is None:
            continue
        fp = out.setdefault(s.module.path, FilePlan(s.module.path))
        inside = {id(n) for n in walk(s.func.node)}
        for n, _ in apex_uses(s.module.sem, s.module.tree):
            if id(n) in inside:
                fp.notes.setdefault((n.lineno, n.col_offset),
                                    f"not rewritten: `{s.func.node.name}` forwards to apex's amp.{s.kind}; {why}")
