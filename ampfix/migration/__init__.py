"""The apex -> native AMP migration, planned over a whole project before anything is edited.

A *group* is everything that must change together: an ``amp.initialize`` (or several, when a
function that scales the loss is shared by several scripts), every ``amp.scale_loss``,
``amp.master_params`` and ``amp.state_dict`` that its scaler must reach, in any function or
module, the steps that follow a scaled backward, the forward passes that autocast must cover,
and the parameters and call sites that carry the scaler there.  A group is planned as a whole
and then tried on a copy: its output must parse and must not trip the checks that catch
hand-migration mistakes (a ``scaler.step`` with no scaled backward before it, a GradScaler
nothing uses, a backward inside autocast...).  A group that cannot be planned, or whose output
fails, is left whole in every file, and each of its files says why.

Planners here: :mod:`.amp` (apex.amp), :mod:`.fp16` (FP16_Optimizer), :mod:`.functions`
(apex.amp's function-level API).
"""
from __future__ import annotations

import ast
from typing import Dict, List, Optional, Sequence, Set, Tuple

from ampfix.edits import Builder, Conflict, Edit, apply_edits
from ampfix.plan import FilePlan
from ampfix.rule import Fix, ImportSpec
from ampfix.semantic import walk
from ampfix.tidy import Remover


class Refuse(Exception):
    """The group cannot be migrated with confidence: the reason, for the person."""


class FileChanges:
    """The edits one group makes to one module."""

    def __init__(self, module) -> None:
        self.module = module
        self.src = module.src
        self.b = Builder(module.src)
        self._inserts: Dict[Tuple[int, str], List[str]] = {}  # (offset, indent) -> lines, in order
        self.edits: List[Edit] = []
        self.removed: List[ast.stmt] = []
        self.adds: List[ImportSpec] = []
        self.removes: List[ImportSpec] = []
        self.touched: Set[int] = set()  # id of statements replaced or removed

    def _claim(self, node) -> None:
        if id(node) in self.touched:
            raise Refuse(f"line {node.lineno} would be rewritten twice")
        self.touched.add(id(node))

    def replace(self, node, text: str) -> None:
        self._claim(node)
        self.edits.append(self.b.replace(node, text))

    def replace_statement(self, stmt, lines: Sequence[str]) -> None:
        self._claim(stmt)
        self.edits.append(self._safe(lambda: self.b.replace_statement(stmt, lines)))

    def insert_before(self, stmt, lines: Sequence[str]) -> None:
        at = self.src.starts[self.b.first_line(stmt) - 1]
        self._inserts.setdefault((at, self.b.indent(stmt)), []).extend(lines)

    def insert_after(self, stmt, lines: Sequence[str], indent: Optional[str] = None) -> None:
        if not self.b.own_lines(stmt):
            raise Refuse(f"line {stmt.end_lineno} holds more than one statement")
        at = self.src.line_end(stmt.end_lineno)
        self._inserts.setdefault((at, self.b.indent(stmt) if indent is None else indent), []).extend(lines)

    def remove(self, stmt) -> None:
        self._claim(stmt)
        self.removed.append(stmt)

    def wrap(self, first, last, header: str) -> None:
        self.edits.append(self._safe(lambda: self.b.wrap(first, last, header)))

    def unwrap(self, compound, body) -> None:
        self.edits.append(self._safe(lambda: self.b.unwrap(compound, body)))

    def _safe(self, make):
        try:
            return make()
        except Conflict as exc:
            raise Refuse(str(exc)) from None

    def finish(self) -> List[Edit]:
        edits = list(self.edits)
        text = self.src.text
        for (at, indent), lines in self._inserts.items():
            body = self.b.statements(lines, indent)
            if at == len(text) and text and not text.endswith(("\n", "\r")):
                body = self.b.nl + body
            edits.append(Edit(at, at, body))
        if self.removed:
            try:
                removals = Remover(self.src, self.module.sem, self.b).remove(self.removed)
            except Conflict as exc:
                raise Refuse(str(exc)) from None
            points = sorted(at for at, _ in self._inserts)
            for r in removals:
                # a removal that also takes the blank lines above its statement stops where
                # something is inserted (the scaler made before a guard that goes)
                inside = [at for at in points if r.start < at < r.end and not r.text]
                if inside and not r.region:
                    cut = max(inside)
                    if not self.src.text[r.start:cut].strip():
                        r = Edit(cut, r.end, r.text)
                edits.append(r)
        return edits


