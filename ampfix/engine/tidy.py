"""Removing statements and imports without leaving debris, and adding the imports fixes need.

Removing the last statement of a block removes what owned the block where that is safe: an
``if`` with no ``else`` whose test has no side effects, a ``try`` whose body can no longer
fail (its handlers are dead code then).  A function, loop or ``with`` keeps a ``pass``.  No
``try: pass`` or ``if x: pass`` is ever left.

A ``try`` whose handlers bind a name that the rest of the module still reads, and that nothing
else binds, is not removed: :class:`~ampfix.model.edits.Conflict` says why.
"""
from __future__ import annotations

import ast
import re
import sys
from collections import Counter
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ampfix.engine.fit import width_of
from ampfix.model.analysis import is_log_call, torch_version_test
from ampfix.model.apex import imports_apex
from ampfix.model.edits import Builder, Conflict, Edit, apply_edits
from ampfix.model.semantic import Model, block_of, dotted, iter_statements, names_own_class, walk
from ampfix.model.source import Source, SourceError
from ampfix.rule import ImportSpec

PURE = (ast.Name, ast.Attribute, ast.Constant, ast.Compare, ast.BoolOp, ast.UnaryOp, ast.Subscript)


#: builtins whose call only looks (an ``if isinstance(x, nn.Module):`` can go with its body)
_LOOKING = frozenset({"isinstance", "issubclass", "callable", "len", "bool"})


def pure(expr) -> bool:
    """An expression with no calls but looking ones (safe to drop with the ``if`` it tests)."""
    return all(not isinstance(n, (ast.Await, ast.NamedExpr, ast.Yield, ast.YieldFrom)) and not (
        isinstance(n, ast.Call) and not (isinstance(n.func, ast.Name) and n.func.id in _LOOKING))
               for n in [expr, *walk(expr)])


def _counts_only(expr) -> bool:
    """``range(len(xs))``, ``enumerate(xs)``, ``zip(a, b)``, a name: iterating it runs no code of
    the project's (nothing is lost with a loop that does nothing)."""
    if isinstance(expr, (ast.Name, ast.Attribute, ast.Constant)):
        return True
    return isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and \
        expr.func.id in ("range", "len", "enumerate", "zip") and not expr.keywords and \
        all(_counts_only(a) for a in expr.args)


def checks_for_apex(expr) -> bool:
    """A test that only asks whether apex is installed (``is_apex_available()``,
    ``importlib.util.find_spec("apex") is not None``, ``has_apex``): the ``if`` of an apex import
    goes with it."""
    if "apex" not in ast.dump(expr).lower():
        return False
    for n in [expr, *walk(expr)]:
        if isinstance(n, ast.Call) and not (isinstance(n.func, ast.Name) and n.func.id in _LOOKING):
            name = (dotted(n.func) or "").lower()
            if "apex" in name or (name.endswith("find_spec") and any(
                    isinstance(a, ast.Constant) and a.value == "apex" for a in n.args)):
                continue
            return False
        if isinstance(n, (ast.Await, ast.NamedExpr, ast.Yield, ast.YieldFrom)):
            return False
    return True


_INVERT = {ast.Eq: "!=", ast.NotEq: "==", ast.Lt: ">=", ast.LtE: ">", ast.Gt: "<=", ast.GtE: "<",
           ast.Is: "is not", ast.IsNot: "is", ast.In: "not in", ast.NotIn: "in"}


