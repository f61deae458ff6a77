"""Planning a run's apex files part by part (see :mod:`ampfix.project.parts`), each part over a
:class:`ampfix.project.graph.Project`, in the worker processes where there are several."""
from __future__ import annotations

from pathlib import Path
from typing import Dict

from ampfix.engine.check import try_rewrite
from ampfix.io.files import read_bytes
from ampfix.model.apex import names_apex
from ampfix.model.source import Source, SourceError
from ampfix.project.graph import Project
from ampfix.project.parts import import_components, project_root

def plan_projects(jobs, settings, planners, given=None, runner=None, read=None, report=None,
                  parts=None) -> Dict[str, object]:
    """path -> its FilePlan, for the files that planners look at (those whose text names apex).

    Files without apex are checked on their own.  The others are planned by parts: the files
    of the run (``given``) joined by what may import what, each part that has an apex file
    planned as a whole, one after the other, so that memory holds one part's trees at a time.
    A part whose planning reads a file of another part is joined with it and planned again: a
    migration spanning modules is always decided as a whole.  Only the small per-file plans
    travel to the worker processes.  ``read``: the bytes of the files, where the caller has them.
    ``report`` (a list) receives, for each part planned, (its files as given, its plans, whether
    they depend on the text of other parts: a project-wide question such as "is apex
    initialized anywhere").  ``parts``: the run's parts, where the caller worked them out."""

    if not planners:
        return {}
    given = list(jobs if given is None else given)  # every file of the run: callers may be there
    named = {}
    texts: Dict[str, bytes] = {}
    for path, _ in given:
        if not path.endswith(".py"):
            continue
        real = str(Path(path).resolve())
        if real in named:
            continue
        data = (read or {}).get(path)
        if data is None:
            data, err = read_bytes(path)
            if data is None:
                continue
        named[real], texts[real] = path, data
    asked = {str(Path(p).resolve()) for p, _ in jobs if names_apex(texts.get(str(Path(p).resolve()), b""))}
    if not asked:
        return {}
    # the apex files of every part (a part joined with one asked for brings its own)
    apex = asked | {r for r, data in texts.items() if names_apex(data)}
    root = project_root([p for p, _ in given])
    if parts is None:
        parts = import_components(texts, root)
    pending = sorted({parts.find(a) for a in asked})
    done: Dict[str, Dict[str, object]] = {}
    run_files = set(texts)
    while pending:
        # the parts are independent: with worker processes, they are planned there, side by
        # side (the largest first); here, one after the other
        batch = sorted(pending, key=lambda t: (-len(parts.members(t)), t))
        pending = []
        jobs_ = [(members, [m for m in members if m in apex], {m: named[m] for m in members},
                  {m: texts[m] for m in members}, settings, tuple(planners), root, run_files)
                 for members in (parts.members(t) for t in batch)]
        if runner is not None and len(jobs_) > 1:
            got = runner(_plan_part_job, jobs_)
        else:
            got = [_plan_part(*job, runner=runner) for job in jobs_]
        joined = set()
        for top, job, (plans, read, other) in zip(batch, jobs_, got):
            outside = sorted(r for r in read if r in texts and parts.find(r) != parts.find(top))
            if outside:  # it needs files of other parts: those parts and this one are one
                for r in outside:
                    parts.join(top, r)
                joined.add(parts.find(top))
                continue
            done[top] = (job[0], plans, other)  # (its files, its plans, asked the other parts)
        if joined:  # a part joined with another is planned again, as one, whatever was planned of it
            stale = [k for k, (members, _, _) in done.items() if parts.members(parts.find(k)) != members]
            pending = sorted({parts.find(t) for t in joined} | {parts.find(k) for k in stale})
            for k in stale:
                del done[k]
    if report is not None:
        report.extend(([named[m] for m in members], plans, other) for members, plans, other in done.values())
    done = {k: v[1] for k, v in done.items()}
    out: Dict[str, object] = {}
    for top in sorted(done):
        for path, fp in done[top].items():
            out[path] = fp if path not in out else out[path].merged(fp)
    return out


def _plan_part_job(job):
    return _plan_part(*job)


def _plan_part(members, apex, named, texts, settings, planners, root, run_files, runner=None):
    """(plans, resolved paths of every module read, whether the plans depend on other parts)
    for one part of the run: its files (resolved paths), those that name apex, their names as
    given and their bytes."""
    sources = {}
    for real in apex:
        try:
            sources[named[real]] = Source(texts[real], named[real])
        except SourceError:
            continue
    if not sources:
        return {}, set(), False
    project = Project(sources, settings, root=root, given=[named[r] for r in members], run_files=run_files)
    project.runner = runner
    project.trial = try_rewrite
    plans: Dict[str, object] = {}
    for planner in planners:
        for path, fp in planner(project).items():
            plans[path] = fp if path not in plans else plans[path].merged(fp)
    read = {project.resolved_paths.get(p) or str(Path(p).resolve()) for p in project.modules}
    return plans, read | project.foreign, project.asked_other_parts
