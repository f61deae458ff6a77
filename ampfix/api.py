"""ampfix as a library: the same data as ``--output-format json``, for tools and notebooks.

    import ampfix
    report = ampfix.check(["src/"])            # {"diagnostics": [...], "summary": {...}, ...}
    diags = ampfix.check_code(text, "train.py")  # [{"code": "AMP302", "location": ...}, ...]
    fixed = ampfix.fix_code(text, "train.py")    # the text with the safe fixes applied
    result = ampfix.migrate(["src/"])           # {"files": [{"path", "changed", "diff", ...}]}

Settings come from ``[tool.ampfix]`` as for the command line; ``select``/``ignore`` take rule
codes or prefixes.  Errors in settings raise ``ampfix.api.ConfigError``.  These names are
stable; everything else in the package is internal.
"""
from __future__ import annotations

import json
from typing import Iterable, List, Optional, Sequence

from ampfix.io.config import ConfigError  # noqa: F401  (part of the API)

__all__ = ["check", "check_code", "fix_code", "migrate", "ConfigError"]


def _kw(paths, select, ignore, config, **more) -> dict:
    kw = {"paths": tuple(str(p) for p in paths), "config_path": config, "select": None, "extend_select": None,
          "ignore": None, "target": None, "torch_version": None, "extend_exclude": (),
          "no_respect_gitignore": False, "stdin_filename": None, "jobs": None, "no_cache": True}
    if select is not None:
        kw["select"] = ",".join(select)
    if ignore is not None:
        kw["ignore"] = ",".join(ignore)
    kw.update(more)
    return kw


def _as_dict(results, diags) -> dict:
    from ampfix.output.report import as_json

    return json.loads(as_json(results, diags))


def check(paths: Iterable[str], *, select: Optional[Sequence[str]] = None, ignore: Optional[Sequence[str]] = None,
          config: Optional[str] = None) -> dict:
    """Check files and folders: the document ``ampfix check --output-format json`` prints."""
    from ampfix.cli import run_paths

    _, results = run_paths(_kw(paths, select, ignore, config), fix=None)
    diags = sorted((d for r in results for d in r.diagnostics), key=lambda d: d.sort_key())
    return _as_dict(results, diags)


def _one(code: str, filename: str, select, fix):
    from pathlib import Path

    from ampfix.io.config import load_config
    from ampfix.engine.check import check_source
    from ampfix.registry import rules_by_code

    cfg = load_config(None, Path.cwd())
    if select is not None:
        cfg.select = list(select)
    codes = cfg.codes_for(Path(filename), cfg.selected_codes())
    return check_source(code.encode("utf-8"), filename, [rules_by_code()[c] for c in codes], cfg.settings, fix)


def check_code(code: str, filename: str = "<string>", *, select: Optional[Sequence[str]] = None) -> List[dict]:
    """The diagnostics of one module's text (as in the JSON output's ``diagnostics``)."""
    r = _one(code, filename, select, None)
    return _as_dict([r], r.diagnostics)["diagnostics"]


def fix_code(code: str, filename: str = "<string>", *, unsafe: bool = False,
             select: Optional[Sequence[str]] = None) -> str:
    """The text with the safe (or, with ``unsafe``, all) fixes applied; unchanged if none apply."""
    r = _one(code, filename, select, "unsafe" if unsafe else "safe")
    return r.fixed if r.changed else code


def migrate(paths: Iterable[str], *, write: bool = False, unsafe: bool = False,
            select: Optional[Sequence[str]] = None, config: Optional[str] = None) -> dict:
    """``ampfix migrate`` (``write=True``: ``--write``): per file, whether it changes, the diff,
    what is left for a person (JSON diagnostics) and any error."""
    from ampfix.cli import run_paths
    from ampfix.output.report import unified_diff
    from ampfix.io.writer import write_all

    _, results = run_paths(_kw(paths, select, None, config), fix="unsafe" if unsafe else "safe")
    files = []
    for r in results:
        files.append({"path": r.path, "changed": r.changed, "diff": unified_diff(r), "applied": list(r.applied),
                      "left": _as_dict([r], r.diagnostics)["diagnostics"], "error": r.error})
    if write:
        failed = {r.path for r in write_all([r for r in results if r.changed and not r.error])}
        for entry, r in zip(files, results):
            if r.path in failed:
                entry["error"] = r.error
                entry["changed"] = False
    return {"files": files}
