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
    first_line: int = 0  # line of the module where this cell's code starts (after its marker)
    lines: int = 0


@dataclass
class Notebook:
    path: str
    raw: str
    nb: dict
    cells: List[Cell] = field(default_factory=list)
    holes: Dict[int, str] = field(default_factory=dict)  # placeholder number -> the IPython line
    module: str = ""
    layout: Optional[dict] = None


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
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise NotebookError("not a Jupyter notebook (no list of cells)")
    lang = ((nb.get("metadata") or {}).get("language_info") or {}).get("name") or \
        ((nb.get("metadata") or {}).get("kernelspec") or {}).get("language") or "python"
    book = Notebook(path, raw, nb)
    if str(lang).lower() != "python":
        return book  # another kernel's language: nothing for ampfix
    parts: List[str] = []
    line = 1
    for i, c in enumerate(nb["cells"]):
        if not isinstance(c, dict) or c.get("cell_type") != "code":
            continue
        source, as_list = _source_text(c.get("source", ""))
        cell = Cell(i, source, as_list)
        first = source.lstrip().split("\n", 1)[0]
        if first.startswith("%%") and first[2:].split(" ", 1)[0].strip() not in PYTHON_CELL_MAGICS:
            continue  # another language in this cell
        out = []
        for text in source.split("\n"):
            m = _MAGIC.match(text)
            if m or text.lstrip().startswith("%%"):
                n = len(book.holes)
                book.holes[n] = text
                indent = m.group(1) if m else ""
                out.append(f"{indent}pass  # ampfix: ipython {n}")
            else:
                out.append(text)
        cell.text = "\n".join(out)
        parts.append(f"# %% [cell {i + 1}]\n")
        line += 1
        cell.first_line = line
        body = cell.text if cell.text.endswith("\n") or not cell.text else cell.text + "\n"
        cell.lines = body.count("\n")
        parts.append(body)
        line += cell.lines
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
    chunks: Dict[int, List[str]] = {}
    current = None
    for text in fixed_module.split("\n"):
        m = MARKER.match(text)
        if m:
            current = int(m.group(1)) - 1
            if current in chunks:
                raise NotebookError("a fix duplicated a cell marker; not written")
            chunks[current] = []
            continue
        if current is None:
            if text.strip():
                raise NotebookError("a fix put code before the first cell; not written")
            continue
        chunks[current].append(text)
    if sorted(chunks) != sorted(c.index for c in book.cells):
        raise NotebookError("a fix moved or removed a cell marker; not written")
    used = set()
    for c in book.cells:
        lines = chunks[c.index]
        if lines and lines[-1] == "" and (len(lines) > 1 or not c.text):
            lines = lines[:-1]  # the newline the joining added
        restored = []
        for text in lines:
            m = _HOLE.match(text)
            if m:
                n = int(m.group(2))
                if n not in book.holes or n in used:
                    raise NotebookError("a fix changed an IPython line; not written")
                used.add(n)
                restored.append(book.holes[n])
            else:
                restored.append(text)
        new = "\n".join(restored)
        if c.source.endswith("\n") and not new.endswith("\n"):
            new += "\n"
        if not c.source.endswith("\n") and new.endswith("\n") and c.text and not c.text.endswith("\n"):
            new = new[:-1]
        c.new_source = new  # type: ignore[attr-defined]
    if used != {n for n in book.holes if any(str(n) == m.group(2) for c in book.cells
                                             for m in [_HOLE.match(t) for t in c.text.split("\n")] if m)}:
        raise NotebookError("a fix removed an IPython line; not written")
    layout = _layout(book)
    for c in book.cells:
        new = c.new_source  # type: ignore[attr-defined]
        if new == c.source:
            continue
        if c.as_list:
            parts = new.splitlines(keepends=True)
            book.nb["cells"][c.index]["source"] = parts
        else:
            book.nb["cells"][c.index]["source"] = new
    newline = layout.pop("newline")
    text = json.dumps(book.nb, **layout) + ("\n" if newline else "")
    return text.encode("utf-8")