def add_module_helper(fc: "FileChanges", module, text: str, key: str) -> None:
    """A helper function the migration needs, once per module, after its top imports (before
    any use at module level)."""
    done = getattr(fc, "helpers", None)
    if done is None:
        done = fc.helpers = set()
    if key in done:
        return
    done.add(key)
    body = module.tree.body
    i = 1 if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else 0
    last = None
    while i < len(body) and (isinstance(body[i], (ast.Import, ast.ImportFrom)) or _only_imports(body[i])):
        last = body[i]
        i += 1
    lines = text.rstrip("\n").split("\n")
    if last is not None:
        src = module.src
        no, blanks = last.end_lineno + 1, 0
        while no <= src.line_count and not src.line_text(no).strip():
            blanks, no = blanks + 1, no + 1
        pad = ["", ""][:max(0, 2 - blanks)] if no <= src.line_count else []
        fc.insert_after(last, ["", "", *lines, *pad], indent="")
    elif i < len(body):
        fc.insert_before(body[i], [*lines, "", ""])
    else:
        raise Refuse("the module has no statement to put a helper before")


def _only_imports(node) -> bool:
    from ampfix.semantic import iter_statements

    if not isinstance(node, (ast.Try, ast.If)):
        return False
    inner = list(iter_statements([node]))[1:]
    return bool(inner) and all(isinstance(x, (ast.Import, ast.ImportFrom, ast.Pass, ast.Raise, ast.Assign, ast.Expr))
                               for x in inner)


class Group:
    """What changes together; ``uses`` are the apex nodes (per path) its fix resolves."""

    def __init__(self, gid: str, kind: str) -> None:
        self.id = gid
        self.kind = kind
        self.changes: Dict[str, FileChanges] = {}
        self.uses: Dict[str, List[ast.AST]] = {}
        self.notes: Set[str] = set()
        self.description = ""
        self.refusal: Optional[str] = None
        self.first_use: Optional[Tuple[str, ast.AST]] = None
        #: nodes of files the group edits without an apex use there (a call that now passes the
        #: scaler), with what to say about them
        self.anchors: Dict[str, List[Tuple[ast.AST, str]]] = {}
        self.note_at_anchor: Optional[str] = None  # said with the anchor use when rewritten

    def file(self, module) -> FileChanges:
        fc = self.changes.get(module.path)
        if fc is None:
            if not module.editable:
                raise Refuse(f"{module.path} takes part but was not among the files given: run ampfix on the "
                             f"whole project")
            fc = self.changes[module.path] = FileChanges(module)
        return fc

    def add_use(self, path: str, node) -> None:
        self.uses.setdefault(path, []).append(node)
        if self.first_use is None:
            self.first_use = (path, node)

    @property
    def paths(self) -> List[str]:
        return sorted(set(self.uses) | set(self.changes) | set(self.anchors))


def plan(project) -> Dict[str, FilePlan]:
    """The migration of a project: path -> FilePlan (the fixes and notes of its apex uses)."""
    from ampfix.migration.amp import AmpPlanner
    from ampfix.migration.dual import DualPlanner
    from ampfix.migration.fp16 import Fp16Planner
    from ampfix.migration.functions import FunctionApiPlanner

    groups: List[Group] = []
    # the apex path of a program that has a native one goes first; what it removes is skipped
    dual = DualPlanner(project)
    try:
        groups.extend(dual.groups())
    except Exception as exc:  # a planner bug: nothing of it, the others go on
        dual.dead = set()
    project.skip = dual.dead
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
    for g, outcome in zip(owners, project.map(try_rewrite, tries)):
        if outcome is not None and g.refusal is None:
            g.refusal = outcome
    out: Dict[str, FilePlan] = {}
    for g in groups:
        _emit(project, g, out)
    for path, nodes in getattr(project, "uninitialized", {}).items():
        fp = out.setdefault(path, FilePlan(path))
        for n in nodes:
            fp.flags[(n.lineno, n.col_offset)] = "uninitialized"
    return out


