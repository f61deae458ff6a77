"""Lines a fix made longer than the file's own width are split, as a careful person would:
at the last bracket of the statement (``f(\\n    args\\n)``), then one argument per line.

Only lines the fixes wrote (not found in the original text) are touched, only whole one-line
statements without a comment, and only when the split parses to the same tree: what a file
already had stays byte for byte."""
from __future__ import annotations

import ast
import io
import re
import textwrap
import tokenize
from collections import Counter
from typing import Dict, List, Optional, Set, Tuple

_OPEN = {"(": ")", "[": "]", "{": "}"}


def width_of(text: str) -> int:
    """The file's own width: its longest line, at least 88 (ruff's and black's default)."""
    return max([88, *(len(line) for line in text.splitlines())])


def indent_unit(text: str) -> str:
    """The indentation one block adds in this file (four spaces when it cannot tell)."""
    widths = sorted({len(m.group(1)) for m in re.finditer(r"^( +)\S", text, re.M)})
    if widths and widths[0] in (2, 3, 4, 8):
        return " " * widths[0]
    return "    "


def fit_lines(before: str, after: str) -> str:
    """``after`` with the lines a fix made too long split (see the module's docstring)."""
    width = width_of(before)
    lines = after.splitlines(keepends=True)
    old = Counter(line.rstrip("\r\n") for line in before.splitlines())
    long = [i for i, line in enumerate(lines) if len(line.rstrip("\r\n")) > width and old[line.rstrip("\r\n")] == 0]
    if not long:
        return after
    whole, inside = _statements(after)
    unit = indent_unit(before)
    for i in reversed(long):
        line = lines[i]
        body = line.rstrip("\r\n")
        end = line[len(body):]
        if i + 1 in whole:
            split = split_line(body, width, unit)
        elif i + 1 in inside:
            split = _break_continued(after, inside[i + 1], i + 1, width)
        else:
            split = None
        if split:
            lines[i] = end.join(split) + end
    return "".join(lines)