def negate(src: Source, expr) -> str:
    """The source of ``not expr``, simply written (operands keep their text)."""
    code = src.code(expr)
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        inner = src.code(expr.operand)
        return inner if isinstance(expr.operand, (ast.Name, ast.Attribute, ast.Call, ast.Compare)) else f"({inner})"
    if isinstance(expr, ast.Compare) and len(expr.ops) == 1 and type(expr.ops[0]) in _INVERT:
        return f"{src.code(expr.left)} {_INVERT[type(expr.ops[0])]} {src.code(expr.comparators[0])}"
    if isinstance(expr, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
        return f"not {code}"
    return f"not ({code})"


def _comment_of_line(text: str, no: int, src) -> Optional[str]:
    """The comment on a line (outside strings), or None."""
    from ampfix.engine.noqa import comment_of

    return comment_of(text, False)


def names_bound(stmts: Iterable[ast.stmt]) -> Set[str]:
    out: Set[str] = set()
    for s in stmts:
        for n in [s, *walk(s)]:
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                out.add(n.id)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(n.name)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                out.update((a.asname or a.name).split(".")[0] for a in n.names if a.name != "*")
    return out


def _speaks_of_apex(text: str) -> bool:
    """A comment that names apex or its ``amp`` (``# save amp state dict``)."""
    low = text.lower()
    return "apex" in low or re.search(r"\bamp\b", low) is not None


def speaks_of_mixed_precision(text: str) -> bool:
    """A comment about half precision (``# fp16 execution of torch.einsum``): right above an apex
    statement that goes, it described that statement."""
    low = text.lower()
    return _speaks_of_apex(text) or re.search(r"\bO[0-3]\b", text) is not None or re.search(
        r"\bfp16\b|float16|half[- ]precision|mixed[- ]precision|opt_level|loss[-_ ]scal", low) is not None


def comments_above(src: Source, line: int) -> Optional[int]:
    """The first of the comment lines right above ``line`` (None when there are none)."""
    no, first = line - 1, None
    while no >= 1 and src.line_text(no).strip().startswith("#"):
        first, no = no, no - 1
    return first


def apex_comment_above(src: Source, line: int, of_import: bool = False, described: bool = False) -> Optional[int]:
    """The first of the comment lines right above ``line`` when together they speak of apex (or,
    ``of_import``, above a removed apex import: of importing or installing it, ``# online import
    to avoid installing if not used``; or, ``described``, above an apex statement that goes: of
    half precision)."""
    first = comments_above(src, line)
    if first is None:
        return None
    text = " ".join(src.line_text(n) for n in range(first, line))
    speaks = speaks_of_mixed_precision(text) if described else _speaks_of_apex(text)
    if not (speaks or (of_import and re.search(r"\bimport|\binstall", text.lower()))):
        return None
    return first


class Remover:
    """Plans the removal of statements of one module, cascading to blocks left empty."""

    def __init__(self, src: Source, model: Model, builder: Optional[Builder] = None) -> None:
        self.src = src
        self.sem = model
        self.b = builder or Builder(src)
        self.gone: Dict[int, ast.stmt] = {}  # id -> statement removed (with what it contains)
        #: ids of ``if`` statements whose test something written before them evaluates now (the
        #: GradScaler's ``enabled=``): emptied, they go whatever the test calls
        self.tests_moved: Set[int] = set()

    def removed(self, node) -> bool:
        """Whether ``node`` lies in a statement already planned for removal."""
        n = node
        while n is not None:
            if id(n) in self.gone:
                return True
            n = getattr(n, "_p", None)
        return False

    def remove(self, stmts: Sequence[ast.stmt], filled: Set[tuple] = frozenset(),
               described: Set[int] = frozenset(), obsolete: Set[int] = frozenset(),
               replaced: Set[int] = frozenset()) -> List[Edit]:
        """Edits removing ``stmts``; ``filled`` names the blocks (``(id(owner), field)``) that
        receive new statements: they are not empty, whatever goes from them.  ``described``: ids
        of apex statements whose comment lines right above, when they speak of apex, go with them.
        ``replaced``: offsets of line starts where new statements go; a statement that starts
        there keeps the comment above it (it describes what takes the statement's place: the
        GradScaler made where `if args.amp: <initialize>` was)."""
        edits: List[Edit] = []
        for s in stmts:
            self.gone[id(s)] = s
        # the topmost statements removed; blocks left empty take their owner along
        changed = True
        while changed:
            changed = False
            for s in list(self.gone.values()):
                owner, field, block = block_of(s)
                if owner is None or isinstance(owner, ast.Module) or id(owner) in self.gone:
                    continue
                if (all(id(x) in self.gone for x in block) and (id(owner), field) not in filled
                        and self._owner_goes(owner, field)):
                    self.gone[id(owner)] = owner
                    changed = True
        tops = [s for s in self.gone.values() if not self._inside_gone(s)]
        # a block that goes because the described statements in it went is described too
        described = set(described) | {id(s) for s in tops if any(id(x) in described for x in walk(s))}
        described -= {id(s) for s in tops if self.src.starts[self.b.first_line(s) - 1] in replaced}
        edits.extend(self._carry_comments([s for s in tops if id(s) not in obsolete]))
        blocks: Dict[tuple, List[ast.stmt]] = {}
        for s in tops:
            owner, field, block = block_of(s)
            blocks.setdefault((id(owner), field), []).append(s)
        for (_, field), removed in blocks.items():
            owner, _, block = block_of(removed[0])
            removed.sort(key=lambda s: (s.lineno, s.col_offset))
            if field in ("orelse", "finalbody") and len(removed) == len(block) and owner is not None:
                edits.append(self._clause(owner, block, "else" if field == "orelse" else "finally"))
                continue
            if (isinstance(owner, ast.If) and field == "body" and len(removed) == len(block) and owner.orelse
                    and not self._is_elif(owner.orelse)):
                # `if c: <gone> else: <kept>` -> `if not c: <kept>`
                edits.append(self._invert(owner))
                continue
            if (owner is not None and not isinstance(owner, ast.Module) and len(removed) == len(block)
                    and (id(owner), field) not in filled):
                # an emptied block that must stay: one `pass` in place of its first statement
                edits.append(self.b.replace_statement(removed[0], ["pass"]))
                removed = removed[1:]
            covered = 0  # the last line that an edit for the head of a block already removes
            for i, s in enumerate(removed):
                if s.end_lineno <= covered:
                    continue
                above = None
                if self._import_like(s):
                    above = self._apex_comment_above(s)
                elif id(s) in described:
                    above = self._apex_comment_above(s, under_code=True)
                elif id(s) in obsolete:
                    above = comments_above(self.src, self.b.first_line(s))
                # a run of removed statements, one right after another: the line after the
                # whole run decides whether the blank lines above its first one go
                run_end = None
                if i == 0 or removed[i - 1].end_lineno + 1 != self.b.first_line(s):
                    j = i
                    while j + 1 < len(removed) and removed[j].end_lineno + 1 == self.b.first_line(removed[j + 1]):
                        j += 1
                    run_end = removed[j].end_lineno
                # (under `def ...:`, `try:`, `if ...:`: a block does not start with a blank line)
                heads = (run_end is not None and block[0] is s and owner is not None
                         and not isinstance(owner, ast.Module) and removed[j] is not block[-1]
                         and (above is None or self._right_under_header(above)))
                edits.append(self.b.remove_statement(s, above, run_end, heads))
                if heads:
                    covered = run_end  # that edit removes the whole run and the blank lines after it
        return _merged_deletions(edits, self.src.text)

    def _right_under_header(self, line: int) -> bool:
        """The comment that starts at ``line`` opens its block (the line above is the header,
        ``if self.is_fp16:``): removed with the statement under it, the block's blank lines after
        them go too, as where no comment was."""
        if line <= 1:
            return False
        above = self.src.line_text(line - 1).strip()
        return bool(above) and not above.startswith("#") and above.endswith(":")

    def _apex_comment_above(self, s, under_code: bool = False) -> Optional[int]:
        """The first of the comment lines right above a removed apex import when they speak of
        apex (``# use apex for mixed precision``): they described what went, and go with it.
        ``under_code``: also where code comes right before them (above an apex statement, not an
        import, a comment speaks of what follows it)."""
        # a block of them (`if args.fp16: try: import apex ...`) is apex's setup: a comment on half
        # precision right above it described it
        first = apex_comment_above(self.src, self.b.first_line(s), of_import=not under_code and self._import_like(s),
                                   described=under_code or isinstance(s, (ast.If, ast.Try)))
        if first is None or under_code:
            return first
        before = self.src.line_text(first - 1).rstrip() if first > 1 else ""
        # right under the code before it, a comment may speak of that code: not when it is an import
        if before.strip() and not before.endswith((":", '"""', "'''")) and \
                not before.lstrip().startswith(("import ", "from ")):
            return None  # (under a docstring, a comment is no description of the code before it)
        return first

    def _is_elif(self, orelse) -> bool:
        first = orelse[0]
        return len(orelse) == 1 and isinstance(first, ast.If) and \
            self.src.line_text(first.lineno).lstrip().startswith("elif")

    def _invert(self, node: ast.If) -> Edit:
        """``if c:`` + a body that goes + ``else:`` -> ``if not c:`` over the else body."""
        src = self.src
        first = node.orelse[0]
        else_line = None
        for no in range(self.b.first_line(first) - 1, node.lineno, -1):
            t = src.line_text(no).lstrip()
            if t.startswith("else") and t[4:].lstrip().startswith(":"):
                else_line = no
                break
        if else_line is None or src.line_text(else_line).strip().split("#")[0].strip() != "else:":
            raise Conflict(f"line {node.lineno}: cannot find its `else:`")
        indent = self.b.indent(node)
        # an `elif` stays one: `if a: ... elif b: <gone> else: <kept>` -> `elif not b: <kept>`
        kw = "elif" if src.line_text(node.lineno).lstrip().startswith("elif") else "if"
        return Edit(src.starts[node.lineno - 1], src.line_end(else_line),
                    f"{indent}{kw} {negate(src, node.test)}:{self.b.nl}")

    def _carry_comments(self, tops) -> List[Edit]:
        """Comments inside removed statements move above the next statement that stays (so
        nothing a person wrote is lost), except those of a removed import, which described it,
        and those that speak of half precision or loss scaling (``# If args.dynamic_loss_scale is
        False, static_loss_scale will be used.`` inside the FP16_Optimizer block that goes): they
        described the apex code that went, and would be stale above the code that stays."""
        edits: List[Edit] = []
        src = self.src
        for s in sorted(tops, key=lambda s: (s.lineno, s.col_offset)):
            if self._import_like(s):
                continue
            lines = []
            for no in range(self.b.first_line(s), s.end_lineno + 1):
                text = src.line_text(no)
                c = _comment_of_line(text, no, src)
                if c and c.strip("#").strip():  # a bare `#` says nothing: it goes with its line
                    lines.append(c)
            if lines and all(speaks_of_mixed_precision(c) for c in lines):
                continue
            if not lines:
                continue
            nxt = self._next_kept(s)
            if nxt is None:
                raise Conflict(f"a comment in line {s.lineno} would be lost with the statement")
            at = src.starts[self.b.first_line(nxt) - 1]
            ind = self.b.indent(nxt)
            edits.append(Edit(at, at, "".join(f"{ind}{c}{self.b.nl}" for c in lines)))
        return edits

    def _next_kept(self, s):
        cur = s
        while cur is not None:
            owner, field, block = block_of(cur)
            idx = next((i for i, x in enumerate(block) if x is cur), None)
            if idx is None:
                return None
            for x in block[idx + 1:]:
                if id(x) not in self.gone:
                    return x
            if owner is None or isinstance(owner, ast.Module) or id(owner) not in self.gone:
                return None
            cur = owner
        return None

    def _import_like(self, s) -> bool:
        """An import, or a block (``try:`` / ``if x:``) of imports and the flags they set."""
        if isinstance(s, (ast.Import, ast.ImportFrom)):
            return True
        if isinstance(s, (ast.Try, ast.If)):
            inner = [x for x in iter_statements(s.body)] + [x for h in getattr(s, "handlers", ()) for x in h.body]
            has_import = any(isinstance(x, (ast.Import, ast.ImportFrom)) for x in inner)
            # (`if args.fp16: try: import apex ... except ImportError: raise ...` nests one in the other)
            return has_import and all(isinstance(x, (ast.Import, ast.ImportFrom, ast.Assign, ast.Pass, ast.Raise, ast.Expr,
                                                     ast.Try, ast.If)) for x in inner)
        return False

    def _clause(self, owner, block, keyword: str) -> Edit:
        """Remove an ``else:`` / ``elif ...:`` / ``finally:`` clause whose statements all go."""
        src = self.src
        first = block[0]
        if keyword == "else" and isinstance(owner, ast.If) and isinstance(first, ast.If) and \
                src.line_text(first.lineno).lstrip().startswith("elif"):
            start_line = first.lineno
        else:
            start_line = None
            for no in range(self.b.first_line(first) - 1, 0, -1):
                t = src.line_text(no).lstrip()
                if t.startswith(keyword) and t[len(keyword):].lstrip().startswith(":"):
                    start_line = no
                    break
            if start_line is None:
                raise Conflict(f"cannot find the `{keyword}:` above line {first.lineno}")
        if not self.b.own_lines(block[-1]):
            raise Conflict(f"line {block[-1].lineno} holds more than one statement")
        return Edit(src.starts[start_line - 1], src.line_end(block[-1].end_lineno), "")

    def _inside_gone(self, s) -> bool:
        p = getattr(s, "_p", None)
        while p is not None:
            if id(p) in self.gone:
                return True
            p = getattr(p, "_p", None)
        return False

    def _owner_goes(self, owner, field: str) -> bool:
        if isinstance(owner, ast.If):
            if not pure(owner.test) and not checks_for_apex(owner.test) and torch_version_test(owner.test) is None \
                    and id(owner) not in self.tests_moved:
                return False
            # `if t: <gone> else: <gone>` goes whole (each branch emptied by the same migration)
            other = owner.orelse if field == "body" else owner.body
            return not other or all(id(x) in self.gone for x in other)
        if isinstance(owner, ast.Try) or type(owner).__name__ == "TryStar":
            if field != "body" or owner.orelse or owner.finalbody:
                return False
            self._check_handlers(owner)
            return True
        if isinstance(owner, ast.For) and field == "body" and not owner.orelse:
            # `for i in range(len(models)):` whose body went (sentence-transformers' loop that
            # initialized apex once per objective): counting does nothing, when the loop's
            # names are read nowhere else
            return _counts_only(owner.iter) and not self._read_outside(owner)
        return False

    def _read_outside(self, loop: ast.For) -> bool:
        names = {n.id for n in [loop.target, *walk(loop.target)] if isinstance(n, ast.Name)}
        if not isinstance(loop.target, (ast.Name, ast.Tuple)) or not names:
            return True
        inside = {id(n) for n in walk(loop, into_functions=True)}
        scope = loop
        while scope is not None and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            scope = getattr(scope, "_p", None)
        if scope is None:
            return True
        # a read inside another loop (or comprehension) that binds the name again reads its value
        rebound: Set[int] = set()
        for other in walk(scope, into_functions=True):
            if other is loop or not isinstance(other, (ast.For, ast.AsyncFor, ast.comprehension)):
                continue
            if names & {t.id for t in [other.target, *walk(other.target)] if isinstance(t, ast.Name)}:
                where = [getattr(other, "_p", None)] if isinstance(other, ast.comprehension) else \
                    [*other.body, *other.orelse]
                rebound |= {id(n) for x in where if x is not None for n in [x, *walk(x, into_functions=True)]}
        return any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in names
                   and id(n) not in inside and id(n) not in rebound for n in walk(scope, into_functions=True))

    def _check_handlers(self, t) -> None:
        """The handlers of a try that goes are dead code: what they bind must not be read
        elsewhere with no other binding."""
        bound = names_bound(h_s for h in t.handlers for h_s in h.body) | {h.name for h in t.handlers if h.name}
        if not bound:
            return
        inside = {id(n) for n in walk(t, into_functions=True)}
        elsewhere_bound = set()
        for n in walk(self.sem.tree, into_functions=True):
            if id(n) in inside or self.removed(n):
                continue
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                elsewhere_bound.add(n.id)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                elsewhere_bound.add(n.name)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                elsewhere_bound |= names_bound([n])
        for n in walk(self.sem.tree, into_functions=True):
            if (isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in bound
                    and n.id not in elsewhere_bound and id(n) not in inside and not self.removed(n)):
                raise Conflict(f"the `except` at line {t.handlers[0].lineno} sets `{n.id}`, which line {n.lineno} "
                               f"still reads; it would be left undefined")


