"""The rewrites of a group's seeds: ``amp.initialize`` becomes a GradScaler where it ran (its options
mapped), autocast for an inference seed, ``model.half()`` for O3, ``amp.init``."""
from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Tuple

from ampfix.engine.tidy import reports_apex
from ampfix.model.apex import apex_value_condition, fold_installed, imports_apex
from ampfix.model.analysis import (casts_one_of, is_const, is_log_call, kwargs, method_call, number_value, receiver, scalar_assignment,
                                   string_value)
from ampfix.migration.groups import Refuse
from ampfix.migration.flow import (
    OPTIMIZERS, ancestors_stmts, assigned, assigned_in, code_body, dominates, guards, is_main_guard, loops_around,
    loss_from, read, stmt_of, terminates,
)
from ampfix.migration.spell import STATIC_NOTE, as_bool, autocast_call, conj, disj, operand, scaler_call
from ampfix.model.semantic import DEFS, block_of, dotted, enclosing_function, walk
from ampfix.migration.rewriter import branch_local, constant_local, quoted_as, returns_after, substitute
from ampfix.migration.seeds import NOTES, Seed, Use, calls_model


def _only_reports(body) -> bool:
    """A handler that only says something (print, a log call, a warning) or passes."""
    return all(isinstance(x, ast.Pass) or (isinstance(x, ast.Expr) and isinstance(x.value, (ast.Call, ast.Constant)))
               for x in body)


def _before_in(t, stmt) -> Optional[List[ast.stmt]]:
    """The statements of try ``t``'s body before ``stmt``, when ``stmt`` is one of them."""
    if not isinstance(t, ast.Try):
        return None
    i = next((i for i, x in enumerate(t.body) if x is stmt), None)
    return None if i is None else t.body[:i]


def _cannot_fail(x) -> bool:
    """A statement that does not raise in practice: a log line or a print, or a name bound to
    arithmetic on names, constants and ``int`` / ``len`` / ``min`` ... (``t_total =
    int(len(loader) * args.epochs)``)."""
    if isinstance(x, ast.Expr) and isinstance(x.value, ast.Call):
        return is_log_call(x)
    return scalar_assignment(x)


