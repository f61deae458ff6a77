"""``# noqa`` and ``# ampfix: skip-file``: reading them (:class:`Suppressions`, for the engine) and
writing them (``check --add-noqa``: a ``# noqa: CODE`` on every line that has a problem today,
so a large codebase can adopt ampfix and its pre-commit hook before fixing everything).

A line that already has ``# noqa: X`` gets the new codes added to that comment; a bare
``# noqa`` already silences everything.  A line whose end lies inside a string, or that ends in
a backslash continuation, cannot take a comment there: it is left as is and counted.
"""
from __future__ import annotations

import ast
import re
from typing import Dict, Iterable, List, Optional, Tuple

from ampfix.model.source import Source

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
                strings = string_line_ranges(src)
            comment = comment_of(line, no in strings)
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


def string_line_ranges(src: Source) -> set:
    """Lines that a multi-line string covers after its first line (a '#' there is text)."""
    out = set()
    for n in ast.walk(src.tree):
        if isinstance(n, (ast.Constant, ast.JoinedStr)) and n.end_lineno > n.lineno and (
                isinstance(n, ast.JoinedStr) or isinstance(n.value, (str, bytes))):
            out.update(range(n.lineno + 1, n.end_lineno + 1))
    return out


def comment_of(line: str, starts_in_string: bool) -> Optional[str]:
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


_NOQA_TEXT = re.compile(r"#\s*noqa(?::[\s]*[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*)?", re.IGNORECASE)


def add_noqa(data: bytes, path: str, codes_by_line: Dict[int, Iterable[str]]) -> Tuple[bytes, int, List[int]]:
    """(new bytes, comments added or extended, lines that could not take one)."""
    src = Source(data, path)
    src.parse()
    inside = string_line_ranges(src)  # lines a multi-line string goes on to
    open_lines = {line - 1 for line in inside}  # lines whose end lies inside such a string
    text = src.text
    edits: List[Tuple[int, int, str]] = []
    skipped: List[int] = []
    for line in sorted(codes_by_line):
        codes = sorted(set(codes_by_line[line]))
        if not codes or not 1 <= line <= src.line_count:
            continue
        body = src.line_text(line)
        start = src.starts[line - 1]
        comment = comment_of(body, line in inside)
        if comment is not None:
            have = parse_noqa(comment)
            if have is None:
                continue  # a bare noqa silences every code already
            if have is not False:
                if set(codes) <= have:
                    continue
                m = _NOQA_TEXT.search(comment)
                at = start + len(body) - len(comment) + m.start()
                edits.append((at, at + len(m.group(0)), "# noqa: " + ", ".join(sorted(have | set(codes)))))
                continue
        if line in open_lines or (comment is None and body.rstrip().endswith("\\")):
            skipped.append(line)
            continue
        end = start + len(body)
        if comment is not None:  # another comment: the noqa goes after it
            edits.append((end, end, f"  # noqa: {', '.join(codes)}"))
        else:
            stripped = body.rstrip()
            edits.append((start + len(stripped), end, f"  # noqa: {', '.join(codes)}"))
    for a, b, new in sorted(edits, reverse=True):
        text = text[:a] + new + text[b:]
    return (src.encode(text) if edits else data), len(edits), skipped
