"""apex's DistributedDataParallel across a project.

The rewrite to torch's DDP changes the wrapper's type, so every module that makes one or tests
for one (``model.module if isinstance(model, DDP) else model``, often in a checkpoint helper of
another module) changes together, or none does: a type test left on apex's class turns false, and
``get_model()`` hands out the wrapper (a checkpoint gains a ``module.`` prefix).  The plan tells
AMP103, by a flag at each use of apex's DDP in the project:

* ``ddp:keep <why>``: nothing changes (a method only apex's DDP has is called somewhere, or one
  of the project's calls has arguments torch's DDP does not take);
* ``ddp:rename``: a reference that is no call becomes torch's class with the calls (every call in
  the project can change).

Without a plan (one file checked on its own) the rule decides per module.
"""
from __future__ import annotations

import ast
from pathlib import PurePosixPath
from typing import Dict, List, Optional, Tuple

from ampfix.model.apex import (APEX_DDP, apex_ddp_call_changes, apex_ddp_only_calls, apex_uses, maybe_not_apex,
                              subclassed_at)
from ampfix.project.plan import FilePlan


def plan(project) -> Dict[str, FilePlan]:
    uses: List[Tuple[object, ast.AST, bool]] = []  # (module, node, is a call)
    for m in project.modules.values():
        if "parallel" not in m.src.text or "apex" not in m.src.text:
            continue
        for node, q in apex_uses(m.sem, m.tree):
            if q != APEX_DDP or maybe_not_apex(m.sem, node):
                continue
            p = getattr(node, "_p", None)
            uses.append((m, node, isinstance(p, ast.Call) and p.func is node))
    if not uses:
        return {}
    out: Dict[str, FilePlan] = {}
    # a wrapper made in one module reaches a type test in another through imports: modules one
    # of which imports the other (directly or not) decide together, separate scripts alone
    groups: Dict[int, List[Tuple[object, ast.AST, bool]]] = {}
    comp = _components(project, {id(m): m for m, _, _ in uses}.values())
    for u in uses:
        groups.setdefault(comp[id(u[0])], []).append(u)
    for mine in groups.values():
        fact = _decide(mine)
        if fact is None:
            continue
        for m, _, _ in mine:
            out.setdefault(m.path, FilePlan(m.path, facts={"apex-ddp": fact}))
    return out


def _decide(uses) -> Optional[str]:
    why = None
    for m in sorted({id(m): m for m, _, _ in uses}.values(), key=lambda x: x.path):
        only = apex_ddp_only_calls(m.tree)
        if only:
            n = only[0]
            why = (f"`{m.src.code(n)}` at {m.path} line {n.lineno} is apex's DistributedDataParallel's own; torch's "
                   "has none (it skips the all-reduce with `with model.no_sync():`): left for a person")
            break
    if why is None:
        for m, node, is_call in uses:
            sub = subclassed_at(node)
            if sub is not None:
                why = (f"`{sub.name}` subclasses apex's DistributedDataParallel at {m.path} line {sub.lineno}: what "
                       "makes one passes apex's arguments; left for a person")
                break
            if is_call and not apex_ddp_call_changes(node._p):
                why = (f"apex's DistributedDataParallel at {m.path} line {node.lineno} has no torch equivalent, so "
                       "the other uses it reaches are left with it")
                break
    if why is not None:
        return "keep " + why
    return "rename" if any(is_call for _, _, is_call in uses) else None


def _components(project, modules) -> Dict[int, int]:
    """id(module) -> its group: a module that makes a wrapper and one that tests for it are in
    one when either imports the other (directly or through other modules of the project).  Two
    scripts that only share a library are not (each makes its own wrapper)."""
    edges: Dict[int, set] = {}
    for m in list(project.modules.values()):
        out = edges.setdefault(id(m), set())
        for imp in m.sem.imports:
            for name in _imported_names(m, imp):
                other = project.module_named(name) if name else None
                if other is not None and other is not m:
                    out.add(id(other))

    def reach(start: int) -> set:
        seen, todo = {start}, [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    mods = list(modules)
    reached = {id(m): reach(id(m)) for m in mods}
    parent = {id(m): id(m) for m in mods}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a in mods:
        for b in mods:
            if a is not b and (id(b) in reached[id(a)] or id(a) in reached[id(b)]):
                parent[find(id(a))] = find(id(b))
    return {id(m): find(id(m)) for m in mods}


def _imported_names(module, imp) -> List[str]:
    """The dotted module names an import statement may load (a relative one said from the
    importing module's folder)."""
    if isinstance(imp, ast.Import):
        return [a.name for a in imp.names]
    base = imp.module or ""
    if imp.level:
        folder = list(PurePosixPath(module.path.replace("\\", "/")).parent.parts)
        folder = folder[:len(folder) - (imp.level - 1)] if imp.level > 1 else folder
        folder = [x for x in folder if x not in ("", ".", "/")]
        base = ".".join([*folder[-3:], *([base] if base else [])])
    return [base, *(f"{base}.{a.name}" for a in imp.names if a.name != "*")] if base else []
