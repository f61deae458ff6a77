"""Jupyter notebooks: the code cells, in order, checked and fixed as one module.

The module ampfix sees is the code cells joined, each one after a marker line
``# %% [cell N]`` (N counts every cell, as Jupyter numbers them, from 1).  IPython lines
(``%magic``, ``!shell``, ``x = !cmd``, ``%%time``) become a placeholder ``pass`` at the same
indentation, so the rest still parses; a cell that a cell magic makes another language
(``%%bash``, ``%%writefile``...) is left out whole.  Diagnostics name the cell and the line in it.

A fix is written back only into the cells whose code changed: each changed cell's ``source`` is
replaced; outputs, metadata and everything else stay as they were, and the JSON is written with
the same layout (indent, key order, escaping) it was read with, found by re-serialising it.  A
notebook whose layout cannot be reproduced, or whose markers or placeholders a fix touched, is
not written (the message says why).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

MARKER = re.compile(r"^# %% \[cell (\d+)\]$")
_MAGIC = re.compile(r"^(\s*)(?:[%!]|\w+\s*=\s*[%!])")
_HOLE = re.compile(r"^(\s*)pass  # ampfix: ipython (\d+)$")
#: cell magics after which the cell is still Python
PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun", "debug"}


class NotebookError(Exception):
    """The notebook cannot be read or written back (one line)."""


@dataclass
class Cell:
    index: int  # in nb["cells"]
    source: str  # as in the notebook
    as_list: bool  # source stored as a list of lines
    text: str = ""  # the Python ampfix sees (magics replaced)
    new_source: Optional[str] = None  # after a fix


@dataclass
class Notebook:
    path: str
    raw: str
    nb: dict
    cells: List[Cell] = field(default_factory=list)
    holes: Dict[int, str] = field(default_factory=dict)  # placeholder number -> the IPython line
    module: str = ""
    layout: Optional[dict] = None


class _Scan:
    """Where a cell's lines stand: IPython reads ``%``/``!`` as a magic only at the start of a
    statement, not inside brackets, a string or a continued line (``(a\n % b)`` is Python)."""

    def __init__(self) -> None:
        self.depth = 0
        self.quote: Optional[str] = None  # an open triple-quoted string
        self.continued = False

    def at_statement(self) -> bool:
        return self.depth == 0 and self.quote is None and not self.continued

    def feed(self, line: str) -> None:
        i, n = 0, len(line)
        while i < n:
            c = line[i]
            if self.quote is not None:
                if c == "\\":
                    i += 2
                    continue
                if line.startswith(self.quote, i):
                    i += len(self.quote)
                    self.quote = None
                    continue
                i += 1
                continue
            if c == "#":
                break
            if c in "([{":
                self.depth += 1
            elif c in ")]}":
                self.depth = max(0, self.depth - 1)
            elif c in "'\"":
                q = line[i:i + 3] if line[i:i + 3] in ("'''", '"""') else c
                if len(q) == 3:
                    self.quote = q
                    i += 3
                    continue
                j = i + 1  # a one-line string: skip to its end
                while j < n and line[j] != c:
                    j += 2 if line[j] == "\\" else 1
                i = j + 1
                continue
            i += 1
        self.continued = self.quote is None and line.rstrip().endswith("\\") and not line.lstrip().startswith("#")


def _source_text(src) -> Tuple[str, bool]:
    if isinstance(src, list):
        return "".join(src), True
    if isinstance(src, str):
        return src, False
    raise NotebookError("a code cell's source is neither text nor a list of lines")


def read(data: bytes, path: str) -> Notebook:
    try:
        raw = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotebookError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        nb = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise NotebookError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if isinstance(nb, dict) and isinstance(nb.get("nbformat"), int) and nb["nbformat"] < 4:
        raise NotebookError(f"nbformat {nb['nbformat']} (before Jupyter 4): convert it first with "
                            "'jupyter nbconvert --to notebook --nbformat 4'")
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise NotebookError("not a Jupyter notebook (no list of cells)")
    lang = ((nb.get("metadata") or {}).get("language_info") or {}).get("name") or \
        ((nb.get("metadata") or {}).get("kernelspec") or {}).get("language") or "python"
    book = Notebook(path, raw, nb)
    if str(lang).lower() != "python":
        return book  # another kernel's language: nothing for ampfix
    parts: List[str] = []
    for i, c in enumerate(nb["cells"]):
        if not isinstance(c, dict) or c.get("cell_type") != "code":
            continue
        source, as_list = _source_text(c.get("source", ""))
        cell = Cell(i, source, as_list)
        first = source.lstrip().split("\n", 1)[0]
        if first.startswith("%%") and first[2:].split(" ", 1)[0].strip() not in PYTHON_CELL_MAGICS:
            continue  # another language in this cell
        out = []
        state = _Scan()
        for text in source.split("\n"):
            m = _MAGIC.match(text) if state.at_statement() else None
            if not m:
                state.feed(text)
            if m or (state.at_statement() and text.lstrip().startswith("%%")):
                n = len(book.holes)
                book.holes[n] = text
                indent = m.group(1) if m else ""
                out.append(f"{indent}pass  # ampfix: ipython {n}")
            else:
                out.append(text)
        cell.text = "\n".join(out)
        parts.append(f"# %% [cell {i + 1}]\n")
        parts.append(cell.text if cell.text.endswith("\n") or not cell.text else cell.text + "\n")
        book.cells.append(cell)
    book.module = "".join(parts)
    return book