# ------------------------------------------------------------------------------ imports
def _merged_deletions(edits: List[Edit], text: str) -> List[Edit]:
    """Removals that overlap or touch become one (the first import of a file takes the blank
    lines after it, the next statement removed the blank lines above it: the same lines); one
    that starts the file takes the blank lines after it too (no file starts with a blank line)."""
    plain = sorted((e for e in edits if not e.text and not e.region and e.start < e.end), key=lambda e: e.start)
    others = [e for e in edits if e.text or e.region or e.start >= e.end]
    out: List[Edit] = []
    for e in plain:
        if out and e.start <= out[-1].end:
            last = out.pop()
            e = Edit(last.start, max(last.end, e.end), "")
        out.append(e)
    if out and out[0].start == 0:
        end = out[0].end
        while end < len(text):
            nl = text.find("\n", end)
            if nl < 0 or text[end:nl].strip():
                break
            end = nl + 1
        if end != out[0].end and not any(e.start < end and e is not out[0] for e in out + others):
            out[0] = Edit(0, end, "")
    return others + out


def _alias_matches(stmt, alias, spec) -> bool:
    if isinstance(stmt, ast.Import):
        return spec.obj is None and alias.name == spec.module and (alias.asname or None) == spec.asname
    if "." * stmt.level + (stmt.module or "") != spec.module:  # (`.file_utils` for a relative import)
        return False
    return alias.name == spec.obj and (alias.asname or None) == spec.asname


def used_names(model: Model, exclude: Set[int] = frozenset()) -> Dict[str, List[ast.Name]]:
    out: Dict[str, List[ast.Name]] = {}
    for n in walk(model.tree, into_functions=True):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store) and id(n) not in exclude and \
                not names_own_class(n):
            out.setdefault(n.id, []).append(n)
    return out


def removal_of_unused(src: Source, model: Model, specs: Iterable, builder: Optional[Builder] = None,
                      remover: Optional[Remover] = None) -> List[Edit]:
    """Edits removing the imports ``specs`` that the module no longer reads.  A read in the test
    of an ``if`` that goes with them (``if is_apex_available(): from apex import amp``, ``if
    version.parse(torch.__version__) >= ...: from torch.cuda.amp import autocast``) is no read:
    the names only such tests read go too (:func:`_read_only_by_tests_that_go`)."""
    specs = list(dict.fromkeys(specs))
    if not specs:
        return []
    b = builder or Builder(src)
    remover = remover or Remover(src, model, b)
    uses = used_names(model)
    whole, partial = _unused_imports(model, specs, uses, lambda n: False)
    if whole:
        trial = Remover(src, model, Builder(src))
        trial.remove(list(whole))
        if any(isinstance(s, ast.If) for s in trial.gone.values()):
            whole, partial = _unused_imports(model, specs, uses, trial.removed)
            whole += _read_only_by_tests_that_go(model, whole, uses, trial)
    edits = [b.replace(stmt, _import_text(stmt, keep, src)) for stmt, keep in partial]
    whole = whole + _nones_of_gone_imports(model, whole, partial, uses)
    whole = whole + _apex_reports_of_gone_imports(model, whole)
    return edits + remover.remove(whole) if whole else edits


