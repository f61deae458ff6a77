"""The engine: bytes -> parse -> semantic model -> rules -> diagnostics and fixes.

It knows no rule by name.  For each file it reads the text as Python does, parses it with
Python's own ``ast`` (every file, so every syntax error is reported), builds one semantic model
that every rule shares, walks the tree once and calls each active rule's ``visit_*`` methods.

Fixing: the fixes that do not overlap are applied as text edits, then the imports they need
are added and the ones they left unused removed; the result must parse, or the fix that broke
it is left out (and reported) while the others stay.  Then the file is checked again, until no
fix applies.  Fixes of one migration group (planned across modules) are all or none: a group
that fails in one file is taken back everywhere (:mod:`ampfix.project.graph`).
"""
from __future__ import annotations

import ast
import dataclasses
import re
from typing import Dict, List, Optional, Sequence, Tuple

from ampfix.model.diagnostic import Diagnostic, FileResult
from ampfix.model.edits import Conflict, Edit, apply_edits
from ampfix.rule import Context, Fix, Report
from ampfix.model.semantic import Model
from ampfix.model.settings import Settings
from ampfix.model.source import Source, SourceError, run_deep
from ampfix.engine.noqa import Suppressions
from ampfix.engine.fit import fit_lines
from ampfix.engine.tidy import branches_made_alike, imports_gone_unused, locals_gone_unread, tidy

SYNTAX_ERROR = ("AMP000", "syntax-error")
IO_ERROR = ("AMP001", "io-error")
FIX_ERROR = ("AMP002", "fix-failed")
NOQA_UNKNOWN = ("AMP003", "noqa-unknown-code")
MAX_PASSES = 10


class FixError(Exception):
    """A fix produced text that does not parse: a bug in a rule; the file is left alone."""


# --------------------------------------------------------------------------- triggers
_TRIGGER_CACHE: Dict[Tuple[str, ...], "re.Pattern"] = {}


def trigger_pattern(triggers: Sequence[str]) -> "re.Pattern":
    """One regex for a rule's triggers; a trigger that begins with a letter must begin a word
    ("amp" is found in "torch.cuda.amp" and "use_amp", not in "example" or "clamp")."""
    key = tuple(triggers)
    pat = _TRIGGER_CACHE.get(key)
    if pat is None:
        parts = []
        for t in triggers:
            p = re.escape(t)
            if t[:1].isalnum():
                p = r"(?<![A-Za-z0-9])" + p
            parts.append(p)
        pat = _TRIGGER_CACHE[key] = re.compile("|".join(parts))
    return pat


def active_rules(text: str, rules: Sequence[type]) -> List[type]:
    # a plain substring test first (C speed); the word-boundary regex only where one is found
    return [r for r in rules if not r.triggers or (any(t in text for t in r.triggers)
                                                    and trigger_pattern(r.triggers).search(text))]


# --------------------------------------------------------------------------- one file
def _dispatch(ctx: Context, rules: Sequence[type]) -> List[Report]:
    instances = [r(ctx) for r in rules]
    handlers: Dict[str, list] = {}
    for rule in instances:
        for t in type(rule).visited_types():
            handlers.setdefault(t, []).append(getattr(rule, "visit_" + t))
    for rule in instances:
        begin = getattr(rule, "visit_Module", None)
        if begin is not None:
            begin(ctx.tree)
    nodes = ctx.sem.nodes
    order: List[ast.AST] = []
    for t in handlers:
        order.extend(nodes.get(t, ()))
    if len(handlers) > 1:
        order.sort(key=lambda n: (n.lineno, n.col_offset))
    for node in order:
        for f in handlers[type(node).__name__]:
            f(node)
    return [rep for rule in instances for rep in rule.reports]


def analyse(src: Source, rules: Sequence[type], settings: Settings, plan=None) -> Tuple[Context, List[Report]]:
    """Run the rules over a parsed source (``plan``: what project planners decided for it)."""
    from ampfix.model.analysis import STAR_EXPORTS

    collect = {t for r in rules for t in r.visited_types()}
    model = Model(src.tree, STAR_EXPORTS, collect)
    ctx = Context(src, model, settings, plan)
    return ctx, _dispatch(ctx, rules)


def _diagnostic(path: str, rep: Report) -> Diagnostic:
    fix = rep.fix
    return Diagnostic(
        path=path, line=rep.line, col=rep.col + 1, end_line=rep.end_line, end_col=rep.end_col + 1,
        code=rep.rule.code, name=rep.rule.name, message=rep.message,
        fix=None if fix is None else ("safe" if fix.safe else "unsafe"),
        fix_description=None if fix is None else fix.description,
    )


