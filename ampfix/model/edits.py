"""Text edits on a module's source: what a fix is made of.

An :class:`Edit` replaces the text between two character offsets of the original text.
A *region* edit transforms what it spans after the edits inside it were applied: it may keep
only an inner part (``inner``: the body of an ``if`` or ``with`` that goes), re-indent it
(``indent`` adds a prefix to every line, ``dedent`` removes one), and put text before and
after it (a ``with ...:`` header).  Lines that begin inside a string are never re-indented.

Edits either nest (a child lies inside its region's kept part) or do not touch; anything else
is a :class:`Conflict`.  Everything outside the edits stays byte for byte what it was.

:class:`Builder` makes edits from ``ast`` nodes of one :class:`~ampfix.model.source.Source`:
replace a node, remove, insert around or wrap whole statements, unwrap a block.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple

from ampfix.model.source import Source, line_starts, string_lines


class Conflict(Exception):
    """Two edits overlap without nesting, or a statement cannot be edited as asked."""


@dataclass(frozen=True)
class Edit:
    start: int
    end: int
    text: str = ""
    region: bool = False
    inner: Optional[Tuple[int, int]] = None
    indent: str = ""
    dedent: str = ""
    before: str = ""
    after: str = ""

    @property
    def keep(self) -> Tuple[int, int]:
        return self.inner if self.inner is not None else (self.start, self.end)


def _sort_key(e: Edit):
    # insertions first where something starts (they go before it, outside a region that starts
    # there); then outer regions before what they contain
    return (e.start, 0 if e.start == e.end else 1, -(e.end - e.start), 0 if e.region else 1, e.text)


def apply_edits(text: str, edits: Iterable[Edit]) -> str:
    """The text with every edit applied; Conflict when two edits overlap without nesting."""
    unique = sorted(set(edits), key=_sort_key)
    return _render(text, 0, len(text), unique)


def _render(text: str, lo: int, hi: int, edits: Sequence[Edit]) -> str:
    out: List[str] = []
    pos = lo
    i = 0
    n = len(edits)
    while i < n:
        e = edits[i]
        if e.start < pos:
            raise Conflict(f"edits overlap at offset {e.start}")
        # the edits this one contains (regions only) are the next ones that lie inside it
        j = i + 1
        children: List[Edit] = []
        if e.region:
            k_lo, k_hi = e.keep
            while j < n and edits[j].start < e.end and not (edits[j].start == e.end == edits[j].end):
                c = edits[j]
                if c.end > e.end:
                    raise Conflict(f"edits overlap at offset {c.start}")
                if c.start < k_lo or c.end > k_hi:
                    if c.end <= k_lo or c.start >= k_hi:
                        j += 1  # inside the part the region drops
                        continue
                    raise Conflict(f"an edit crosses the kept part of a region at offset {c.start}")
                children.append(c)
                j += 1
        elif e.start == e.end:
            pass
        out.append(text[pos:e.start])
        if e.region:
            k_lo, k_hi = e.keep
            body = _render(text, k_lo, k_hi, children)
            out.append(e.before + reindent(body, e.indent, e.dedent) + e.after)
        else:
            out.append(e.text)
        pos = max(pos, e.end)
        i = j
    out.append(text[pos:hi])
    return "".join(out)


def reindent(body: str, indent: str = "", dedent: str = "") -> str:
    """Add ``indent`` to / remove ``dedent`` from the start of every line of ``body`` that has
    code or a comment, except lines that begin inside a string."""
    if not indent and not dedent:
        return body
    starts = line_starts(body)
    inside = string_lines(body)
    out = []
    for no, (a, b) in enumerate(zip(starts, [*starts[1:], len(body)]), start=1):
        line = body[a:b]
        if not line:
            continue
        if no in inside or not line.strip():
            out.append(line)
            continue
        if dedent:
            if line.startswith(dedent):
                line = line[len(dedent):]
            else:  # a comment (or a bracket continuation) indented less: as far as it goes
                strip = len(line) - len(line.lstrip(" \t"))
                line = line[min(strip, len(dedent)):]
        out.append(indent + line)
    return "".join(out)


# ------------------------------------------------------------------------------ building edits
def statements_text(lines: Sequence[str], indent: str, newline: str = "\n") -> str:
    """Statement lines (relative indentation inside) at ``indent``, each ending in newline."""
    out = []
    for code in lines:
        for ln in code.split("\n"):
            out.append((indent + ln if ln.strip() else ln.rstrip()) + newline)
    return "".join(out)


class Builder:
    """Edits of one source, made from its ``ast`` nodes."""

    def __init__(self, src: Source) -> None:
        self.src = src
        self.nl = src.newline()

    # -- positions ---------------------------------------------------------------------------
    def span(self, node) -> Tuple[int, int]:
        return self.src.span(node)

    def first_line(self, stmt) -> int:
        """A statement's first line, its decorators included."""
        decos = getattr(stmt, "decorator_list", None)
        return min([stmt.lineno, *(d.lineno for d in decos)]) if decos else stmt.lineno

    def own_lines(self, stmt) -> bool:
        """Whether the statement has its lines to itself (no ``a; b``, no ``if x: y``)."""
        src = self.src
        first = self.first_line(stmt)
        start_col = src.char_col(stmt.lineno, stmt.col_offset) if first == stmt.lineno else None
        if start_col is not None and src.line_text(first)[:start_col].strip():
            return False
        end_col = src.char_col(stmt.end_lineno, stmt.end_col_offset)
        rest = src.line_text(stmt.end_lineno)[end_col:].strip()
        return not rest or rest.startswith("#")

    def lines_span(self, first_stmt, last_stmt=None) -> Tuple[int, int]:
        """From the start of the first statement's first line to past the last one's line end."""
        last_stmt = last_stmt or first_stmt
        for s in {id(first_stmt): first_stmt, id(last_stmt): last_stmt}.values():
            if not self.own_lines(s):
                raise Conflict(f"line {s.lineno} holds more than one statement")
        return self.src.starts[self.first_line(first_stmt) - 1], self.src.line_end(last_stmt.end_lineno)

    def indent(self, stmt) -> str:
        return self.src.indent_of(self.first_line(stmt))

    def unit(self, stmt=None) -> str:
        """One level of indentation as this file writes it: the step from a compound statement
        to its block (the block of ``stmt`` when given, else the most common one in the file)."""
        src = self.src
        if stmt is not None:
            body = getattr(stmt, "body", None)
            if isinstance(body, list) and body and body[0].lineno > stmt.lineno:
                a, b = src.indent_of(self.first_line(body[0])), src.indent_of(self.first_line(stmt))
                if a.startswith(b) and len(a) > len(b):
                    return a[len(b):]
        if getattr(self, "_unit", None) is None:
            counts: dict = {}
            for n in ast.walk(src.tree) if src.tree is not None else ():
                body = getattr(n, "body", None)
                if not isinstance(n, ast.stmt) or not isinstance(body, list) or not body or body[0].lineno <= n.lineno:
                    continue
                a, b = src.indent_of(self.first_line(body[0])), src.indent_of(self.first_line(n))
                if a.startswith(b) and len(a) > len(b):
                    step = a[len(b):]
                    counts[step] = counts.get(step, 0) + 1
            self._unit = max(counts, key=counts.get) if counts else "    "
        return self._unit

    # -- edits -------------------------------------------------------------------------------
    def replace(self, node, text: str) -> Edit:
        a, b = self.span(node)
        return Edit(a, b, text)

    def replace_range(self, start: int, end: int, text: str) -> Edit:
        return Edit(start, end, text)

    def statements(self, lines: Sequence[str], indent: str) -> str:
        return statements_text(lines, indent, self.nl)

    def replace_statement(self, stmt, lines: Sequence[str]) -> Edit:
        """The statement's lines become ``lines`` (code at relative indentation), at its indentation."""
        a, b = self.lines_span(stmt)
        return Edit(a, b, self.statements(lines, self.indent(stmt)))

    def remove_statement(self, stmt, from_line: Optional[int] = None, run_end: Optional[int] = None,
                         heads: bool = False) -> Edit:
        """Remove a statement's lines (from ``from_line`` when given: comment lines above it
        that go too) and the blank lines right above them (as a statement's leading blank lines
        go with it), so that no gap is left doubled.  ``run_end``: the last line of the run of
        removed statements this one starts (what follows the run decides)."""
        a, b = self.lines_span(stmt)
        src = self.src
        first = from_line or self.first_line(stmt)
        a = min(a, src.starts[first - 1])
        end = run_end or stmt.end_lineno
        after = end + 1
        if heads:
            # the run opened its block (right under `def ...:`, `try:`): the blank lines after it go, so
            # that the block does not start with one
            while after < src.line_count and not src.line_text(after).strip():
                after += 1
            # one edit for the whole run (the tidy skips the run's other statements)
            b = src.starts[after - 1] if after > end + 1 else src.line_end(end)
            return Edit(a, b, "")
        if after <= src.line_count and not src.line_text(after).strip():
            # a blank line follows: the blank lines above go too (else they would pile up); with
            # code right after, they stay and keep the paragraphs apart.  At module level two
            # blank lines stay between what comes before and after (PEP 8's two around a def)
            following = 0
            while after + following <= src.line_count and not src.line_text(after + following).strip():
                following += 1
            nxt = src.line_text(after + following).lstrip() if after + following <= src.line_count else ""
            defines = nxt.startswith(("def ", "async def ", "class ", "@"))
            keep = max(0, 2 - following) if not self.indent(stmt) and defines else 0
            line = first - 1
            blanks = []
            while line >= 1 and not src.line_text(line).strip():
                blanks.append(line)
                line -= 1
            if line == 0:  # at the top of the file: the text after it starts there (no blank first line)
                a = src.starts[first - 1]
                if end == stmt.end_lineno:
                    b = src.starts[after + following - 1] if after + following <= src.line_count else len(src.text)
            elif len(blanks) > keep:  # the nearest go, the farthest `keep` stay
                a = src.starts[blanks[len(blanks) - keep - 1] - 1]
        return Edit(a, b, "")

    def insert_before(self, stmt, lines: Sequence[str]) -> Edit:
        a = self.src.starts[self.first_line(stmt) - 1]
        return Edit(a, a, self.statements(lines, self.indent(stmt)))

    def insert_after(self, stmt, lines: Sequence[str], indent: Optional[str] = None) -> Edit:
        b = self.src.line_end(stmt.end_lineno)
        text = self.statements(lines, self.indent(stmt) if indent is None else indent)
        if b == len(self.src.text) and self.src.text and not self.src.text.endswith(("\n", "\r")):
            text = self.nl + text
        return Edit(b, b, text)

    def wrap(self, first, last, header: str, unit: Optional[str] = None) -> Edit:
        """``header:`` (e.g. ``with torch.autocast(...)``) around the statements first..last
        of one block, which move one level in."""
        a, b = self.lines_span(first, last)
        unit = unit or self.unit()
        return Edit(a, b, region=True, indent=unit, before=f"{self.indent(first)}{header}:{self.nl}")

    def unwrap(self, compound, body: Sequence[ast.stmt], unit: Optional[str] = None) -> Edit:
        """The compound statement (if/with/try) is replaced by ``body`` (a run of its own
        statements), one level out."""
        if not body:
            raise Conflict("nothing to keep")
        if body[0].lineno == compound.lineno:
            raise Conflict(f"line {compound.lineno}: the block is on the header's line")
        a, b = self.lines_span(compound)
        ia = self.src.starts[self.first_line(body[0]) - 1]
        # comments right above the first kept statement come along
        ia = self._comments_above(body[0], ia, a)
        ib = self.src.line_end(body[-1].end_lineno)
        for s in (body[0], body[-1]):
            if not self.own_lines(s):
                raise Conflict(f"line {s.lineno} holds more than one statement")
        ind_c, ind_b = self.indent(compound), self.indent(body[0])
        if self.is_elif(compound):
            # `if a: ... elif b: <kept> else: ...`: the kept block is the `else` of the `if` above
            # (dedented, it would run after that `if` on every path); a kept `elif` stays one
            if self.is_elif(body[0]):
                return Edit(a, b, region=True, inner=(self.src.starts[body[0].lineno - 1], ib))
            if ind_b == ind_c:
                raise Conflict(f"line {body[0].lineno}: unexpected indentation")
            return Edit(a, b, region=True, inner=(ia, ib), before=f"{ind_c}else:{self.nl}")
        if not ind_b.startswith(ind_c) or ind_b == ind_c:
            raise Conflict(f"line {body[0].lineno}: unexpected indentation")
        return Edit(a, b, region=True, inner=(ia, ib), dedent=unit or ind_b[len(ind_c):])

    def is_elif(self, stmt) -> bool:
        """An ``if`` written as the ``elif`` of another."""
        return isinstance(stmt, ast.If) and self.src.text.startswith("elif", self.src.offset(stmt.lineno,
                                                                                          stmt.col_offset))

    # -- call arguments ----------------------------------------------------------------------
    def open_paren(self, call) -> int:
        """Offset just after the ``(`` of a call."""
        text = self.src.text
        i = self.span(call.func)[1]
        while i < len(text):
            c = text[i]
            if c == "(":
                return i + 1
            if c == "#":
                while i < len(text) and text[i] not in "\r\n":
                    i += 1
                continue
            i += 1
        raise Conflict(f"line {call.lineno}: no '(' after the function")

    def open_paren_def(self, fn) -> int:
        """Offset just after the ``(`` of a def's parameters."""
        text = self.src.text
        i = self.src.offset(fn.lineno, fn.col_offset)
        j = text.find("(", text.find(fn.name, i) + len(fn.name))
        if j < 0:
            raise Conflict(f"line {fn.lineno}: no '(' after the name")
        return j + 1

    def remove_last_param(self, fn) -> Edit:
        """Remove a def's last parameter (with its default) and the comma before it."""
        a = fn.args
        items = [*getattr(a, "posonlyargs", []), *a.args]
        last = items[-1]
        end = self.span(last)[1]
        default = a.defaults[-1] if a.defaults else None
        if default is not None:
            end = max(end, self.span(default)[1])
        if len(items) == 1:
            return Edit(self.open_paren_def(fn), end, "")
        prev = items[-2]
        start = self.span(prev)[1]
        if len(a.defaults) >= 2:
            start = max(start, self.span(a.defaults[-2])[1])
        return Edit(start, end, "")

    def args_of(self, call) -> List[ast.AST]:
        return sorted([*call.args, *call.keywords], key=lambda n: (n.lineno, n.col_offset))

    def insert_arg(self, call, text: str, first: bool = False) -> Edit:
        """``text`` (``"cuda"`` or ``device=x``) as the call's first or last argument."""
        args = self.args_of(call)
        if not args:
            p = self.open_paren(call)
            return Edit(p, p, text)
        if first:
            a = self.span(args[0])[0]
            return Edit(a, a, text + ", ")
        # after the last token before the call's `)`: an argument's own closing parentheses
        # (`f(a, (b == 0))`) and a trailing comma are not inside any argument's span
        start = self.span(args[-1])[1]
        end = self.src.offset(call.end_lineno, call.end_col_offset) - 1
        seg = self.src.text[start:end]
        last, comma, i = 0, False, 0
        while i < len(seg):
            c = seg[i]
            if c == "#":
                while i < len(seg) and seg[i] not in "\r\n":
                    i += 1
                continue
            if c in ")]},":
                last, comma = i + 1, c == ","
            i += 1
        b = start + last
        if comma and "\n" in seg[last:]:  # one argument a line: the new one on its own line too
            line = self.src.line_text(args[-1].lineno)
            return Edit(b, b, self.nl + line[:len(line) - len(line.lstrip())] + text + ",")
        return Edit(b, b, (" " + text + ",") if comma else (", " + text))

    def remove_arg(self, call, node) -> Edit:
        """Remove one argument and the comma that separates it from its neighbour."""
        args = self.args_of(call)
        i = next(k for k, a in enumerate(args) if a is node)
        a, b = self.span(node)
        if len(args) == 1:
            end = self.src.offset(call.end_lineno, call.end_col_offset) - 1  # the ')'
            return Edit(self.open_paren(call), end, "")
        if i + 1 < len(args):
            return Edit(a, self.span(args[i + 1])[0], "")
        return Edit(self.span(args[i - 1])[1], b, "")

    def remove_args(self, call, nodes) -> List[Edit]:
        """Remove several arguments at once, with their commas: edits that never overlap (one per
        run of neighbouring arguments), where :meth:`remove_arg` for each could."""
        args = self.args_of(call)
        gone = {id(n) for n in nodes}
        if all(id(a) in gone for a in args):
            end = self.src.offset(call.end_lineno, call.end_col_offset) - 1  # the ')'
            return [Edit(self.open_paren(call), end, "")]
        edits, i = [], 0
        while i < len(args):
            if id(args[i]) not in gone:
                i += 1
                continue
            j = i
            while j + 1 < len(args) and id(args[j + 1]) in gone:
                j += 1
            if j + 1 < len(args):  # a kept argument follows: up to its start
                edits.append(Edit(self.span(args[i])[0], self.span(args[j + 1])[0], ""))
            else:  # the last ones: from the end of the kept one before
                edits.append(Edit(self.span(args[i - 1])[1], self.span(args[j])[1], ""))
            i = j + 1
        return edits

    def _comments_above(self, stmt, start: int, floor: int) -> int:
        """Extend ``start`` upwards over comment lines directly above ``stmt`` (not past floor)."""
        src = self.src
        line = self.first_line(stmt) - 1
        while line >= 1 and src.starts[line - 1] > floor:
            t = src.line_text(line).strip()
            if not t.startswith("#"):
                break
            start = src.starts[line - 1]
            line -= 1
        return start