def _apex_reports_of_gone_imports(model: Model, whole) -> List[ast.stmt]:
    """``try: from apex import amp; logger.info(f"apex enabled on {rank}"); ...``: where apex's
    imports go (all of them: where one stays, apex is still set up there), a log line or print
    beside them that speaks of apex (it reported apex's setup) goes too, when the block keeps
    other statements."""
    gone = {id(x) for x in whole}
    out: List[ast.stmt] = []
    for t in walk(model.tree, into_functions=True):
        if not isinstance(t, ast.Try):
            continue
        imports = [x for x in t.body if imports_apex(x)]
        if not imports or any(id(x) not in gone for x in imports):
            continue
        said = [x for x in t.body if id(x) not in gone and reports_apex(x)]
        if said and any(id(x) not in gone and x not in said for x in t.body):
            out.extend(said)
    return out


def reports_apex(x) -> bool:
    """A print or a log call whose message speaks of apex."""
    return is_log_call(x) and any(isinstance(n, ast.Constant) and isinstance(n.value, str)
                                  and "apex" in n.value.lower() for a in x.value.args for n in ast.walk(a))


def _nones_of_gone_imports(model: Model, whole, partial, uses) -> List[ast.stmt]:
    """``try: from apex import amp; from apex.parallel import DDP / except ImportError: amp = None``
    where only ``amp``'s import goes: the handler's ``amp = None`` goes with it when nothing reads
    ``amp`` any more (a try that loses all its imports is :func:`dead_import_guards`' to unwrap)."""
    gone: Dict[int, Set[str]] = {}
    for stmt in whole:
        gone.setdefault(id(getattr(stmt, "_p", None)), set()).update(
            (a.asname or a.name).split(".")[0] for a in stmt.names)
    for stmt, keep in partial:
        kept = {(a.asname or a.name).split(".")[0] for a in keep}
        gone.setdefault(id(getattr(stmt, "_p", None)), set()).update(
            (a.asname or a.name).split(".")[0] for a in stmt.names if (a.asname or a.name).split(".")[0] not in kept)
    out = []
    for t in walk(model.tree, into_functions=True):
        if not isinstance(t, ast.Try) or id(t) not in gone:
            continue
        if not any(isinstance(x, (ast.Import, ast.ImportFrom)) and x not in whole for x in t.body):
            continue  # the whole guard goes: dead_import_guards unwraps it
        names = gone[id(t)] - names_bound(x for x in t.body if x not in whole)
        for h in t.handlers:
            for x in h.body:
                if isinstance(x, ast.Assign) and len(x.targets) == 1 and isinstance(x.targets[0], ast.Name) and \
                        x.targets[0].id in names and isinstance(x.value, ast.Constant) and x.value.value is None \
                        and not uses.get(x.targets[0].id):
                    out.append(x)
    return out


def _unused_imports(model: Model, specs, uses, gone) -> Tuple[List[ast.stmt], List[tuple]]:
    """(import statements that go whole, (statement, the aliases it keeps) for the others that
    lose some): the aliases of ``specs`` with no read left outside what ``gone`` says goes."""
    whole: List[ast.stmt] = []
    partial: List[tuple] = []
    for stmt in model.imports:
        keep, drop = [], []
        for alias in stmt.names:
            bound = (alias.asname or alias.name).split(".")[0]
            spec = next((sp for sp in specs if _alias_matches(stmt, alias, sp)), None)
            live = {bound: [n for n in uses.get(bound, ()) if not gone(n)]}
            if spec is not None and not _read_through(model, stmt, bound, live):
                drop.append(alias)
            else:
                keep.append(alias)
        if not drop:
            continue
        if not keep:
            whole.append(stmt)
        else:
            partial.append((stmt, keep))
    return whole, partial


def _read_only_by_tests_that_go(model: Model, whole: List[ast.stmt], uses, trial: "Remover") -> List[ast.stmt]:
    """``from packaging import version`` read only by ``if version.parse(torch.__version__) >=
    ...:`` whose body (an ``autocast`` import) goes: the ``if`` goes with it (a query), and so
    does the import (whole import statements, at module level, binding only such names)."""
    tests = [s.test for s in trial.gone.values() if isinstance(s, ast.If) and not trial._inside_gone(s)]
    names = {n.id for t in tests for n in [t, *walk(t)] if isinstance(n, ast.Name)}
    out = []
    for stmt in model.imports:
        if stmt in whole or not isinstance(getattr(stmt, "_p", None), ast.Module):
            continue
        bound = {(a.asname or a.name).split(".")[0] for a in stmt.names}
        if not bound <= names:
            continue
        if all(trial.removed(n) for b in bound for n in uses.get(b, [])):
            out.append(stmt)
    return out


def _read_through(model: Model, stmt, bound: str, uses) -> bool:
    """Whether a read of ``bound`` resolves to the binding this import statement makes."""
    for n in uses.get(bound, ()):
        for b in model.bindings_of(n):
            if b.node is stmt:
                return True
    return False


def _import_text(stmt, aliases, src: Optional[Source] = None) -> str:
    """The import statement with only ``aliases``; one laid out an alias a line in parentheses
    keeps that layout, less the lines of the aliases that go."""
    names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in aliases)
    if src is not None and isinstance(stmt, ast.ImportFrom) and stmt.end_lineno > stmt.lineno:
        rows = [a.lineno for a in stmt.names]
        first, last = src.line_text(stmt.lineno), src.line_text(stmt.end_lineno)
        if len(set(rows)) == len(rows) and first.rstrip().endswith("(") and last.strip() == ")" and \
                stmt.lineno not in rows and stmt.end_lineno not in rows:
            kept = {a.lineno for a in aliases}
            body = [src.line_text(no) for no in range(stmt.lineno + 1, stmt.end_lineno) if no not in rows or no in kept]
            return src.newline().join([first.lstrip(), *body, last])
    if isinstance(stmt, ast.Import):
        return f"import {names}"
    return f"from {'.' * stmt.level}{stmt.module or ''} import {names}"


def addition_of(src: Source, model: Model, specs: Iterable, builder: Optional[Builder] = None,
                gap: Optional[int] = None) -> List[Edit]:
    """Edits adding ``import X`` / ``from X import Y`` where the module lacks them: after the
    imports at the top of the module (after its docstring and ``__future__`` imports), with a
    blank line before the code that follows (two before a function or class, PEP 8). ``gap``: the
    blank lines the file had after imports that went (the new import takes their place and keeps them)."""
    b = builder or Builder(src)
    tree = model.tree
    need = []
    for spec in dict.fromkeys(specs):
        bound = spec.asname or (spec.obj if spec.obj else spec.module.split(".")[0])
        q = f"{spec.module}.{spec.obj}" if spec.obj else (spec.module if spec.asname else spec.module.split(".")[0])
        have = model.module_scope.bindings.get(bound, [])
        if any(bd.kind == "import" and bd.qname == q and isinstance(bd.node._p, ast.Module) for bd in have):
            continue
        need.append(spec)
    if not need:
        return []
    lines = []
    for spec in need:
        if spec.obj is None:
            lines.append(f"import {spec.module}" + (f" as {spec.asname}" if spec.asname else ""))
        else:
            lines.append(f"from {spec.module} import {spec.obj}" + (f" as {spec.asname}" if spec.asname else ""))
    body = tree.body
    first_import, i, last = _import_block(body)
    nl = b.nl
    placed = _sorted_placement(src, body[first_import:i], need, nl)
    if placed is not None:
        return placed
    text = "".join(line + nl for line in lines)
    if last is not None:
        at = src.line_end(last.end_lineno)
        if at == len(src.text) and not src.text.endswith(("\n", "\r")):
            text = nl + text
    elif i == 1:  # after the docstring
        at = src.line_end(body[0].end_lineno)
    else:
        at = 0
        # keep a shebang and an encoding declaration first
        for no in (1, 2):
            if no <= src.line_count and src.line_text(no).startswith("#") and (
                    no == 1 and src.line_text(1).startswith("#!") or "coding" in src.line_text(no)):
                at = src.line_end(no)
    following = src.text[at:]
    nxt = following.lstrip(" \t")
    if following and not following.startswith(("\n", "\r")) and i < len(body) and not (
            at == src.starts[body[i].lineno - 1] and isinstance(body[i], (ast.Import, ast.ImportFrom))):
        # PEP 8: two blank lines between the imports and a top-level function or class, unless the
        # import takes the place of ones that went: then the file's own spacing stays
        if last is None and gap:
            text += nl * gap
        else:
            text += nl * (2 if last is None and isinstance(body[i], (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                       ast.ClassDef)) else 1)
    elif last is None and i == 1 and nxt and not following.startswith(("\n", "\r")):
        text += nl
    return [Edit(at, at, text)]


