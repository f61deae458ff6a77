"""What a project planner hands to the rules of one file.

A planner (a rule's ``planner`` attribute: a function of the :class:`~ampfix.project.graph.Project`)
decides migrations that span functions and modules before anything is edited.  For each file it
returns a :class:`FilePlan`: the fix to attach to the diagnostic at a position, and the reason
a part was left alone.  Plans are small and picklable: they travel to the worker processes,
the project does not.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ampfix.rule import Fix

Pos = Tuple[int, int]  # (line, ast column)


@dataclass
class PlannedReport:
    """A diagnostic the planner itself makes (a file a migration edits where no rule reports:
    a caller that now passes the scaler)."""

    line: int
    col: int
    end_line: int
    end_col: int
    message: str
    fix: Optional[Fix]
    #: the kind of migration it belongs to (the group's: "apex.amp", "fp16", "dual"): the rule of
    #: that kind says it, so ``--select`` of that rule alone carries the whole migration
    kind: str = ""


@dataclass
class FilePlan:
    path: str
    #: the fix of the diagnostic reported at a position (several positions may share one Fix)
    fixes: Dict[Pos, Fix] = field(default_factory=dict)
    #: a note said with the diagnostic at a position (why it is left alone, what changed)
    notes: Dict[Pos, str] = field(default_factory=dict)
    reports: List[PlannedReport] = field(default_factory=list)
    #: facts a rule reads at a position ("uninitialized": an apex use no amp.initialize reaches)
    flags: Dict[Pos, str] = field(default_factory=dict)
    #: facts about the whole file, which hold in every pass (positions do not matter): what a
    #: project-wide decision says of it (``"apex-ddp"``: ``"keep <why>"`` or ``"rename"``)
    facts: Dict[str, str] = field(default_factory=dict)

    def fix_at(self, node) -> Optional[Fix]:
        return self.fixes.get((node.lineno, node.col_offset))

    def note_at(self, node) -> Optional[str]:
        return self.notes.get((node.lineno, node.col_offset))

    def merged(self, other: "FilePlan") -> "FilePlan":
        return FilePlan(self.path, {**self.fixes, **other.fixes}, {**self.notes, **other.notes},
                        [*self.reports, *other.reports], {**self.flags, **other.flags}, {**self.facts, **other.facts})

    def without_fixes(self) -> "FilePlan":
        """For the passes after the first: positions no longer match the edited text (the
        file's facts still hold)."""
        return FilePlan(self.path, facts=dict(self.facts))

    def __bool__(self) -> bool:
        return bool(self.fixes or self.notes or self.reports or self.flags or self.facts)


def planners_of(rules) -> list:
    """The distinct project planners that the given rules use, in a stable order (a rule's
    ``planner``: one function, or a tuple of them where several plan its fixes)."""
    out = []
    for r in rules:
        p = getattr(r, "planner", None)
        for q in (p if isinstance(p, tuple) else (p,)):
            if q is not None and q not in out:
                out.append(q)
    return out
