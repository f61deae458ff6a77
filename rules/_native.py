"""The building blocks of a whole-module rewrite to native AMP, shared by the apex rules that
migrate loss scaling (AMP101 apex.amp, AMP102 apex.fp16_utils).

Not a rule itself (no registry line).  A :class:`ModuleMigration` plans the rewrite of a whole
module when it visits it: either every part can be rewritten, and one fix carries all the edits,
or the plan raises :class:`Refuse` with the reason, and nothing is rewritten.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Set

import libcst as cst

from ampfix.analysis import (
    bound_by_imports, dotted, enclosing_function, is_optimizer_step, line_of, method_call, receiver, statement_of, walk,
)
from libcst.metadata import PositionProvider

from ampfix.rule import Fix
from ampfix.rules._apex import ApexRule


class Refuse(Exception):
    """The module cannot be migrated with confidence: the reason, for the person."""


CUDA = '"cuda"'
#: generated lines longer than this are broken
MAX_LINE = 100
STATIC_NOTE = ("static loss scale: GradScaler starts at it and never grows (growth_interval=2**31-1); it still skips "
               "a step whose gradients overflow and halves the scale, where apex applied it")


# ------------------------------------------------------------------------------ spellings
def scaler_call(settings, args: List[str], indent: int = 0, head: str = "") -> str:
    """``torch.amp.GradScaler("cuda", ...)``, or ``torch.cuda.amp.GradScaler(...)`` for that
    target; one argument a line when the statement (``head`` + call, at ``indent``) is long."""
    if settings.target == "torch.cuda.amp":
        func = "torch.cuda.amp.GradScaler"
    else:
        func, args = "torch.amp.GradScaler", [CUDA, *args]
    one = f"{func}({', '.join(args)})"
    if indent + len(head) + len(one) <= MAX_LINE or len(args) < 2:
        return one
    # continuation lines are relative: libcst adds the block's indentation when it renders
    return f"{func}(\n" + "".join(f"    {a},\n" for a in args) + ")"


def autocast_call(settings, enabled: str = "True") -> str:
    extra = "" if enabled == "True" else f", enabled={enabled}"
    if settings.target == "torch.cuda.amp":
        return f"torch.cuda.amp.autocast(dtype=torch.float16{extra})"
    return f'torch.autocast("cuda", dtype=torch.float16{extra})'


def target_description(settings) -> str:
    if settings.target == "torch.cuda.amp":
        return "torch.cuda.amp.autocast + torch.cuda.amp.GradScaler"
    return "torch.autocast + torch.amp.GradScaler"


# ------------------------------------------------------------------------------ small helpers
def names_in(node) -> Set[str]:
    out = set()
    for n in [node, *walk(node, into_functions=True)]:
        d = dotted(n) if isinstance(n, (cst.Name, cst.Attribute)) else None
        if d:
            out.add(d)
    return out


def assigned(stmt) -> Set[str]:
    out = set()
    for n in [stmt, *walk(stmt)]:
        targets = []
        if isinstance(n, cst.Assign):
            targets = [t.target for t in n.targets]
        elif isinstance(n, (cst.AugAssign, cst.AnnAssign)):
            targets = [n.target]
        elif isinstance(n, (cst.For, cst.CompFor)):
            targets = [n.target]
        elif isinstance(n, cst.WithItem) and n.asname is not None:
            targets = [n.asname.name]
        for t in targets:
            for e in ([t] if not isinstance(t, (cst.Tuple, cst.List)) else [el.value for el in t.elements]):
                if dotted(e):
                    out.add(dotted(e))
    return out


def imported(stmt) -> Set[str]:
    out = set()
    for x in stmt.body:
        if isinstance(x, (cst.Import, cst.ImportFrom)) and not isinstance(x.names, cst.ImportStar):
            out.update((a.evaluated_alias or a.evaluated_name).split(".")[0] for a in x.names)
    return out


def as_bool(code: str, expr) -> str:
    """autocast(enabled=...) takes a bool only: comparisons, `not` and True/False are; wrap the rest."""
    if isinstance(expr, cst.Comparison) or (isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not)):
        return code
    if isinstance(expr, cst.Name) and expr.value in ("True", "False"):
        return code
    return f"bool({code})"


def stmt(code: str) -> cst.BaseStatement:
    return cst.parse_statement(code + "\n")


def sole_expr(line) -> Optional[cst.BaseExpression]:
    """The expression of a statement line that is one expression, else None."""
    if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and isinstance(line.body[0], cst.Expr):
        return line.body[0].value
    return None


def comment_lines(node) -> List[cst.EmptyLine]:
    """Every comment in a statement (its leading lines included), in order, as comment lines."""
    return [cst.EmptyLine(comment=n) for n in [node, *walk(node, into_functions=True)] if isinstance(n, cst.Comment)]


# ------------------------------------------------------------------------------ the planner
class ModuleMigration(ApexRule):
    """An apex rule whose fix rewrites the whole module: subclasses implement :meth:`plan`
    (return a Fix, None when the module has nothing to migrate, or raise Refuse) and set
    ``self.anchor`` to the node (the ``func`` of a call) whose report carries the fix."""

    def visit_Module(self, node: cst.Module) -> None:
        super().visit_Module(node)
        self.plan_fix: Optional[Fix] = None
        self.refusal: Optional[str] = None
        self.anchor = None
        self._told = False
        self.note: Optional[str] = None  # said with the anchor when the module is rewritten
        self.edits: list = []  # (original node, replacement)
        self.expand: Dict[int, int] = {}  # id(statement) -> how many statements it becomes
        self.carry: Dict[int, list] = {}  # id(statement) -> leading lines of removed statements before it
        self.wraps: Dict[int, tuple] = {}  # id(block) -> (block, [(first, last)]) autocast regions
        try:
            self.plan_fix = self.plan(node)
        except Refuse as exc:
            self.refusal = str(exc)
            self.edits = []

    def plan(self, module: cst.Module) -> Optional[Fix]:  # pragma: no cover - abstract
        raise NotImplementedError

    def fix_for(self, node, call, qname):
        if call is not None and self.anchor is not None and call.func is self.anchor:
            return self.plan_fix
        return None

    def message(self, qname, fix, call=None):
        text = super().message(qname, fix, call)
        # the reason the module was left whole goes with the anchor, or with the first use
        if self.refusal and ((call is not None and call.func is self.anchor) or (self.anchor is None and not self._told)):
            text += f" (not rewritten: {self.refusal})"
            self._told = True
        elif self.note and fix is not None:
            text += f" ({self.note})"
        return text

    # -- what the module uses -----------------------------------------------------------------
    def references(self, module):
        """Each use of this rule's apex area outside imports: (outermost Name/Attribute, its
        qualified name)."""
        for n in walk(module, into_functions=True):
            if not isinstance(n, (cst.Name, cst.Attribute)):
                continue
            parent = self.parent(n)
            if isinstance(parent, cst.Attribute) and parent.value is n:
                continue
            q = self.apex_name(n)
            if q is not None and not any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in self.ancestors(n)):
                yield n, q

    def called(self, n, q) -> cst.Call:
        """The call of which ``n`` is the function; Refuse when ``n`` is used otherwise."""
        parent = self.parent(n)
        if not (isinstance(parent, cst.Call) and parent.func is n):
            raise Refuse(f"`{q}` is used other than by calling it (line {line_of(self, n)})")
        return parent

    # -- where the scaler lives ---------------------------------------------------------------
    def scaler_home(self, module, made_at, sites) -> str:
        """The scaler's name: a local (or module global) when it is made at the top level or in
        the function that uses it, ``self.<name>`` when made in a method and used in other
        methods of the class, and a module global (``global scaler`` where it is made) when
        made in a plain function and used in others (``main()`` builds, ``train()`` steps).
        Sets ``self.global_scaler`` for the last case.  Raises Refuse when one of ``sites``
        cannot reach it."""
        func = enclosing_function(self, made_at)
        cls = None
        if func is not None and func.params.params and func.params.params[0].name.value == "self":
            cls = next((a for a in self.ancestors(func) if isinstance(a, cst.ClassDef)), None)
        taken = names_in(module)
        base = "scaler" if "scaler" not in taken and "self.scaler" not in taken else "grad_scaler"
        self.global_scaler = False
        for site in sites:
            if site is made_at or func is None or (cls is None and any(a is func for a in self.ancestors(site))):
                continue
            if cls is None:
                self.global_scaler = True
                continue
            f = enclosing_function(self, site)
            if not (f is not None and any(a is cls for a in self.ancestors(f)) and f.params.params
                    and f.params.params[0].name.value == "self"):
                raise Refuse(f"the scaler made at line {line_of(self, made_at)} cannot reach `{self.code_of(site)}` "
                             f"at line {line_of(self, site)}")
        return f"self.{base}" if cls is not None else base

    def scaler_statements(self, scaler: str, call: str) -> List[cst.BaseStatement]:
        """``scaler = <call>``, declared global first when the scaler is shared across functions."""
        out = [stmt(f"{scaler} = {call}")]
        return [stmt(f"global {scaler}"), *out] if self.global_scaler else out

    def place_scaler(self, line, scaler: str, scaler_args: List[str], enabled: str, before=(), after=()):
        """Replace ``line`` (amp.initialize, FP16_Optimizer(...)) by the scaler, with ``before`` and
        ``after`` statements around it.  Under ``if cond:`` (no else) the scaler is made
        unconditionally, ``enabled=cond``, before the ``if`` (or in its place when nothing else
        is left in it): the uses of the scaler are unconditional once migrated.  Any other
        enclosing control flow (a loop, an else branch, a try) refuses.  Returns the statement
        that now holds the scaler and the ``enabled`` expression."""
        guard = self.parent(self.parent(line))
        guarded = isinstance(guard, cst.If) and guard.orelse is None and any(s is line for s in guard.body.body)
        for a in self.ancestors(line):
            if isinstance(a, (cst.FunctionDef, cst.ClassDef, cst.Module)):
                break
            if a is guard and guarded:
                continue
            if isinstance(a, (cst.If, cst.Else, cst.For, cst.While, cst.Try, cst.ExceptHandler, cst.Finally, cst.With)):
                kind = {cst.If: "an `if` with an `else`" if getattr(a, "orelse", None) else "a nested `if`", cst.Else: "an `else` branch", cst.For: "a `for` loop",
                        cst.While: "a `while` loop", cst.With: "a `with` block"}.get(type(a), "a `try` statement")
                raise Refuse(f"line {line_of(self, line)} runs inside {kind} (line {line_of(self, a)}): the scaler "
                             f"must exist wherever the step runs; make it once, before, by hand")
        if guarded:
            cond = as_bool(self.code_of(guard.test), guard.test)
            enabled = cond if enabled == "True" else ("False" if enabled == "False" else f"{cond} and ({enabled})")
        node = guard if guarded else line
        col = self.get_metadata(PositionProvider, node).start.column
        args = [*scaler_args, *([f"enabled={enabled}"] if enabled != "True" else [])]
        made = self.scaler_statements(scaler, scaler_call(self.settings, args, col, scaler + " = "))
        if not guarded or guard.body.body == (line,):
            self.put(node, [*before, *made, *after])
            return node, enabled
        # the guard keeps its other statements; the line becomes before + after (or goes)
        rest = [*before, *after]
        if rest:
            self.put(line, rest)
        else:
            self.expand[id(line)] = 0
            self.edits.append((line, cst.RemovalSentinel.REMOVE))
        leading, carry, expand = guard.leading_lines, self.carry, self.expand

        def rep(u):
            lines = [*carry.get(id(guard), []), *leading, *(carry.get(id(line), []) if not rest else [])]
            out = [*made, *([u.with_changes(leading_lines=[])] if u.body.body else [])]
            expand[id(guard)] = len(out)
            out[0] = out[0].with_changes(leading_lines=lines)
            return cst.FlattenSentinel(out)

        self.expand[id(guard)] = len(made) + 1
        self.edits.append((guard, rep))
        return guard, enabled

    # -- statement edits ------------------------------------------------------------------------
    def put(self, node, new_stmts) -> None:
        """Replace a statement by several; None in new_stmts stands for the (updated) statement
        itself; an empty list removes it (its comment lines move to the next statement)."""
        if not new_stmts:
            self.remove(node)
            return
        self.expand[id(node)] = len(new_stmts)
        carry = self.carry

        def rep(u, new_stmts=new_stmts):
            first = [*carry.get(id(node), []), *node.leading_lines]
            out = [u if s is None else s for s in new_stmts]
            out = [out[0].with_changes(leading_lines=first)] + [s.with_changes(leading_lines=[]) for s in out[1:]]
            return cst.FlattenSentinel(out)

        self.edits.append((node, rep))

    def remove(self, node) -> None:
        """Remove a statement; its comments move above the next statement of its block.  The
        sole statement of an ``if`` without ``else`` takes the ``if`` with it."""
        block = self.parent(node)
        owner = self.parent(block)
        if (isinstance(block, cst.IndentedBlock) and len(block.body) == 1 and isinstance(owner, cst.If)
                and owner.orelse is None and owner.body is block):
            self.remove(owner)
            return
        body = list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else [node]
        idx = next(i for i, s in enumerate(body) if s is node)
        own = [*self.carry.pop(id(node), []), *comment_lines(node)]
        if own:
            if idx + 1 >= len(body):
                raise Refuse(f"a comment in line {line_of(self, node)} would be lost with the statement")
            self.carry.setdefault(id(body[idx + 1]), []).extend(own)
        if len(body) == 1 and not isinstance(block, cst.Module):
            raise Refuse(f"removing line {line_of(self, node)} would leave an empty block")
        self.expand[id(node)] = 0
        self.edits.append((node, cst.RemovalSentinel.REMOVE))

    def finish_carry(self) -> None:
        """Statements that receive comment lines but have no edit of their own get one."""
        edited = {id(n) for n, _ in self.edits}
        for stmt_node in self._all_statements():
            if id(stmt_node) in self.carry and id(stmt_node) not in edited:
                carry, node = self.carry, stmt_node
                self.edits.append((node, lambda u, node=node: u.with_changes(
                    leading_lines=[*carry[id(node)], *u.leading_lines])))

    def _all_statements(self):
        for n in walk(self.module, into_functions=True):
            if isinstance(n, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                yield n

    def collapse_guard(self, site, plain) -> cst.CSTNode:
        """``if c: <site> else: <plain>`` (``plain(stmt)`` true of the one else statement)
        becomes the (updated) site alone, since native AMP has no separate path; call it after
        the site's own edits.  Returns the statement that holds the site in its block now: the
        If, or the site itself.  A comment only the If holds (its test, its else) keeps it."""
        guard = self.parent(self.parent(site))
        if not (isinstance(guard, cst.If) and isinstance(guard.orelse, cst.Else) and guard.body.body == (site,)
                and len(guard.orelse.body.body) == 1 and plain(guard.orelse.body.body[0])):
            return site
        own = [line for line in guard.leading_lines if line.comment is not None]
        if len(comment_lines(guard)) != len(own) + len(comment_lines(site)):
            return site
        leading = guard.leading_lines
        carry = self.carry
        self.expand[id(guard)] = self.expand.get(id(site), 1)

        def rep(u):
            stmts = list(u.body.body)
            stmts[0] = stmts[0].with_changes(leading_lines=[*carry.get(id(guard), []), *leading,
                                                             *stmts[0].leading_lines])
            return cst.FlattenSentinel(stmts)

        self.edits.append((guard, rep))
        return guard

    # -- steps ------------------------------------------------------------------------------
    def rewrite_steps(self, optimizers: Dict[cst.CSTNode, Set[str]], scaler: str) -> None:
        """Every ``opt.step()`` of the scaled optimizers becomes ``scaler.step(opt)``, with one
        ``scaler.update()`` after the last step of the function."""
        for unit, names in optimizers.items():
            steps = [n for n in walk(unit) if is_optimizer_step(n) or (method_call(n, "step") and not n.args)]
            steps = [s for s in steps if not s.args and self.code_of(receiver(s)) in names]
            found = {self.code_of(receiver(s)) for s in steps}
            missing = sorted(names - found)
            if missing:
                raise Refuse(f"`{missing[0]}.step()` is not in the function that scales the loss")
            last = max(steps, key=lambda n: line_of(self, n))
            for s in steps:
                line = statement_of(self, s)
                if line is None or sole_expr(line) is not s:
                    raise Refuse(f"`{self.code_of(s)}` at line {line_of(self, s)} is not a statement of its own")
                new = [stmt(f"{scaler}.step({self.code_of(receiver(s))})").with_changes(
                    trailing_whitespace=line.trailing_whitespace)]
                if s is last:
                    new.append(stmt(f"{scaler}.update()"))
                self.put(line, new)

    # -- the autocast region ---------------------------------------------------------------------
    def wrap(self, site, loss, autocast: str, stop: dict) -> List[cst.CSTNode]:
        """Plan an autocast region around the statements before ``site`` (in its block) that
        compute ``loss``, by data flow, from the first that uses a model (``stop["models"]``);
        return every statement the loss depends on there."""
        block = self.parent(site)
        stmts = list(block.body)
        idx = next(i for i, s in enumerate(stmts) if s is site)
        needed = names_in(loss)
        first = last = None
        for j in range(idx - 1, -1, -1):
            s = stmts[j]
            if s is stop["init"] or isinstance(s, (cst.FunctionDef, cst.ClassDef)) or assigned(s) & stop["models"]:
                break
            if any(method_call(n, "backward") or is_optimizer_step(n) or self.is_scaling_site(n) for n in [s, *walk(s)]):
                break
            got = assigned(s)
            if got & needed:
                needed |= names_in(s)
                first = j
                last = last if last is not None else j
        if first is None:
            raise Refuse(f"the loss `{self.code_of(loss)}` is not computed in the block that scales it (line "
                         f"{line_of(self, site)}): wrap its forward pass in {autocast} by hand")
        # statements before the first that uses the model only prepare inputs: they stay out
        start = next((j for j in range(first, last + 1) if names_in(stmts[j]) & (stop["models"] - {"self"})), first)
        entry = self.wraps.setdefault(id(block), (block, []))
        entry[1].append((stmts[start], stmts[last]))
        return stmts[first:last + 1]

    def is_scaling_site(self, node) -> bool:
        """A statement that ends a forward pass (subclasses: their own scaled backward)."""
        return False

    def finish_wraps(self, autocast: str) -> None:
        for block, ranges in self.wraps.values():
            self.edits.append((block, self._wrapper(block, ranges, autocast)))

    def _wrapper(self, block, ranges, autocast):
        originals = list(block.body)
        expand = self.expand

        def rep(u):
            new = list(u.body)
            # map original indices to updated ones through the known expansions
            starts, pos = [], 0
            for s in originals:
                starts.append(pos)
                pos += expand.get(id(s), 1)
            for a, b in sorted(ranges, key=lambda r: -originals.index(r[0])):
                i, j = originals.index(a), originals.index(b)
                lo, hi = starts[i], starts[j] + expand.get(id(b), 1)
                inner = new[lo:hi]
                if not inner:
                    continue
                with_stmt = cst.parse_statement(f"with {autocast}:\n    pass\n")
                body = [inner[0].with_changes(leading_lines=[])] + inner[1:]
                with_stmt = with_stmt.with_changes(body=with_stmt.body.with_changes(body=body),
                                                   leading_lines=inner[0].leading_lines)
                new[lo:hi] = [with_stmt]
            return u.with_changes(body=new)

        return rep

    # -- imports ------------------------------------------------------------------------------
    def guard_imports(self, module, rewritten_ids: Set[int]) -> None:
        """Remove ``try: from apex import amp / except ImportError: amp = None`` once nothing else
        uses the names it binds (the uses being rewritten do not count)."""
        for t in walk(module, into_functions=True):
            if not isinstance(t, cst.Try) or t.orelse is not None or t.finalbody is not None:
                continue
            imports = [s for s in t.body.body if isinstance(s, cst.SimpleStatementLine)
                       and all(isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body)]
            if not imports or len(imports) != len(t.body.body):
                continue
            if any(bound_by_imports(s, "apex") != imported(s) for s in imports):
                continue
            if not all(h.type is None or dotted(h.type) in ("ImportError", "ModuleNotFoundError") for h in t.handlers):
                continue
            names = set().union(*(assigned(h) for h in t.handlers), *(imported(s) for s in imports))
            inside = {id(n) for n in walk(t, into_functions=True)}
            for n in walk(module, into_functions=True):
                if isinstance(n, cst.Name) and n.value in names and id(n) not in inside:
                    outer = n
                    while isinstance(self.parent(outer), cst.Attribute) and self.parent(outer).value is outer:
                        outer = self.parent(outer)
                    if id(outer) not in rewritten_ids:
                        break
            else:
                self.remove(t)

    def leaves(self, expr) -> List[str]:
        """``[a, b], c`` -> ['a', 'b', 'c']: the names a target or an argument list holds."""
        if isinstance(expr, (cst.Tuple, cst.List)):
            return [leaf for e in expr.elements for leaf in self.leaves(e.value)]
        return [self.code_of(expr)]