def _section(module: str, level: int = 0) -> int:
    """isort's sections: the standard library, then third-party (and first-party), then relative."""
    if level:
        return 2
    return 0 if module.split(".")[0] in sys.stdlib_module_names else 1


def _sort_key(stmt) -> Tuple[int, bool, str]:
    if isinstance(stmt, ast.Import):
        return _section(stmt.names[0].name), False, stmt.names[0].name.lower()
    return _section(stmt.module or "", stmt.level), True, (stmt.module or "").lower()


def _sorted_placement(src: Source, imports, need, nl: str) -> Optional[List[Edit]]:
    """Each added import where isort would put it among the top imports (its section, straight
    imports before ``from`` imports, by name); None where the block has no place to tell by
    (``__future__`` imports, or none of the added import's section nor a neighbouring one)."""
    if not imports or any(isinstance(x, ast.ImportFrom) and x.module == "__future__" for x in imports):
        return None
    at: Dict[int, List[Tuple[Tuple[int, bool, str], str]]] = {}
    for spec in need:
        key = (_section(spec.module), spec.obj is not None, spec.module.lower())
        text = (f"import {spec.module}" if spec.obj is None else f"from {spec.module} import {spec.obj}") + (
            f" as {spec.asname}" if spec.asname else "")
        same = [x for x in imports if _sort_key(x)[0] == key[0]]
        later = next((x for x in same if _sort_key(x) > key), None)
        if later is not None:
            pos, line = src.starts[later.lineno - 1], text + nl
        elif same:
            pos, line = src.line_end(same[-1].end_lineno), text + nl
        else:
            nxt = next((x for x in imports if _sort_key(x)[0] > key[0]), None)
            prev = [x for x in imports if _sort_key(x)[0] < key[0]]
            if nxt is not None and not prev:
                pos, line = src.starts[nxt.lineno - 1], text + nl + nl
            elif prev and nxt is None:
                pos, line = src.line_end(prev[-1].end_lineno), nl + text + nl
            else:
                return None
        if pos == len(src.text) and not src.text.endswith(("\n", "\r")):
            line = nl + line
        at.setdefault(pos, []).append((key, line))
    return [Edit(pos, pos, "".join(line for _, line in sorted(items))) for pos, items in sorted(at.items())]


_IMPORT_ERRORS = ("ImportError", "ModuleNotFoundError")


def dead_import_guards(src: Source, model: Model, builder: Builder,
                       unwrapped: Optional[List[ast.Try]] = None) -> List[Edit]:
    """``try: <no import any more> except ImportError: ...``: the handlers can no longer run; the
    try becomes its body, when the names the handlers bind are also bound by the body (or no
    longer read).  The trys that go are added to ``unwrapped``."""
    edits = []
    uses = used_names(model)
    for t in walk(model.tree, into_functions=True):
        if not isinstance(t, ast.Try) or t.orelse or t.finalbody or not t.handlers:
            continue
        # a body of constant assignments cannot raise at all: any handler is dead
        cannot_raise = all(isinstance(x, ast.Pass) or _extends_path(x) or (
            isinstance(x, ast.Assign) and isinstance(x.value, ast.Constant)
            and all(isinstance(y, ast.Name) for y in x.targets)) for x in t.body)
        if not cannot_raise and not all(
                h.type is not None and all(_name_of(x) in _IMPORT_ERRORS for x in
                                           (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]))
                for h in t.handlers):
            continue
        if any(isinstance(n, (ast.Import, ast.ImportFrom)) or (isinstance(n, ast.Call) and "import" in (
                _name_of(n.func) or "")) for s in t.body for n in [s, *walk(s)]):
            continue
        in_body = names_bound(t.body)
        only_handlers = names_bound(x for h in t.handlers for x in h.body) - in_body
        inside = {id(n) for n in walk(t, into_functions=True)}
        if any(n.id in only_handlers and id(n) not in inside for name in only_handlers for n in uses.get(name, [])):
            continue
        # `sys.path.append("./apex")` at the ends of the body only served the import that went
        body = list(t.body)
        while body and _extends_path(body[0], "apex"):
            body.pop(0)
        while body and _extends_path(body[-1], "apex"):
            body.pop()
        try:
            edits.extend([builder.unwrap(t, body)] if body else Remover(src, model, builder).remove([t]))
        except Conflict:
            continue
        if unwrapped is not None:
            unwrapped.append(t)
    return edits


def _extends_path(stmt, naming: Optional[str] = None) -> bool:
    """``sys.path.append("./apex")``, ``sys.path.insert(0, "..")``: a list grows by a constant, which
    cannot raise; ``naming``: a path that names it (``"apex"``)."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return False
    call = stmt.value
    name = dotted(call.func)
    if call.keywords or not all(isinstance(a, ast.Constant) for a in call.args):
        return False
    if naming is not None and not (isinstance(call.args[-1].value, str) and naming in call.args[-1].value.lower()):
        return False
    return (name == "sys.path.append" and len(call.args) == 1) or (name == "sys.path.insert" and len(call.args) == 2)


def guard_flags(tree) -> Set[str]:
    """The flags of the module's guarded apex imports (:func:`true_flags`, :func:`constant_flags`)."""
    trys = [t for t in walk(tree, into_functions=True)
            if isinstance(t, ast.Try) and any(imports_apex(x) for x in t.body)]
    return constant_flags(tree, trys, set().union(*(true_flags(t) for t in trys)))


def now_true(tree, flags: Set[str]) -> Set[str]:
    """Those of ``flags`` that every binding left in the module sets to True: their guard went
    whole (``has_apex = True`` before ``try: from apex import amp / except ImportError: has_apex
    = False``, the try removed)."""
    out = set(flags)
    for n in walk(tree, into_functions=True):
        if isinstance(n, ast.Name) and n.id in out and isinstance(n.ctx, (ast.Store, ast.Del)):
            a = getattr(n, "_p", None)
            if not (isinstance(a, ast.Assign) and len(a.targets) == 1 and a.targets[0] is n
                    and is_true(a.value)):
                out.discard(n.id)
    return out


def is_true(v) -> bool:
    return isinstance(v, ast.Constant) and v.value is True


def true_flags(t: ast.Try) -> Set[str]:
    """``try: from apex import amp; HAS_AMP = True / except ImportError: HAS_AMP = False``: the
    names the body sets to True and every handler to False (or None).  ``HAS_AMP = True`` right
    before the try, which the body does not set again, is the body's too."""
    def consts(stmts, ok) -> Set[str]:
        return {x.targets[0].id for x in stmts if isinstance(x, ast.Assign) and len(x.targets) == 1
                and isinstance(x.targets[0], ast.Name) and isinstance(x.value, ast.Constant) and x.value.value in ok}
    names = consts(t.body, (True,))
    owner, _, block = block_of(t)
    i = next((k for k, x in enumerate(block) if x is t), 0)
    before = block[i - 1:i] if owner is not None and i > 0 else []
    names |= consts(before, (True,)) - names_bound(t.body)
    # `have_apex = False` right before the try, `have_apex = True` in its body and a handler that
    # only reports: the handler's path leaves the False that was set before
    preset = consts(before, (False, None))
    for h in t.handlers:
        names = {n for n in names if n in consts(h.body, (False, None)) or
                 (n in preset and n not in names_bound(h.body))}
    return names


