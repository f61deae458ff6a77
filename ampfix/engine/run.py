"""A run over many files: read each once, plan the apex files part by part, check the rest in
worker processes meanwhile, take back a migration group that failed in any file, and keep
results in the cache (:mod:`ampfix.engine.cache`)."""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ampfix.engine.check import FixError, check_notebook, check_source, error_result
from ampfix.engine.pool import Pool, WorkerDied, result
from ampfix.io.files import read_bytes
from ampfix.model.diagnostic import FileResult
from ampfix.model.settings import Settings

#: Above this many files, work is spread over a process pool.
PARALLEL_THRESHOLD = 16


def _work(args) -> FileResult:
    path, codes, settings, fix, plan = args
    from ampfix.registry import rules_by_code

    rules = [rules_by_code()[c] for c in codes]
    data, err = read_bytes(path)
    if data is None:
        return error_result(path, err)
    from ampfix.io.writer import digest

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
    :class:`ampfix.engine.cache.Cache`, for a check without fixes) keeps results across runs.

    The files that no planner looks at (no "apex" in their bytes) are checked by the workers
    while this process plans the others."""
    from ampfix.project.plan import planners_of
    from ampfix.registry import rules_by_code

    jobs = [(p, tuple(codes)) for p, codes in jobs]
    planners = planners_of(rules_by_code()[c] for c in sorted({c for _, codes in jobs for c in codes}))
    texts = {}
    for p, _ in jobs:
        data, _err = read_bytes(p)
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
        from ampfix.project.planning import plan_projects

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
                    if plan and any(f.group in failed for f in [*plan.fixes.values(),
                                                                 *(r.fix for r in plan.reports if r.fix)])]
            for i in redo:
                p, codes, st, fx, plan = tasks[i]
                tasks[i] = (p, codes, st, fx, _without_groups(plan, failed))
            for i, r in zip(redo, _run_tasks([tasks[i] for i in redo], workers)):
                results[i] = r
    return results


def _check_cached(jobs, texts, settings, planners, workers, cache, progress=None) -> List[FileResult]:
    """check_paths through the result cache: every file is read once, its digest keys its
    entry.  A file of a part of the run that the planner looks at (see
    :func:`ampfix.project.planning.plan_projects`) is keyed on its part's plan too, and that plan on the
    part's files (and, where the plan asked a project-wide question, on the other parts that
    name it): an edit re-plans the part it is in, not the whole run."""
    import hashlib

    from ampfix.project.parts import part_keys

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
        from ampfix.project.planning import plan_projects

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
    from ampfix.project.plan import FilePlan

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
    A worker that dies (a crash in the interpreter) costs only the file it was checking: its
    chunk is split in halves and run again until the file to blame is alone, which gets an error
    result naming the crash; the other workers go on.  ``also``: how many tasks ``more`` is
    expected to bring (whether a pool pays); ``progress``: told how many files are done."""
    import os

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
    with Pool(n) as pool:
        chunks: List[Tuple[object, List[int]]] = []

        def submit(start):
            size = max(1, (len(every) - start) // (n * 8))
            for k in range(start, len(every), size):
                chunk = list(range(k, min(k + size, len(every))))
                chunks.append((pool.submit(_work_chunk, [every[i] for i in chunk]), chunk))

        def runner(fn, items):
            try:
                return pool.map(fn, items)
            except WorkerDied:  # a crash while planning twice over: the tries are made here
                return [fn(x) for x in items]

        submit(0)
        if more is not None:
            extra = more(runner)
            if extra:
                start = len(every)
                every.extend(extra)
                submit(start)
        results: List[Optional[FileResult]] = [None] * len(every)
        while chunks:
            fut, chunk = chunks.pop(0)
            try:
                got = result(fut)
            except WorkerDied as exc:
                if len(chunk) == 1:
                    path = every[chunk[0]][0]
                    results[chunk[0]] = error_result(
                        path, f"skipped: checking this file crashed the worker process ({exc}); please report it")
                    if progress is not None:
                        progress.add(1)
                else:  # halves, each in a worker of its own, until the file to blame is alone
                    half = len(chunk) // 2
                    for part in (chunk[:half], chunk[half:]):
                        chunks.append((pool.submit(_work_chunk, [every[i] for i in part]), part))
                continue
            for i, r in zip(chunk, got):
                results[i] = r
            if progress is not None:
                progress.add(len(chunk))
    return results


def _work_chunk(chunk):
    return [_work(t) for t in chunk]
