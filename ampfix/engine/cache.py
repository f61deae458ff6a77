"""A result cache for ``ampfix check``, as ruff keeps one.

An entry is the pickled result of checking one file, keyed on everything the result depends on:
ampfix's version, the effective settings, the rule codes, the path as reported, the file's bytes,
and for a file that takes part in a migration planned across modules, the bytes of every file of
that plan.  A key never names stale content, so nothing is ever invalidated; old entries are
simply not read again (``ampfix cache clean`` removes them).

Entries live in ``$AMPFIX_CACHE_DIR``, else ``$XDG_CACHE_HOME/ampfix``, else ``~/.cache/ampfix``,
one file each, written to a temporary name and renamed into place: concurrent runs never read a
half-written entry, and a failing cache (read-only, full disk) only costs speed.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from pathlib import Path
from typing import Optional


def default_dir() -> Path:
    env = os.environ.get("AMPFIX_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ampfix"


def code_stamp() -> str:
    """The size and modification time of every module of the ampfix and ampfix.rules packages."""
    import importlib.util

    h = hashlib.sha256()
    roots = {Path(__file__).resolve().parents[1]}
    spec = importlib.util.find_spec("ampfix.rules")  # installed under ampfix/, or rules/ in a checkout
    roots |= {Path(x) for x in (spec.submodule_search_locations or [])} if spec else set()
    for p in sorted(f for r in roots for f in r.rglob("*.py")):
        try:
            st = p.stat()
        except OSError:
            continue
        h.update(f"{p}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


class Cache:
    def __init__(self, folder: Optional[Path] = None) -> None:
        from ampfix.version import __version__

        self.folder = (folder or default_dir()) / f"v{__version__}"
        # the code itself, not only its version: an install from a newer commit of the same
        # version (pre-commit's `rev: main`, an editable install) must not read older results
        self.version = __version__ + ":" + code_stamp()
        self.hits = 0
        self.misses = 0

    def key(self, *parts) -> str:
        h = hashlib.sha256(self.version.encode())
        for p in parts:
            h.update(b"\0")
            h.update(p if isinstance(p, bytes) else repr(p).encode("utf-8", "surrogatepass"))
        return h.hexdigest()

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / key

    def get(self, key: str):
        try:
            with open(self._path(key), "rb") as fh:
                value = pickle.load(fh)
        except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, IndexError, TypeError,
                ValueError):
            self.misses += 1
            return None
        self.hits += 1
        return value

    def put(self, key: str, value) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as fh:
                    pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
                os.replace(tmp, path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        except OSError:  # a cache that cannot be written costs speed, never the run
            pass


def clean(folder: Optional[Path] = None) -> int:
    """Remove every cache entry; returns how many files went."""
    import shutil

    root = folder or default_dir()
    if not root.exists():
        return 0
    n = sum(1 for _ in root.rglob("*") if _.is_file())
    shutil.rmtree(root, ignore_errors=True)
    return n