def constant_flags(tree, trys: Sequence[ast.Try], flags: Set[str]) -> Set[str]:
    """Those of ``flags`` (:func:`true_flags` of ``trys``, the guards that go) that nothing binds
    but those trys and the statements right before them: a flag the code turns off elsewhere
    (``mixed_precision = False`` on a CPU) is a switch, not a constant."""
    mine: Set[int] = set()
    for t in trys:
        owner, _, block = block_of(t)
        i = next((k for k, x in enumerate(block) if x is t), 0)
        mine |= {id(n) for s in ([t] + ([block[i - 1]] if i > 0 else [])) for n in [s, *walk(s, into_functions=True)]}
    out = set(flags)
    for n in walk(tree, into_functions=True):
        if id(n) not in mine and isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.discard(n.id)
    return out


def _truth(test, flags: Set[str]) -> Optional[bool]:
    """The value of an ``if`` test where every name of ``flags`` is True: True, False, or None
    when it depends on more (or has side effects that would be lost)."""
    if isinstance(test, ast.Name) and test.id in flags:
        return True
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Name) and \
            test.left.id in flags and isinstance(test.ops[0], (ast.Is, ast.IsNot, ast.Eq, ast.NotEq)) and \
            isinstance(test.comparators[0], ast.Constant) and isinstance(test.comparators[0].value, bool):
        # `HAS_AMP is False`, `HAS_AMP == True`
        same = test.comparators[0].value is True
        return same if isinstance(test.ops[0], (ast.Is, ast.Eq)) else not same
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "bool" and \
            len(test.args) == 1 and not test.keywords:
        return _truth(test.args[0], flags)  # `bool(has_apex)`
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        v = _truth(test.operand, flags)
        return None if v is None else not v
    if isinstance(test, ast.BoolOp):
        vals = [_truth(v, flags) for v in test.values]
        # a side effect before the decisive operand would be lost
        if isinstance(test.op, ast.And) and False in vals:
            i = vals.index(False)
            return False if all(pure(v) for v in test.values[:i]) else None
        if isinstance(test.op, ast.Or) and True in vals:
            i = vals.index(True)
            return True if all(pure(v) for v in test.values[:i]) else None
    return None


def _always_holds(test, flags: Set[str]) -> bool:
    """Whether ``test`` is truthy whatever its other operands are, once every name of ``flags``
    is True: ``not fp16 or fp16 and APEX_AVAILABLE`` is.  Its operands other than ``and``, ``or``,
    ``not`` and the flags are names or attributes (reading one twice gives one value), at most
    four different ones: every way they can be truthy or not is tried."""
    atoms: Dict[str, int] = {}

    def collect(n) -> bool:
        if isinstance(n, ast.BoolOp):
            return all(collect(v) for v in n.values)
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
            return collect(n.operand)
        if isinstance(n, ast.Name) and n.id in flags:
            return True
        if isinstance(n, ast.Constant):
            return True
        if isinstance(n, (ast.Name, ast.Attribute)) and all(isinstance(x, (ast.Name, ast.Attribute, ast.Load))
                                                              for x in walk(n)):
            atoms.setdefault(ast.dump(n), len(atoms))
            return True
        return False

    if not collect(test) or len(atoms) > 4:
        return False

    def value(n, bits: int) -> bool:
        if isinstance(n, ast.BoolOp):
            vals = (value(v, bits) for v in n.values)
            return all(vals) if isinstance(n.op, ast.And) else any(vals)
        if isinstance(n, ast.UnaryOp):
            return not value(n.operand, bits)
        if isinstance(n, ast.Name) and n.id in flags:
            return True
        if isinstance(n, ast.Constant):
            return bool(n.value)
        return bool(bits >> atoms[ast.dump(n)] & 1)

    return all(value(test, bits) for bits in range(1 << len(atoms)))


def fold_flags(src: Source, model: Model, builder: Builder, flags: Set[str], taken: List[ast.AST]) -> List[Edit]:
    """Tests of availability flags that are constant now (``HAS_AMP = True`` once apex went):
    ``if use_amp and not HAS_AMP: raise ...`` goes, ``if HAS_AMP: <a> else: <b>`` becomes
    ``<a>``; ``if use_amp and HAS_AMP:`` becomes ``if use_amp:``; ``assert not fp16 or HAS_AMP``
    (which always holds now) goes.  Nothing inside ``taken``
    (statements other edits rewrite) is touched."""
    edits: List[Edit] = []
    gone: List[ast.stmt] = []
    taken = list(taken)

    def inside_taken(n) -> bool:
        p = n
        while p is not None:
            if any(p is t for t in taken):
                return True
            p = getattr(p, "_p", None)
        return False

    for node in walk(model.tree, into_functions=True):
        if isinstance(node, ast.keyword) and node.arg == "enabled" and not inside_taken(node) and any(
                isinstance(n, ast.Name) and n.id in flags for n in walk(node.value)) and \
                _truth(node.value, flags) is True and pure(node.value):
            # `torch.autocast("cuda", enabled=bool(has_apex))`: enabled always, as by default
            call = _switched_call(node)
            if call is not None and any(k is node for k in call.keywords):
                try:
                    edits.append(_one_line(src, builder, call, node, None) or builder.remove_arg(call, node))
                except Conflict:
                    continue
                taken.append(node)
            continue
        if isinstance(node, ast.Assert) and not inside_taken(node) and any(
                isinstance(n, ast.Name) and n.id in flags for n in walk(node.test)) and \
                (_truth(node.test, flags) is True or _always_holds(node.test, flags)):
            # `assert not fp16 or APEX_AVAILABLE, "install apex"`: it always holds now
            gone.append(node)
            taken.append(node)
            continue
        if isinstance(node, ast.BoolOp) and not inside_taken(node):
            text = _folded_operands(src, node, flags)
            if text is not None:
                a, b = builder.span(node)
                parent = getattr(node, "_p", None)
                if not isinstance(parent, ast.Call) and " " not in text.strip():
                    # `True if (HAS_AMP and args.amp) else False`: one name left needs no parentheses
                    i, j = a - 1, b
                    while i >= 0 and src.text[i] in " \t":
                        i -= 1
                    while j < len(src.text) and src.text[j] in " \t":
                        j += 1
                    if i >= 0 and j < len(src.text) and src.text[i] == "(" and src.text[j] == ")":
                        a, b = i, j + 1
                call = _switched_call(node)
                try:
                    edits.append((_one_line(src, builder, call, node, text, (a, b)) if call is not None else None)
                                 or builder.replace_range(a, b, text))
                except Conflict:
                    continue
                taken.append(node)
            continue
        if not isinstance(node, ast.If) or inside_taken(node):
            continue
        if not any(isinstance(n, ast.Name) and n.id in flags for n in [node.test, *walk(node.test)]):
            continue
        v = _truth(node.test, flags)
        if not node.orelse and node.body and all(reports_apex(x) for x in node.body) and pure(node.test):
            # `if apex_support and args.fp16: logging.debug("Using apex for fp16")`: it reported
            # apex's use, which is gone
            gone.append(node)
            taken.append(node)
            continue
        try:
            if v is True:
                edits.append(builder.unwrap(node, node.body))
            elif v is False and node.orelse and not (len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If)):
                edits.append(builder.unwrap(node, node.orelse))
            elif v is False and not node.orelse:
                gone.append(node)
            elif v is None and isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And):
                keep = [x for x in node.test.values if _truth(x, flags) is not True]
                if len(keep) == len(node.test.values) or not keep:
                    continue
                edits.append(builder.replace(node.test, " and ".join(
                    src.code(x) if not isinstance(x, ast.BoolOp) else f"({src.code(x)})" for x in keep)))
            else:
                continue
        except Conflict:
            continue
        taken.append(node)
    if gone:
        edits.extend(Remover(src, model, builder).remove(gone))
    return edits


