"""Writing a fixed file back, never losing what a user has.

- Python text is written only if it parses.
- A symlink is written through: its target changes, the link stays a link.
- The file is replaced only if it still holds the bytes that were read (no lost update).
- A read-only file is not written (a message says so).
- Owner, group and mode are kept; a file with several hard links keeps its inode (the verified
  text is written in place); otherwise the new text goes to a temporary file in the same folder,
  is flushed, and replaces the old one atomically.
"""
from __future__ import annotations

import ast
import hashlib
import os
import stat
import tempfile
from typing import Optional


class WriteError(Exception):
    """The file was not written; the message says why (one line)."""


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_atomic(path: str, data: bytes, expected: Optional[str] = None, python: bool = True) -> None:
    """Write ``data`` to ``path``.  ``expected``: the digest of the bytes that were read (the
    write is refused if the file changed since).  Raises WriteError with the reason."""
    target, st = check_writable(path, data, expected, python)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_nlink > 1:
        _in_place(target, data)  # keep the inode that the other names share
        return
    _replace(target, data, st, mode)


def check_writable(path: str, data: bytes, expected: Optional[str] = None, python: bool = True):
    """(the real path, its stat) when :func:`write_atomic` may write ``data`` there now; else
    WriteError with the reason (nothing is written)."""
    if python:
        try:
            compile(data, path, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
        except (SyntaxError, ValueError) as exc:  # never write what does not parse
            raise WriteError(f"the fixed text does not parse ({exc}); nothing written") from None
    try:
        target = os.path.realpath(path)
        st = os.stat(target)
    except OSError as exc:
        raise WriteError(f"cannot write: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise WriteError("not a regular file; nothing written")
    if not (st.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)) or not os.access(target, os.W_OK):
        raise WriteError("read-only file; not written (make it writable to apply the fixes)")
    if expected is not None:
        try:
            with open(target, "rb") as fh:
                now = fh.read()
        except OSError as exc:
            raise WriteError(f"cannot read it back: {exc.strerror or exc}") from None
        if digest(now) != expected:
            raise WriteError("changed since ampfix read it; not written (run ampfix again)")
    return target, st


def _replace(target: str, data: bytes, st, mode: int) -> None:
    folder = os.path.dirname(target)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".ampfix-", suffix=".tmp", dir=folder)
    except OSError:
        _in_place(target, data)  # a folder we may not create files in, a file we may write
        return
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        if (st.st_uid, st.st_gid) != (os.getuid(), os.getgid()):
            try:
                os.chown(tmp, st.st_uid, st.st_gid)
            except OSError:  # not allowed to give it away: write in place, the owner stays
                os.unlink(tmp)
                tmp = None
                _in_place(target, data)
                return
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        raise WriteError(f"cannot write: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _in_place(target: str, data: bytes) -> None:
    try:
        with open(target, "r+b") as fh:
            fh.write(data)
            fh.truncate()
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise WriteError(f"cannot write: {exc.strerror or exc}") from None


def write_all(results, python_suffixes=(".py", ".pyi")) -> list:
    """Write every changed result (``FileResult``), all or nothing per migration plan: each file is
    checked first (it parses, still holds the bytes read, may be written); a file that cannot be
    written keeps back every file that shares a migration group with it (a scaler parameter added
    in one module and passed in another: half of it would break the code), and what is written is
    written with Ctrl-C and SIGTERM held back to the end.  Returns the results not written, each
    with ``error`` saying why; the others are written."""
    from ampfix.engine.interrupts import shielded

    changed = [r for r in results if r.changed]
    why = {}
    for r in changed:
        try:
            check_writable(r.path, r.fixed_bytes, r.digest, r.path.endswith(python_suffixes))
        except WriteError as exc:
            why[r.path] = str(exc)
    held = True
    while held:  # a file kept back keeps back the files of its groups, and theirs
        held = False
        kept = {g: r.path for r in changed if r.path in why for g in getattr(r, "groups", ())}
        for r in changed:
            if r.path in why:
                continue
            shared = sorted(g for g in getattr(r, "groups", ()) if g in kept)
            if shared:
                why[r.path] = (f"not written: its migration also changes {kept[shared[0]]}, which could not be "
                               "written; nothing of that migration was written (run ampfix again)")
                held = True
    with shielded():
        for r in changed:
            if r.path in why:
                continue
            try:
                write_atomic(r.path, r.fixed_bytes, expected=r.digest, python=r.path.endswith(python_suffixes))
            except WriteError as exc:  # it changed between the check and now
                why[r.path] = str(exc)
    failed = []
    for r in changed:
        if r.path in why:
            r.error = why[r.path]
            r.fixed = r.original  # not rewritten
            failed.append(r)
    return failed