def error_result(path: str, message: str, line: int = 1, col: int = 1, kind=IO_ERROR) -> FileResult:
    """A file that could not be read, decoded or parsed: one diagnostic, nothing written."""
    return FileResult(path=path, error=message if kind is IO_ERROR else None,
                      diagnostics=[Diagnostic(path, line, col, line, col, *kind, message)])


def _source_error(path: str, exc: SourceError) -> FileResult:
    if exc.code == "AMP000":
        return error_result(path, f"cannot parse: {exc.message}", exc.line, exc.col, SYNTAX_ERROR)
    return error_result(path, exc.message, exc.line, exc.col, IO_ERROR)


def _inside(inner: Edit, region: Edit) -> bool:
    lo, hi = region.keep
    return region.region and lo <= inner.start and inner.end <= hi and (inner.start, inner.end) != (region.start,
                                                                                                   region.end)


def _overlap(a: Edit, b: Edit) -> bool:
    if a == b:
        return False
    if _inside(a, b) or _inside(b, a):
        return False  # one lies in the part of the other's region that stays: they compose
    if a.start == a.end and b.start == b.end:
        return a.start == b.start
    if a.start == a.end:
        return b.start < a.start < b.end
    if b.start == b.end:
        return a.start < b.start < a.end
    return a.start < b.end and b.start < a.end


def choose(fixes: Sequence[Fix]) -> List[Fix]:
    """Fixes whose edits do not overlap: planned migrations first (they cannot wait: their
    positions hold for the original text only), then by position (the rest wait for the next
    pass)."""
    ordered = sorted(fixes, key=lambda f: (f.group is None, min((e.start for e in f.edits), default=0)))
    chosen: List[Fix] = []
    taken: List[Edit] = []
    for fix in ordered:
        if any(_overlap(e, t) for e in fix.edits for t in taken):
            continue
        chosen.append(fix)
        taken.extend(fix.edits)
    return chosen


def apply_fixes(text: str, path: str, fixes: Sequence[Fix]) -> str:
    out = apply_edits(text, [e for f in fixes for e in f.edits])
    from ampfix.model.analysis import STAR_EXPORTS

    adds = [i for f in fixes for i in f.add_imports]
    removes = [i for f in fixes for i in f.remove_imports]
    may_go = {n for f in fixes for n in getattr(f, "names_may_go", ())}
    out = tidy(out, path, adds, removes, STAR_EXPORTS, may_go)
    out = locals_gone_unread(text, out, path, STAR_EXPORTS)
    out = branches_made_alike(text, out, path)
    return fit_lines(text, imports_gone_unused(text, out, path, removes, STAR_EXPORTS))