def where(module: str, line: int) -> Tuple[Optional[int], int]:
    """A line of a notebook's module text (as read, or as fixed) as (cell number as Jupyter
    shows it, line in the cell); a marker line is given as the first line of its cell."""
    cell, start = None, 1
    for no, text in enumerate(module.split("\n"), 1):
        if no > line:
            break
        m = MARKER.match(text)
        if m:
            cell, start = int(m.group(1)), no + 1
    if cell is None:
        return None, line
    return cell, max(1, line - start + 1)


def shown(book: Notebook, module: str) -> str:
    """The module text with the IPython lines back in place of their stand-ins (for a diff)."""
    def back(m):
        n = int(m.group(2))
        return book.holes.get(n, m.group(0))
    return "\n".join(_HOLE.sub(back, t) for t in module.split("\n"))


def _layout(book: Notebook) -> dict:
    """The json.dumps arguments that give back the notebook's text exactly."""
    for indent in (1, 2, 4, None):
        for sort_keys in (True, False):
            for ensure_ascii in (False, True):
                kw = {"indent": indent, "sort_keys": sort_keys, "ensure_ascii": ensure_ascii}
                text = json.dumps(book.nb, **kw)
                if text == book.raw or text + "\n" == book.raw:
                    kw["newline"] = text + "\n" == book.raw
                    return kw
    raise NotebookError("its JSON layout is not one ampfix can write back unchanged (re-save it in Jupyter)")


def write_back(book: Notebook, fixed_module: str) -> bytes:
    """The notebook with the fixed module's cells in place of the old ones."""
    if not book.cells and not fixed_module.strip():
        return book.raw.encode("utf-8")
    marks = list(re.finditer(r"^# %% \[cell (\d+)\]\n", fixed_module, re.M))
    if not marks or fixed_module[:marks[0].start()].strip():
        raise NotebookError("a fix put code before the first cell; not written")
    chunks: Dict[int, str] = {}
    for m, nxt in zip(marks, marks[1:] + [None]):
        index = int(m.group(1)) - 1
        if index in chunks:
            raise NotebookError("a fix duplicated a cell marker; not written")
        chunks[index] = fixed_module[m.end():nxt.start() if nxt is not None else len(fixed_module)]
    if sorted(chunks) != sorted(c.index for c in book.cells):
        raise NotebookError("a fix moved or removed a cell marker; not written")
    used = set()
    for c in book.cells:
        text = chunks[c.index]
        if c.text and not c.text.endswith("\n") and text.endswith("\n"):
            text = text[:-1]  # the newline the joining added
        restored = []
        for line in text.split("\n"):
            m = _HOLE.match(line)
            if m:
                n = int(m.group(2))
                if n not in book.holes or n in used:
                    raise NotebookError("a fix changed an IPython line; not written")
                used.add(n)
                restored.append(book.holes[n])
            else:
                restored.append(line)
        c.new_source = "\n".join(restored)
    if used != set(book.holes):
        raise NotebookError("a fix removed an IPython line; not written")
    layout = _layout(book)
    for c in book.cells:
        new = c.new_source
        if new == c.source:
            continue
        if c.as_list:  # as Jupyter stores it: split after each "\n" only
            bits = new.split("\n")
            book.nb["cells"][c.index]["source"] = [b + "\n" for b in bits[:-1]] + ([bits[-1]] if bits[-1] else [])
        else:
            book.nb["cells"][c.index]["source"] = new
    newline = layout.pop("newline")
    text = json.dumps(book.nb, **layout) + ("\n" if newline else "")
    return text.encode("utf-8")
