"""The engine: bytes -> parse -> rules -> diagnostics and fixes.  It knows no rule by name."""
from __future__ import annotations

import io
import os
import tokenize
from concurrent.futures import ProcessPoolExecutor
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.metadata import MetadataWrapper, PositionProvider

from ampfix.diagnostic import Diagnostic, FileResult
from ampfix.registry import rules_by_code
from ampfix.rule import Fix, Report
from ampfix.settings import Settings

SYNTAX_ERROR = ("AMP000", "syntax-error")
IO_ERROR = ("AMP001", "io-error")
MAX_PASSES = 10
#: Above this many files, work is spread over a process pool.
PARALLEL_THRESHOLD = 16


class FixError(Exception):
    """A fix produced text that does not parse: a bug in a rule; the file is left alone."""


# --------------------------------------------------------------------------- decoding
def decode(data: bytes) -> str:
    """Decode source bytes the way Python does (PEP 263 declaration, BOM); ValueError if not text."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot decode: {exc}") from None


# --------------------------------------------------------------------------- suppression
class _Comments(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        self.noqa: Dict[int, Optional[frozenset]] = {}  # line -> codes (None: all)
        self.skip_file = False

    def visit_Comment(self, node: cst.Comment) -> None:
        text = node.value.lstrip("#").strip()
        if text.lower().replace(" ", "") == "ampfix:skip-file":
            self.skip_file = True
        codes = parse_noqa(node.value)
        if codes is not False:
            line = self.get_metadata(PositionProvider, node).start.line
            prev = self.noqa.get(line, frozenset())
            self.noqa[line] = None if codes is None or prev is None else prev | codes


def parse_noqa(comment: str):
    """``# noqa`` -> None (all codes); ``# noqa: A, B`` -> {A, B}; no noqa -> False."""
    for part in comment.split("#")[1:]:
        part = part.strip()
        if part[:4].lower() != "noqa":
            continue
        rest = part[4:]
        if not rest.startswith(":"):
            return None if not rest.strip() or rest[0] in " \t" else False
        codes = frozenset(c for c in rest[1:].replace(",", " ").split() if c)
        return codes or None
    return False


# --------------------------------------------------------------------------- applying fixes
class _Apply(cst.CSTTransformer):
    def __init__(self, edits: Dict[int, object]) -> None:
        super().__init__()
        self.edits = edits

    def on_leave(self, original_node, updated_node):
        rep = self.edits.get(id(original_node))
        if rep is None:
            return updated_node
        return rep(updated_node) if callable(rep) else rep


def _overlaps(a, b) -> bool:
    return not (a[1] <= b[0] or b[1] <= a[0])


def _apply_fixes(wrapper: MetadataWrapper, fixes: Sequence[Fix]) -> Tuple[cst.Module, List[Fix]]:
    positions = wrapper.resolve(PositionProvider)
    chosen: List[Fix] = []
    taken: List[Tuple[tuple, tuple]] = []

    def span(node):
        r = positions[node]
        return ((r.start.line, r.start.column), (r.end.line, r.end.column))

    ordered = sorted(fixes, key=lambda f: min(span(n) for n, _ in f.edits) if f.edits else ((0, 0), (0, 0)))
    for fix in ordered:
        spans = [span(n) for n, _ in fix.edits]
        if any(_overlaps(s, t) for s in spans for t in taken):
            continue  # applied in a later pass, after the tree is re-checked
        chosen.append(fix)
        taken.extend(spans)
    edits = {id(n): rep for fix in chosen for n, rep in fix.edits}
    module = wrapper.module.visit(_Apply(edits))
    adds = [i for f in chosen for i in f.add_imports]
    removes = [i for f in chosen for i in f.remove_imports]
    if adds or removes:
        context = CodemodContext()
        for spec in adds:
            AddImportsVisitor.add_needed_import(context, spec.module, spec.obj, spec.asname)
        for spec in removes:
            RemoveImportsVisitor.remove_unused_import(context, spec.module, spec.obj, spec.asname)
        if adds:
            module = AddImportsVisitor(context).transform_module(module)
        if removes:
            module = RemoveImportsVisitor(context).transform_module(module)
    return module, chosen


