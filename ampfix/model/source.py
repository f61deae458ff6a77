"""One file's source: bytes, text, lines, and the positions of Python's own ``ast``.

``ast`` gives a node's line (1-based) and its column as a UTF-8 byte offset in that line.
Fixes are edits of the decoded text, so every position is turned into a character offset of
the text here.  Lines end where Python ends them: ``\\r\\n``, ``\\r`` or ``\\n`` (not at the
other characters that ``str.splitlines`` breaks on).
"""
from __future__ import annotations

import ast
import io
import re
import sys
import threading
import tokenize
from typing import Callable, Dict, List, Optional, Tuple, TypeVar

_NEWLINE = re.compile(r"\r\n|\r|\n")
T = TypeVar("T")

#: Files larger than this are skipped with a message (configurable as ``max-file-size``).
MAX_FILE_SIZE = 10 * 1024 * 1024
#: Deeply nested code (generated expressions) is analysed in a thread with a stack this large.
DEEP_STACK = 512 * 1024 * 1024


class SourceError(Exception):
    """The file cannot be read as Python: (line, column, message, code)."""

    def __init__(self, line: int, col: int, message: str, code: str = "AMP000") -> None:
        super().__init__(message)
        self.line, self.col, self.message, self.code = line, col, message, code


def run_deep(fn: Callable[..., T], *args) -> T:
    """Run ``fn`` in a thread with a large stack, so that parsing and walking a generated
    expression thousands of levels deep costs time proportional to its size instead of a
    RecursionError (or, in a C parser, a crash)."""
    box: list = []

    def target():
        try:
            box.append((True, fn(*args)))
        except BaseException as exc:  # re-raised in the caller's thread
            box.append((False, exc))

    old = threading.stack_size()
    threading.stack_size(DEEP_STACK)
    try:
        t = threading.Thread(target=target, name="ampfix-deep", daemon=True)
        t.start()
    finally:
        threading.stack_size(old)
    t.join()
    ok, value = box[0]
    if ok:
        return value
    raise value


if sys.getrecursionlimit() < 200_000:
    # only threads started by run_deep have the stack for this; the main thread never recurses deeply
    sys.setrecursionlimit(200_000)


def detect_encoding(data: bytes) -> str:
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        raise SourceError(1, 1, f"cannot decode: {exc}", "AMP001") from None
    return encoding


def decode(data: bytes) -> Tuple[str, str]:
    """(text, encoding) the way Python reads a file (PEP 263 declaration, BOM)."""
    encoding = detect_encoding(data)
    try:
        return data.decode(encoding), encoding
    except (LookupError, UnicodeDecodeError) as exc:
        raise SourceError(1, 1, f"cannot decode as {encoding}: {exc}", "AMP001") from None


def line_starts(text: str) -> List[int]:
    starts = [0]
    starts.extend(m.end() for m in _NEWLINE.finditer(text))
    return starts