def lazy_tested(test) -> Set[str]:
    """What a lazy guard tests for being unset: ``X is None``, ``X == None``, ``not X``."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and dotted(test.operand):
        return {dotted(test.operand)}
    if (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Is, ast.Eq))
            and is_const(test.comparators[0], None) and dotted(test.left)):
        return {dotted(test.left)}
    return set()


def fold_conditions(module, around, folded, negated, enabled: str) -> str:
    """``enabled`` under the ``if`` statements ``around`` a statement (innermost first): the test of
    each guard in ``folded`` holds there, the test of each ``if`` in ``negated`` does not (the
    statement is in its ``else``, or further down its ``elif`` chain)."""
    from ampfix.engine.tidy import negate

    cond = enabled
    # innermost first, each test put in front: the text reads outermost first (`a and b` for `if a: if b:`)
    for gd in [a for a in around if any(a is x for x in folded) or any(a is n for n in negated)]:
        if cond == "False":
            break
        neg = any(gd is n for n in negated)
        try:
            # `if amp is not None:` of `try: from apex import amp / except ImportError: amp = None`:
            # whether apex is installed; native AMP always is
            f = fold_installed(module.sem, module.src.code, gd.test)
        except ValueError:
            raise Refuse(f"line {gd.lineno}: the test reads apex's amp, which is None where apex is not installed, "
                         "other than as `amp is None` / `amp is not None`: migrate it by hand")
        if isinstance(f, bool):
            if f == neg:
                cond = "False"
            continue
        if isinstance(f, str):
            text = f"not ({f})" if neg else f
            cond = conj(as_bool(text, ast.parse(text, mode="eval").body), cond)
        elif neg:
            cond = conj(as_bool(negate(module.src, gd.test), ast.UnaryOp(op=ast.Not(), operand=gd.test)), cond)
        else:
            cond = conj(as_bool(module.src.code(gd.test), gd.test), cond)
    return cond


#: builtins that only gather what they are given (``list(model.parameters())``)
_COLLECTING = frozenset({"list", "tuple", "set", "sorted", "filter", "iter"})


class SetInside(Refuse):
    """The scaler's options read a name the seed's guard sets before it: the scaler cannot move
    above the guard (it can stay where the seed is, with a disabled one made before the guard)."""


def option_reads(call: ast.Call, bf16: bool = False) -> Set[str]:
    """The names the scaler's options read: what must exist where the scaler is made (with
    bfloat16, only what says whether AMP is on)."""
    out: Set[str] = set()
    for k, v in kwargs(call).items():
        if k not in ("models", "optimizers") and not (bf16 and k not in ("opt_level", "enabled")):
            out |= read(v)
    return out


class SeedRewrites:
    """The part of a group's plan (:class:`ampfix.migration.amp.GroupPlan`) that rewrites its seeds."""

    def _install_checks_go(self, s: Seed) -> None:
        """``if not is_apex_available(): raise ImportError("Please install apex ...")`` before the
        initialize, in its block: a check that apex is installed, which nothing needs once the
        initialize goes (it would stop a run that no longer uses apex)."""
        owner, field, block = block_of(s.stmt)
        code = s.module.src.code
        for x in block:
            if x is s.stmt:
                break
            if not (isinstance(x, ast.If) and not x.orelse and x.body
                    and all(isinstance(y, (ast.Raise, ast.Expr)) for y in x.body)
                    and isinstance(x.body[-1], ast.Raise)):
                continue
            said = " ".join(code(y) for y in x.body).lower()
            if "apex" in said and ("install" in said or "nvidia/apex" in said):
                self.fc(s.module).remove(x)
        lo, hi = (s.unit.lineno, s.unit.end_lineno) if s.func is not None else (1, s.module.src.line_count)
        self.fc(s.module).drop_ordering_notes(lo, hi)

    def _initialize_goes(self, s: Seed) -> None:
        """The initialize statement goes; its targets get its arguments where they differ."""
        after = self._reassign(s)
        fc = self.fc(s.module)
        if self._else_says_the_same(s, after):
            return
        if after:
            fc.replace_statement(s.stmt, after)
        else:
            fc.remove(s.stmt, described=True)

    def _exported_away(self, s: Seed) -> None:
        """The seed of a ``setup()`` moved to its callers: here initialize goes (its targets are
        its arguments) and the function returns the model and optimizer as they are."""
        self._initialize_goes(s)
        if not s.training:
            self._optimizer_made_for_apex_goes(s)
        ls = kwargs(s.call).get("loss_scale")
        chosen = branch_local(s.func, ls.id, s.stmt) if isinstance(ls, ast.Name) else None
        in_call = {id(n) for n in ast.walk(s.call)}
        if chosen is not None and all(id(n) in in_call for n in walk(s.func.node, into_functions=True)
                                      if isinstance(n, ast.Name) and n.id == ls.id and isinstance(n.ctx, ast.Load)):
            # the `if` that chose the loss scale, read by nothing else: the callers say the choice
            self.fc(s.module).remove(chosen[1])
        self.notes.add(f"`{s.func.qualname}` no longer initializes apex: its callers set up native AMP where they "
                       "call it")

    def _switch_seed(self, s) -> None:
        """A trainer's own switch says when AMP is on (:mod:`ampfix.migration.switches`): its
        scaler is made right after ``self.<switch> = ...`` in ``__init__``, with the options of the
        setups' initialize that goes."""
        dropped = [x for x in self.g.seeds if s in (getattr(x, "dropped", None) or ())]
        args: Optional[List[str]] = None
        level = False
        for x in dropped:
            enabled, notes, scaler_args, pure = self._options(x)
            if pure:
                raise Refuse(f"opt_level O3 at line {x.use.line} is pure float16: convert the model by hand")
            if enabled == "False":
                raise Refuse(f"amp.initialize at line {x.use.line} is disabled, yet `{s.switch}` scales the loss: "
                             "migrate it by hand")
            if args is not None and args != scaler_args:
                raise Refuse(f"the setups that initialize apex for `{s.func.cls.name}` differ in their loss scale: "
                             "make the scaler by hand")
            args = scaler_args
            self.notes |= {n for n in notes if not n.startswith("opt_level is not a literal")}
            lv = kwargs(x.call).get("opt_level")
            if lv is not None and string_value(lv) is None and (dotted(lv) or "").split(".")[-1] == \
                    s.switch.split(".")[-1]:
                level = True  # the switch is apex's opt level too: "O0" ran in float32
        cond = f"bool({s.switch})" + (f' and {s.switch} != "O0"' if level else "")
        target = self._scaler_target(s)
        col = s.module.src.char_col(s.stmt.lineno, s.stmt.col_offset)
        made = self._made(target, [*(args or []), f"enabled={cond}"], cond, col, always=True)
        self.fc(s.module).insert_after(s.stmt, [made])
        self.enabled[s.idx] = cond
        self.notes.add(f"`{s.func.cls.name}` makes the GradScaler where `{s.switch}` is set, enabled by it: apex's "
                       "scale_loss ran only where it held")

    def _dropped(self, s: Seed) -> None:
        """The initialize of a setup whose trainer makes the scaler itself: it goes."""
        self._initialize_goes(s)
        # `# use apex fp16 optimizer` above the block the initialize was in speaks of what went
        outer = [a for a in ancestors_stmts(s.stmt, s.func.node if s.func else None) if isinstance(a, ast.If)]
        if outer:
            self.fc(s.module).drop_comment_above(outer[-1])
        home = s.dropped[0]
        self.notes.add(f"`{s.func.qualname}` no longer initializes apex: `{home.func.cls.name}` sets up native AMP "
                       f"where `{home.switch}` is set")

    def _made_already(self, s: Seed, target: str, made: str) -> bool:
        """A setup called twice in one block (``self.actor, ... = self.init_trainable(...)``, then
        the critic's) makes the same scaler after each call: apex had one loss scaler for both, and
        the second ``self.scaler = GradScaler(...)`` would throw the first away.  The one made after
        the earlier call serves both, where nothing between rebinds what its arguments read."""
        if getattr(s, "before_call", False):
            return False
        _, _, block = block_of(s.stmt)
        key = (s.module.path, id(block), target, made)
        earlier = self.made_in_block.get(key)
        if earlier is None or earlier not in block or block.index(earlier) > block.index(s.stmt):
            self.made_in_block[key] = s.stmt
            return False
        try:
            made_tree = ast.parse(made.strip())
        except SyntaxError:
            return False
        if not (len(made_tree.body) == 1 and isinstance(made_tree.body[0], ast.Assign)):
            return False
        reads = {dotted(n) for n in ast.walk(made_tree.body[0].value) if isinstance(n, (ast.Name, ast.Attribute))}
        reads = {r for r in reads if r}
        between = block[block.index(earlier) + 1: block.index(s.stmt) + 1]
        for st in between:
            for n in walk(st, into_functions=False):
                if isinstance(getattr(n, "ctx", None), (ast.Store, ast.Del)):
                    d = dotted(n)
                    if d is None or d == target:
                        continue
                    if any(r == d or r.startswith(d + ".") or d.startswith(r + ".") for r in reads):
                        self.made_in_block[key] = s.stmt
                        return False
        self.shared_by_setups = (f"`{s.exported_from[0].func.qualname}`'s calls at lines {earlier.lineno} and "
                                 f"{s.stmt.lineno}")
        self.notes.add("the setup is called twice in one block: one GradScaler serves both, as apex's one loss "
                       "scaler did")
        return True

    def _options(self, s: Seed):
        call = s.call
        kws = kwargs(call)
        notes: Set[str] = set()
        scaler_args: List[str] = []
        enabled = "True"
        pure = False
        level = kws.get("opt_level")
        code = s.module.src.code
        if isinstance(level, ast.Name) and s.func is not None:
            # `fp16_opt_level = 'O1'` just before: the level is that literal
            level = constant_local(s.func, level.id, s.stmt) or level
        if level is None:
            notes.add("opt_level defaulted to O1")
        elif string_value(level) is not None:
            lv = string_value(level).upper()
            if lv == "O3":
                pure = True
            elif lv == "O0":
                enabled = "False"
            elif lv not in ("O1", "O2"):
                raise Refuse(f"unknown opt_level {lv}")
        elif isinstance(level, ast.IfExp) and string_value(level.body) is not None and \
                string_value(level.orelse) is not None:
            # `opt_level='O2' if mp else 'O0'`: the test says when AMP is on, as the author wrote it
            on = [string_value(x).upper() != "O0" for x in (level.body, level.orelse)]
            test = code(level.test)
            enabled = {(True, False): as_bool(test, level.test), (False, True): f"not {operand(test, level.test)}",
                       (True, True): "True", (False, False): "False"}[tuple(on)]
            if "O3" in (string_value(level.body).upper(), string_value(level.orelse).upper()):
                notes.add("opt_level O3 in a conditional: it runs as O1 (autocast), the model stays float32")
        else:
            enabled = f'{operand(code(level), level)} != "O0"'
            notes.add("opt_level is not a literal: AMP is enabled unless it is O0 (O3 runs as O1)")
        if "enabled" in kws:
            e = as_bool(code(kws["enabled"]), kws["enabled"])
            if pure:
                raise Refuse("opt_level O3 with `enabled`: convert the model with .half() by hand")
            enabled = "False" if is_const(kws["enabled"], False) else conj(e, enabled)
        ls = kws.get("loss_scale")
        if isinstance(ls, ast.Name) and s.func is not None and getattr(s, "exported", False):
            # `if opt.ls != 'dynamic': ls = float(opt.ls) else: ls = 'dynamic'` before a seed that
            # goes to its callers: the choice, said there (its parts are the source's own nodes)
            chosen = branch_local(s.func, ls.id, s.stmt)
            if chosen is not None:
                ls = chosen[0]
        if pure:
            if ls is not None and number_value(ls) != 1:
                raise Refuse("opt_level O3 with loss scaling: GradScaler cannot unscale float16 gradients; "
                             "use opt_level O1 (autocast) or scale the loss by hand")
            for k in kws:
                if k not in ("opt_level", "loss_scale", "models", "optimizers", "verbosity"):
                    raise Refuse(f"opt_level O3 with {k!r}: convert the model with .half() by hand")
            return enabled, notes, scaler_args, pure
        if ls is not None:
            scaler_args += loss_scale_args(ls, code, notes)
        for k in kws:
            if k in NOTES:
                notes.add(f"{k}: {NOTES[k]}")
            elif k not in ("opt_level", "enabled", "loss_scale", "models", "optimizers"):
                raise Refuse(f"amp.initialize argument {k!r} has no native mapping")
        return enabled, notes, scaler_args, pure

    def _hoist(self, s: Seed, enabled: str, reads: Set[str], lazy_ok: bool = False, in_place: bool = False,
               read_after: bool = False):
        """Where the scaler (or nothing) replaces the seed: (statement to put it before, enabled).

        The seed's ``if`` guards (no ``else`` needed) fold into ``enabled``; a guard whose ``else``
        only raises adds nothing (past it the test held); a ``with`` block runs its body once, as
        straight code does.  Any other enclosing control flow refuses: the scaler must exist
        wherever the step runs.  A lazy guard (``if self.optimizer is None:`` around the code that
        sets ``self.optimizer``) runs once in a method called many times: the scaler stays inside
        it when ``lazy_ok`` (an attribute that ``__init__`` makes disabled first), else refuses.

        ``read_after``: the condition is read only after the seed (autocast around what runs the
        model next), so a name the guard sets before the seed (``if args.amp: level = ...;
        initialize(model, opt_level=level)``) may stay where it is, when nothing else binds it:
        the guard's test comes first in the condition, and ``and`` reads the name only where the
        guard held and set it."""
        stmt = s.stmt
        unit = s.unit
        # a script's `if __name__ == "__main__":` is its main body, not a condition of AMP's
        unit = next((a for a in ancestors_stmts(stmt, unit) if is_main_guard(a)), unit)
        gs = guards(stmt, unit)
        home = self._optimizer_home(s) if not in_place else None
        if home is not None:
            # the optimizer is made in a block inside a loop: the scaler is made beside it
            inside = [a for a in ancestors_stmts(stmt, unit)]
            inside = inside[:next(i for i, a in enumerate(inside) if a is home) + 1] if home is not stmt else []
            gs = [g for g in gs if any(g is a for a in inside)]
        # `if deepspeed: ... else: initialize(...)` and `elif` chains: the branch's condition is
        # the negation of the tests before it; the scaler goes before the chain, enabled by it
        negs: List[ast.If] = []
        loops: List[ast.For] = []
        tries: List[ast.Try] = []
        for a in ancestors_stmts(stmt, unit):
            if home is not None and (a is home or not any(a is x for x in inside)):
                if a is home and isinstance(a, ast.If) and a not in gs:
                    negs.append(a)
                break
            if a in gs or isinstance(a, DEFS + (ast.With, ast.AsyncWith)):
                continue
            if isinstance(a, ast.If):  # stmt is in its else branch
                negs.append(a)
                continue
            if isinstance(a, ast.Try) and not a.finalbody and not a.orelse and a.handlers and \
                    all(terminates(h.body) or isinstance(h.body[-1], ast.Return) for h in a.handlers) and \
                    any(x is stmt or any(y is stmt for y in walk(x)) for x in a.body):
                # `try: from apex import amp; initialize(...)` / `except ...: print(...); return`:
                # what follows the try runs only where its body ran whole, as straight code
                continue
            before = _before_in(a, stmt)
            if before is not None and not a.finalbody and not a.orelse and a.handlers and \
                    all(_only_reports(h.body) for h in a.handlers) and \
                    all(isinstance(x, (ast.Import, ast.ImportFrom)) or _cannot_fail(x) for x in before):
                # `try: import apex.amp as amp; initialize(...)` / `except: logger.info("install
                # apex")`: only apex's import could fail before the seed (a log line or arithmetic
                # beside it does not), which native AMP cannot; the scaler is made where apex was
                # set up, and what follows it falls to the handler as before.  Where a statement
                # comes before the seed in the try, the scaler is made before the try: it then
                # exists wherever the step runs, whatever the body does
                if any(not isinstance(x, (ast.Import, ast.ImportFrom)) for x in before):
                    tries.append(a)
                continue
            if isinstance(a, ast.For) and home is None and not a.orelse:
                # a model and its optimizer initialized one by one in a loop (one objective each): one
                # scaler before the loop serves them all, as apex's one loss scaler did, when nothing
                # it is made from changes from one turn to the next
                loops.append(a)
                continue
            kind = {ast.For: "a `for` loop", ast.While: "a `while` loop"}.get(type(a), "a `try` statement")
            raise Refuse(f"line {stmt.lineno} runs inside {kind} (line {a.lineno}): the scaler must exist wherever "
                         f"the step runs; make it once, before, by hand")
        for i, gd in enumerate(gs):
            if assigned_in(gd.body, skip=stmt) & lazy_tested(gd.test):
                if not lazy_ok:
                    raise Refuse(f"line {stmt.lineno} runs once, under the `if` at line {gd.lineno} that tests what "
                                 "it sets: the scaler must exist wherever the step runs; make it once, before, "
                                 "by hand")
                gs = gs[:i]
                break
        around = [a for a in ancestors_stmts(stmt, unit) if a in gs or any(a is n for n in negs)
                  or any(a is n for n in loops) or any(a is t for t in tries)]
        top = around[-1] if around else stmt
        folded = [gd for gd in gs if not terminates(gd.orelse)]
        negated = [a for a in negs if not terminates(a.body)]
        reads = set(reads)
        for gd in folded + negated:
            reads |= read(gd.test)
        for lp in loops:
            changing = sorted((assigned_in([lp]) | {n.id for n in walk(lp.target) if isinstance(n, ast.Name)})
                              & (reads | read(ast.parse(enabled, mode="eval"))))
            if changing or any(gd for gd in gs + negs if any(gd is x for x in walk(lp))
                               and read(gd.test) & assigned_in([lp])):
                raise Refuse(f"line {stmt.lineno} runs inside a `for` loop (line {lp.lineno}) and its options read "
                             f"`{', '.join(changing) or 'what the loop sets'}`, which changes from one turn to the "
                             "next: make the scaler by hand")
            if any(isinstance(n, (ast.Break, ast.Continue)) for n in walk(lp)):
                raise Refuse(f"line {stmt.lineno} runs inside a `for` loop (line {lp.lineno}) that can stop early: "
                             "make the scaler once, before, by hand")
        # a name the enabled expression reads, set before the seed inside what the scaler moves out of
        # (nothing moves where the scaler is made in place, after a call that returns what apex set up)
        if top is not stmt and not in_place:
            for a in [stmt, *ancestors_stmts(stmt, unit)]:
                if a is top:
                    break
                owner, field, block = block_of(a)
                before = block[:next(i for i, x in enumerate(block) if x is a)]
                hit = sorted(assigned_in(before) & reads)
                if hit and read_after and self._set_once_under(hit, top, around, unit, stmt):
                    continue
                if hit:
                    raise SetInside(f"line {stmt.lineno}: `{', '.join(hit)}` is set inside the `{type(top).__name__.lower()}`"
                                 f" at line {top.lineno}, before it; make the scaler by hand")
        cond = fold_conditions(s.module, around, folded, negated, enabled)
        return top, cond

    @staticmethod
    def _set_once_under(names: List[str], top, around, unit, stmt) -> bool:
        """Each name is bound in ``unit`` only inside ``top``, the outermost of the ``if`` guards
        ``around`` the seed ``stmt``, and before it (so a condition that tests the guards first
        reads it only where the guard held and bound it, with the value apex was given)."""
        if not around or not all(isinstance(a, ast.If) for a in around):
            return False
        inside = {id(n) for n in walk(top)}
        for n in walk(unit):
            if isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, (ast.Store, ast.Del)) \
                    and (id(n) not in inside or (n.lineno, n.col_offset) > (stmt.lineno, stmt.col_offset)):
                return False
            if isinstance(n, ast.arg) and n.arg in names:
                return False
        return True

    def _optimizer_home(self, s: Seed):
        """The statement holding the seed in the block that makes its optimizer, when that block
        lies inside a loop (``for epoch ...: if epoch == start: optimizer = Adam(...); if fp16:
        initialize(...)``); None otherwise.

        A scaler made before that statement exists exactly when the optimizer does: every binding
        of the optimizer's name in the function is in that block, before it (or is the seed), and
        only ``if`` / ``with`` statements lie between it and the seed."""
        stmt, unit = s.stmt, s.unit
        chain = ancestors_stmts(stmt, unit)
        if not any(isinstance(a, (ast.For, ast.AsyncFor, ast.While)) for a in chain):
            return None
        opt = s.call.args[1] if len(s.call.args) > 1 else kwargs(s.call).get("optimizers")
        names = {dotted(opt)} if isinstance(opt, ast.Name) else set()
        names |= {t for t in s.target_names[1:] if t and "." not in t}
        if not names or len(names) > 1:
            return None
        name = next(iter(names))
        # every place that binds the name (a parameter binds it on entry)
        binds = [x for x in walk(unit) if isinstance(x, ast.Name) and x.id == name
                 and isinstance(x.ctx, (ast.Store, ast.Del))]
        if s.func is None:
            # a script's loop at module level (k-fold training: `for fold in ...: model = ...;
            # optimizer = ...; if fp16: initialize(...)`): a function of the module that declares
            # the name global binds it too, where the walk above does not look
            if any(isinstance(x, ast.Global) and name in x.names for x in walk(unit, into_functions=True)):
                return None
        elif name in s.func.positional or name in s.func.kwonly:
            return None
        for a in [stmt, *chain]:
            if isinstance(a, (ast.For, ast.AsyncFor, ast.While, ast.Try)) or isinstance(a, DEFS):
                return None
            owner, field, block = block_of(a)
            i = next(k for k, x in enumerate(block) if x is a)
            made = [x for x in block[:i] if name in assigned_in([x])]
            if not made:
                continue
            inside = {id(z) for y in [*block[:i], stmt] for z in walk(y)}
            ok = all(id(b) in inside for b in binds)
            return a if ok else None
        return None

    def _exported_options(self, s: Seed):
        """The options of the seed a virtual seed came from, said in its caller's terms."""
        orig, cs, telts, returned = s.exported_from
        enabled, notes, scaler_args, pure = self._options(orig)
        # an `if` around both the seed and every return the seed reaches held when the caller got
        # the seed's values (`if opt.is_train:` ... `return model, optimizers`): it says nothing more
        reached = returns_after(orig.func, orig.stmt)
        held = {id(a) for a in ancestors_stmts(orig.stmt, orig.unit) if isinstance(a, ast.If) and reached and all(
            _same_branch(a, orig.stmt, r) for r in reached)} | s.none_held
        gs = [g for g in guards(orig.stmt, orig.unit) if id(g) not in held]
        around = [a for a in ancestors_stmts(orig.stmt, orig.unit) if isinstance(a, ast.If) and id(a) not in held]
        negated = [a for a in around if a not in gs and not terminates(a.body)]
        # `if deepspeed: ... elif fairscale: ... else: <this seed>`: the branch's condition is the
        # negation of the tests before it, said in the caller's terms like the guards; a caller that
        # throws the optimizer away (`model, _ = setup(...)`) only evaluates and makes no scaler
        folded = [gd for gd in gs if not terminates(gd.orelse)]
        enabled = fold_conditions(orig.module, around, folded, negated, enabled)
        # a scaler option is `keyword=value`: only its value is said in the caller's terms
        mapped = [substitute(x, orig, cs) if i == 0 or "=" not in x.split("(")[0] else
                  x.split("=", 1)[0] + "=" + substitute(x.split("=", 1)[1], orig, cs)
                  for i, x in enumerate([enabled, *scaler_args])]
        return self._apex_values_tested(mapped[0], cs), notes, mapped[1:], pure

    def _apex_values_tested(self, text: str, cs) -> str:
        """``bool(amp)`` in a caller where ``amp`` is apex's amp under ``if args.fp16:`` and None
        otherwise: ``bool(args.fp16)`` (nothing reads the caller's amp after the migration)."""
        if cs.caller is None:
            return text
        tree = ast.parse(text, mode="eval")
        sem = cs.module.sem

        class Sub(ast.NodeTransformer):
            def visit_Name(self, node):
                scope = sem.scope_for(cs.caller.node)
                bs = scope.bindings.get(node.id, []) if scope is not None else []
                if not any(b.kind == "import" and (b.qname or "").startswith("apex") for b in bs):
                    return node
                test = apex_value_condition(sem, cs.caller.node, node.id)
                if test is None:
                    raise Refuse(f"`{node.id}` in `{cs.caller.qualname}` is apex's amp or something else; the "
                                 f"scaler's enabled= cannot be said without it: make the scaler by hand")
                tested.append(node.id)
                return ast.parse(cs.module.src.code(test), mode="eval").body

        tested: List[str] = []
        out = ast.unparse(Sub().visit(tree))
        for name in tested:
            self._apex_none_goes(cs, name)
        return quoted_as(text, out)

    def _apex_none_goes(self, cs, name: str) -> None:
        """``else: amp = None`` beside ``from apex import amp`` in the caller goes once every read of
        ``amp`` there is one of this migration's uses (the import goes with the tidy)."""
        sem = cs.module.sem
        scope = sem.scope_for(cs.caller.node)
        mine = {id(n) for n in self.g.uses.get(cs.module.path, ())}
        reads = [n for n in walk(cs.caller.node, into_functions=True) if isinstance(n, ast.Name) and n.id == name
                 and isinstance(n.ctx, ast.Load) and sem.resolve(name, sem.scope_of(n)) is scope]
        for n in reads:
            while id(n) not in mine and isinstance(getattr(n, "_p", None), ast.Attribute) and n._p.value is n:
                n = n._p
            if id(n) not in mine:
                return
        for b in scope.bindings.get(name, []):
            st = b.node
            while not isinstance(st, ast.stmt):
                st = getattr(st, "_p", None)
            if b.kind == "assign" and id(st) not in self.nones_gone:
                self.nones_gone.add(id(st))
                self.fc(cs.module).remove(st)

    def _half_model_before(self, s: Seed) -> None:
        """``if args.fp16: model.half()`` before ``model, optimizer = amp.initialize(model, ...)``:
        apex trained the float16 model (O1 patched around it); with native AMP it would stay
        float16 and GradScaler cannot unscale float16 gradients.  Refused, naming the line."""
        if s.models is None:
            return
        models = s.models.elts if isinstance(s.models, (ast.List, ast.Tuple)) else [s.models]
        names = {dotted(x) for x in models} - {None}
        if not names:
            return
        for n in walk(s.unit, into_functions=False):
            if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "half"
                    and not n.args and not n.keywords and n.lineno < s.stmt.lineno):
                continue
            if casts_one_of(n, names):
                raise Refuse(f"line {n.lineno} makes the model float16 (`{s.module.src.code(n)}`) before "
                             f"amp.initialize at line {s.use.line}: native AMP keeps the model float32 (GradScaler "
                             "cannot unscale float16 gradients); take that cast out by hand")

    def _training_seed(self, s: Seed) -> None:
        self._half_model_before(s)
        if getattr(s, "exported_from", None) is not None:
            enabled, notes, scaler_args, pure = self._exported_options(s)
        else:
            enabled, notes, scaler_args, pure = self._options(s)
        self.notes |= notes
        m = s.module
        fc = self.fc(m)
        if pure and self.bf16:
            raise Refuse("opt_level O3 is pure float16: with --dtype bfloat16 convert the model by hand "
                         "(model.to(torch.bfloat16))")
        if pure:
            self.pure = True
            self._pure_fp16(s)
            return
        if self.bf16:
            self.notes -= {n for n in notes if "loss scale" in n or "loss_scale" in n}
            if "loss_scale" in kwargs(s.call if getattr(s, "exported_from", None) is None else s.exported_from[0].call):
                self.notes.add("bfloat16 needs no loss scaling: apex's loss_scale has no counterpart")
        if getattr(s, "exported_from", None) is not None:
            at, cond = self._hoist(s, enabled, set(), in_place=True)
            self.made_line[s.idx] = s.stmt.lineno
            target = self._scaler_target(s)
            col = m.src.char_col(s.stmt.lineno, s.stmt.col_offset)
            # made beside the call, inside the caller's own `if args.do_train:`: that test holds
            # there, and says nothing in the scaler's enabled= (the regions elsewhere still read it)
            args = [*scaler_args, *([f"enabled={enabled}"] if enabled != "True" else [])]
            made = self._made(target, args, enabled, col)
            self.enabled[s.idx] = cond
            # two initialize calls of one setup (a generator's and a discriminator's optimizers)
            # arrive at the same call: one scaler serves both, as apex's one loss scaler did
            done = self.made_at
            key = (m.path, id(s.stmt))
            if key in done:
                if done[key] != made:
                    raise Refuse(f"`{s.exported_from[0].func.qualname}` initializes apex twice with different options: "
                                 "make the scaler by hand")
                return
            done[key] = made
            if made and self._made_already(s, target, made):
                return
            if made and getattr(s, "before_call", False):
                fc.insert_before(s.stmt, [made])
            elif made:
                fc.insert_after(s.stmt, [made])
            if target.startswith("self."):
                self._default_in_init(s)
            return
        target = self._scaler_target(s)
        lazy_ok = target.startswith("self.")
        try:
            at, cond = self._hoist(s, enabled, option_reads(s.call, self.bf16) | self._initial_scale_reads(m),
                                   lazy_ok)
        except SetInside:
            self.made_line[s.idx] = s.stmt.lineno
            self._in_place_with_default(s, target, enabled, scaler_args)
            return
        if at is not s.stmt and self._options_only_under_guard(s):
            # `opt_level=params["amp"]["opt_level"]` under `if "amp" in params:`: read before the
            # guard, the options would fail where AMP is off
            self.made_line[s.idx] = s.stmt.lineno
            self._in_place_with_default(s, target, enabled, scaler_args)
            return
        self.made_line[s.idx] = at.lineno
        if lazy_ok and guards(s.stmt, s.unit) and at is not guards(s.stmt, s.unit)[-1]:
            self.must_default.add(id(s.func.cls))  # made under a lazy guard: __init__ makes a disabled one
        self.enabled[s.idx] = cond
        scaler_args = self._with_initial_scale(s, scaler_args)
        key = (m.path, id(at), target)
        if at is not s.stmt and key in self.made_before:
            # `if n_gpu > 1: ...initialize... else: ...initialize...`: one scaler, made once, on
            # whichever branch runs (a second one made right after would replace the first)
            first = self.made_before[key]
            if first["args"] != scaler_args:
                # `if args.loss_scale == 0: initialize(..., loss_scale="dynamic") else: initialize(...,
                # loss_scale=args.loss_scale)` (NVIDIA's BERT scripts): each option as the branch chose it
                scaler_args = self._with_initial_scale(s, self._options_by_branch(first, s, scaler_args))
            cond = disj(first["cond"], cond)
            args = [*scaler_args, *([f"enabled={cond}"] if cond != "True" else [])]
            made = self._made(target, args, cond, m.src.char_col(at.lineno, at.col_offset))
            fc.restate_inserted(first["made"], made)
            first.update(cond=cond, made=made)
            for idx in first["seeds"]:
                self.enabled[idx] = cond
            first["seeds"].append(s.idx)
            self.enabled[s.idx] = cond
            self._seed_statement_goes(s)
            if target.startswith("self."):
                self._default_in_init(s)
            return
        args = [*scaler_args, *([f"enabled={cond}"] if cond != "True" else [])]
        col = m.src.char_col(at.lineno, at.col_offset)
        made = self._made(target, args, cond, col)
        if at is not s.stmt and made:
            self.made_before[key] = {"args": list(scaler_args), "cond": cond, "made": made, "line": s.use.line,
                                     "seeds": [s.idx], "seed": s}
        after = self._reassign(s)
        if at is s.stmt or not made:
            if made or after:
                fc.replace_statement(s.stmt, [*([made] if made else []), *after])
            else:
                fc.remove(s.stmt, described=True)
                self._dummy_optimizer_goes(s)
        else:
            fc.insert_before(at, [made])
            # `if comm.get_world_size() > 1: <initialize>`: the scaler made right before the `if`
            # evaluates its test now (`enabled=comm.get_world_size() > 1`); emptied, it goes
            chain = [s.stmt, *ancestors_stmts(s.stmt, s.unit)]
            top = next((i for i, a in enumerate(chain) if a is at), 0)
            for a in chain[1:top + 1]:
                if isinstance(a, ast.If) and m.src.code(a.test) in made:
                    fc.tests_moved.add(id(a))
            self._seed_statement_goes(s, after)
        if target.startswith("self."):
            self._default_in_init(s)

    def _seed_statement_goes(self, s: Seed, after: Optional[List[str]] = None) -> None:
        """The initialize statement goes (its targets keep what it changed: ``_reassign``), and an
        optimizer made only for it goes with it."""
        after = self._reassign(s) if after is None else after
        if self._else_says_the_same(s, after):
            return
        if after:
            self.fc(s.module).replace_statement(s.stmt, after)
        else:
            fc = self.fc(s.module)
            fc.remove(s.stmt, described=True)
            owner = block_of(s.stmt)[0]
            # (not when the scaler is made right before that block's owner: the owner goes later)
            if isinstance(owner, ast.stmt) and not fc.inserted_before(owner):
                for st in self._apex_setup_beside(s):
                    if id(st) not in fc.touched:
                        fc.remove(st, described=True)
            self._dummy_optimizer_goes(s)

    @staticmethod
    def _apex_setup_beside(s: Seed) -> List[ast.stmt]:
        """The rest of the initialize's block when it is all apex's setup: its imports, ``global``
        declarations of the names they bind, log lines that speak of apex (``if is_apex: global amp;
        from apex import amp; model, opt = amp.initialize(...)``).  They go with the initialize in
        one step, so the emptied block's comment above it (``# Do training in mixed precision``)
        goes with it as one describing it; the import tidy would have left that comment behind."""
        owner, _, block = block_of(s.stmt)
        if owner is None or isinstance(owner, ast.Module):
            return []
        others = [x for x in block if x is not s.stmt]
        names = {(a.asname or a.name).split(".")[0] for x in others if imports_apex(x) for a in x.names}
        if not others or not all(imports_apex(x) or reports_apex(x) or (
                isinstance(x, ast.Global) and set(x.names) <= names) for x in others):
            return []
        return others

    def _else_says_the_same(self, s: Seed, after: List[str]) -> bool:
        """``if opt_level: self.model, self.optimizer = amp.initialize(model, optimizer, ...)`` with
        ``else: self.model, self.optimizer = model, optimizer``: once initialize goes both branches
        assign the same, so the ``if`` becomes that assignment (a log line in the apex branch that
        speaks of apex goes with it).  Only where the test has no side effects and every comment
        in the ``if`` speaks of mixed precision; True when so rewritten."""
        from ampfix.engine.noqa import comment_of
        from ampfix.engine.tidy import pure, reports_apex, speaks_of_mixed_precision

        g = getattr(s.stmt, "_p", None)
        if len(after) != 1 or not isinstance(g, ast.If) or not any(x is s.stmt for x in g.body) or \
                len(g.orelse) != 1 or not pure(g.test):
            return False
        fc = self.fc(s.module)
        if fc.b.is_elif(g) or id(g) in fc.touched:
            return False
        try:
            made = ast.parse(after[0]).body
        except SyntaxError:
            return False
        if len(made) != 1 or ast.dump(made[0]) != ast.dump(g.orelse[0]):
            return False
        if not all(x is s.stmt or reports_apex(x) for x in g.body):
            return False
        src = s.module.src
        for no in range(g.lineno, g.end_lineno + 1):
            said = comment_of(src.line_text(no), False)
            if said is not None and not speaks_of_mixed_precision(said):
                return False
        fc.replace_statement(g, after)
        return True

    #: GradScaler's defaults, for an option one branch sets and the other leaves
    _SCALER_DEFAULTS = {"init_scale": "2.0**16", "growth_interval": "2000", "growth_factor": "2.0",
                        "backoff_factor": "0.5"}

    def _options_by_branch(self, first: dict, s: Seed, args: List[str]) -> List[str]:
        """The scaler's options when two initialize calls in the two branches of one ``if`` set
        them differently: ``name=<first's> if <test> else <second's>``."""
        a, b = first["seed"].stmt, s.stmt
        gd = next((x for x in ancestors_stmts(a, s.unit) if isinstance(x, ast.If)
                   and any(y is a or any(z is a for z in walk(y)) for y in x.body)
                   and any(y is b or any(z is b for z in walk(y)) for y in x.orelse)), None)
        if gd is None:
            raise Refuse(f"amp.initialize at lines {first['line']} and {s.use.line} make scalers with different "
                         "options in one place: make the scaler by hand")
        code = s.module.src.code
        test = code(gd.test)
        ka, kb = kwargs(first["seed"].call), kwargs(s.call)
        same = [code(x) for x in first["seed"].call.args] == [code(x) for x in s.call.args] and \
            {k: code(v) for k, v in ka.items() if k != "loss_scale"} == \
            {k: code(v) for k, v in kb.items() if k != "loss_scale"}
        if same:
            # the branches differ by their loss scale alone: one choice between them, said as
            # apex's `"dynamic" if test else value` would be (the test folds where it restates it)
            choice = ast.IfExp(test=gd.test, body=ka.get("loss_scale", ast.Constant("dynamic")),
                               orelse=kb.get("loss_scale", ast.Constant("dynamic")))
            notes: Set[str] = set()
            out = [x for x in first["args"] if not x.startswith(("init_scale=", "growth_interval="))]
            out = loss_scale_args(choice, code, notes) + out
            self.notes |= notes
            return out

        def split(xs):
            out = {}
            for x in xs:
                k, _, v = x.partition("=")
                if not _ or k in out:
                    raise Refuse(f"amp.initialize at lines {first['line']} and {s.use.line}: option `{x}` cannot be "
                                 "chosen by branch; make the scaler by hand")
                out[k] = v
            return out

        one, two = split(first["args"]), split(args)
        merged = []
        for k in [*one, *(k for k in two if k not in one)]:
            va, vb = one.get(k, self._SCALER_DEFAULTS.get(k)), two.get(k, self._SCALER_DEFAULTS.get(k))
            if va is None or vb is None:
                raise Refuse(f"amp.initialize at lines {first['line']} and {s.use.line}: `{k}` has no value in one "
                             "branch; make the scaler by hand")
            merged.append(f"{k}={va}" if va == vb else f"{k}={va} if {test} else {vb}")
        self.notes.add("the scaler's options follow the branch of the `if` that chose apex's")
        return merged

    def _dummy_optimizer_goes(self, s: Seed) -> None:
        """``optimizer_ema = torch.optim.SGD(model_ema.parameters(), lr=0)`` made only to hand
        ``amp.initialize`` an optimizer for a second model (CMC's momentum encoder): nothing else
        in the function reads it, so it goes with the initialize."""
        opt = s.optimizers
        if not isinstance(opt, ast.Name) or s.func is None:
            return
        name = opt.id
        inside = {id(n) for n in walk(s.stmt)}
        every = list(walk(s.func.node, into_functions=True))  # closures read it too
        reads = [n for n in every if isinstance(n, ast.Name) and n.id == name and id(n) not in inside
                 and not isinstance(n.ctx, ast.Store)]
        binds = [n for n in every if isinstance(n, ast.Name) and n.id == name and id(n) not in inside
                 and isinstance(n.ctx, ast.Store)]
        if any(isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names for n in every):
            return
        if reads or len(binds) != 1 or name in s.func.positional or name in s.func.kwonly:
            return
        st = stmt_of(binds[0])
        if not (isinstance(st, ast.Assign) and len(st.targets) == 1 and st.targets[0] is binds[0]
                and isinstance(st.value, ast.Call) and (dotted(st.value.func) or "").split(".")[-1] in OPTIMIZERS):
            return
        self.fc(s.module).remove(st)
        self.notes.add(f"`{name}` was made only for amp.initialize: it goes with it")

    @staticmethod
    def _options_only_under_guard(s: Seed) -> bool:
        """An option of initialize that may only be read where its guard holds: an item
        (``params["amp"]``) or a call, which can fail where AMP is off; names and attributes can not."""
        opts = [k.value for k in s.call.keywords if k.arg in ("opt_level", "loss_scale", "enabled")]
        return any(isinstance(n, (ast.Subscript, ast.Call)) for o in opts for n in [o, *walk(o)])

    def _in_place_with_default(self, s: Seed, target: str, enabled: str, scaler_args: List[str]) -> None:
        """``if amp: loss_scale = ...; initialize(..., loss_scale=loss_scale)``: the scaler is made
        where initialize was (its options are known only there), and a disabled one before the
        guard, so that the step finds one on every path; autocast follows the scaler."""
        m = s.module
        fc = self.fc(m)
        gs = guards(s.stmt, s.unit)
        ifs = []
        # the optimizer made in a loop's body (a fold loop: `for fold ...: optimizer = ...; if fp16:
        # <options>; initialize(...)`): the scalers go beside it, a fresh one per optimizer as
        # apex's initialize made a fresh loss scaler; what encloses that block does not matter
        home = self._optimizer_home(s)
        for a in ancestors_stmts(s.stmt, s.unit):
            # an `elif` (the `else` of an `if`) holds it like a guard: a disabled scaler made
            # before the outermost `if` is there on every path
            if isinstance(a, ast.If):
                ifs.append(a)
            elif not isinstance(a, DEFS + (ast.With, ast.AsyncWith)):
                raise Refuse(f"line {s.stmt.lineno}: the scaler's options are set inside the `{type(a).__name__.lower()}`"
                             f" at line {a.lineno}; make the scaler by hand")
            if a is home:
                break
        top = ifs[-1] if ifs else gs[-1]
        args = [*scaler_args, *([f"enabled={enabled}"] if enabled != "True" else [])]
        col = m.src.char_col(s.stmt.lineno, s.stmt.col_offset)
        made = self._made(target, args, enabled, col, always=True)
        first = []
        ls = kwargs(s.call).get("loss_scale")
        taken = {n.id for n in walk(s.unit) if isinstance(n, ast.Name)} | {
            a.arg for a in ast.walk(s.unit.args) if isinstance(a, ast.arg)} if hasattr(s.unit, "args") else set()
        if made and isinstance(ls, ast.Subscript) and "loss_scale" not in taken and not self.bf16:
            # `params["amp"]["loss_scale"]` read three times in the scaler's options: once, by name
            v = m.src.code(ls)
            first = [f"loss_scale = {v}"]
            args = [a.replace(v, "loss_scale") for a in args]
            test = 'loss_scale in (None, 0, "dynamic")'
            if "dynamic" not in taken and sum(test in a for a in args) > 1:
                first.append(f"dynamic = {test}")
                args = [a.replace(test, "dynamic") for a in args]
            made = self._made(target, args, enabled, col, always=True)
        fc.replace_statement(s.stmt, [*first, made, *self._reassign(s)])
        if target.startswith("self.") and s.func.node.name != "__init__":
            self.must_default.add(id(s.func.cls))
            self._default_in_init(s)
        else:
            fc.insert_before(top, [self._disabled(target)])
        self.enabled[s.idx] = target if self.bf16 else f"{target}.is_enabled()"
        self.notes.add("the scaler's options are computed under the `if`: it is made there, a disabled one before")

    def _made(self, target: str, args: List[str], cond: str, col: int, always: bool = False) -> Optional[str]:
        """The statement that makes the scaler; with bfloat16, the flag that says whether AMP is on
        (none where every use reads the seed's own condition)."""
        if self.bf16:
            if not (always or target.startswith("self.") or self.needs_flag()):
                return None
            return f"{target} = {cond}"
        return f"{target} = {scaler_call(self.s, args, col, target + ' = ')}"

    def _disabled(self, target: str) -> str:
        return f"{target} = False" if self.bf16 else f"{target} = {scaler_call(self.s, ['enabled=False'])}"

    def _scaler_target(self, s: Seed) -> str:
        c = self.solver.solve(s.module, s.func)
        return c.expr if c is not None else self.name

    def _default_in_init(self, s: Seed) -> None:
        """``self.scaler`` made in a method other than ``__init__``: ``__init__`` makes a disabled one
        first, so that the other methods always find it."""
        f = s.func
        if id(f.cls) in self.default_made or f.node.name == "__init__" or (
                self._called_from_init(f) and id(f.cls) not in self.must_default):
            return
        if self._used_only_in(f) and not self.p.mentioned_elsewhere(self.name):
            return  # the method that makes it is the only one that reads it: no other can miss it
        self.default_made.add(id(f.cls))
        init = next((x for x in f.cls.body if isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and x.name == "__init__"), None)
        if init is None and self._ancestor_makes_default(s):
            self.notes.add(f"`{f.cls.name}` inherits the disabled `{self.name}` its base class's __init__ makes")
            return
        if init is None:
            # no __init__ of its own (a subclass, a trainer set up by a framework): a disabled one
            # as a class attribute, which the instance's own replaces where the method makes it
            body = code_body(f.cls.body)
            if not body or any(isinstance(d, (ast.Name, ast.Attribute, ast.Call)) and "dataclass" in (
                    dotted(d.func if isinstance(d, ast.Call) else d) or "") for d in f.cls.decorator_list):
                raise Refuse(f"`self.{self.name}` is made in `{f.qualname}` and the class has no __init__ to make a "
                             "disabled one first")
            blank = [""] if isinstance(body[0], (*DEFS,)) else []
            self.fc(s.module).insert_before(body[0], [self._disabled(self.name), *blank])
            self.notes.add(f"`{f.cls.name}` has no __init__: a disabled `{self.name}` is its class attribute, the "
                           "instance's own replaces it where it is made")
            return
        body = code_body(init.body)
        first = body[0] if body else init.body[0]
        # after super().__init__(...)
        for i, b in enumerate(body):
            if isinstance(b, ast.Expr) and method_call(b.value, "__init__"):
                first = body[i + 1] if i + 1 < len(body) else None
                if first is None:
                    self.fc(s.module).insert_after(b, [self._disabled(f"self.{self.name}")])
                    return
        self.fc(s.module).insert_before(first, [self._disabled(f"self.{self.name}")])

    def _ancestor_makes_default(self, s: Seed) -> bool:
        """A seed of this group in a method of the same name of a class ``s``'s class inherits, where
        that class has an __init__ of its own (the disabled default goes there, for both)."""
        f = s.func
        for mod, cls in self.p.ancestors(s.module, f.cls):
            for o in self.g.seeds:
                if o is not s and getattr(o, "func", None) is not None and o.func.cls is cls and \
                        o.func.node.name == f.node.name and any(
                            isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef)) and x.name == "__init__"
                            for x in cls.body):
                    if id(cls) not in self.default_made:
                        self._default_in_init(o)
                    return id(cls) in self.default_made
        return False

    def _used_only_in(self, f) -> bool:
        """Every use the scaler serves lies in ``f`` (the method that makes it), and nothing else
        in the project reads ``self.<scaler>``."""
        if not self.g.needs or any(u.func is not f for u, _ in self.g.needs):
            return False
        attr = "." + self.name
        for m in self.p.modules.values():
            if attr in m.src.text and any(isinstance(n, ast.Attribute) and n.attr == self.name
                                          for n in walk(m.tree, into_functions=True)):
                return False
        return True

    def _called_from_init(self, f) -> bool:
        """Called unconditionally from its class's __init__: self.scaler always exists then."""
        for cs in self.p.callers(f):
            if cs.caller is not None and cs.caller.node.name == "__init__" and cs.caller.cls is f.cls:
                st = stmt_of(cs.node)
                if not guards(st, cs.caller.node) and not any(
                        isinstance(a, (ast.If, ast.For, ast.While, ast.Try, ast.With))
                        for a in ancestors_stmts(st, cs.caller.node)):
                    return True
        return False

    def _reassign(self, s: Seed) -> List[str]:
        """``a, b = amp.initialize(m, o)``: what the targets receive instead (nothing when they are
        the arguments themselves)."""
        assign = s.stmt
        code = s.module.src.code
        if isinstance(assign, ast.Expr) and assign.value is s.use.call:
            return []
        if not (isinstance(assign, ast.Assign) and assign.value is s.use.call and len(assign.targets) == 1):
            raise Refuse(f"amp.initialize at line {s.use.line} is not a statement of its own")
        target = (s.unpack or assign).targets[0]
        # `amp.initialize(model, None, ...)` returns the model alone, as with no optimizers at all
        src = [s.models] + ([s.optimizers] if s.optimizers is not None and not is_const(s.optimizers, None)
                            and not s.optimizer_none else [])
        tnodes = list(target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target])
        if len(src) == 1 and isinstance(s.models, (ast.List, ast.Tuple)) and len(tnodes) == len(s.models.elts) > 1:
            # `model, teacher = amp.initialize([model, teacher], opt_level=...)`: the list of models
            # comes back, unpacked into the targets one by one
            src = list(s.models.elts)
        # `m, [o1, o2] = amp.initialize(m, [a, b])`: pair the inner lists element by element
        flat_t, flat_s = [], []
        for t, v in zip(tnodes, src):
            if isinstance(t, (ast.List, ast.Tuple)) and isinstance(v, (ast.List, ast.Tuple)) and len(t.elts) == len(v.elts):
                flat_t += t.elts
                flat_s += v.elts
            else:
                flat_t.append(t)
                flat_s.append(v)
        if len(tnodes) == len(src):
            tnodes, src = flat_t, flat_s
        tnames = [code(e) for e in tnodes]
        snames = [code(e) for e in src]
        if len(tnames) == len(snames):
            pairs = [(t, v) for t, v in zip(tnames, snames) if t != v and t != "_"]
            if s.func is not None:
                # a local the function never reads again (YOLOX: `model, optimizer = amp.initialize(
                # model, self.optimizer)`, apex patching self.optimizer in place): nothing to receive
                read = {n.id for n in walk(s.func.node, into_functions=True)
                        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
                declared = {x for n in walk(s.func.node) if isinstance(n, (ast.Global, ast.Nonlocal)) for x in n.names}
                pairs = [(t, v) for t, v in pairs if not t.isidentifier() or t in read or t in declared]
                pairs = self._without_write_backs(s, pairs)
                pairs = [(t, v) for t, v in pairs if not self._already_holds(s, t, v)]
            elif pairs:
                # a script's module level: only what is written back where it came from goes (a
                # name read nowhere else may still be imported from the script)
                pairs = self._without_write_backs(s, pairs)
            if not pairs:
                return []
            return [f"{', '.join(t for t, _ in pairs)} = {', '.join(v for _, v in pairs)}"]
        if len(tnames) == 1 and len(snames) > 1:
            return [f"{tnames[0]} = {', '.join(snames)}"]
        raise Refuse(f"amp.initialize at line {s.use.line} assigns {len(tnames)} names from {len(snames)} values")

    @staticmethod
    def _already_holds(s: Seed, t: str, v: str) -> bool:
        """``self.model = model`` at the top of the function, before the seed, and nothing between
        them rebinds either (an assignment, or a call on ``self`` that might): once initialize
        goes, ``self.model, self.optimizer = model, optimizer`` would write what is there."""
        if not (v.isidentifier() and t.startswith("self.") and t[5:].isidentifier()):
            return False
        body = s.func.node.body
        start = next((x for x in body if isinstance(x, ast.Assign) and len(x.targets) == 1 and
                      dotted(x.targets[0]) == t and isinstance(x.value, ast.Name) and x.value.id == v
                      and x.end_lineno < s.stmt.lineno), None)
        if start is None:
            return False
        for n in walk(s.func.node):
            line = getattr(n, "lineno", None)
            if line is None or not (start.end_lineno < line < s.stmt.lineno):
                continue
            if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, (ast.Store, ast.Del)) and \
                    dotted(n) in (t, v):
                return False
            if isinstance(n, ast.Call) and any(isinstance(x, ast.Name) and x.id == "self"
                                               for a in [n.func, *n.args, *(k.value for k in n.keywords)]
                                               for x in [a, *walk(a)]):
                return False
        return True

    def _without_write_backs(self, s: Seed, pairs):
        """``model, optimizer = amp.initialize(models[i], optimizers[i])`` followed by
        ``models[i] = model; optimizers[i] = optimizer`` (sentence-transformers' loop over its
        objectives): once initialize goes, each pair only writes a value back where it came
        from; the pair and its write-back go (a loop left empty goes with them), where the local
        is read by nothing else in the function."""
        _, _, block = block_of(s.stmt)
        i = next((k for k, x in enumerate(block) if x is s.stmt), None)
        if i is None:
            return pairs
        code = s.module.src.code
        unit = s.func.node if s.func is not None else s.module.tree
        end = s.stmt.end_lineno

        def dead_after(t: str, back, checks=()) -> bool:
            """Every later read of ``t`` comes after a new assignment that always runs first; no
            read before the seed runs again in a loop around it."""
            stores = [x for x in walk(unit) if isinstance(x, ast.stmt) and x is not back and x.lineno > end
                      and t in assigned(x)]
            around = loops_around(s.stmt, unit)
            skipped = {id(y) for c in checks for y in walk(c)}
            for n in walk(unit, into_functions=True):
                if not (isinstance(n, ast.Name) and n.id == t and isinstance(n.ctx, ast.Load)) or n is back.value \
                        or id(n) in skipped:
                    continue
                if n.lineno <= end:
                    if any(any(n is y for y in walk(lp)) for lp in around):
                        return False
                    continue
                if not any(dominates(a, n) for a in stores):
                    return False
            return True
        # the statements right after it that write a pair's target back where its value came from
        # (`models[i] = model`), or unpack it into the names it was made of (HGN: `models, opt =
        # amp.initialize([encoder, model], opt)`, `assert len(models) == 2`, `encoder, model =
        # models`), with the checks of the target between
        def unpacks(x, t: str, v: str) -> bool:
            try:
                made = ast.parse(v, mode="eval").body
            except SyntaxError:
                return False
            tgt = x.targets[0]
            return isinstance(made, (ast.List, ast.Tuple)) and isinstance(tgt, (ast.Tuple, ast.List)) and \
                [ast.unparse(e) for e in tgt.elts] == [ast.unparse(e) for e in made.elts]

        names = {t for t, _ in pairs}
        following, checks = [], []
        for x in block[i + 1:]:
            if isinstance(x, ast.Assert) and read(x) and read(x) <= names | {"len"}:
                checks.append(x)
                continue
            if not (isinstance(x, ast.Assign) and len(x.targets) == 1 and isinstance(x.value, ast.Name)
                    and ((x.value.id, code(x.targets[0])) in pairs
                         or any(x.value.id == t and unpacks(x, t, v) for t, v in pairs))):
                break
            following.append(x)
        kept, backs = [], []
        for t, v in pairs:
            back = next((x for x in following if x.value.id == t and (code(x.targets[0]) == v or unpacks(x, t, v))),
                        None)
            if back is not None and t.isidentifier() and dead_after(t, back, checks):
                backs.append(back)
            else:
                kept.append((t, v))
        if kept and backs:  # all or nothing: a half-kept unpacking reads worse than the original
            return pairs
        if backs:
            backs += [c for c in checks if read(c) - {"len"} <= {b.value.id for b in backs}]
        for b in backs:
            if id(b) not in self.write_backs_gone:
                self.write_backs_gone.add(id(b))
                self.fc(s.module).remove(b)
        return kept

    def _pure_fp16(self, s: Seed) -> None:
        """O3: the model itself in float16, and apex's cast of floating-point inputs kept as a
        forward pre-hook."""
        models = s.models
        if isinstance(models, (ast.List, ast.Tuple)):
            raise Refuse("opt_level O3 with a list of models: convert each with .half() by hand")
        code = s.module.src.code
        m = code(models)
        out = [f"{m} = {m}.half()",
               f"{m}.register_forward_pre_hook(lambda module, args: tuple(\n"
               f"    a.half() if torch.is_tensor(a) and a.is_floating_point() else a for a in args))"]
        assign = s.stmt
        if isinstance(assign, ast.Assign) and len(assign.targets) == 1:
            target = assign.targets[0]
            tnames = [code(e) for e in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target])]
            vals = [m] + ([code(s.optimizers)] if s.optimizers is not None and not is_const(s.optimizers, None)
                          else [])
            if len(tnames) == len(vals):
                pairs = [(t, v) for t, v in zip(tnames, vals) if t != v and t != "_"]
                if pairs:
                    out.append(f"{', '.join(t for t, _ in pairs)} = {', '.join(v for _, v in pairs)}")
            elif tnames != [m]:
                raise Refuse(f"amp.initialize at line {s.use.line} assigns {len(tnames)} names from {len(vals)} values")
        elif not isinstance(assign, ast.Expr):
            raise Refuse(f"amp.initialize at line {s.use.line} is not a statement of its own")
        for a in ancestors_stmts(s.stmt, s.unit):
            if not isinstance(a, (ast.If, *DEFS)):
                raise Refuse(f"opt_level O3 inside a loop, with or try (line {a.lineno}): convert the model with "
                             ".half() by hand")
        # nothing else needs it: the model becomes float16 where apex made it so (under its guard)
        self.fc(s.module).replace_statement(s.stmt, out)
        self.g.note_at_anchor = ("O3 is pure float16: migrate makes it model.half(), with no master weights and no "
                                 "loss scaling; opt_level O1's autocast is the safer choice")

    def _inference_seed(self, s: Seed) -> None:
        """``model = amp.initialize(model, opt_level=...)`` with no optimizer: what uses the model
        after it runs under autocast (or the model is .half() for O3)."""
        moved = getattr(s, "exported_from", None) is not None
        enabled, notes, scaler_args, pure = self._exported_options(s) if moved else self._options(s)
        self.notes |= {n for n in notes if "loss" not in n}
        if pure and self.bf16:
            raise Refuse("opt_level O3 is pure float16: with --dtype bfloat16 convert the model by hand "
                         "(model.to(torch.bfloat16))")
        if pure:
            if moved:
                raise Refuse(f"opt_level O3 in `{s.exported_from[0].func.qualname}`: convert the model with .half() "
                             "by hand where it is called")
            self.pure = True
            self._pure_fp16(s)
            return
        fc = self.fc(s.module)
        twin = next((t for t in self.g.seeds if t is not s and t.training and t.module is s.module and
                     t.func is s.func and s.func is not None and not getattr(t, "exported", False) and
                     not getattr(t, "exported_from", None)), None)
        if twin is not None and not moved:
            # `model_ema = amp.initialize(model_ema)` beside the trained model's initialize (a
            # momentum encoder, the teachers of a distillation): apex was on for the whole
            # process; where this model runs with the trained one, the training autocast covers it
            self._seed_statement_goes(s)
            self.notes.add(f"the model initialized at line {s.use.line} runs under the training step's autocast")
            self.twins.add(s.module.path)
            try:  # its condition, for the evaluation calls after it (an `else:` that only evaluates)
                self.enabled[s.idx] = self._hoist(s, enabled, option_reads(s.call))[1]
            except Refuse:
                pass
            return
        at, cond = self._hoist(s, enabled, set() if moved else option_reads(s.call), in_place=moved,
                               read_after=True)
        if not moved:
            after = self._reassign(s)
            if after:
                fc.replace_statement(s.stmt, after)
            else:
                fc.remove(s.stmt, described=True)
            self._optimizer_made_for_apex_goes(s)
        else:
            # the regions lie in the caller's block of the call, where its own guards hold
            at, cond = s.stmt, enabled
        model_names = s.model_names
        returned = s.func is not None and not moved and any(
            isinstance(r, ast.Return) and r.value is not None and r.lineno > s.stmt.lineno
            and read(r.value) & (model_names | set(t for t in s.target_names if t))
            for r in walk(s.func.node))
        # apex patched torch for what ran after it: autocast covers the statements from the first
        # that runs the model (or an object built from it) to the last such one, in the seed's own
        # block (`if __name__ == "__main__":` ... initialize ... the evaluation loop), else in the
        # block of each statement around it up to where the scaler's condition is said
        levels = [s.stmt] if at is s.stmt else [s.stmt, *ancestors_stmts(s.stmt, s.unit)]
        levels = levels[:next((k for k, x in enumerate(levels) if x is at), len(levels) - 1) + 1]
        regions, block = [], None
        for level in levels:
            owner, field, block = block_of(level)
            idx = next(i for i, x in enumerate(block) if x is level)
            held = set(model_names) | self._owners(s, model_names)
            kept_by: Dict[str, list] = {}
            touching = []
            for j in range(idx + 1, len(block)):
                x = block[j]
                if isinstance(x, ast.Return):
                    break
                if self._under_autocast(x):
                    continue
                if self._uses_model(x, held, kept_by) or self._calls_on(x, held - model_names, kept_by):
                    if isinstance(x, DEFS) or any(method_call(n, "backward") for n in walk(x)):
                        raise Refuse(f"the model initialized at line {s.use.line} is trained at line {x.lineno} "
                                     "without amp.scale_loss: add the scaled backward by hand")
                    touching.append(j)
                held |= self._holders(x, held, kept_by)
            while touching and self._only_configures(block[touching[0]], model_names):
                touching.pop(0)
            if touching:
                regions = self._narrowed(block, self._runs(block, touching), held, model_names, kept_by)
                if level is not levels[-1] and not moved:
                    # inside every `if` the scaler's condition folded in: only the options' own
                    cond = enabled
                break
        if not regions:
            raise Refuse(f"nothing uses the model after amp.initialize at line {s.use.line} in this function, so "
                         "autocast has no forward to cover")
        names = model_names | set(t for t in s.target_names if t)
        if returned and not any(
                isinstance(n, ast.Call) and (dotted(n.func) in names or (
                    not isinstance(n.func, ast.Attribute) and any(dotted(a) in names for a in n.args)))
                for b, i, j in regions for st in b[i:j + 1] for n in [st, *walk(st)]):
            # allennlp's `Model._load`: nothing here runs the model (`model.extend_embedder_vocab()`);
            # apex's casting reached its forward passes in the callers, which a region here misses
            raise Refuse(f"the model initialized at line {s.use.line} for inference is returned: its forward passes "
                         "run in the callers; wrap them in torch.autocast by hand")
        for b, i, j in regions:
            self._add_region(s.module, b, i, j, autocast_call(self.s, cond))
        self.g.note_at_anchor = "inference: the model's forward runs under autocast (no GradScaler: nothing trains)"

    def _runs(self, block, touching: List[int]) -> List[Tuple[int, int]]:
        """One region per run of statements that run the model: what lies between two runs
        (results written to files, logging) stays outside."""
        regions: List[Tuple[int, int]] = []
        for j in touching:
            if regions and (j == regions[-1][1] + 1 or all(
                    self._blank_between(block[k]) for k in range(regions[-1][1] + 1, j))):
                regions[-1] = (regions[-1][0], j)
            else:
                regions.append((j, j))
        return regions

    def _narrowed(self, block, runs, held: Set[str], model_names: Set[str], kept_by: Dict[str, list]) -> List[tuple]:
        """(block, first, last) for each run; a run that is one loop (``while True: q = input();
        ... emb = model.encode(q); ... print(hits)``) gives the runs in its body instead, so that the
        prompt, the search and the printing stay outside autocast as a person would write it."""
        out = []
        for i, j in runs:
            loop = block[i]
            if i == j and isinstance(loop, (ast.For, ast.While)) and not loop.orelse:
                inner_held = set(held)
                inner_kept = dict(kept_by)
                touching = []
                for k, x in enumerate(loop.body):
                    if self._uses_model(x, inner_held, inner_kept) or \
                            self._calls_on(x, inner_held - model_names, inner_kept):
                        touching.append(k)
                    inner_held |= self._holders(x, inner_held, inner_kept)
                while touching and self._only_configures(loop.body[touching[0]], model_names):
                    touching.pop(0)
                if touching:
                    inner = []
                    for first, last in self._runs(loop.body, touching):
                        # with the loss computed from the forward's outputs right after it
                        made = set().union(*(assigned(x) for x in loop.body[first:last + 1]))
                        while last + 1 < len(loop.body) and loss_from(loop.body[last + 1], made):
                            last += 1
                            made |= assigned(loop.body[last])
                        inner.append((first, last))
                    out.extend(self._narrowed(loop.body, inner, inner_held, model_names, inner_kept))
                    continue
            out.append((block, i, j))
        return out

    def _optimizer_made_for_apex_goes(self, s: Seed) -> None:
        """An evaluation script that built an optimizer only to hand it to ``amp.initialize``
        (``optimizer = build_optimizer(model, opts)`` right before it, read by nothing else): once
        the initialize goes, so does the optimizer (nothing in the module trains)."""
        opt = s.optimizers
        if not isinstance(opt, ast.Name):
            return
        # a script's `if __name__ == "__main__":` too: every function's use of the name counts there
        unit = s.func.node if s.func is not None else s.module.tree
        seed_nodes = {id(n) for n in walk(s.stmt)}
        reads = [n for n in walk(unit, into_functions=True) if isinstance(n, ast.Name) and n.id == opt.id
                 and isinstance(n.ctx, ast.Load) and id(n) not in seed_nodes]
        stores = [n for n in walk(unit, into_functions=True) if isinstance(n, ast.Name) and n.id == opt.id
                  and isinstance(n.ctx, ast.Store) and id(n) not in seed_nodes]
        if reads or len(stores) != 1:
            return
        st = stmt_of(stores[0])
        _, _, block = block_of(s.stmt)
        if not (isinstance(st, ast.Assign) and len(st.targets) == 1 and st.targets[0] is stores[0]
                and any(x is st for x in block) and st.lineno < s.stmt.lineno):
            return
        # only where what builds it goes unnoticed: torch's optimizers, a function of this module, or
        # one imported from a project module whose import only binds names (its import goes too,
        # read by nothing else; another module's import may have to stay: importing it runs it)
        for n in [st.value, *walk(st.value)]:
            if isinstance(n, ast.Call) and not (isinstance(n.func, ast.Attribute) or (
                    isinstance(n.func, ast.Name) and n.func.id in _COLLECTING
                    and not s.module.sem.bindings_of(n.func)) or any(
                    b.kind in ("def", "class") or (b.qname or "").startswith("torch.") or (
                        b.kind == "import" and isinstance(b.node, ast.ImportFrom) and not b.node.level
                        and len(b.node.names) == 1 and self.p.import_is_quiet(b.node.module or ""))
                    for b in (s.module.sem.bindings_of(n.func) if isinstance(n.func, ast.Name) else []))):
                return
        self.fc(s.module).remove(st)
        self.notes.add(f"`{opt.id}` was built only to hand to apex's initialize: it goes with it")

    @staticmethod
    def _owners(s: Seed, model_names: Set[str]) -> Set[str]:
        """Objects the initialized models were taken from, before the seed in its function
        (``img_model, txt_model = bi_encoder.img_model, bi_encoder.txt_model``): running them
        runs the models (the same modules, which apex had patched)."""
        out: Set[str] = set()
        for n in walk(s.unit):
            if not (isinstance(n, ast.Assign) and len(n.targets) == 1 and n.lineno < s.stmt.lineno):
                continue
            t, v = n.targets[0], n.value
            pairs = zip(t.elts, v.elts) if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple) and \
                len(t.elts) == len(v.elts) else [(t, v)]
            for a, b in pairs:
                if dotted(a) in model_names and isinstance(b, ast.Attribute) and isinstance(b.value, ast.Name):
                    out.add(b.value.id)
        return out

    @staticmethod
    def _blank_between(stmt) -> bool:
        """A statement between two that run the model that may as well sit in their region: a plain
        assignment or augmented assignment with no call but a tensor method's (``n += x.size(0)``)."""
        return isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and not any(
            isinstance(n, ast.Call) and not isinstance(n.func, ast.Attribute) for n in walk(stmt))

    def _holders(self, stmt, held: Set[str], kept_by: Dict[str, list]) -> Set[str]:
        """Names bound to an object built from the model (``r = Retriever(model)``,
        ``m = get_model_obj(model)``): calling them may run it.  ``kept_by`` gets, for each such
        name that every way of building reads as a project class keeping the model, the (class,
        attributes) of each way (:meth:`_leaves_model_alone`)."""
        out = set()
        ways: Dict[str, list] = {}
        # in the branches of an `if` too (`if rpc: retriever = RPCRetriever(encoder, ...) else:
        # retriever = LocalRetriever(encoder, ...)`)
        for x in [stmt, *(n for n in walk(stmt, into_functions=False) if isinstance(n, ast.Assign))]:
            if not (isinstance(x, ast.Assign) and isinstance(x.value, ast.Call)):
                continue
            call = x.value
            name = (dotted(call.func) or "").split(".")[-1]
            if any(dotted(a) in held for a in [*call.args, *(k.value for k in call.keywords)]) and (
                    name[:1].isupper() or any(w in name.lower() for w in ("model", "encoder", "get_", "wrap"))):
                got = {dotted(e) for t in x.targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])
                       if dotted(e)}
                kept = self._kept_in(x, call, held) if len(got) == 1 else None
                for g in got:
                    ways.setdefault(g, []).append(kept)
                out |= got
        for g, kept in ways.items():
            # every way of building it must be read (`if rpc: RPCRetriever(...) else:
            # LocalRetriever(...)`): a method leaves the model alone where it does in each class
            if all(k is not None for k in kept):
                kept_by[g] = kept
            else:
                kept_by.pop(g, None)
        return out

    def _calls_on(self, stmt, objs: Set[str], kept_by: Dict[str, list]) -> bool:
        """A method of an object built from the model is called (``retriever.search(q)``); not one
        that only reads or loads its state (``model_to_load.load_state_dict(state)``), nor one
        that leaves the model alone (:meth:`_leaves_model_alone`)."""
        return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and dotted(n.func.value) in objs
                   and n.func.attr not in self._NOT_RUNNING and not self._leaves_model_alone(n, kept_by)
                   for n in [stmt, *walk(stmt)])

    def _leaves_model_alone(self, call: ast.Call, kept_by: Dict[str, list]) -> bool:
        """``retriever.get_top_docs(...)``: a method of an object that keeps the model (``kept_by``
        of :meth:`_holders`) that does not run it, in every class the object may be."""
        if not isinstance(call.func, ast.Attribute):
            return False
        kept = kept_by.get(dotted(call.func.value))
        return bool(kept) and not any(self._method_runs(*where, call.func.attr, attrs) for where, attrs in kept)

    def _only_configures(self, stmt, names: Set[str]) -> bool:
        """``model.eval()``, ``model.to(device)``: the model's own methods that do not run it."""
        return isinstance(stmt, ast.Expr) and method_call(stmt.value, "eval", "train", "to", "cuda", "half", "float",
                                                         "requires_grad_") and dotted(receiver(stmt.value)) in names

    def _uses_model(self, stmt, names: Set[str], kept_by: Optional[Dict[str, list]] = None) -> bool:
        """Whether a statement runs the model: calls it, or hands it to a function that may (not
        a torch wrapper such as DataParallel or torch.jit.script, not one of its own methods)."""
        sem = self._sem_of(stmt)
        for n in [stmt, *walk(stmt, into_functions=False)]:
            if isinstance(n, ast.Call):
                if calls_model(n, names):
                    if kept_by and self._leaves_model_alone(n, kept_by):
                        continue
                    return True
                if any(dotted(a) in names for a in [*n.args, *(k.value for k in n.keywords)]):
                    if isinstance(n.func, ast.Attribute) and dotted(n.func.value) in names:
                        continue
                    if any(q.startswith(("torch.", "builtins.", "apex.parallel.")) for q in sem.qnames(n)):
                        continue  # torch's and apex's wrappers (DistributedDataParallel) build, not run
                    if self._callee_leaves_unrun(stmt, n, names):
                        continue
                    return True
        return False

    #: methods of a module that do not run its forward
    _NOT_RUNNING = frozenset({"state_dict", "load_state_dict", "parameters", "named_parameters", "buffers",
                              "named_buffers", "modules", "named_modules", "children", "named_children",
                              "eval", "train", "to", "cuda", "cpu", "requires_grad_", "zero_grad"})

    def _callee_leaves_unrun(self, stmt, call: ast.Call, names: Set[str]) -> bool:
        """``load_state_dict_with_mismatch(model, path)``: a function of the project (not a method)
        that only reads the model's weights or state through its own methods (``model.state_dict()``,
        ``model.load_state_dict(...)``, ``isinstance(model, ...)``) and neither calls it nor hands it
        on: loading weights is not a forward pass.  One that returns it, or the module a wrapper
        holds (DPR's ``get_model_obj``: ``return model.module if hasattr(model, "module") else
        model``), does not run it either: what the caller does with the result is read there.  A
        project class whose ``__init__`` only keeps the model (``self.encoder = encoder``, or hands
        it to its base class's ``__init__`` that keeps it: DPR's ``LocalFaissRetriever(encoder,
        ...)``) does not run it when built; its methods that do are calls on the object, later."""
        f, bound = self.p.resolve(self._module_of(stmt), call.func)
        if f is None:
            return False
        if bound:
            if f.node.name != "__init__" or f.cls is None:
                return False
            return self._kept_only(f, call, names, 1, 0, set())
        if f.is_method:
            return False
        return self._kept_only(f, call, names, 0, 0, set())

    def _kept_only(self, f, call: ast.Call, names: Set[str], skip: int, depth: int, attrs: Set[str]) -> bool:
        """The parameters of ``f`` that ``call`` hands one of ``names`` (``skip``: the bound
        ``self``) are only read as :meth:`_callee_leaves_unrun` allows; ``attrs`` gets the
        attributes of ``self`` a constructor keeps them in."""
        if f.vararg or f.kwarg or depth > 3:
            return False
        params = set()
        positional = f.positional[skip:]
        for i, a in enumerate(call.args):
            if isinstance(a, ast.Starred):
                return False
            if dotted(a) in names:
                if i >= len(positional):
                    return False
                params.add(positional[i])
        for k in call.keywords:
            if k.arg is None:
                return False
            if dotted(k.value) in names:
                params.add(k.arg)
        if not params:
            return False
        ctor = f.node.name == "__init__" and f.cls is not None
        for x in walk(f.node, into_functions=True):
            if not (isinstance(x, ast.Name) and x.id in params):
                continue
            if not isinstance(x.ctx, ast.Load):
                return False
            p = getattr(x, "_p", None)
            if isinstance(p, ast.Attribute) and p.attr in self._NOT_RUNNING and \
                    isinstance(getattr(p, "_p", None), ast.Call) and p._p.func is p:
                continue
            if not ctor and _unwrapped(x, f.node):
                continue
            if isinstance(p, ast.Call) and isinstance(p.func, ast.Name) and p.func.id in ("isinstance", "hasattr") \
                    and p.args and p.args[0] is x:
                continue
            if ctor and isinstance(p, ast.Assign) and p.value is x and len(p.targets) == 1 and \
                    isinstance(p.targets[0], ast.Attribute) and dotted(p.targets[0].value) == "self" and \
                    enclosing_function(p) is f.node:
                attrs.add(p.targets[0].attr)
                continue  # `self.encoder = encoder`
            if ctor and isinstance(p, ast.Call) and x in p.args + [k.value for k in p.keywords] and \
                    self._base_init_keeps(f, p, names | {x.id}, depth, attrs):
                continue
            return False
        return True

    def _base_init_keeps(self, f, call: ast.Call, names: Set[str], depth: int, attrs: Set[str]) -> bool:
        """``super().__init__(encoder, ...)`` / ``Base.__init__(self, encoder, ...)`` in the
        ``__init__`` ``f``, to a project base class whose own ``__init__`` only keeps it."""
        fn = call.func
        if not (isinstance(fn, ast.Attribute) and fn.attr == "__init__"):
            return False
        via_super = isinstance(fn.value, ast.Call) and dotted(fn.value.func) == "super"
        if not via_super and not (call.args and dotted(call.args[0]) == "self"):
            return False
        if via_super:
            bases = self.p.ancestors(f.module, f.cls)
            init = self.p.method(*bases[0], "__init__") if bases else None
        else:
            init, _ = self.p.resolve(f.module, fn.value)  # `Base.__init__`: the class named
        if init is None or init.node.name != "__init__":
            return False
        return self._kept_only(init, call, names, 1 if via_super else 0, depth + 1, attrs)

    def _kept_in(self, stmt, call: ast.Call, names: Set[str]):
        """(the class, the attributes of ``self`` it keeps the model in) where ``call`` builds a
        project class whose ``__init__`` only keeps it; else None."""
        f, bound = self.p.resolve(self._module_of(stmt), call.func)
        if f is None or not bound or f.node.name != "__init__" or f.cls is None or \
                f.cls.name != (dotted(call.func) or "").split(".")[-1]:
            return None  # not a constructor whose class is known (one that inherits its __init__, an alias)
        attrs: Set[str] = set()
        if not self._kept_only(f, call, names, 1, 0, attrs) or not attrs:
            return None
        return (f.module, f.cls), attrs

    def _whole_hierarchy_known(self, module, cls) -> bool:
        """Every base of ``cls``, and of theirs, is a project class (or ``object``)."""
        found = [c for _, c in self.p.ancestors(module, cls)]
        known = {c.name for c in found}
        for c in [cls, *found]:
            if c.keywords:
                return False  # a metaclass
            for b in c.bases:
                name = (dotted(b) or "").split(".")[-1]
                if name != "object" and name not in known:
                    return False
        return True

    def _method_runs(self, module, cls, name: str, attrs: Set[str], depth: int = 0) -> bool:
        """Whether the method ``name`` of ``cls`` may run what ``attrs`` keep: it reads one of them,
        hands ``self`` on, or calls a method that does (unknown methods may)."""
        m = self.p.method(module, cls, name)
        if m is None:
            # no such method where every class it inherits from is the project's: the call
            # raises AttributeError (a branch for another class of the object: `load_index` of
            # the RPC retriever), it runs nothing
            return not self._whole_hierarchy_known(module, cls)
        if depth > 3:
            return True
        for n in walk(m.node, into_functions=True):
            if isinstance(n, ast.Name) and n.id == "self":
                p = getattr(n, "_p", None)
                if not (isinstance(p, ast.Attribute) and p.value is n):
                    return True  # `helper(self)`: handed on whole
                if p.attr in attrs:
                    return True
                c = getattr(p, "_p", None)
                if isinstance(c, ast.Call) and c.func is p and \
                        self._method_runs(module, cls, p.attr, attrs, depth + 1):
                    return True
            elif isinstance(n, ast.Call) and dotted(n.func) == "super":
                return True
        return False

    def _amp_init(self, s: Seed) -> None:
        """apex's first API, ``handle = amp.init(enabled=...)``: it patched torch for the rest of the
        run.  Natively, autocast covers the statements after it, in its block."""
        call = s.call
        kws = kwargs(call)
        for k in kws:
            if k not in ("enabled", "verbose", "enable_caching"):
                raise Refuse(f"amp.init argument {k!r} has no native mapping")
        code = s.module.src.code
        enabled = as_bool(code(kws["enabled"]), kws["enabled"]) if "enabled" in kws else "True"
        stmt = s.stmt
        if isinstance(stmt, ast.Assign):
            handle = {dotted(t) for t in stmt.targets}
            m = s.module
            for n in walk(m.tree, into_functions=True):
                if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load) and dotted(n) in handle:
                    raise Refuse(f"the handle of amp.init is used at line {n.lineno}: migrate it by hand")
        elif not isinstance(stmt, ast.Expr):
            raise Refuse(f"amp.init at line {s.use.line} is not a statement of its own")
        at, cond = self._hoist(s, enabled, option_reads(call))
        fc = self.fc(s.module)
        fc.remove(s.stmt, described=True)
        owner, field, block = block_of(at)
        idx = next(i for i, x in enumerate(block) if x is at)
        rest = [j for j in range(idx + 1, len(block)) if not isinstance(block[j], (ast.Return, *DEFS))]
        if not rest:
            raise Refuse(f"nothing runs after amp.init at line {s.use.line}")
        start, end = rest[0], rest[-1]
        if isinstance(block[end], ast.Return):
            end -= 1
        # the models made after it (names later called, `out = model(x)`): autocast covers the
        # statements that run them, not the seeding, the construction or the prints around
        made = set()
        for j in rest:
            x = block[j]
            if isinstance(x, ast.Assign):
                made |= {t.id for t in x.targets if isinstance(t, ast.Name)}
        called = {n.func.id for j in rest for n in walk(block[j], into_functions=False)
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        models = made & called
        touching = [j for j in rest if models and self._uses_model(block[j], models)]
        if touching:
            start, end = touching[0], touching[-1]
        self._add_region(s.module, block, start, end, autocast_call(self.s, cond))
        self.g.description = "apex.amp.init -> torch.autocast around what follows it"

    def _with_initial_scale(self, s: Seed, scaler_args: List[str]) -> List[str]:
        """apex's private first loss scale, set beside initialize (ViT-pytorch and its copies,
        NVIDIA's BERT scripts): the scaler's init_scale, whatever the loss scale option said."""
        for u in self._initial_scale_uses(s.module):
            val = self._initial_scale(u, s)
            scaler_args = [a for a in scaler_args if not a.startswith("init_scale=")]
            scaler_args.insert(0, f"init_scale={val}")
            self.notes.add("apex's private _amp_state loss scale: the scaler's init_scale")
        return scaler_args

    def _initial_scale_uses(self, m) -> List[Use]:
        """apex's private state used in module ``m`` (``amp._amp_state.loss_scalers[0]._loss_scale``)."""
        return [u for u, c in self.g.needs if u.kind == "_amp_state" and u.module is m
                and _idle_test(u.node) is None]

    def _initial_scale_reads(self, m) -> Set[str]:
        """The names apex's private first loss scale reads (``_loss_scale = args.init_scale``)."""
        out: Set[str] = set()
        for u in self._initial_scale_uses(m):
            st = stmt_of(u.node)
            if isinstance(st, ast.Assign):
                out |= read(st.value)
        return out

    def _initial_scale(self, u: Use, s: Seed) -> str:
        """``amp._amp_state.loss_scalers[0]._loss_scale = 2**20``: the value, and the line goes."""
        n = u.node
        sub, attr = getattr(n, "_p", None), getattr(getattr(n, "_p", None), "_p", None)
        stmt = stmt_of(n)
        code = u.module.src.code
        if not (isinstance(sub, ast.Subscript) and isinstance(attr, ast.Attribute) and attr.value is sub
                and attr.attr == "_loss_scale" and code(sub.slice) == "0"
                and isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and stmt.targets[0] is attr):
            raise Refuse(f"apex's private state is used at line {u.line}: migrate it by hand")
        value = stmt.value
        calls = [x for x in [value, *walk(value)] if isinstance(x, ast.Call)]
        if any(dotted(x.func) not in _PURE_SCALE_CALLS for x in calls):
            raise Refuse(f"the loss scale set at line {stmt.lineno} is not a number")
        # `= args.init_loss_scale`, `= float(os.getenv("INIT_LOSS_SCALE", 2**20))`: the expression
        # is read where the scaler is made (its names are among the options' reads there); a name
        # it reads bound again between amp.initialize and this line would read something else
        unit = s.func.node if s.func is not None else s.module.tree
        names = {d.split(".")[0] for d in read(value)}
        if any(isinstance(x, ast.Name) and isinstance(x.ctx, ast.Store) and x.id in names
               and s.stmt.lineno <= x.lineno <= stmt.lineno for x in walk(unit)):
            raise Refuse(f"the loss scale set at line {stmt.lineno} reads a name bound after amp.initialize: "
                         "make the scaler by hand")
        if id(stmt) not in self.scales_gone:  # one line for both seeds of `if ...: initialize() else: initialize()`
            self.scales_gone.add(id(stmt))
            self.fc(u.module).remove(stmt)
        return code(value)

    def _private_scale(self, u: Use) -> None:
        if self._test_of_no_consequence(u):
            return
        seeds = [s for s in self.g.seeds if s.module is u.module]
        if not seeds:
            raise Refuse(f"apex's private loss scale at line {u.line} is not beside amp.initialize")

    def _test_of_no_consequence(self, u: Use) -> bool:
        """apex's private state read in an :func:`_idle_test`: the ``if`` gives way to its body."""
        top = _idle_test(u.node)
        if top is None:
            return False
        fc = self.fc(u.module)
        if id(top) in fc.touched:
            return True  # the other private read of the same test
        fc.unwrap(top, top.body)
        fc.touched.add(id(top))
        self.notes.add("an `if` on apex's private state whose two branches did the same: its statements stay, "
                       "without the test")
        return True


def _idle_test(node) -> Optional[ast.If]:
    """The ``if`` whose test reads ``node`` and whose two branches are the same statements
    (carbonati's melanoma trainer: ``if self._fp_16 and amp._amp_state.loss_scalers[0]._unskipped
    != 0: self.scheduler.step() else: self.scheduler.step()``): whatever the test says, the same
    statements run.  Only a test that calls nothing (reading it has no effect of its own)."""
    top, child = getattr(node, "_p", None), node
    while top is not None and not isinstance(top, ast.stmt):
        child, top = top, getattr(top, "_p", None)
    if not (isinstance(top, ast.If) and child is top.test and top.orelse):
        return None
    if any(isinstance(x, (ast.Call, ast.Await, ast.NamedExpr, ast.Yield, ast.YieldFrom)) for x in ast.walk(top.test)):
        return None
    if [ast.dump(x) for x in top.body] != [ast.dump(x) for x in top.orelse]:
        return None
    return top


_DYNAMIC_VALUES = (None, 0, "dynamic")
#: a comparison's operator -> the text of its negation
_OPPOSITE = {ast.Eq: "!=", ast.NotEq: "==", ast.Is: "is not", ast.IsNot: "is", ast.In: "not in", ast.NotIn: "in"}
#: calls a first loss scale may make and still be said as the scaler's init_scale
_PURE_SCALE_CALLS = {"float", "int", "os.getenv", "os.environ.get"}


def loss_scale_args(ls, code, notes: Set[str]) -> List[str]:
    """The GradScaler options that apex's ``loss_scale`` expression says."""
    dyn, static = loss_scale_choice(ls, code)
    if static is None:
        return []  # always dynamic: GradScaler's default
    if dyn is None:
        notes.add(STATIC_NOTE)
        return [f"init_scale={static}", "growth_interval=2**31 - 1"]
    notes.add("loss_scale chosen at run time: dynamic when it is None, 0 or 'dynamic', else static"
              if not isinstance(ls, ast.IfExp) else
              "loss_scale chosen at run time: dynamic where apex's was, else static")
    return [f"init_scale=2.0**16 if {dyn} else {static}", f"growth_interval=2000 if {dyn} else 2**31 - 1"]


def loss_scale_choice(ls, code) -> Tuple[Optional[str], Optional[str]]:
    """apex's ``loss_scale`` as (the test that makes it dynamic, the static scale otherwise).

    ``(None, None)``: always dynamic; ``(None, "128")``: always static; a name is chosen at run
    time (dynamic when it is None, 0 or "dynamic", as apex reads it).  A conditional expression
    whose one branch is dynamic and the other a number or a name (``"dynamic" if args.loss_scale
    == 0 else args.loss_scale``, NVIDIA's BERT scripts) is dynamic when its test says so or when
    the other branch is; a test that only restates the name's own dynamic values folds away."""
    if string_value(ls) == "dynamic" or is_const(ls, None):
        return None, None
    if number_value(ls) is not None:
        return None, code(ls)
    if isinstance(ls, (ast.Name, ast.Attribute, ast.Subscript)):
        v = code(ls)
        return f'{v} in (None, 0, "dynamic")', f"float({v})"
    if isinstance(ls, ast.Call) and isinstance(ls.func, ast.Name) and ls.func.id in ("float", "int") and \
            len(ls.args) == 1 and not ls.keywords and isinstance(ls.args[0], (ast.Name, ast.Attribute, ast.Subscript)):
        # `float(opt.loss_scale)`: a number (apex was handed one; "dynamic" would have raised here)
        return None, code(ls)
    if isinstance(ls, ast.IfExp):
        branches = {"body": ls.body, "orelse": ls.orelse}
        fixed = [k for k, b in branches.items() if string_value(b) == "dynamic" or is_const(b, None)]
        if len(fixed) == 1:
            other = branches["orelse" if fixed[0] == "body" else "body"]
            dyn, static = loss_scale_choice(other, code)
            if static is not None and not isinstance(other, ast.IfExp):
                if _restates(ls.test, other, code, negated=fixed[0] == "orelse"):
                    return dyn, static
                test = code(ls.test)
                t = ls.test
                if fixed[0] == "orelse" and isinstance(t, ast.Compare) and len(t.ops) == 1 and \
                        type(t.ops[0]) in _OPPOSITE:
                    # `x != 'dynamic'` chose the number: dynamic where `x == 'dynamic'`
                    test = f"{code(t.left)} {_OPPOSITE[type(t.ops[0])]} {code(t.comparators[0])}"
                elif fixed[0] == "orelse":
                    simple = isinstance(ls.test, (ast.Name, ast.Attribute, ast.Subscript, ast.Call))
                    test = f"not {test}" if simple else f"not ({test})"
                return (test if dyn is None else f"{test} or {dyn}"), static
    raise Refuse("loss_scale is neither 'dynamic', a number, a name nor a choice between them")


def _restates(test, value, code, negated: bool = False) -> bool:
    """``x == 0``, ``x is None``, ``x == "dynamic"``, ``not x`` (or, ``negated``, ``x``, ``x != 0``,
    ``x is not None``): a test that picks "dynamic" only where the name ``value`` already reads
    as dynamic."""
    if not isinstance(value, (ast.Name, ast.Attribute, ast.Subscript)):
        return False
    v = code(value)
    if negated:
        if code(test) == v:
            return True
    elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return code(test.operand) == v
    ops = (ast.NotEq, ast.IsNot) if negated else (ast.Eq, ast.Is)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ops):
        a, b = test.left, test.comparators[0]
        for x, y in ((a, b), (b, a)):
            if code(x) == v and isinstance(y, ast.Constant) and y.value in _DYNAMIC_VALUES and \
                    not isinstance(y.value, bool):
                return True
    return False


def _same_branch(owner: ast.If, a: ast.AST, b: ast.AST) -> bool:
    """``a`` and ``b`` both lie in the body of ``owner``, or both in its ``else``."""
    for field in ("body", "orelse"):
        inside = [x for st in getattr(owner, field) for x in (st, *walk(st))]
        if any(x is a for x in inside):
            return any(x is b for x in inside)
    return False


def _unwrapped(name: ast.Name, func) -> bool:
    """``name`` (a parameter) is returned as it is or through attributes it holds, not called
    (``return model.module if hasattr(model, "module") else model``)."""
    node = name
    p = getattr(node, "_p", None)
    while isinstance(p, ast.Attribute) and p.value is node:
        node, p = p, getattr(p, "_p", None)
    if isinstance(p, ast.Call) and p.func is node:
        return False
    while isinstance(p, ast.IfExp) and p.test is not node:
        node, p = p, getattr(p, "_p", None)
    return isinstance(p, ast.Return) and p.value is node and enclosing_function(p) is func