def _apex_nodes(m) -> list:
    from ampfix.rules._apex import apex_uses

    return [n for n, _ in apex_uses(m.sem, m.tree)]


def _emit(project, g: Group, out: Dict[str, FilePlan]) -> None:
    others = [p for p in g.paths]
    for path in g.paths:
        fp = out.setdefault(path, FilePlan(path))
        uses = g.uses.get(path, [])
        if g.refusal is not None:
            if uses:
                where = ""
                if len(others) > 1:
                    where = " (with " + ", ".join(o for o in others if o != path) + ")"
                fp.notes[(uses[0].lineno, uses[0].col_offset)] = f"not rewritten{where}: {g.refusal}"
            continue
        fc = g.changes.get(path)
        if fc is None:
            continue
        desc = g.description + (" (" + "; ".join(sorted(g.notes)) + ")" if g.notes else "")
        fix = Fix(desc, fc.final_edits, add_imports=list(dict.fromkeys(fc.adds)),
                  remove_imports=list(dict.fromkeys(fc.removes)), group=g.id)
        for u in uses:
            fp.fixes[(u.lineno, u.col_offset)] = fix
        if not uses:
            # a file the group edits without an apex use of its own (a caller that now passes
            # the scaler): the planner reports there itself, with the fix
            from ampfix.plan import PlannedReport

            src = fc.src
            for i, (node, msg) in enumerate(g.anchors.get(path, [])):
                fp.reports.append(PlannedReport(node.lineno, src.char_col(node.lineno, node.col_offset),
                                                node.end_lineno, src.char_col(node.end_lineno, node.end_col_offset),
                                                msg, fix if i == 0 else None))
        if g.note_at_anchor and uses:
            fp.notes[(uses[0].lineno, uses[0].col_offset)] = g.note_at_anchor


def rewrites(project, g: Group) -> List[tuple]:
    """The group's edits of each file, as self-contained tries for :func:`try_rewrite`."""
    out = []
    for path, fc in g.changes.items():
        edits = fc.finish()
        fc.final_edits = edits
        if not any("torch." in e.text or "torch." in e.before for e in edits):
            fc.adds = [a for a in fc.adds if a.module != "torch"]
        out.append((path, fc.src.text, g.description, edits, list(fc.adds), list(fc.removes), g.id,
                    project.settings))
    return out


def try_rewrite(job) -> Optional[str]:
    """None when the rewrite parses and passes the self-checks; else why it is refused."""
    from ampfix.engine import _apply, _parses

    path, text, description, edits, adds, removes, group, settings = job
    fix = Fix(description, edits, add_imports=adds, remove_imports=removes, group=group)
    try:
        new = _apply(text, path, [fix])
    except Conflict as exc:
        return f"the rewrite of {path} does not fit together ({exc})"
    except SyntaxError:
        return f"the rewrite of {path} does not parse"
    except Exception as exc:  # a bug: the group is left whole, the run goes on
        return f"ampfix could not check this rewrite ({type(exc).__name__}: {exc}); please report it"
    if not _parses(new):
        return f"the rewrite of {path} does not parse"
    try:
        problems = self_check_texts(settings, text, new, path)
    except Exception as exc:
        return f"ampfix could not check this rewrite ({type(exc).__name__}: {exc}); please report it"
    if problems:
        return f"its output would be wrong: {problems[0]}"
    return None


SELF_CHECK = ("AMP203", "AMP204", "AMP205", "AMP206", "AMP207", "AMP211", "AMP212")


def self_check_texts(settings, before: str, after: str, path: str) -> List[str]:
    from ampfix.engine import check_source
    from ampfix.registry import rules_by_code

    rules = [rules_by_code()[c] for c in SELF_CHECK if c in rules_by_code()]

    def found(text):
        res = check_source(text.encode("utf-8"), path, rules, settings, plan=False)
        return [(d.code, d.message, d.line) for d in res.diagnostics if d.code in SELF_CHECK]

    old = {(c, m) for c, m, _ in found(before)}
    return [f"{c} at line {line}: {m}" for c, m, line in found(after) if (c, m) not in old]