def house_quote(text: str) -> str:
    """The quote a module's own one-line string literals use most: ``'`` or ``"`` (``"`` on a
    tie, or where the text cannot be tokenized)."""
    single = double = 0
    for tok in _string_tokens(text) or ():
        body = tok.string.lstrip("rRbBuUfF")
        if body[:3] in ('"""', "'''"):
            continue
        if body.startswith("'"):
            single += 1
        elif body.startswith('"'):
            double += 1
    return "'" if single > double else '"'


def requote(text: str, quote: str) -> str:
    """``text`` (code the migration writes) with its plain double-quoted literals in single
    quotes when the module uses those: ``GradScaler('cuda')`` in a file of ``'loss'``.  Literals
    with a prefix, a quote or a backslash inside stay as they are."""
    if quote != "'" or '"' not in text:
        return text
    toks = _string_tokens(text)
    if not toks:
        return text
    starts = line_starts(text)
    out, last = [], 0
    for tok in toks:
        s = tok.string
        if not (s.startswith('"') and not s.startswith('"""') and len(s) >= 2 and s.endswith('"')
                and "'" not in s and "\\" not in s):
            continue
        a = starts[tok.start[0] - 1] + tok.start[1]
        b = starts[tok.end[0] - 1] + tok.end[1]
        if text[a:b] != s:
            return text
        out.append(text[last:a])
        out.append("'" + s[1:-1] + "'")
        last = b
    out.append(text[last:])
    return "".join(out)


def _string_tokens(text: str):
    import io
    import tokenize

    try:
        return [t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.STRING]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
