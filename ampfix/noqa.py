"""``check --add-noqa``: a ``# noqa: CODE`` on every line that has a problem today, so a large
codebase can adopt ampfix (and its pre-commit hook) before fixing everything.

A line that already has ``# noqa: X`` gets the new codes added to that comment; a bare
``# noqa`` already silences everything.  A line whose end lies inside a string, or that ends in
a backslash continuation, cannot take a comment there: it is left as is and counted.
"""
from __future__ import annotations

import re
from typing import Dict, Iterable, List, Tuple

from ampfix.source import Source

_NOQA_TEXT = re.compile(r"#\s*noqa(?::[\s]*[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*)?", re.IGNORECASE)


def add_noqa(data: bytes, path: str, codes_by_line: Dict[int, Iterable[str]]) -> Tuple[bytes, int, List[int]]:
    """(new bytes, comments added or extended, lines that could not take one)."""
    from ampfix.engine import _comment_of, _string_line_ranges, parse_noqa

    src = Source(data, path)
    src.parse()
    inside = _string_line_ranges(src)  # lines a multi-line string goes on to
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
        comment = _comment_of(body, line in inside)
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
