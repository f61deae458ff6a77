"""The rule API: what a rule is, what it reports, and the examples that test it.

A rule sees one parsed module (Python's ``ast``) with its semantic model and reports
diagnostics through :meth:`Rule.report`, each with an optional :class:`Fix`.  A rule never
edits text and never writes a file: the engine decides which fixes to apply.

The engine walks the module once for all rules and calls each rule's ``visit_<NodeType>``
methods (``visit_Call``, ``visit_For``, ...); ``visit_Module`` is called first.
"""
from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from ampfix.model.edits import Builder, Edit
from ampfix.model.semantic import Model, dotted
from ampfix.model.settings import Settings
from ampfix.model.source import Source


@dataclass(frozen=True)
class ImportSpec:
    """``import module`` (obj None) or ``from module import obj [as asname]``."""

    module: str
    obj: Optional[str] = None
    asname: Optional[str] = None


@dataclass
class Fix:
    """Text edits that resolve one diagnostic, applied together or not at all.

    ``safe`` fixes keep behaviour; unsafe ones change it (the description says how) and are
    applied only with ``--unsafe-fixes``.  ``add_imports`` are added when the result lacks them;
    ``remove_imports`` are removed when the result no longer uses them, ``names_may_go`` (flags)
    likewise.  Fixes that share a
    ``group`` (a migration planned across modules) are applied all or none.
    """

    description: str
    edits: Sequence[Edit]
    safe: bool = True
    add_imports: Sequence[ImportSpec] = ()
    remove_imports: Sequence[ImportSpec] = ()
    group: Optional[str] = None
    #: module-level availability flags (``HAS_APEX = True`` once apex's guarded import went) that
    #: no other module imports: they go where nothing in the result reads them
    names_may_go: Sequence[str] = ()


@dataclass
class Report:
    """What a rule reported (engine-internal): position, message, optional fix."""

    rule: "type[Rule]"
    line: int
    col: int  # 0-based, characters
    end_line: int
    end_col: int
    message: str
    fix: Optional[Fix]


@dataclass
class Example:
    """A VALID or INVALID example: a rule's documentation and its test at once.

    ``expected`` (INVALID only) is the code after the rule's fixes were applied (unsafe ones
    included when ``unsafe`` is true); ``count`` the number of reports; ``settings`` overrides
    (``{"torch_version": "1.13", "target": "torch.cuda.amp"}``); ``message`` a substring that
    the first report's message must contain.
    """

    code: str
    expected: Optional[str] = None
    count: int = 1
    settings: Dict[str, Any] = field(default_factory=dict)
    message: Optional[str] = None
    unsafe: bool = False
    #: file rules only: the example file's name, and the project's Python files beside it
    filename: str = "example.py"
    project: Dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.code = textwrap.dedent(self.code).lstrip("\n")
        if self.expected is not None:
            self.expected = textwrap.dedent(self.expected).lstrip("\n")


Valid = Example
Invalid = Example


class _Memo:
    """``cached(key, compute)``: ``compute()`` once per key (analyses several rules need)."""

    _cache: Dict[Any, Any]

    def cached(self, key, compute):
        try:
            return self._cache[key]
        except KeyError:
            value = self._cache[key] = compute()
            return value


class Context(_Memo):
    """What every rule of one file shares: source, tree, semantic model, settings, what project
    planners decided for the file (a :class:`~ampfix.project.plan.FilePlan` or None), and a cache for
    analyses rules share."""

    def __init__(self, src: Source, model: Model, settings: Settings, plan=None) -> None:
        self.src = src
        self.tree = src.tree
        self.sem = model
        self.settings = settings
        self.plan = plan
        self.edits = Builder(src)
        self._cache: Dict[Any, Any] = {}



