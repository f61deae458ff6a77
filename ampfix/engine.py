"""The engine: bytes -> parse -> semantic model -> rules -> diagnostics and fixes.

It knows no rule by name.  For each file it reads the text as Python does, parses it with
Python's own ``ast`` (every file, so every syntax error is reported), builds one semantic model
that every rule shares, walks the tree once and calls each active rule's ``visit_*`` methods.

Fixing: the fixes that do not overlap are applied as text edits, then the imports they need
are added and the ones they left unused removed; the result must parse, or the fix that broke
it is left out (and reported) while the others stay.  Then the file is checked again, until no
fix applies.  Fixes of one migration group (planned across modules) are all or none: a group
that fails in one file is taken back everywhere (:mod:`ampfix.project`).
"""
from __future__ import annotations

import ast
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ampfix.diagnostic import Diagnostic, FileResult
from ampfix.edits import Conflict, Edit, apply_edits
from ampfix.rule import Context, Fix, Report
from ampfix.semantic import Model
from ampfix.settings import Settings
from ampfix.source import Source, SourceError, run_deep
from ampfix.tidy import tidy

SYNTAX_ERROR = ("AMP000", "syntax-error")
IO_ERROR = ("AMP001", "io-error")
FIX_ERROR = ("AMP002", "fix-failed")
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


# --------------------------------------------------------------------------- suppression
_NOQA = re.compile(r"#\s*noqa(?::[\s]*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?", re.IGNORECASE)
_SKIP = re.compile(r"#\s*ampfix:\s*skip-file\b", re.IGNORECASE)


def parse_noqa(comment: str):
    """``# noqa`` -> None (all codes); ``# noqa: A, B`` -> {A, B}; no noqa -> False."""
    m = _NOQA.search(comment)
    if not m:
        return False
    codes = m.group("codes")
    if not codes:
        return None
    return frozenset(c.upper() for c in re.split(r"[\s,]+", codes) if c)


class Suppressions:
    """``# noqa`` comments by line and ``# ampfix: skip-file``, found in comments only."""

    def __init__(self, src: Source) -> None:
        self.noqa: Dict[int, Optional[frozenset]] = {}
        self.skip_file = False
        text = src.text
        low = text.lower()
        if "noqa" not in low and "ampfix" not in low:
            return
        strings = None
        for no in range(1, src.line_count + 1):
            line = src.line_text(no)
            if "#" not in line:
                continue
            ll = line.lower()
            if "noqa" not in ll and "ampfix" not in ll:
                continue
            if strings is None:
                strings = _string_line_ranges(src)
            comment = _comment_of(line, no in strings)
            if comment is None:
                continue
            if _SKIP.search(comment):
                self.skip_file = True
            codes = parse_noqa(comment)
            if codes is not False:
                prev = self.noqa.get(no, frozenset())
                self.noqa[no] = None if codes is None or prev is None else prev | codes

    def suppressed(self, line: int, code: str) -> bool:
        if line not in self.noqa:
            return False
        codes = self.noqa[line]
        return codes is None or code in codes


def _string_line_ranges(src: Source) -> set:
    """Lines that a multi-line string covers after its first line (a '#' there is text)."""
    out = set()
    for n in ast.walk(src.tree):
        if isinstance(n, (ast.Constant, ast.JoinedStr)) and n.end_lineno > n.lineno and (
                isinstance(n, ast.JoinedStr) or isinstance(n.value, (str, bytes))):
            out.update(range(n.lineno + 1, n.end_lineno + 1))
    return out


def _comment_of(line: str, starts_in_string: bool) -> Optional[str]:
    """The comment of a line (a '#' outside quotes), or None; a line that starts inside a
    multi-line string has a comment only after that string closes (approximated as none)."""
    if starts_in_string:
        return None
    quote = None
    i = 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if line.startswith(quote, i):
                i += len(quote)
                quote = None
                continue
        elif c == "#":
            return line[i:]
        elif c in "'\"":
            quote = line[i:i + 3] if line[i:i + 3] in ("'''", '"""') else c
            i += len(quote)
            continue
        i += 1
    return None


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
    from ampfix.analysis import STAR_EXPORTS

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


