"""The migration of a project: every planner's groups, each group's rewrite tried in memory by
the engine (``project.trial``), then one :class:`~ampfix.project.plan.FilePlan` per file."""
from __future__ import annotations

import ast
import re
from typing import Dict, List

from ampfix.migration.groups import Group, Refuse
from ampfix.project.plan import FilePlan
from ampfix.rule import Fix


def plan(project) -> Dict[str, FilePlan]:
    """The migration of a project: path -> FilePlan (the fixes and notes of its apex uses)."""
    from ampfix.migration import shims
    from ampfix.migration.amp import AmpPlanner
    from ampfix.migration.dual import DualPlanner
    from ampfix.migration.fp16 import Fp16Planner
    from ampfix.migration.functions import FunctionApiPlanner

    groups: List[Group] = []
    # the apex path of a program that has a native one goes first; what it removes is skipped
    dual = DualPlanner(project)
    try:
        groups.extend(dual.groups())
    except Exception:  # a planner bug: nothing of it, the others go on
        dual.dead = set()
    project.skip = set(dual.dead)
    # a project's own forwarders to apex's amp: their calls are apex's (shims.py)
    try:
        forwarders = shims.mark(project)
    except Exception:  # a bug: no forwarder is followed, the planners go on as before
        forwarders = []
    project.apex_shims = forwarders
    for planner in (AmpPlanner, Fp16Planner, FunctionApiPlanner):
        try:
            groups.extend(planner(project).groups())
        except Exception as exc:  # a planner bug refuses what it planned, and the run goes on
            g = Group(f"{planner.__name__}:error", "error")
            g.refusal = f"ampfix could not plan this migration ({type(exc).__name__}: {exc}); please report it"
            for m in project.modules.values():
                if m.editable and "apex" in m.src.text:
                    uses = _apex_nodes(m)
                    for n in uses[:1]:
                        g.add_use(m.path, n)
            groups.append(g)
    # each group's rewrite is tried on copies of its files (in the worker processes, when the
    # run has them: the tries are independent of each other)
    tries: List[tuple] = []
    owners: List[Group] = []
    for g in groups:
        if g.refusal is None:
            g.refusal = _suppressed(project, g)
        if g.refusal is not None:
            continue
        try:
            mine = rewrites(project, g)
        except Refuse as exc:
            g.refusal = str(exc)
            continue
        except Exception as exc:  # a bug: the group is left whole, the run goes on
            g.refusal = f"ampfix could not check this rewrite ({type(exc).__name__}: {exc}); please report it"
            continue
        tries.extend(mine)
        owners.extend([g] * len(mine))
    for g, outcome in zip(owners, project.map(project.trial, tries)):
        if outcome is not None and g.refusal is None:
            g.refusal = outcome
    _follow(groups)
    for g in groups:
        if g.refusal is not None:
            # a reason quotes code (a call over several lines): one line, as every message is
            g.refusal = one_line(g.refusal)
    out: Dict[str, FilePlan] = {}
    for g in groups:
        _emit(project, g, out)
    shims.kept_forwarders_say_why(project, groups, out)
    for path, nodes in getattr(project, "uninitialized", {}).items():
        fp = out.setdefault(path, FilePlan(path))
        for n in nodes:
            fp.flags[(n.lineno, n.col_offset)] = "uninitialized"
    return out


def one_line(text: str) -> str:
    """``text`` with each line break and the indentation after it made one space."""
    return re.sub(r"[ \t]*\r?\n\s*", " ", text)


def _follow(groups: List[Group]) -> None:
    """A group that acts only with another of its module (apex's op lists edited beside the
    module's amp.initialize: ``follows``) shares that one's fate: refused with it, unsafe with it;
    refused, it keeps the other as it is too."""
    for g in groups:
        path = g.follows
        if path is None:
            continue
        if g.refusal is not None:
            # and the other way round: the initialize without the lists would change what they said
            for o in groups:
                if o is not g and o.kind != g.kind and path in o.uses and o.refusal is None:
                    o.refusal = g.refusal
            continue
        for o in groups:
            if o is g or o.kind == g.kind or path not in o.uses:
                continue
            if o.refusal is not None:
                g.refusal = f"apex's op lists act with the module's amp.initialize, which is not rewritten: {o.refusal}"
                break
            if o.unsafe and not g.unsafe:
                g.unsafe = o.unsafe


def _private_flags(project, path: str) -> List[str]:
    """The availability flags a guarded apex import of the module sets (``try: from apex import
    amp; HAS_APEX = True / except ImportError: HAS_APEX = False``) that no other module takes
    from it: the engine may remove them once they fold and nothing reads them."""
    from ampfix.engine.tidy import true_flags
    from ampfix.model.semantic import walk

    m = project.modules.get(path)
    if m is None or path.replace("\\", "/").endswith("__init__.py"):
        return []
    out = set()
    for t in walk(m.tree, into_functions=True):
        if isinstance(t, ast.Try) and any(isinstance(x, (ast.Import, ast.ImportFrom)) and "apex" in m.src.code(x)
                                          for x in t.body):
            out |= true_flags(t)
    return sorted(n for n in out if not project.imported_from(m, n))


def _apex_nodes(m) -> list:
    from ampfix.model.apex import apex_uses

    return [n for n, _ in apex_uses(m.sem, m.tree)]