#: the calls whose ``enabled=`` defaults to True
_SWITCHED = frozenset({"autocast", "GradScaler"})


def _switched_call(node) -> Optional[ast.Call]:
    """The ``GradScaler(...)`` or ``autocast(...)`` call whose argument ``node`` is part of."""
    p = getattr(node, "_p", None)
    while p is not None and not isinstance(p, ast.stmt):
        if isinstance(p, ast.Call) and (dotted(p.func) or "").split(".")[-1] in _SWITCHED:
            return p
        p = getattr(p, "_p", None)
    return None


def _one_line(src: Source, builder: Builder, call: ast.Call, node, text: Optional[str],
              span: Optional[Tuple[int, int]] = None) -> Optional[Edit]:
    """The call written over several lines (the migration broke it for a flag that made it long)
    on one line again, with ``node`` (one of its arguments, or inside one) replaced by ``text``
    or, None, its keyword removed: when it fits the file's width and holds no comment.  None
    where it stays as it is written."""
    if call.lineno == call.end_lineno:
        return None
    a, b = builder.span(call)
    if "#" in src.text[a:b] or any(isinstance(x, ast.Starred) for x in call.args):
        return None
    parts = []
    for arg in builder.args_of(call):
        if arg is node and text is None:
            continue
        x, y = builder.span(arg)
        if isinstance(arg, ast.keyword) and arg.arg is None:
            return None
        piece = src.text[x:y]
        if span is not None and x <= span[0] and span[1] <= y:
            piece = src.text[x:span[0]] + text + src.text[span[1]:y]
        if "\n" in piece:
            return None
        parts.append(piece)
    fx, fy = builder.span(call.func)
    one = f"{src.text[fx:fy]}({', '.join(parts)})"
    before = src.text[src.starts[call.lineno - 1]:a]
    after = src.text[b:src.starts[call.end_lineno - 1] + len(src.line_text(call.end_lineno).rstrip("\r\n"))]
    if len(before) + len(one) + len(after) > width_of(src.text):
        return None
    return builder.replace_range(a, b, one)


def _folded_operands(src: Source, node: ast.BoolOp, flags: Set[str]) -> Optional[str]:
    """An ``and`` outside an ``if`` or ``assert`` test (those fold whole) without the operands
    that are flags, True now: ``enabled=bool(has_apex and args.fp16)`` becomes
    ``enabled=bool(args.fp16)``.  ``has_apex and x`` is ``x`` wherever it stands; a flag after
    another operand only drops where the value is only tested (``bool(...)``, ``not``, a
    conditional's test), since ``x and True`` is True, not ``x``."""
    if not isinstance(node.op, ast.And):
        return None
    parent = getattr(node, "_p", None)
    if isinstance(parent, (ast.If, ast.Assert, ast.While)) and parent.test is node:
        return None
    truth = [_truth(v, flags) is True and pure(v) for v in node.values]
    if not any(truth) or all(truth):
        return None
    lead = next(k for k, t in enumerate(truth) if not t)
    tested = (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id == "bool"
              and parent.args == [node] and not parent.keywords) or \
        (isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not)) or \
        (isinstance(parent, ast.IfExp) and parent.test is node)
    if any(truth[lead:]) and not tested:
        return None
    keep = [v for v, t in zip(node.values, truth) if not t]
    return " and ".join(f"({src.code(v)})" if isinstance(v, (ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr))
                        else src.code(v) for v in keep)


def _unread_flags_go(text: str, path: str, flags: Set[str], star_exports=None) -> str:
    """A flag that folded (``amp_pck_loaded_ = True`` once apex's import went) and that nothing
    reads any more goes, with the ``global`` statements that only declared it: dead code the
    migration would otherwise leave."""
    src = Source(text.encode("utf-8"), path, text=text)
    try:
        src.parse()
    except SourceError:
        return text
    model = Model(src.tree, star_exports)
    b = Builder(src)
    read = {n.id for n in walk(model.tree, into_functions=True) if isinstance(n, ast.Name)
            and isinstance(n.ctx, (ast.Load, ast.Del))}
    dead = flags - read
    if not dead:
        return text
    gone: List[ast.stmt] = []
    edits: List[Edit] = []
    for n in walk(model.tree, into_functions=True):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) and \
                n.targets[0].id in dead and isinstance(n.value, ast.Constant) and \
                isinstance(getattr(n, "_p", None), ast.Module):
            gone.append(n)
        elif isinstance(n, ast.Global) and set(n.names) & dead:
            if set(n.names) <= dead:
                gone.append(n)
            else:
                edits.append(b.replace(n, "global " + ", ".join(x for x in n.names if x not in dead)))
    stores = [n for n in walk(model.tree, into_functions=True) if isinstance(n, ast.Name) and n.id in dead
              and isinstance(n.ctx, ast.Store)]
    if len(stores) != sum(isinstance(g, ast.Assign) for g in gone):
        return text  # bound somewhere else too (a loop, a function's own assignment): leave it
    try:
        # a comment above the flag that speaks of apex (`# NVIDIA Apex for mixed precision`) goes too
        edits += Remover(src, model, b).remove(gone, described={id(g) for g in gone if isinstance(g, ast.Assign)})
        return apply_edits(text, edits)
    except Conflict:
        return text


def _name_of(node) -> Optional[str]:
    from ampfix.model.semantic import dotted

    d = dotted(node)
    return d.split(".")[-1] if d else None


def tidy(text: str, path: str, adds: Sequence, removes: Sequence, star_exports=None,
         names_may_go: Set[str] = frozenset()) -> str:
    """Apply import additions and removals to ``text`` (the result of a round of fixes)."""
    if not adds and not removes:
        return text
    src = Source(text.encode("utf-8"), path, text=text)
    src.parse()
    model = Model(src.tree, star_exports)
    b = Builder(src)
    edits = removal_of_unused(src, model, removes, b) if removes else []
    gap = _blank_after_imports(src, model.tree) if edits else None
    guarded = guard_flags(model.tree) if edits else set()
    out = apply_edits(text, edits) if edits else text
    if edits:
        # a guarded import whose imports went: its ImportError handlers are dead code now
        src2 = Source(out.encode("utf-8"), path, text=out)
        src2.parse()
        model2 = Model(src2.tree, star_exports)
        b2 = Builder(src2)
        unwrapped: List[ast.Try] = []
        dead = dead_import_guards(src2, model2, b2, unwrapped)
        # the flags those guards set are constant now: their tests fold
        flags = constant_flags(model2.tree, unwrapped, set().union(*(true_flags(t) for t in unwrapped)))
        flags |= now_true(model2.tree, guarded)
        folded = fold_flags(src2, model2, b2, flags, unwrapped) if flags else []
        if dead or folded:
            out = apply_edits(out, dead + folded)
        if flags & set(names_may_go):
            out = _unread_flags_go(out, path, flags & set(names_may_go), star_exports)
        out = _stale_globals(out, path, {(r.asname or r.obj or r.module.split(".")[0]) for r in removes})
    if adds:
        if edits:
            src = Source(out.encode("utf-8"), path, text=out)
            src.parse()
            model = Model(src.tree, star_exports)
            b = Builder(src)
        add = addition_of(src, model, adds, b, gap=gap)
        out = apply_edits(out, add) if add else out
    return out


def _import_block(body) -> Tuple[int, int, Optional[ast.stmt]]:
    """The imports at the top of a module's body (after its docstring): (index of the first, index
    of the statement after them, the last import or None)."""
    i = 1 if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
        and isinstance(body[0].value.value, str) else 0
    first, last = i, None
    while i < len(body) and isinstance(body[i], (ast.Import, ast.ImportFrom)):
        last = body[i]
        i += 1
    return first, i, last