class Rule:
    """Base class of every rule.  Subclasses set the class attributes and visit methods.

    The class docstring is the rule's documentation, in four sections: ``What it does``,
    ``Why is this bad?``, ``Example``, ``Use instead``.
    """

    code: ClassVar[str] = ""
    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    #: "safe", "unsafe", "sometimes" (safe or unsafe depending on the case) or None.
    fix_kind: ClassVar[Optional[str]] = None
    default: ClassVar[bool] = True
    #: The advice holds from this torch release on (documentation).
    since: ClassVar[str] = "1.6"
    #: Cheap pre-filter: the rule runs only on files whose text contains one of these (as a
    #: word where the trigger begins or ends with a letter).
    triggers: ClassVar[Tuple[str, ...]] = ()
    VALID: ClassVar[List[Example]] = []
    INVALID: ClassVar[List[Example]] = []

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.src = ctx.src
        self.sem = ctx.sem
        self.settings = ctx.settings
        self.edits = ctx.edits
        self.module = ctx.tree
        self.reports: List[Report] = []

    # -- reporting -------------------------------------------------------------------------
    def report(self, node, message: str, fix: Optional[Fix] = None) -> None:
        src = self.src
        line, end_line = node.lineno, getattr(node, "end_lineno", None) or node.lineno
        col = src.char_col(line, node.col_offset)
        end_col = src.char_col(end_line, getattr(node, "end_col_offset", node.col_offset))
        self.reports.append(Report(type(self), line, col, end_line, end_col, message, fix))

    def report_at(self, line: int, col: int, end_line: int, end_col: int, message: str,
                  fix: Optional[Fix] = None) -> None:
        """Report at a position (0-based character columns) rather than a node."""
        self.reports.append(Report(type(self), line, col, end_line, end_col, message, fix))

    # -- helpers shared by rules --------------------------------------------------------------
    def qnames(self, node) -> set:
        """Fully qualified names of what ``node`` (a Name, Attribute or Call) may refer to,
        through imports and builtins (a local binding such as ``apex = 1`` is not a name)."""
        return self.sem.qnames(node)

    def is_call_to(self, node, names: Iterable[str]) -> bool:
        return isinstance(node, ast.Call) and bool(self.qnames(node) & set(names))

    def parent(self, node):
        return getattr(node, "_p", None)

    def ancestors(self, node) -> Iterator[ast.AST]:
        return self.sem.ancestors(node)

    def code_of(self, node) -> str:
        return self.src.code(node)

    def line_of(self, node) -> int:
        return node.lineno

    @classmethod
    def documentation(cls) -> str:
        return textwrap.dedent(cls.__doc__ or "").strip()

    @classmethod
    def visited_types(cls) -> List[str]:
        return [n[len("visit_"):] for n in dir(cls) if n.startswith("visit_") and n != "visit_Module"
                and callable(getattr(cls, n))]


def dotted_name(node) -> Optional[str]:
    return dotted(node)


def edits_of(fixes: Sequence[Fix]) -> List[Edit]:
    return [e for f in fixes for e in f.edits]


@dataclass(frozen=True)
class FileFinding:
    """A line of a non-Python file (requirements, Dockerfile, a YAML config...) that a file rule
    reports; ``removable``: the fix is to drop the line, and the rule says it may go now;
    ``replacement``: the fix is this text instead of the line (its comment and end kept by the
    rule)."""

    line: int  # 1-based
    col: int  # 1-based
    message: str
    removable: bool = False
    fix_description: str = "remove the line"
    replacement: Optional[str] = None


class Facts(_Memo):
    """What a file rule may know of the project: its Python files (path -> text; the fixed text
    when fixes are being applied), and whether those files are the whole project."""

    def __init__(self, python: Dict[str, str], whole: bool = True) -> None:
        self.python = python
        self.whole = whole
        self._cache: Dict[Any, Any] = {}


class FileRule(Rule):
    """A rule over files that are not Python (dependency and environment files).  Subclasses
    set ``files`` (name patterns, e.g. ``requirements*.txt``) and implement :meth:`check_file`;
    the engine drops the lines reported ``removable`` when fixing, and keeps the result only if
    :meth:`well_formed` accepts it."""

    files: ClassVar[Tuple[str, ...]] = ()

    def __init__(self) -> None:  # no Python file, no Context
        pass

    def check_file(self, path: str, text: str, facts: Facts) -> Iterator[FileFinding]:  # pragma: no cover
        raise NotImplementedError

    def well_formed(self, path: str, text: str) -> bool:
        return True

    @classmethod
    def matches(cls, name: str) -> bool:
        import fnmatch

        return any(fnmatch.fnmatch(name, pattern) for pattern in cls.files)