def parses(text: str) -> bool:
    try:
        compile(text, "<ampfix>", "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


def check_text(src: Source, rules: Sequence[type], settings: Settings, fix: Optional[str] = None,
               plan=None, allowed_groups=None) -> FileResult:
    """Lint (and with ``fix`` = "safe" or "unsafe", fix) one decoded source."""
    path = src.path
    result = FileResult(path=path)
    try:
        src.parse()
    except SourceError as exc:
        return _source_error(path, exc)
    active = active_rules(src.text, rules)
    if plan:
        # the rules that own a plan run where it says something, whatever the file's text
        active += [r for r in rules if getattr(r, "planner", None) is not None and r not in active]
    if not active:
        if fix:
            result.original = result.fixed = src.text
            result.fixed_bytes = src.data
        result.diagnostics = _unknown_noqa(path, Suppressions(src) if "noqa" in src.text.lower() else None)
        return result
    sup = Suppressions(src)
    if sup.skip_file:
        return result
    original = src.text
    failed: List[Tuple[Fix, str]] = []
    seen_failed = set()
    first: List[Report] = []
    for n_pass in range(MAX_PASSES):
        ctx, reports = analyse(src, active, settings, plan if n_pass == 0 or not plan else plan.without_fixes())
        reports = [r for r in reports if not sup.suppressed(r.line, r.rule.code)]
        if n_pass == 0:
            first = reports
            if fix and plan:
                failed.extend(_parts_not_carried(plan, reports, fix, allowed_groups))
        if not fix:
            break
        gone = {f.group for f, _ in failed if f.group is not None}
        fixes = list({id(r.fix): r.fix for r in reports if r.fix and r.fix.edits and (r.fix.safe or fix == "unsafe")
                      and (r.fix.group is None or allowed_groups is None or r.fix.group in allowed_groups)
                      and r.fix.group not in gone
                      and (r.fix.description, r.line) not in seen_failed}.values())
        if not fixes:
            break
        chosen = choose(fixes)
        for f in fixes:
            if f.group is not None and all(f is not c for c in chosen):
                # a planned fix that cannot go in with the others: its group is taken back everywhere
                failed.append((f, "its edits overlap another planned fix"))
                seen_failed.add((f.description, next((r.line for r in reports if r.fix is f), 0)))
        new_text = _try_apply(src.text, path, chosen, failed, seen_failed, reports)
        if new_text is None or new_text == src.text:
            break
        result.applied.extend(f.description for f in chosen if all(f is not g for g, _ in failed))
        result.groups.update(f.group for f in chosen if f.group is not None and all(f is not g for g, _ in failed))
        src = Source(src.encode(new_text), path, text=new_text, encoding=src.encoding)
        src.parse()
        sup = Suppressions(src)
    if reports is not first:
        reports = _with_planned_reasons(reports, first, {f.group for f, _ in failed if f.group is not None})
    result.diagnostics = sorted([*(_diagnostic(path, r) for r in reports), *_unknown_noqa(path, sup)],
                                key=Diagnostic.sort_key)
    for f, why in failed:
        result.failed_fixes.append(f"{f.description}: {why}")
        if f.group is not None:
            result.failed_groups.add(f.group)
    if fix:
        result.original = original
        result.fixed = src.text
        result.fixed_bytes = src.encode(src.text) if src.text != original else src.data
    return result


def _parts_not_carried(plan, reports: List[Report], fix: str, allowed_groups) -> List[Tuple[Fix, str]]:
    """The planned fixes of this file that no report carries (their rule is not selected, or the
    line says ``# noqa``): a migration's part here would not go in while its other files' parts
    do (a function that takes the scaler, its callers not passing it), so each such group is
    taken back everywhere."""
    planned = {f.group: f for f in [*plan.fixes.values(), *(r.fix for r in plan.reports if r.fix is not None)]
               if f.group is not None and f.edits and (f.safe or fix == "unsafe")
               and (allowed_groups is None or f.group in allowed_groups)}
    carried = {r.fix.group for r in reports if r.fix is not None and r.fix.group is not None}
    return [(f, "its rule is not selected in this file, or its line says noqa: the migration's other files "
                "cannot change without this one") for g, f in planned.items() if g not in carried]


def _with_planned_reasons(reports: List[Report], first: List[Report], failed_groups=frozenset()) -> List[Report]:
    """The passes after the first run with no plan (its positions no longer match the edited
    text), so what is left loses the planner's reason (``... (not rewritten: why)``) and the
    planned fix that only ``--unsafe-fixes`` applies (then "needs --unsafe-fixes (why)" would be
    missing once a safe fix elsewhere changed the file).  Each such report takes them back from
    the first pass's report of the same rule and message, in order (the fix only says what it
    is: the diagnostics carry no edits)."""
    reasons: Dict[tuple, List[str]] = {}
    unsafe: Dict[tuple, list] = {}
    for r in first:
        base, sep, _ = r.message.partition(" (not rewritten")
        if sep:
            reasons.setdefault((r.rule.code, base), []).append(r.message)
        elif r.fix is not None and not r.fix.safe and r.fix.group is not None and r.fix.group not in failed_groups:
            unsafe.setdefault((r.rule.code, r.message), []).append(r.fix)
    if not reasons and not unsafe:
        return reports
    out = []
    for r in reports:
        queue = reasons.get((r.rule.code, r.message))
        if queue:
            r = dataclasses.replace(r, message=queue.pop(0))
        elif r.fix is None and unsafe.get((r.rule.code, r.message)):
            r = dataclasses.replace(r, fix=unsafe[(r.rule.code, r.message)].pop(0))
        out.append(r)
    return out


def _unknown_noqa(path: str, sup: Optional[Suppressions]) -> List[Diagnostic]:
    """AMP003 for each AMP code a ``# noqa:`` names that no rule (and no engine code) has; the
    codes of other tools are theirs."""
    if sup is None or not sup.noqa:
        return []
    from ampfix.engine.codes import ENGINE_CODES
    from ampfix.registry import rules_by_code

    known = set(rules_by_code()) | set(ENGINE_CODES)
    out = []
    for line, codes in sorted(sup.noqa.items()):
        for code in sorted(c for c in (codes or ()) if c.startswith("AMP") and c not in known):
            out.append(Diagnostic(path, line, 1, line, 1, NOQA_UNKNOWN[0], NOQA_UNKNOWN[1],
                                  f"`# noqa: {code}` names no ampfix rule, so it silences nothing (see 'ampfix rules')"))
    return out


def _try_apply(text: str, path: str, chosen: List[Fix], failed, seen_failed, reports) -> Optional[str]:
    """Apply the chosen fixes together; when the result does not parse (or edits conflict),
    try each alone, leave out (and record) each that fails, and apply the others."""
    try:
        new = apply_fixes(text, path, chosen)
        if parses(new):
            return new
    except (Conflict, SourceError):  # SourceError: the edits broke the syntax before tidying
        pass
    good = []
    for f in chosen:
        try:
            ok, why = parses(apply_fixes(text, path, [f])), "the result does not parse"
        except Conflict as exc:
            ok, why = False, str(exc)
        except SourceError as exc:
            ok, why = False, f"the result does not parse ({exc.message}, line {exc.line})"
        if ok:
            good.append(f)
            continue
        failed.append((f, why))
        line = next((r.line for r in reports if r.fix is f), 0)
        seen_failed.add((f.description, line))
    if not good:
        return None
    try:
        new = apply_fixes(text, path, good)
        if parses(new):
            return new
    except (Conflict, SourceError):
        pass
    return apply_fixes(text, path, good[:1])


def check_source(data: bytes, path: str, rules: Sequence[type], settings: Settings, fix: Optional[str] = None,
                 plan=None, allowed_groups=None) -> FileResult:
    """Lint (and maybe fix) one file's bytes.  ``plan``: the FilePlan that project planners made
    for it; None plans the file as a project of its own; False plans nothing."""
    if len(data) > settings.max_file_size:
        return error_result(path, f"skipped: {len(data) // 1024} KiB is more than max-file-size "
                                  f"({settings.max_file_size // 1024} KiB)")
    try:
        src = Source(data, path)
    except SourceError as exc:
        return _source_error(path, exc)
    rules = [r for r in rules if not getattr(r, "files", None)]  # file rules read other files
    return run_deep(_check_one, src, rules, settings, fix, plan, allowed_groups)


def check_notebook(data: bytes, path: str, rules: Sequence[type], settings: Settings,
                   fix: Optional[str] = None) -> FileResult:
    """A Jupyter notebook: its code cells checked (and fixed) as one module; diagnostics name
    the cell and the line in it; the fixed notebook keeps everything but the changed cells."""
    from ampfix.io import notebook

    try:
        book = notebook.read(data, path)
    except notebook.NotebookError as exc:
        return error_result(path, f"cannot read the notebook: {exc}", kind=SYNTAX_ERROR)
    result = check_source(book.module.encode("utf-8"), path, rules, settings, fix, plan=None)
    import dataclasses

    text = result.fixed if fix and result.fixed is not None else book.module
    placed = []
    for d in result.diagnostics:
        cell, line = notebook.where(text, d.line)
        if cell is not None:
            d = dataclasses.replace(d, cell=cell, line=line, end_line=line + (d.end_line - d.line))
        placed.append(d)
    result.diagnostics = placed
    if fix:
        if result.changed:
            try:
                result.fixed_bytes = notebook.write_back(book, result.fixed)
            except notebook.NotebookError as exc:
                result.error = f"not rewritten: {exc}"
                result.fixed, result.fixed_bytes = result.original, data
        else:
            result.fixed_bytes = data
        if result.original is not None:  # the diff shows the IPython lines, not their stand-ins
            result.original = notebook.shown(book, result.original)
            result.fixed = notebook.shown(book, result.fixed)
    return result


def _check_one(src, rules, settings, fix, plan, allowed_groups):
    if plan is None:
        from ampfix.project.plan import planners_of

        planners = planners_of(rules)
        if planners and "apex" in src.text:
            from ampfix.project.graph import Project

            try:
                src.parse()
            except SourceError as exc:
                return _source_error(src.path, exc)
            project = Project.single(src, rules, settings)
            project.trial = try_rewrite
            plan = None
            for planner in planners:
                fp = planner(project).get(src.path)
                if fp is not None:
                    plan = fp if plan is None else plan.merged(fp)
    return check_text(src, rules, settings, fix, plan or None, allowed_groups)


# --------------------------------------------------------------------------- planned rewrites
def try_rewrite(job) -> Optional[str]:
    """None when the rewrite parses and passes the self-checks; else why it is refused."""
    path, text, description, edits, adds, removes, group, settings = job
    fix = Fix(description, edits, add_imports=adds, remove_imports=removes, group=group)
    try:
        new = apply_fixes(text, path, [fix])
    except Conflict as exc:
        return f"the rewrite of {path} does not fit together ({exc})"
    except SyntaxError:
        return f"the rewrite of {path} does not parse"
    except Exception as exc:  # a bug: the group is left whole, the run goes on
        return f"ampfix could not check this rewrite ({type(exc).__name__}: {exc}); please report it"
    if not parses(new):
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
    from ampfix.registry import rules_by_code

    rules = [rules_by_code()[c] for c in SELF_CHECK if c in rules_by_code()]

    def found(text):
        res = check_source(text.encode("utf-8"), path, rules, settings, plan=False)
        return [(d.code, d.message, d.line) for d in res.diagnostics if d.code in SELF_CHECK]

    old = {(c, m) for c, m, _ in found(before)}
    return [f"{c} at line {line}: {m}" for c, m, line in found(after) if (c, m) not in old]