def _apply(text: str, path: str, fixes: Sequence[Fix]) -> str:
    out = apply_edits(text, [e for f in fixes for e in f.edits])
    from ampfix.analysis import STAR_EXPORTS

    adds = [i for f in fixes for i in f.add_imports]
    removes = [i for f in fixes for i in f.remove_imports]
    return tidy(out, path, adds, removes, STAR_EXPORTS)


def _parses(text: str) -> bool:
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
        return result
    sup = Suppressions(src)
    if sup.skip_file:
        return result
    original = src.text
    failed: List[Tuple[Fix, str]] = []
    seen_failed = set()
    for n_pass in range(MAX_PASSES):
        ctx, reports = analyse(src, active, settings, plan if n_pass == 0 or not plan else plan.without_fixes())
        reports = [r for r in reports if not sup.suppressed(r.line, r.rule.code)]
        if not fix:
            break
        fixes = list({id(r.fix): r.fix for r in reports if r.fix and r.fix.edits and (r.fix.safe or fix == "unsafe")
                      and (r.fix.group is None or allowed_groups is None or r.fix.group in allowed_groups)
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
        src = Source(src.encode(new_text), path, text=new_text, encoding=src.encoding)
        src.parse()
        sup = Suppressions(src)
    result.diagnostics = sorted((_diagnostic(path, r) for r in reports), key=Diagnostic.sort_key)
    for f, why in failed:
        result.failed_fixes.append(f"{f.description}: {why}")
        if f.group is not None:
            result.failed_groups.add(f.group)
    if fix:
        result.original = original
        result.fixed = src.text
        result.fixed_bytes = src.encode(src.text) if src.text != original else src.data
    return result


def _try_apply(text: str, path: str, chosen: List[Fix], failed, seen_failed, reports) -> Optional[str]:
    """Apply the chosen fixes together; when the result does not parse (or edits conflict),
    try each alone, leave out (and record) each that fails, and apply the others."""
    try:
        new = _apply(text, path, chosen)
        if _parses(new):
            return new
    except Conflict:
        pass
    good = []
    for f in chosen:
        try:
            ok, why = _parses(_apply(text, path, [f])), "the result does not parse"
        except Conflict as exc:
            ok, why = False, str(exc)
        if ok:
            good.append(f)
            continue
        failed.append((f, why))
        line = next((r.line for r in reports if r.fix is f), 0)
        seen_failed.add((f.description, line))
    if not good:
        return None
    try:
        new = _apply(text, path, good)
        if _parses(new):
            return new
    except Conflict:
        pass
    return _apply(text, path, good[:1])


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
    from ampfix import notebook

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
        from ampfix.plan import planners_of

        planners = planners_of(rules)
        if planners and "apex" in src.text:
            from ampfix.project import Project

            try:
                src.parse()
            except SourceError as exc:
                return _source_error(src.path, exc)
            project = Project.single(src, rules, settings)
            plan = None
            for planner in planners:
                fp = planner(project).get(src.path)
                if fp is not None:
                    plan = fp if plan is None else plan.merged(fp)
    return check_text(src, rules, settings, fix, plan or None, allowed_groups)


# --------------------------------------------------------------------------- many files
#: Above this many files, work is spread over a process pool.
PARALLEL_THRESHOLD = 16


def _read(path: str):
    import os
    import stat

    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):  # a FIFO or a device would block or never end
            return None, "not a regular file; skipped"
        with open(path, "rb") as fh:
            return fh.read(), None
    except OSError as exc:
        return None, f"cannot read: {exc.strerror or exc}"


def _work(args) -> FileResult:
    path, codes, settings, fix, plan = args
    from ampfix.registry import rules_by_code

    rules = [rules_by_code()[c] for c in codes]
    data, err = _read(path)
    if data is None:
        return error_result(path, err)
    from ampfix.writer import digest

    try:
        if path.endswith(".ipynb"):
            result = check_notebook(data, path, rules, settings, fix)
        else:
            result = check_source(data, path, rules, settings, fix, plan=plan if plan is not None else False)
    except FixError as exc:
        return error_result(path, str(exc))
    result.digest = digest(data)
    return result


def check_paths(jobs: Iterable[Tuple[str, Sequence[str]]], settings: Settings, fix: Optional[str] = None,
                workers: Optional[int] = None, cache=None, progress=None) -> List[FileResult]:
    """Check each ``(path, rule codes)``; results come back in the order given.  Files that
    take part in a migration planned across modules are checked with that plan.  ``cache`` (an
    :class:`ampfix.cache.Cache`, for a check without fixes) keeps results across runs.

    The files that no planner looks at (no "apex" in their bytes) are checked by the workers
    while this process plans the others."""
    from ampfix.plan import planners_of
    from ampfix.registry import rules_by_code

    jobs = [(p, tuple(codes)) for p, codes in jobs]
    planners = planners_of(rules_by_code()[c] for c in sorted({c for _, codes in jobs for c in codes}))
    texts = {}
    for p, _ in jobs:
        data, _err = _read(p)
        if data is not None:
            texts[p] = data
    shown = _Progress(progress, len(jobs)) if progress else None
    try:
        return _check_paths(jobs, texts, settings, fix, planners, workers, cache, shown)
    finally:
        if shown is not None:
            shown.finish()


class _Progress:
    def __init__(self, show, total: int) -> None:
        self.show, self.total, self.done = show, total, 0

    def add(self, n: int) -> None:
        self.done = min(self.total, self.done + n)
        self.show(min(self.done, self.total - 1), self.total)

    def finish(self) -> None:
        self.show(self.total, self.total)



def _check_paths(jobs, texts, settings, fix, planners, workers, cache, progress):
    if cache is not None and not fix:
        return _check_cached(jobs, texts, settings, planners, workers, cache, progress)
    planned = {p for p, _ in jobs if planners and b"apex" in texts.get(p, b"") and not p.endswith(".ipynb")}
    plans: dict = {}
    late: List[int] = []

    def planned_tasks(runner=None):
        # a file without apex can take part too (a caller that now passes the scaler): it is
        # checked again, with its plan
        from ampfix.project import plan_projects

        plans.update(plan_projects([j for j in jobs if j[0] in planned], settings, planners, given=jobs,
                                   runner=runner, read=texts))
        late.extend(i for i, (p, _) in enumerate(jobs) if p in planned or p in plans)
        return [(jobs[i][0], jobs[i][1], settings, fix, plans.get(jobs[i][0])) for i in late]

    early = [i for i, (p, _) in enumerate(jobs) if p not in planned]
    got = _run_tasks([(jobs[i][0], jobs[i][1], settings, fix, None) for i in early], workers,
                     planned_tasks if planned else None, also=len(planned), progress=progress)
    results: List[Optional[FileResult]] = [None] * len(jobs)
    for i, r in zip(early + late, got):
        results[i] = r
    tasks = [(p, codes, settings, fix, plans.get(p)) for p, codes in jobs]
    if fix:
        # a migration group that failed in one file is taken back in all of its files
        failed: set = set()
        while True:
            new = {g for r in results for g in r.failed_groups} - failed
            if not new:
                break
            failed |= new
            redo = [i for i, (p, codes, st, fx, plan) in enumerate(tasks)
                    if plan and any(f.group in failed for f in plan.fixes.values())]
            for i in redo:
                p, codes, st, fx, plan = tasks[i]
                tasks[i] = (p, codes, st, fx, _without_groups(plan, failed))
            for i, r in zip(redo, _run_tasks([tasks[i] for i in redo], workers)):
                results[i] = r
    return results


def _check_cached(jobs, texts, settings, planners, workers, cache, progress=None) -> List[FileResult]:
    """check_paths through the result cache: every file is read once, its digest keys its
    entry.  A file of a part of the run that the planner looks at (see
    :func:`ampfix.project.plan_projects`) is keyed on its part's plan too, and that plan on the
    part's files (and, where the plan asked a project-wide question, on the other parts that
    name it): an edit re-plans the part it is in, not the whole run."""
    import hashlib

    from ampfix.project import part_keys

    digests = {p: hashlib.sha256(data).hexdigest() for p, data in texts.items()}
    planned = [(p, codes) for p, codes in jobs
               if planners and b"apex" in texts.get(p, b"") and not p.endswith(".ipynb")]
    part_of: Dict[str, str] = {}  # path -> its part's key
    outside: Dict[str, str] = {}  # part key -> the signature of the other parts' text it may read
    parts = None  # the run's parts, when worked out in this run
    if planned:  # the parts of an unchanged run are read back, not worked out again
        run_key = cache.key("parts", settings, sorted((p, tuple(c), digests.get(p)) for p, c in jobs))
        got = cache.get(run_key)
        if got is None:
            part_of, outside, parts = part_keys(jobs, texts, digests, planned,
                                                lambda *a: cache.key("part", settings, *a))
            cache.put(run_key, (part_of, outside))
        else:
            part_of, outside = got
    entries: Dict[str, Optional[dict]] = {}

    def plan_id(part: str) -> Optional[str]:
        """What the part's files are keyed on: its plan as cached, if that plan still holds."""
        if part not in entries:
            entries[part] = cache.get(part)
        e = entries[part]
        if e is None or (e["outside"] is not None and e["outside"] != outside[part]):
            return None
        return part if e["outside"] is None else cache.key("plan", part, e["outside"])

    def key(i):
        p, codes = jobs[i]
        pid = plan_id(part_of[p]) if p in part_of else None
        if p in part_of and pid is None:
            return None  # its part is to be planned first
        return cache.key("file", settings, codes, p, digests[p], pid)

    results: List[Optional[FileResult]] = [None] * len(jobs)
    keys: Dict[int, str] = {}
    todo = []
    for i, (p, codes) in enumerate(jobs):
        k = key(i) if p in digests else None  # unreadable: checked (and reported) without the cache
        hit = cache.get(k) if k is not None else None
        if k is not None:
            keys[i] = k
        if hit is None:
            todo.append(i)
        else:
            results[i] = hit
    first = [i for i in todo if jobs[i][0] not in part_of]
    later = [i for i in todo if jobs[i][0] in part_of]
    plans: Dict[str, object] = {}
    unkept: set = set()  # files of parts joined while planning: their plans are not cached

    def planned_tasks(runner=None):
        from ampfix.project import plan_projects

        stale = sorted({part_of[jobs[i][0]] for i in later if plan_id(part_of[jobs[i][0]]) is None})
        for i in later:
            e = entries.get(part_of[jobs[i][0]])
            if plan_id(part_of[jobs[i][0]]) is not None:
                plans.update(e["plans"])
        if stale:
            report: list = []
            asked = [(p, c) for p, c in planned if part_of[p] in stale]
            plans.update(plan_projects(asked, settings, planners, given=jobs, runner=runner, read=texts,
                                       report=report, parts=parts))
            for files, part_plans, other in report:
                of = {part_of.get(f) for f in files}
                if len(of) != 1 or None in of or {f for f in part_of if part_of[f] in of} != set(files):
                    unkept.update(files)  # a part joined with another while planning
                    continue
                part = of.pop()
                entries[part] = {"outside": outside[part] if other else None, "plans": part_plans}
                cache.put(part, entries[part])
                for i, (p, _) in enumerate(jobs):
                    if part_of.get(p) == part:
                        keys[i] = key(i)
            # a file outside the planned parts that a joined part's plan covers: checked again
            # with it, and not kept
            for i, (p, _) in enumerate(jobs):
                if p in plans and p not in part_of and i not in later:
                    later.append(i)
                    unkept.add(p)
        return [(jobs[i][0], jobs[i][1], settings, None, plans.get(jobs[i][0])) for i in later]

    fresh = _run_tasks([(jobs[i][0], jobs[i][1], settings, None, None) for i in first], workers,
                       planned_tasks if later else None, also=len(later), progress=progress)
    redone = set(later)
    for n, (i, r) in enumerate(zip(first + later, fresh)):
        if n < len(first) and i in redone:
            continue  # checked again with its plan
        results[i] = r
        # what the file's bytes decide is kept; a read error, a crash or a joined part's plan is not
        if keys.get(i) and r.digest == digests[jobs[i][0]] and not r.error and jobs[i][0] not in unkept:
            cache.put(keys[i], r)
    return results


def _without_groups(plan, groups):
    """The plan without the fixes of ``groups``; their uses say why they were left."""
    from ampfix.plan import FilePlan

    fixes = {pos: f for pos, f in plan.fixes.items() if f.group not in groups}
    notes = dict(plan.notes)
    for pos, f in plan.fixes.items():
        if f.group in groups:
            notes.setdefault(pos, "not rewritten: another file of this migration could not take its part")
    return FilePlan(plan.path, fixes, notes, [r for r in plan.reports if r.fix is None or r.fix.group not in groups],
                    plan.flags)


def _run_tasks(tasks, workers, more=None, also: int = 0, progress=None):
    """Run the tasks, in worker processes when there are enough; ``more(runner)`` is called
    here once they are under way (``runner(fn, items)`` maps over the same workers), and the
    tasks it returns run after them: results come back for ``tasks + more()``, in that order.
    A worker that dies (a crash in the interpreter) costs only the file it was checking: the
    others are re-run in a new pool, and the file that brings a pool down alone gets an error
    result.  ``also``: how many tasks ``more`` is expected to bring (whether a pool pays);
    ``progress``: told how many files are done."""
    import os
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    n = workers if workers is not None else (os.cpu_count() or 1)
    if n <= 1 or len(tasks) + also < PARALLEL_THRESHOLD:
        results = []
        for t in tasks:
            results.append(_work(t))
            if progress is not None:
                progress.add(1)
        if more is not None:
            results += _run_tasks(more(None), workers, progress=progress)
        return results
    every = list(tasks)
    futures = []
    broken = []

    def submit(pool, start):
        size = max(1, (len(every) - start) // (n * 8))
        for k in range(start, len(every), size):
            chunk = list(range(k, min(k + size, len(every))))
            try:
                futures.append((pool.submit(_work_chunk, [every[i] for i in chunk]), chunk))
            except BrokenProcessPool:
                broken.extend(chunk)

    def runner(fn, items):
        try:
            return list(pool.map(fn, items))
        except BrokenProcessPool:  # a crash while planning: the tries are made here instead
            return [fn(x) for x in items]

    with ProcessPoolExecutor(max_workers=n, initializer=_worker_init, initargs=(os.getpid(),)) as pool:
        submit(pool, 0)
        if more is not None:
            extra = more(runner)
            if extra:
                start = len(every)
                every.extend(extra)
                submit(pool, start)
        results = [None] * len(every)
        for fut, chunk in futures:
            try:
                for i, r in zip(chunk, fut.result()):
                    results[i] = r
                if progress is not None:
                    progress.add(len(chunk))
            except BrokenProcessPool:
                broken.extend(chunk)
    for i in broken:  # the pool died: each of these alone, to find the file to blame
        results[i] = _alone(every[i])
    return results


def _alone(task):
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool
    import os

    try:
        with ProcessPoolExecutor(max_workers=1, initializer=_worker_init, initargs=(os.getpid(),)) as pool:
            return pool.submit(_work, task).result()
    except BrokenProcessPool:
        return error_result(task[0], "skipped: checking this file crashed the worker process; please report it")


def _work_chunk(chunk):
    return [_work(t) for t in chunk]


def _worker_init(parent: int) -> None:
    """A worker dies with its parent (SIGKILL included), and leaves Ctrl-C to it."""
    import os
    import signal
    import threading
    import time

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except Exception:
        pass

    def watch():
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()
