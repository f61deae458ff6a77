"""apex's DistributedDataParallel across a project.

The rewrite to torch's DDP changes the wrapper's type, so every module that makes one or tests
for one (``model.module if isinstance(model, DDP) else model``, often in a checkpoint helper of
another module) changes together, or none does: a type test left on apex's class turns false, and
``get_model()`` hands out the wrapper (a checkpoint gains a ``module.`` prefix).  :func:`decide`
says, for the uses a wrapper reaches:

* ``keep <why>``: nothing changes (a method only apex's DDP has is called, a call has arguments
  torch's DDP does not take, or a class subclasses apex's);
* ``rename``: a reference that is no call becomes torch's class with the calls (there is one).

The plan hands that to AMP103 as the fact ``"apex-ddp"`` of each file (it holds in every fix
pass); a file checked on its own (no plan) is decided alone, with the same function.

The call's arguments torch's DDP has no use for go (``gradient_predivide_factor=get_world_size()``);
a project function imported only for them (``from utils.dist_util import get_world_size``) would be
left unread.  The plan, which sees which modules import what from which, names the imported names
that no other module takes from this one, and whose statement keeps other names or imports a
module that only defines (dropping it skips no effect), in the fact ``"apex-ddp-dropped-imports"``; AMP103 removes
their imports where nothing reads them after the fix.  A file checked on its own keeps them.
"""
from __future__ import annotations

import ast
import re
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

from ampfix.model.apex import (APEX_DDP, apex_ddp_call_changes, apex_ddp_only_calls, apex_uses, maybe_not_apex,
                              subclassed_at)
from ampfix.project.plan import FilePlan


class DdpUse(NamedTuple):
    path: str
    tree: ast.Module
    code: Callable[[ast.AST], str]
    node: ast.AST
    is_call: bool


def ddp_uses(path: str, sem, tree, code) -> List[DdpUse]:
    """The uses of apex's DistributedDataParallel in a module (a name that may be torch's on
    another path is not one)."""
    out = []
    for node, q in apex_uses(sem, tree):
        if q == APEX_DDP and not maybe_not_apex(sem, node):
            p = getattr(node, "_p", None)
            out.append(DdpUse(path, tree, code, node, isinstance(p, ast.Call) and p.func is node))
    return out


def plan(project) -> Dict[str, FilePlan]:
    uses: List[DdpUse] = []
    owner: Dict[str, object] = {}
    for m in project.modules.values():
        if "parallel" in m.src.text and "apex" in m.src.text:
            mine = ddp_uses(m.path, m.sem, m.tree, m.src.code)
            uses.extend(mine)
            if mine:
                owner[m.path] = m
    if not uses:
        return {}
    out: Dict[str, FilePlan] = {}
    # a wrapper made in one module reaches a type test in another through imports: modules one
    # of which imports the other (directly or not) decide together, separate scripts alone
    comp = _components(project, owner.values())
    groups: Dict[int, List[DdpUse]] = {}
    for u in uses:
        groups.setdefault(comp[id(owner[u.path])], []).append(u)
    for mine in groups.values():
        fact = decide(mine)
        for u in mine if fact is not None else ():
            out.setdefault(u.path, FilePlan(u.path, facts={"apex-ddp": fact}))
    for path, m in owner.items():
        names = sorted(n for n, alone, full in dropped_names([u for u in uses if u.path == path], m.tree)
                       if not project.imported_from(m, n) and not (alone and not project.import_is_quiet(full)))
        if names:
            out.setdefault(path, FilePlan(path)).facts["apex-ddp-dropped-imports"] = ",".join(names)
    return out


#: the keywords of apex's DDP whose values the rewrite keeps (the model; the message size becomes
#: a number of megabytes)
KEPT_KEYWORDS = ("module", "message_size")


def dropped_names(uses: List[DdpUse], tree) -> List[Tuple[str, bool, str]]:
    """Names bound by a module-level ``from X import name`` that the arguments the rewrite drops
    from apex's DDP calls read (``gradient_predivide_factor=get_world_size()``), each with whether
    it is the statement's only name (then dropping the statement skips importing ``X``) and ``X``."""
    imported = {(a.asname or a.name): (len(st.names) == 1, "." * st.level + (st.module or ""))
                for st in tree.body if isinstance(st, ast.ImportFrom) for a in st.names if a.name != "*"}
    out = set()
    for u in uses:
        call = getattr(u.node, "_p", None)
        if not u.is_call or not isinstance(call, ast.Call):
            continue
        for kw in call.keywords:
            if kw.arg is not None and kw.arg not in KEPT_KEYWORDS:
                out |= {n.id for n in ast.walk(kw.value) if isinstance(n, ast.Name) and n.id in imported}
    return sorted((n, *imported[n]) for n in out)


#: what a comment about apex's DDP names: its class, its module, the option torch's DDP lacks
_APEX_DDP_WORDS = re.compile(r"\bapex\.parallel\b|\bapex DDP\b|\bdelay_allreduce\b", re.IGNORECASE)


def apex_ddp_comment(src, stmt) -> Optional[Tuple[int, int]]:
    """(first, last) comment lines right above ``stmt`` when one of them speaks of apex's DDP
    (``# By default, apex.parallel.DistributedDataParallel overlaps communication ...``, ``#
    delay_allreduce delays all communication ...``): once the wrapper is torch's, with no
    ``delay_allreduce``, the block describes what is gone."""
    from ampfix.engine.tidy import comments_above

    line = stmt.lineno
    first = comments_above(src, line)
    if first is None or not any(_APEX_DDP_WORDS.search(src.line_text(n)) for n in range(first, line)):
        return None
    return first, line - 1


def decide(uses: List[DdpUse]) -> Optional[str]:
    """``keep <why>``, ``rename`` or None (nothing to say) for uses that one wrapper may reach."""
    for path, tree in sorted({u.path: u.tree for u in uses}.items()):
        only = apex_ddp_only_calls(tree)
        if only:
            n = only[0]
            code = next(u.code for u in uses if u.path == path)
            return (f"keep `{code(n)}` at {path} line {n.lineno} is apex's DistributedDataParallel's own; torch's "
                    "has none (it skips the all-reduce with `with model.no_sync():`): left for a person")
    for u in uses:
        sub = subclassed_at(u.node)
        if sub is not None:
            return (f"keep `{sub.name}` subclasses apex's DistributedDataParallel at {u.path} line {sub.lineno}: "
                    "what makes one passes apex's arguments; left for a person")
        if u.is_call and not apex_ddp_call_changes(u.node._p):
            return (f"keep apex's DistributedDataParallel at {u.path} line {u.node.lineno} has no torch equivalent, "
                    "so the other uses it reaches are left with it")
    return "rename" if any(u.is_call for u in uses) else None


def _components(project, modules) -> Dict[int, int]:
    """id(module) -> its group: a module that makes a wrapper and one that tests for it are in
    one when either imports the other (directly or through other modules of the project).  Two
    scripts that only share a library are not (each makes its own wrapper)."""
    edges: Dict[int, set] = {}
    for m in list(project.modules.values()):
        out = edges.setdefault(id(m), set())
        for imp in m.sem.imports:
            for name in project.imported_names(m, imp):
                other = project.imported_module(m, name)
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

