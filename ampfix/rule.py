"""The rule API: what a rule is, what it reports, and the examples that test it.

A rule is a libcst visitor over one parsed module (wrapped with metadata).  It reports
diagnostics through :meth:`Rule.report`, each with an optional :class:`Fix`.  A rule never
edits the tree and never writes a file: the engine decides which fixes to apply.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import (
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    QualifiedNameSource,
    ScopeProvider,
)

from ampfix.settings import Settings

# A replacement is a node, a FlattenSentinel / RemovalSentinel (for statements), or a
# callable that receives the updated node (children already transformed) and returns one.
Replacement = Union[cst.CSTNode, cst.FlattenSentinel, cst.RemovalSentinel, Callable[[Any], Any]]


@dataclass(frozen=True)
class ImportSpec:
    """``import module`` (obj None) or ``from module import obj [as asname]``."""

    module: str
    obj: Optional[str] = None
    asname: Optional[str] = None


@dataclass
class Fix:
    """A change to the tree that resolves one diagnostic.

    ``edits`` replace original nodes (identity of the nodes the rule saw).  All edits of a fix
    are applied together or not at all.  ``safe`` fixes keep behaviour; unsafe ones change it
    (the description says how) and are applied only with ``--unsafe-fixes``.
    """

    description: str
    edits: Sequence[Tuple[cst.CSTNode, Replacement]]
    safe: bool = True
    add_imports: Sequence[ImportSpec] = ()
    remove_imports: Sequence[ImportSpec] = ()


@dataclass
class Report:
    """What a rule reported: the node, the message and an optional fix (engine-internal)."""

    rule: "type[Rule]"
    node: cst.CSTNode
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

    def __post_init__(self) -> None:
        self.code = textwrap.dedent(self.code).lstrip("\n")
        if self.expected is not None:
            self.expected = textwrap.dedent(self.expected).lstrip("\n")


Valid = Example
Invalid = Example


class Rule(m.MatcherDecoratableVisitor):
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
    #: Cheap pre-filter: the rule runs only on files whose text contains one of these.
    triggers: ClassVar[Tuple[str, ...]] = ()
    VALID: ClassVar[List[Example]] = []
    INVALID: ClassVar[List[Example]] = []

    METADATA_DEPENDENCIES = (
        PositionProvider,
        QualifiedNameProvider,
        ParentNodeProvider,
        ScopeProvider,
    )

    def __init__(self, module: cst.Module, settings: Settings) -> None:
        super().__init__()
        self.module = module
        self.settings = settings
        self.reports: List[Report] = []

    # -- reporting -------------------------------------------------------------------------
    def report(self, node: cst.CSTNode, message: str, fix: Optional[Fix] = None) -> None:
        self.reports.append(Report(type(self), node, message, fix))

    # -- helpers shared by rules --------------------------------------------------------------
    def qnames(self, node: cst.CSTNode) -> set:
        """Fully qualified names of what ``node`` (a Name, Attribute or Call) may refer to,
        through imports and builtins (a local binding such as ``apex = 1`` is not a name)."""
        if isinstance(node, cst.Call):
            node = node.func
        try:
            return {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())
                    if q.source is not QualifiedNameSource.LOCAL}
        except KeyError:
            return set()

    def is_call_to(self, node: cst.CSTNode, names: Iterable[str]) -> bool:
        return isinstance(node, cst.Call) and bool(self.qnames(node) & set(names))

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self.get_metadata(ParentNodeProvider, node, None)

    def ancestors(self, node: cst.CSTNode) -> Iterable[cst.CSTNode]:
        p = self.parent(node)
        while p is not None:
            yield p
            p = self.parent(p)

    def code_of(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    @classmethod
    def documentation(cls) -> str:
        return textwrap.dedent(cls.__doc__ or "").strip()
