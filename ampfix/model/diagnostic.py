"""Plain, picklable results that cross from the worker processes to the reporters."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import List, Optional, Set


@dataclass(frozen=True)
class Diagnostic:
    path: str
    line: int  # 1-based
    col: int  # 1-based
    end_line: int
    end_col: int
    code: str
    name: str
    message: str
    fix: Optional[str] = None  # "safe" | "unsafe" | None
    fix_description: Optional[str] = None
    cell: Optional[int] = None  # a notebook's cell (as Jupyter numbers them); line is in the cell

    def sort_key(self):
        return (self.path, self.cell or 0, self.line, self.col, self.code)

    @property
    def where(self) -> str:
        """``path:line:col``, or ``path:cell N:line:col`` in a notebook."""
        cell = f"cell {self.cell}:" if self.cell is not None else ""
        return f"{self.path}:{cell}{self.line}:{self.col}"

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class FileResult:
    path: str
    diagnostics: List[Diagnostic] = field(default_factory=list)
    #: A file that could not be read or decoded: the message (no diagnostics then).
    error: Optional[str] = None
    #: Set when fixes were asked for and changed the text.
    original: Optional[str] = None
    fixed: Optional[str] = None
    fixed_bytes: Optional[bytes] = None
    applied: List[str] = field(default_factory=list)
    #: fixes left out because their result did not parse or their edits conflicted (why)
    failed_fixes: List[str] = field(default_factory=list)
    #: migration groups a fix of which failed here (taken back in every file)
    failed_groups: Set[str] = field(default_factory=set)
    #: sha256 of the bytes read (a write replaces the file only if it still holds them)
    digest: Optional[str] = None
    #: migration groups whose fixes went into the fixed text (a plan across files: written together)
    groups: Set[str] = field(default_factory=set)

    @property
    def changed(self) -> bool:
        return self.fixed is not None and self.fixed != self.original