def _emit(project, g: Group, out: Dict[str, FilePlan]) -> None:
    from ampfix.model.apex import replacement_for, stand_in
    from ampfix.project.plan import PlannedReport

    others = [p for p in g.paths]
    for path in g.paths:
        fp = out.setdefault(path, FilePlan(path))
        uses = g.uses.get(path, [])
        m = project.module(path)
        # a call of the project's forwarder to apex (shims.py): no rule sees apex there, so the
        # planner reports it itself, with the fix (on the first) or the reason
        stand_ins = [(u, stand_in(m.sem, u)) for u in uses if m is not None and stand_in(m.sem, u)]
        uses = [u for u in uses if all(u is not x for x, _ in stand_ins)] or uses
        where = " (with " + ", ".join(o for o in others if o != path) + ")" if len(others) > 1 else ""

        def report_stand_ins(fix) -> None:
            for k, (u, q) in enumerate(stand_ins):
                msg = f"`{m.src.code(u)}` forwards to apex's `{q}`; use {replacement_for(q)}"
                if g.refusal is not None:
                    msg += f" (not rewritten{where}: {g.refusal})"
                fp.reports.append(PlannedReport(u.lineno, m.src.char_col(u.lineno, u.col_offset), u.end_lineno,
                                                m.src.char_col(u.end_lineno, u.end_col_offset), msg,
                                                fix if k == 0 else None, g.kind))

        if g.refusal is not None:
            report_stand_ins(None)
            if uses:
                # a noqa'd use reports nothing: then every use carries the reason
                for u in (uses if g.refusal.startswith("line ") and "noqa" in g.refusal else uses[:1]):
                    fp.notes[(u.lineno, u.col_offset)] = f"not rewritten{where}: {g.refusal}"
            continue
        fc = g.changes.get(path)
        if fc is None:
            report_stand_ins(None)
            continue
        desc = one_line(g.description + (" (" + "; ".join(sorted(g.notes)) + ")" if g.notes else ""))
        if g.unsafe:
            desc += f" (unsafe fix: {g.unsafe})"
        fix = Fix(desc, fc.final_edits, add_imports=list(dict.fromkeys(fc.adds)),
                  remove_imports=list(dict.fromkeys(fc.removes)), group=g.id, safe=not g.unsafe,
                  names_may_go=_private_flags(project, path))
        for u in uses:
            fp.fixes[(u.lineno, u.col_offset)] = fix
        report_stand_ins(fix)
        if not uses:
            # a file the group edits without an apex use of its own (a caller that now passes
            # the scaler): the planner reports there itself, with the fix
            src = fc.src
            anchors = g.anchors.get(path, [])
            for i, (node, msg) in enumerate(anchors):
                fp.reports.append(PlannedReport(node.lineno, src.char_col(node.lineno, node.col_offset),
                                                node.end_lineno, src.char_col(node.end_lineno, node.end_col_offset),
                                                msg, fix if i == 0 else None, g.kind))
            if not anchors and fc.final_edits:
                # no planner named a place here (a function that now takes the scaler): the report
                # is at the first edit, so the file's part is never dropped while the others land
                first = min(fc.final_edits, key=lambda e: e.start)
                line, col = src.position(first.start)
                with_ = ", ".join(o for o in others if o != path) or "the project"
                fp.reports.append(PlannedReport(line, col, line, col, f"rewritten with {with_}: this file's part of "
                                                f"their migration ({g.kind})", fix, g.kind))
        if g.note_at_anchor and uses:
            fp.notes[(uses[0].lineno, uses[0].col_offset)] = g.note_at_anchor


def rewrites(project, g: Group) -> List[tuple]:
    """The group's edits of each file, as self-contained tries for :func:`try_rewrite`."""
    from ampfix.migration.shims import forwarders_go
    from ampfix.migration.stale_attributes import unread_apex_attributes_go

    out = []
    forwarders_go(project, g)
    for fc in g.changes.values():
        fc.final_edits = fc.finish()
    unread_apex_attributes_go(project, g.changes)
    for path, fc in g.changes.items():
        edits = fc.final_edits
        if not any("torch." in e.text or "torch." in e.before for e in edits):
            fc.adds = [a for a in fc.adds if a.module != "torch"]
        out.append((path, fc.src.text, g.description, edits, list(fc.adds), list(fc.removes), g.id,
                    project.settings))
    return out


def _suppressed(project, g: Group):
    """Why the group is left alone when a ``# noqa`` covers one of its apex uses (bare, or naming
    an apex rule: AMP1xx), as ruff leaves a fix on a noqa'd line; else None.  The group is all or
    nothing, so one such line keeps every file of it as it is."""
    from ampfix.engine.noqa import Suppressions

    for path in sorted(g.uses):
        m = project.module(path)
        if m is None:
            continue
        sup = Suppressions(m.src)
        for node in g.uses[path]:
            codes = sup.noqa.get(node.lineno, False)
            if codes is None or (codes and any(c.startswith("AMP1") for c in codes)):
                what = "`# noqa`" if codes is None else "`# noqa: " + ", ".join(sorted(codes)) + "`"
                return f"line {node.lineno} of {path} has {what}: the migration it belongs to is left alone"
    return None