class Source:
    """Text and positions of one module.  ``tree`` is the parsed module (``parse`` fills it)."""

    def __init__(self, data: bytes, path: str = "<stdin>", text: Optional[str] = None,
                 encoding: Optional[str] = None) -> None:
        self.path = path
        self.data = data
        if text is None:
            text, encoding = decode(data)
        self.text = text
        self.encoding = encoding or "utf-8"
        self.starts = line_starts(text)
        self._ascii: Dict[int, bool] = {}
        self.tree: Optional[ast.Module] = None
        self._tokens: Optional[list] = None

    # -- parsing -------------------------------------------------------------------------------
    def parse(self) -> ast.Module:
        """Parse with Python's own parser; SourceError with Python's line, column and message."""
        if "\x00" in self.text:
            i = self.text.index("\x00")
            line, col = self.position(i)
            raise SourceError(line, col + 1, "source contains a null byte")
        try:
            self.tree = ast.parse(self.text, self.path, type_comments=False)
        except SyntaxError as exc:
            raise SourceError(exc.lineno or 1, max(1, exc.offset or 1), exc.msg) from None
        except (RecursionError, MemoryError):
            raise SourceError(1, 1, "too deeply nested for Python's parser", "AMP001") from None
        except ValueError as exc:  # e.g. a stray surrogate
            raise SourceError(1, 1, str(exc)) from None
        return self.tree

    # -- positions -----------------------------------------------------------------------------
    @property
    def line_count(self) -> int:
        return len(self.starts)

    def line_text(self, line: int) -> str:
        """Line ``line`` (1-based) without its line ending."""
        a = self.starts[line - 1]
        b = self.starts[line] if line < len(self.starts) else len(self.text)
        return self.text[a:b].rstrip("\r\n")

    def line_end(self, line: int) -> int:
        """Offset just past line ``line``'s ending (or the end of the text)."""
        return self.starts[line] if line < len(self.starts) else len(self.text)

    def offset(self, line: int, col_bytes: int) -> int:
        """Character offset of an ``ast`` position (line 1-based, column in UTF-8 bytes)."""
        start = self.starts[line - 1]
        if col_bytes == 0:
            return start
        ascii_ = self._ascii.get(line)
        if ascii_ is None:
            ascii_ = self._ascii[line] = self.line_text(line).isascii()
        if ascii_:
            return start + col_bytes
        return start + len(self.line_text(line).encode("utf-8")[:col_bytes].decode("utf-8", "ignore"))

    def span(self, node) -> Tuple[int, int]:
        """(start, end) character offsets of a node."""
        return (self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset))

    def position(self, offset: int) -> Tuple[int, int]:
        """(line 1-based, column 0-based in characters) of a character offset."""
        lo, hi = 0, len(self.starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1, offset - self.starts[lo]

    def char_col(self, line: int, col_bytes: int) -> int:
        """0-based character column of an ``ast`` column."""
        return self.offset(line, col_bytes) - self.starts[line - 1]

    def code(self, node) -> str:
        a, b = self.span(node)
        return self.text[a:b]

    def indent_of(self, line: int) -> str:
        t = self.line_text(line)
        return t[: len(t) - len(t.lstrip(" \t"))]

    def newline(self) -> str:
        """The file's line ending (the first one found; '\\n' when there is none)."""
        m = _NEWLINE.search(self.text)
        return m.group(0) if m else "\n"

    # -- tokens (only for rewriting: the tokenizer is slow) ------------------------------------
    @property
    def tokens(self) -> list:
        if self._tokens is None:
            self._tokens = list(tokenize.generate_tokens(_LineReader(self.text).readline))
        return self._tokens

    def encode(self, text: str) -> bytes:
        return text.encode(self.encoding)


class _LineReader:
    """readline() over text, lines ending where Python ends them (``\\r`` included)."""

    def __init__(self, text: str) -> None:
        self.lines = [text[a:b] for a, b in zip(line_starts(text), [*line_starts(text)[1:], len(text)])]
        self.lines = [ln.replace("\r\n", "\n").replace("\r", "\n") for ln in self.lines if ln]
        self.i = 0

    def readline(self) -> str:
        if self.i >= len(self.lines):
            return ""
        self.i += 1
        return self.lines[self.i - 1]


def string_lines(text: str) -> set:
    """Line numbers (1-based, relative to ``text``) that begin inside a string token: their
    leading whitespace belongs to the string, so re-indenting must not touch them."""
    out = set()
    try:
        for tok in tokenize.generate_tokens(_LineReader(text).readline):
            if tok.type in (tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", -1)) and tok.end[0] > tok.start[0]:
                out.update(range(tok.start[0] + 1, tok.end[0] + 1))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


def decode_text(data: bytes) -> str:
    """The text of source bytes, as Python reads it (ValueError if it cannot be decoded)."""
    try:
        return decode(data)[0]
    except SourceError as exc:
        raise ValueError(exc.message) from None