def _blank_after_imports(src: Source, tree) -> Optional[int]:
    """The blank lines between the imports at the top of the module and the statement after them."""
    body = tree.body
    _, i, last = _import_block(body)
    if last is None or i >= len(body):
        return None
    first = body[i].lineno
    if getattr(body[i], "decorator_list", None):
        first = min(first, *(d.lineno - 1 for d in body[i].decorator_list))
    n = 0
    for no in range(last.end_lineno + 1, first):
        if src.line_text(no).strip():
            return None  # a comment between: the remover decides what stays
        n += 1
    return n


def _stale_globals(text: str, path: str, names: Set[str]) -> str:
    """``global amp`` in a function where an import of apex's ``amp`` went and nothing else in the
    function names ``amp`` now: the declaration goes (the name alone where it shares one)."""
    if not names or "global" not in text:
        return text
    src = Source(text.encode("utf-8"), path, text=text)
    try:
        src.parse()
    except SourceError:
        return text
    b = Builder(src)
    model = Model(src.tree)
    edits: List[Edit] = []
    for fn in ast.walk(src.tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        named = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
        for g in ast.walk(fn):
            if not isinstance(g, ast.Global):
                continue
            stale = [x for x in g.names if x in names and x not in named]
            if not stale:
                continue
            keep = [x for x in g.names if x not in stale]
            try:
                if keep:
                    edits.append(b.replace(g, "global " + ", ".join(keep)))
                else:
                    edits.extend(Remover(src, model, b).remove([g]))
            except Conflict:
                continue
    return apply_edits(text, edits) if edits else text


#: packages whose names a fix may leave unread: the standard library, and torch (the fixes'
#: own domain: ``from torch.nn.utils import clip_grad_norm_`` once the clip of scaled gradients
#: is ``_clip_scaled_grad_norm_``); a module of another project would not import them from here
OWN_IMPORTS = frozenset(sys.stdlib_module_names) | {"torch"}


def imports_gone_unused(before: str, after: str, path: str, removes: Sequence, star_exports=None) -> str:
    """Standard-library and torch imports that code read before the fixes and nothing reads
    after them (``import warnings`` read only by the ``except`` of a removed apex import) go, in
    a round of fixes that removes imports.  Only those: another module may import a project name
    from this one (the planners, which see the project, take those), and a package's
    ``__init__.py`` re-exports what it imports.  An import the original left unread stays: that
    was not the fixes' doing."""
    if not removes or path.replace("\\", "/").rsplit("/", 1)[-1] == "__init__.py":
        return after
    try:
        src = Source(after.encode("utf-8"), path, text=after)
        src.parse()
        r0 = used_names(Model(ast.parse(before)))
    except (SourceError, SyntaxError):
        return after
    model = Model(src.tree, star_exports)
    r1 = used_names(model)
    exported = {c.value for n in ast.walk(src.tree) if isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
        for c in ast.walk(n.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    specs = []
    for stmt in model.imports:
        if isinstance(stmt, ast.ImportFrom) and (stmt.level or (stmt.module or "").split(".")[0]
                                                 not in OWN_IMPORTS):
            continue
        for alias in stmt.names:
            bound = (alias.asname or alias.name).split(".")[0]
            if alias.name == "*" or bound in exported or not r0.get(bound) or r1.get(bound):
                continue
            if isinstance(stmt, ast.ImportFrom):
                specs.append(ImportSpec(stmt.module, alias.name, alias.asname))
            elif alias.name.split(".")[0] in OWN_IMPORTS:
                specs.append(ImportSpec(alias.name, None, alias.asname))
    if not specs:
        return after
    edits = removal_of_unused(src, model, specs)
    return apply_edits(after, edits) if edits else after


def _qualnames(tree) -> Dict[str, ast.AST]:
    out: Dict[str, ast.AST] = {}
    stack = [(tree, "")]
    while stack:
        node, prefix = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                q = prefix + child.name
                out.setdefault(q, child)
                stack.append((child, q + "."))
            elif not isinstance(child, (ast.expr, ast.Lambda)):
                stack.append((child, prefix))
    return out


def locals_gone_unread(before: str, after: str, path: str, star_exports=None) -> str:
    """A local of a function that the code read before the fixes and nothing in the function
    reads after them, bound only to constants (``use_amp = 'native'`` once the comparisons with
    ``'apex'`` that read it went): its assignments go, dead code the fixes would otherwise leave.
    A local the original left unread stays: that was not the fixes' doing."""
    if before == after:
        return after
    try:
        old = _qualnames(ast.parse(before))
        src = Source(after.encode("utf-8"), path, text=after)
        src.parse()
    except (SourceError, SyntaxError, ValueError):
        return after
    gone: List[ast.stmt] = []
    for q, fn in _qualnames(src.tree).items():
        was = old.get(q)
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not isinstance(
                was, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        names = list(ast.walk(fn))
        if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and (
                n.func.id in ("locals", "eval", "exec") or (n.func.id == "vars" and not n.args)) for n in names):
            continue  # the function's locals are read by name
        declared = {x for n in names if isinstance(n, (ast.Global, ast.Nonlocal)) for x in n.names}
        params = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
        read_after = {n.id for n in names if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)}
        read_before = {n.id for n in ast.walk(was) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)}
        stores = Counter(n.id for n in names if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
        constants: Dict[str, List[ast.Assign]] = {}  # `name = <constant>` statements
        for n in names:
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) and \
                    isinstance(n.value, ast.Constant):
                constants.setdefault(n.targets[0].id, []).append(n)
        for name in sorted((read_before - read_after) & set(stores) - declared - params):
            if len(constants.get(name, ())) == stores[name]:  # bound by those alone
                gone.extend(constants[name])
    if not gone:
        return after
    try:
        return apply_edits(after, Remover(src, Model(src.tree, star_exports), Builder(src)).remove(gone))
    except Conflict:
        return after


def branches_made_alike(before: str, after: str, path: str) -> str:
    """``if a: <one> else: <other>`` whose branches the fixes made the same text
    (``amp.scale_loss(loss, opt_a)`` and ``amp.scale_loss(loss, opt_b)`` both became
    ``scaler.scale(loss).backward()``): one copy stays, in the ``if``'s place, where the test
    has no effect of its own.  An ``if`` whose branches were already alike stays: that was not
    the fixes' doing."""
    if before == after:
        return after
    try:
        old = ast.parse(before)
        src = Source(after.encode("utf-8"), path, text=after)
        src.parse()
    except (SourceError, SyntaxError, ValueError):
        return after

    def alike(n) -> bool:
        if not (isinstance(n, ast.If) and n.body and n.orelse) or (
                len(n.orelse) == 1 and isinstance(n.orelse[0], ast.If) and n.orelse[0].col_offset == n.col_offset):
            return False  # an `elif` chain
        return ast.dump(ast.Module(n.body, [])) == ast.dump(ast.Module(n.orelse, []))

    had = Counter(ast.dump(n) for n in ast.walk(old) if alike(n))
    b = Builder(src)
    lines = src.text.splitlines(keepends=True)
    edits: List[Edit] = []
    for n in ast.walk(src.tree):
        if not alike(n) or not pure(n.test) or any(isinstance(x, ast.If) and alike(x) for x in walk(n)):
            continue
        key = ast.dump(n)
        if had[key]:
            had[key] -= 1
            continue
        at = next((i for i in range(n.body[-1].end_lineno, n.orelse[0].lineno)
                   if lines[i].strip().startswith("else")), None)
        if at is None or n.body[0].lineno <= n.test.end_lineno:
            continue
        # everything between the header and `else:`, and after `else:`, comments too
        if lines[n.test.end_lineno:at] != lines[at + 1:n.orelse[-1].end_lineno]:
            continue  # a comment or a layout of its own in one branch: left as it is
        try:
            edits.append(b.unwrap(n, n.body))
        except Conflict:
            continue
    if not edits:
        return after
    try:
        return apply_edits(after, edits)
    except Conflict:
        return after
