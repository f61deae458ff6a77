"""Files that are not Python but belong to the migration: dependency and environment files.

Which files: those that a file rule names (``FileRule.files``), in the folders given (and their
usual subfolders) or named explicitly: never a file above what was asked for.  Each is read whole, checked by the file rules that match its name, and fixed by
dropping the lines a rule reports removable (a line is a whole entry in these files); the result
is kept only if every rule that matched accepts it as well formed.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from ampfix.model.diagnostic import Diagnostic, FileResult
from ampfix.rule import Facts, FileRule

#: folders under a project where these files live, besides the root
_SUBDIRS = ("requirements", "docker", "env", "envs", "ci", ".devcontainer", "configs", "config", "conf")


def file_rules(rules: Iterable[type]) -> List[type]:
    return [r for r in rules if isinstance(r, type) and issubclass(r, FileRule)]


def discover(paths: Sequence[str], root: Optional[Path], rules: Sequence[type], exclude=()) -> List[Path]:
    """The files the file rules read: in each folder given and its usual subfolders, and each file
    named explicitly.  ``root`` anchors the exclude patterns; a file above the paths given (the
    project's own pyproject.toml when ``src/`` was asked for) is not read."""
    from ampfix.io.files import matches_any

    if not rules:
        return []
    found: Dict[str, Path] = {}

    def consider(p: Path) -> None:
        try:
            if not p.is_file():
                return
        except OSError:  # a symlink loop: the Python walk reports it
            return
        if any(r.matches(p.name) for r in rules) and not matches_any(p, root or Path.cwd(), exclude):
            found.setdefault(os.path.realpath(p), p)

    folders = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            folders.append(p)
        else:
            consider(p)
    if folders:
        for folder in folders:
            for d in [folder, *(folder / s for s in _SUBDIRS)]:
                try:
                    entries = sorted(os.scandir(d), key=lambda e: e.name)
                except OSError:
                    continue
                for e in entries:
                    consider(d / e.name)
    return sorted(found.values(), key=str)


def covered(path: Path, paths: Sequence[str]) -> bool:
    """Whether the folders given contain ``path`` (then they are the project it belongs to)."""
    rp = path.resolve()
    for raw in paths:
        p = Path(raw).resolve()
        if p.is_dir() and (p == rp.parent or p in rp.parents):
            return True
    return False


def check(files: Sequence[Path], codes_for, rules: Sequence[type], python: Dict[str, str], paths: Sequence[str],
          fix: Optional[str]) -> List[FileResult]:
    """One FileResult per file: its findings as diagnostics, and its text without the
    removable lines when fixing."""
    out = []
    for path in files:
        name = str(path)
        result = FileResult(name)
        try:
            data = path.read_bytes()
            text = data.decode("utf-8")
            from ampfix.io.writer import digest

            result.digest = digest(data)
        except (OSError, UnicodeDecodeError) as exc:
            result.error = f"cannot read: {exc}"
            out.append(result)
            continue
        codes = set(codes_for(path))
        matching = [r for r in rules if r.code in codes and r.matches(path.name)]
        facts = Facts(python, whole=covered(path, paths))
        drop: Dict[int, List[str]] = {}
        replace: Dict[int, str] = {}
        described: Dict[int, str] = {}
        diags = []
        lines = text.splitlines()
        for rule in matching:
            inst = rule()
            for f in inst.check_file(name, text, facts):
                removable = (f.removable or f.replacement is not None) and facts.whole
                line_text = lines[f.line - 1] if f.line - 1 < len(lines) else ""
                d = Diagnostic(name, f.line, f.col, f.line, len(line_text) + 1, rule.code, rule.name, f.message,
                               fix="safe" if removable else None,
                               fix_description=f.fix_description if removable else None)
                if fix and removable:
                    drop.setdefault(f.line, []).append(rule.code)
                    if f.replacement is not None:
                        replace[f.line] = f.replacement
                    described[f.line] = f"line {f.line}: {f.fix_description}"
                else:
                    diags.append(d)
        if drop:
            new = "".join(replace.get(i, x) if i in replace else x
                          for i, x in enumerate(text.splitlines(keepends=True), start=1)
                          if i not in drop or i in replace)
            if all(r().well_formed(name, new) for r in matching):
                result.original, result.fixed = text, new
                result.fixed_bytes = new.encode("utf-8")
                result.applied = [described[no] for no in sorted(drop)]
            else:
                result.failed_fixes.append("removing the lines would leave the file malformed")
                names = {r.code: r.name for r in matching}
                diags.extend(Diagnostic(name, no, 1, no, 1, codes_[0], names[codes_[0]], "not removed: the file would not stay "
                                        "well formed; remove the entry by hand") for no, codes_ in drop.items())
        result.diagnostics = sorted(diags, key=lambda d: d.sort_key())
        out.append(result)
    return out


def python_texts(results: Sequence[FileResult], fixing: bool) -> Dict[str, str]:
    """path -> the text of every Python file checked (fixed when fixing)."""
    out = {}
    for r in results:
        if r.error:
            continue
        if fixing and r.fixed is not None:
            out[r.path] = r.fixed
            continue
        try:
            out[r.path] = Path(r.path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
    return out
