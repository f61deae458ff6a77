"""Writing a file atomically, only if the new bytes parse, keeping its mode."""
from __future__ import annotations

import ast
import os
import stat
import tempfile


def write_atomic(path: str, data: bytes) -> None:
    compile(data, path, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)  # never write what does not parse
    folder = os.path.dirname(os.path.abspath(path))
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = None
    fd, tmp = tempfile.mkstemp(prefix=".ampfix-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
