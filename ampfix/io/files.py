"""Which files to check: walk folders, honour .gitignore and excludes."""
from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

#: what ampfix checks: Python modules and Jupyter notebooks
SOURCES = (".py", ".ipynb")

DEFAULT_EXCLUDES = (
    ".git", ".hg", ".svn", ".bzr", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".tox", ".nox",
    ".venv", "venv", ".eggs", "__pycache__", "__pypackages__", "_build", "build", "dist",
    "site-packages", "node_modules", ".ipynb_checkpoints",
)


class GitIgnore:
    """The patterns of one .gitignore file (or ``.git/info/exclude``), relative to its folder,
    matched with pathspec's implementation of git's wildmatch rules."""

    def __init__(self, base: Path, lines: Sequence[str]) -> None:
        import pathspec

        self.base = base
        self.spec = pathspec.GitIgnoreSpec.from_lines(lines)

    @classmethod
    def load(cls, folder: Path, name: str = ".gitignore") -> Optional["GitIgnore"]:
        f = folder / name
        try:
            return cls(folder, f.read_text(encoding="utf-8", errors="replace").splitlines())
        except OSError:
            return None

    def match(self, path: Path, is_dir: bool) -> Optional[bool]:
        """True ignored, False re-included, None no opinion."""
        try:
            rel = path.relative_to(self.base).as_posix()
        except ValueError:
            return None
        return self.spec.check_file(rel + "/" if is_dir else rel).include


def _located(path: Path) -> Path:
    """The path with its folder resolved but not its own name (a symlink is matched where it is,
    and a symlink loop does not raise)."""
    return Path(os.path.realpath(path.parent)) / path.name


def matches_any(path: Path, root: Path, patterns: Sequence[str]) -> bool:
    try:
        rel = _located(path).relative_to(root.resolve()).as_posix()
    except ValueError:
        rel = path.as_posix()
    for pat in patterns:
        pat = pat.rstrip("/")
        if fnmatch.fnmatch(path.name, pat) or fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(rel, pat + "/*"):
            return True
        # a folder pattern excludes what is under it
        if any(fnmatch.fnmatch(part, pat) for part in Path(rel).parts[:-1]) and "/" not in pat:
            return True
    return False


def _git_root(start: Path) -> Optional[Path]:
    for p in [start, *start.parents]:
        if (p / ".git").exists():
            return p
    return None


#: suffixes of files that are never Python, even when named explicitly (a script without a suffix is)
NOT_PYTHON = (".toml", ".txt", ".in", ".cfg", ".ini", ".yml", ".yaml", ".md", ".rst", ".json", ".lock")


def discover(
    paths: Sequence[str],
    root: Path,
    exclude: Sequence[str] = (),
    respect_gitignore: bool = True,
    problems: Optional[List[Tuple[str, str]]] = None,
) -> Iterator[Path]:
    """Yield the Python files under ``paths`` (sorted, each real file once).

    A file named explicitly is yielded even if only the default excludes or .gitignore would
    drop it (pre-commit passes names); the configured ``exclude`` patterns apply to it too.
    A symlink and its target, or one file named twice, count once.  What cannot be walked or
    read (a folder without permission, a symlink loop, a FIFO named ``*.py``, a name that is
    not valid UTF-8) is appended to ``problems`` as ``(path, reason)``.
    """
    seen = set()
    problems = problems if problems is not None else []

    def once(p: Path) -> bool:
        try:
            key = os.path.realpath(p)
        except (OSError, ValueError):
            key = os.path.abspath(p)
        if key in seen:
            return False
        seen.add(key)
        return True

    for raw in paths:
        p = Path(raw)
        if p.is_file() and p.suffix.lower() in NOT_PYTHON:
            continue  # a dependency or config file named explicitly: the file rules read it
        if p.is_file() or (not p.exists() and p.suffix in SOURCES and not p.is_symlink()):
            if matches_any(p, root, exclude):
                continue
            if once(p):
                yield p
            continue
        if p.suffix in SOURCES and (p.is_symlink() or p.exists()) and not p.is_dir():
            problems.append((str(p), _why_not_file(p)))
            continue
        if not p.is_dir():
            continue
        found = []
        git_root = _git_root(p.resolve()) if respect_gitignore else None
        ignores: List[GitIgnore] = []
        if git_root is not None:
            # .gitignore files from the repository root down to the folder named
            chain = [git_root] + [d for d in reversed(p.resolve().parents) if git_root in d.parents] + [p.resolve()]
            # the repository's own exclusions (.git/info/exclude) first: any .gitignore overrides them
            info = GitIgnore.load(git_root / ".git" / "info", "exclude")
            if info is not None:
                info.base = git_root
                ignores.append(info)
            for d in dict.fromkeys(chain):
                gi = GitIgnore.load(d)
                if gi:
                    ignores.append(gi)
        found.extend(_walk(p, root, exclude, ignores, git_root is not None, problems, set()))
        for f in sorted(found):
            if once(f):
                yield f


def _why_not_file(p: Path) -> str:
    try:
        st = os.stat(p)
    except OSError as exc:
        if exc.errno == 40:
            return "a symlink loop; skipped"
        return f"cannot read: {exc.strerror or exc}"
    import stat as _stat

    if _stat.S_ISFIFO(st.st_mode):
        return "a FIFO, not a regular file; skipped"
    return "not a regular file; skipped"


def _ignored(path: Path, is_dir: bool, ignores: Sequence[GitIgnore]) -> bool:
    verdict = False
    rp = _located(path)
    for gi in ignores:
        v = gi.match(rp, is_dir)
        if v is not None:
            verdict = v
    return verdict


def _walk(folder: Path, root: Path, exclude, ignores, respect_gitignore, problems, visited) -> Iterator[Path]:
    try:
        real = os.path.realpath(folder)
        if real in visited:  # a folder symlink back up the tree
            return
        visited.add(real)
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        problems.append((str(folder), f"cannot read the folder: {exc.strerror or exc}"))
        return
    local = list(ignores)
    if respect_gitignore:
        gi = GitIgnore.load(folder.resolve())
        if gi and all(g.base != gi.base for g in ignores):
            local.append(gi)
    for e in entries:
        path = folder / e.name
        try:
            e.name.encode("utf-8")
        except UnicodeEncodeError:
            if e.name.endswith(SOURCES):
                problems.append((os.fsdecode(os.fsencode(str(path))).encode("utf-8", "backslashreplace").decode(),
                                 "the file name is not valid UTF-8; skipped"))
            continue
        try:
            is_dir = e.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        if is_dir:
            if e.name in DEFAULT_EXCLUDES or e.name.endswith(".egg-info"):
                continue
            if matches_any(path, root, exclude) or (local and _ignored(path, True, local)):
                continue
            yield from _walk(path, root, exclude, local, respect_gitignore, problems, visited)
        elif e.name.endswith(SOURCES):
            if matches_any(path, root, exclude) or (local and _ignored(path, False, local)):
                continue
            try:
                regular = e.is_file()
            except OSError:
                regular = False
            if regular:
                yield path
            else:
                problems.append((str(path), _why_not_file(path)))


def read_bytes(path: str):
    """(bytes, None), or (None, why not): a FIFO or a device is not read (it would block)."""
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