# --------------------------------------------------------------------------- one file
class _Dispatch(cst.CSTVisitor):
    """One traversal for every rule: calls each rule's own visit_*/leave_* methods."""

    def __init__(self, rules: Sequence[cst.CSTVisitor]) -> None:
        super().__init__()
        self.visits: Dict[str, list] = {}
        self.leaves: Dict[str, list] = {}
        for rule in rules:
            for name in dir(type(rule)):
                if not name.startswith(("visit_", "leave_")):
                    continue
                impl = getattr(type(rule), name)
                if impl is getattr(cst.CSTVisitor, name, None) or not callable(impl):
                    continue
                table = self.visits if name.startswith("visit_") else self.leaves
                table.setdefault(name.split("_", 1)[1], []).append(getattr(rule, name))

    def on_visit(self, node: cst.CSTNode) -> bool:
        for f in self.visits.get(type(node).__name__, ()):
            f(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        for f in self.leaves.get(type(original_node).__name__, ()):
            f(original_node)


def _run_rules(wrapper: MetadataWrapper, rules: Sequence[type], settings: Settings,
               comments: "_Comments") -> List[Report]:
    """Every rule, and the comment scan for suppressions, in one traversal."""
    deps = set(_Comments.METADATA_DEPENDENCIES)
    for rule_cls in rules:
        deps |= set(rule_cls.METADATA_DEPENDENCIES)
    metadata = wrapper.resolve_many(deps)
    instances = []
    for rule_cls in rules:
        rule = rule_cls(wrapper.module, settings)
        rule.metadata = metadata
        instances.append(rule)
    comments.metadata = metadata
    wrapper.module.visit(_Dispatch([comments, *instances]))
    return [rep for rule in instances for rep in rule.reports]


def _to_diagnostic(path: str, wrapper: MetadataWrapper, rep: Report) -> Diagnostic:
    r = wrapper.resolve(PositionProvider)[rep.node]
    fix = rep.fix
    return Diagnostic(
        path=path,
        line=r.start.line,
        col=r.start.column + 1,
        end_line=r.end.line,
        end_col=r.end.column + 1,
        code=rep.rule.code,
        name=rep.rule.name,
        message=rep.message,
        fix=None if fix is None else ("safe" if fix.safe else "unsafe"),
        fix_description=None if fix is None else fix.description,
    )


def check_source(
    data: bytes,
    path: str,
    rules: Sequence[type],
    settings: Settings,
    fix: Optional[str] = None,
) -> FileResult:
    """Lint (and with ``fix`` = "safe" or "unsafe", fix) one file's bytes."""
    result = FileResult(path=path)
    try:
        text = decode(data)
    except ValueError as exc:
        return error_result(path, str(exc))
    active = [r for r in rules if not r.triggers or any(t in text for t in r.triggers)]
    if not active:
        return result
    try:
        module = cst.parse_module(data)
    except cst.ParserSyntaxError as exc:
        line, col, msg = _syntax_error(text, exc)
        result.diagnostics.append(Diagnostic(path, line, col, line, col, *SYNTAX_ERROR, f"cannot parse: {msg}"))
        return result
    original_module = module
    for _ in range(MAX_PASSES):
        wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        comments = _Comments()
        reports = _run_rules(wrapper, active, settings, comments)
        if comments.skip_file:
            return result
        reports = [r for r in reports if not _suppressed(r, wrapper, comments)]
        fixes = [r.fix for r in reports if r.fix and r.fix.edits and (r.fix.safe or fix == "unsafe")]
        if not fix or not fixes:
            break
        new_module, chosen = _apply_fixes(wrapper, fixes)
        new_code = new_module.code
        if new_code == module.code:
            break
        try:
            module = cst.parse_module(new_module.bytes)
        except cst.ParserSyntaxError as exc:  # pragma: no cover - a rule bug; never write it
            raise FixError(f"{path}: a fix produced code that does not parse: {exc}") from None
        result.applied.extend(f.description for f in chosen)
    result.diagnostics = sorted((_to_diagnostic(path, wrapper, r) for r in reports), key=Diagnostic.sort_key)
    if fix:
        result.original = original_module.code
        result.fixed = module.code
        result.fixed_bytes = module.bytes
    return result


def _syntax_error(text: str, exc: cst.ParserSyntaxError):
    """Where and why: Python's own compiler says it best; libcst's message otherwise."""
    try:
        compile(text, "<ampfix>", "exec", dont_inherit=True)
    except SyntaxError as err:
        if err.lineno:
            return err.lineno, max(1, err.offset or 1), err.msg
    except (ValueError, RecursionError, MemoryError):
        pass
    return exc.raw_line, exc.raw_column + 1, str(exc).strip().splitlines()[0]


def _suppressed(rep: Report, wrapper: MetadataWrapper, comments: _Comments) -> bool:
    line = wrapper.resolve(PositionProvider)[rep.node].start.line
    if line not in comments.noqa:
        return False
    codes = comments.noqa[line]
    return codes is None or rep.rule.code in codes


# --------------------------------------------------------------------------- many files
def error_result(path: str, message: str) -> FileResult:
    """A file that could not be read, decoded or fixed: one diagnostic, nothing written."""
    return FileResult(path=path, error=message,
                      diagnostics=[Diagnostic(path, 1, 1, 1, 1, *IO_ERROR, message)])


def _work(args) -> FileResult:
    path, codes, settings, fix = args
    rules = [rules_by_code()[c] for c in codes]
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        return error_result(path, f"cannot read: {exc.strerror or exc}")
    try:
        return check_source(data, path, rules, settings, fix)
    except RecursionError:
        return error_result(path, "too deeply nested to analyse")
    except FixError as exc:
        return error_result(path, str(exc))


def check_paths(
    jobs: Iterable[Tuple[str, Sequence[str]]],
    settings: Settings,
    fix: Optional[str] = None,
    workers: Optional[int] = None,
) -> List[FileResult]:
    """Check each ``(path, rule codes)``; results come back in the order given."""
    tasks = [(p, tuple(codes), settings, fix) for p, codes in jobs]
    n = workers if workers is not None else (os.cpu_count() or 1)
    if n <= 1 or len(tasks) < PARALLEL_THRESHOLD:
        return [_work(t) for t in tasks]
    with ProcessPoolExecutor(max_workers=n) as pool:
        return list(pool.map(_work, tasks, chunksize=max(1, len(tasks) // (n * 8))))