def _break_continued(text: str, span: Tuple[int, int], no: int, width: int) -> Optional[List[str]]:
    """Line ``no`` of a statement written over lines ``span`` (brackets open at its end): broken
    after its last comma that fits, the rest aligned under the bracket that holds it (the way the
    statement's own continuation lines are)."""
    first, last = span
    src_lines = text.splitlines()
    stmt = "\n".join(src_lines[first - 1:last])
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(stmt + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    row = no - first + 1
    line = src_lines[no - 1]
    stack: List[int] = []  # columns of the open brackets (on their own rows)
    best = None
    for t in toks:
        if t.type != tokenize.OP:
            continue
        if t.string in _OPEN:
            stack.append(t.start[1] if t.start[0] == row else -1)
        elif t.string in (")", "]", "}"):
            if stack:
                stack.pop()
        elif t.string == "," and t.start[0] == row and stack and t.end[1] <= width:
            rest = line[t.end[1]:].strip()
            if rest and stack[-1] >= 0:
                best = (t.end[1], stack[-1] + 1)
            elif rest and stack[-1] < 0:
                best = (t.end[1], len(line) - len(line.lstrip()))
    if best is None:
        # one argument on its own line (`    enabled=a and b and c,`): one operand a line
        pad = line[:len(line) - len(line.lstrip())]
        body = line.strip()
        ops = _top_bool_ops(body[:-1]) if body.endswith(",") else None
        if not ops:
            return None
        out = [pad + x for x in ops[:-1]] + [pad + ops[-1] + ","]
        if any(len(x) > width for x in out):
            return None
    else:
        cut, col = best
        out = [line[:cut].rstrip(), " " * col + line[cut:].strip()]
        if len(out[1]) > width:
            return None
    new = "\n".join([*src_lines[first - 1:no - 1], *out, *src_lines[no:last]])
    return out if _same(textwrap.dedent(stmt), textwrap.dedent(new)) else None


def _statements(text: str) -> Tuple[Set[int], Dict[int, Tuple[int, int]]]:
    """(line numbers holding one whole statement, {line number: (first, last) line of the
    statement over several lines that holds it}); only statements with no comment and no
    string over several lines."""
    whole: Set[int] = set()
    inside: Dict[int, Tuple[int, int]] = {}
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return whole, inside
    start = None
    ok = True
    for t in toks:
        if t.type in (tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING):
            continue
        if start is None and t.type == tokenize.COMMENT:
            continue  # a comment on a line of its own: the statement under it starts after it
        if start is None:
            start, ok = t.start[0], True
        if t.type == tokenize.COMMENT or t.start[0] != t.end[0] or t.string == "\\":
            ok = False
        if t.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            end = t.start[0]
            if ok and t.type == tokenize.NEWLINE:
                if end == start:
                    whole.add(start)
                else:
                    for n in range(start, end + 1):
                        inside[n] = (start, end)
            start = None
    return whole, inside


def _pairs(stmt: str) -> List[Tuple[int, int]]:
    """(open, close) offsets of the brackets at depth 0 of a one-line statement."""
    out: List[Tuple[int, int]] = []
    stack: List[Tuple[str, int]] = []
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(stmt).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    for t in toks:
        if t.type != tokenize.OP:
            continue
        if t.string in _OPEN:
            stack.append((t.string, t.start[1]))
        elif t.string in (")", "]", "}"):
            if not stack:
                return []
            o, at = stack.pop()
            if not stack:
                out.append((at, t.start[1]))
    return out


def _top_tokens(text: str) -> Optional[List[tokenize.TokenInfo]]:
    """The tokens of ``text`` outside any bracket (None where it does not tokenize)."""
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    out, depth = [], 0
    for t in toks:
        if t.type == tokenize.OP and t.string in _OPEN:
            depth += 1
        elif t.type == tokenize.OP and t.string in (")", "]", "}"):
            depth -= 1
        elif depth == 0:
            out.append(t)
    return out


def _top_commas(inner: str) -> Optional[List[str]]:
    toks = _top_tokens(inner)
    if toks is None:
        return None
    parts, last = [], 0
    for t in toks:
        if t.type == tokenize.OP and t.string == ",":
            parts.append(inner[last:t.start[1]].strip())
            last = t.end[1]
    tail = inner[last:].strip()
    if tail:
        parts.append(tail)
    return parts if len(parts) > 1 else None


def _top_bool_ops(part: str) -> Optional[List[str]]:
    """``a and b or c`` (outside any bracket) as ``["a", "and b", "or c"]``; None without one."""
    toks = _top_tokens(part)
    if toks is None:
        return None
    out, last = [], 0
    for t in toks:
        if t.type == tokenize.NAME and t.string in ("and", "or"):
            out.append(part[last:t.start[1]].strip())
            last = t.start[1]
    out.append(part[last:].strip())
    return out if len(out) > 1 and all(out) else None


def _same(a: str, b: str) -> bool:
    def tree(s: str) -> Optional[str]:
        s = s.strip()
        if s.endswith(":"):
            s += " pass"
        try:
            return ast.dump(ast.parse(s))
        except SyntaxError:
            return None

    ta = tree(a)
    return ta is not None and ta == tree(b)


def split_line(line: str, width: int, unit: str = "    ") -> Optional[List[str]]:
    """The lines one statement becomes, or None where no split fits or keeps its meaning."""
    indent = line[:len(line) - len(line.lstrip())]
    stmt = line.strip()
    pairs = [(o, c) for o, c in _pairs(stmt) if c - o > 1]
    # the bracket that ends the statement first (black's right-hand split), then the widest
    pairs.sort(key=lambda p: (stmt[p[1] + 1:].strip() not in ("", ":"), p[0] - p[1]))
    for o, c in pairs:
        head, inner, tail = stmt[:o + 1], stmt[o + 1:c].strip(), stmt[c:]
        candidates = [[indent + head, indent + unit + inner, indent + tail]]
        before = stmt[:o].rstrip()
        after_name = bool(before) and (before[-1].isalnum() or before[-1] in "_)]")
        if (stmt[o] == "(" and after_name) or stmt[o] == "{" or (stmt[o] == "[" and not after_name):
            parts = _top_commas(inner) or ([inner] if stmt[o] == "(" and after_name else None)
            if parts:
                candidates.append([indent + head, *(indent + unit + p + "," for p in parts), indent + tail])
                # an argument still too long (`enabled=a != x and b != y and ...`): one operand of
                # its `and`/`or` a line, as black writes it
                lines = [indent + head]
                for p in parts:
                    ops = _top_bool_ops(p) if len(indent + unit + p) + 1 > width else None
                    if ops:
                        lines += [indent + unit + x for x in ops[:-1]] + [indent + unit + ops[-1] + ","]
                    else:
                        lines.append(indent + unit + p + ",")
                if len(lines) > len(parts) + 1:
                    candidates.append([*lines, indent + tail])
        for cand in candidates:
            if all(len(x) <= width for x in cand) and _same(stmt, "\n".join(x[len(indent):] for x in cand)):
                return cand
    return None
