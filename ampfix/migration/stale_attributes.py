"""An attribute that said "apex is on" and that only the removed apex code read.

``self._use_apex = opt_level is not None`` in a trainer's ``__init__``, read by ``if
self._use_apex: with amp.scale_loss(...)`` alone: once the group's edits remove that read, the
assignment is dead code the migration made.  It goes when no module of the project reads an
attribute of that name any more (nor names it in a string: ``getattr(self, "_use_apex")``) and
its value has no side effects; otherwise it stays.  A Python file under the root that this part of
the run did not read keeps it too where it reads the attribute of another object than its own
``self`` (a callback handed the trainer); its ``self.<name>`` is its own classes' attribute.
"""
from __future__ import annotations

import ast
from typing import Dict, List, Sequence, Tuple

from ampfix.migration.groups import touched
from ampfix.model.edits import Conflict, Edit
from ampfix.model.semantic import walk


def _names_apex(attr: str) -> bool:
    return "apex" in attr.lower()


def _dropped(edits: Sequence[Edit], a: int, b: int) -> bool:
    """Some edit removes or replaces the text ``[a, b)`` (a region edit keeps its inner part)."""
    for e in edits:
        if e.start <= a and b <= e.end and e.start < e.end:
            if e.region:
                k_lo, k_hi = e.keep
                if k_lo <= a and b <= k_hi:
                    continue
            return True
    return False


def unread_apex_attributes_go(project, changes: Dict[str, object]) -> None:
    """Append to each file's ``final_edits`` the removal of ``self.<apex flag> = <pure value>``
    whose every read in the project lies in text those edits remove."""
    from ampfix.engine.tidy import Remover, pure

    stores = [(fc, n) for fc in changes.values() for n in walk(fc.module.tree, into_functions=True)
              if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Attribute)
              and isinstance(n.targets[0].value, ast.Name) and n.targets[0].value.id == "self"
              and _names_apex(n.targets[0].attr) and pure(n.value)]
    if not stores:
        return
    reads: Dict[str, List[Tuple[str, ast.AST]]] = {}
    named = set()
    for path, m in project.modules.items():
        for n in walk(m.tree, into_functions=True):
            if isinstance(n, ast.Attribute) and not isinstance(n.ctx, ast.Store) and _names_apex(n.attr):
                reads.setdefault(n.attr, []).append((path, n))
            elif isinstance(n, ast.Constant) and isinstance(n.value, str) and _names_apex(n.value):
                named.add(n.value)
    written = " ".join(e.text + e.before + e.after for fc in changes.values() for e in fc.final_edits)
    for fc, n in stores:
        attr = n.targets[0].attr
        if attr in named or attr in written:
            continue
        seen = reads.get(attr, [])
        if not seen:
            continue  # read by nothing before the migration either: not the migration's debris
        if any(_read_on_another_object(p, attr) for p in project.mentioned_elsewhere(attr, other_parts=True)):
            continue  # a file not read with this part reads it (a callback handed the trainer)
        if not all(p in changes and _dropped(changes[p].final_edits, *changes[p].b.span(x)) for p, x in seen):
            continue
        try:
            gone = Remover(fc.src, fc.module.sem, fc.b).remove([n])
        except Conflict:
            continue
        if any(touched(e.start, e.end, fc.final_edits) for e in gone):
            continue
        fc.final_edits = [*fc.final_edits, *gone]


def _read_on_another_object(path: str, attr: str) -> bool:
    """A file outside this part reads ``<obj>.<attr>`` of something other than its own ``self``
    (``trainer._use_apex`` in a callback), or names it in a string.  Its ``self.<attr>`` is the
    attribute of its own classes: without importing this module it cannot subclass ours."""
    try:
        with open(path, "rb") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return True
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and n.attr == attr and not (
                isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")):
            return True
        if isinstance(n, ast.Constant) and n.value == attr:
            return True
    return False
