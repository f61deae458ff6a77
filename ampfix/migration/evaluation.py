"""Evaluation after an apex.amp training seed: apex ran it in half precision too.

``amp.initialize`` patched torch for the whole process (O1) or cast the model itself to float16
(O2), so a function that ran the initialized model after it (``validate(val_loader, model)``,
``evaluate(args, model, tokenizer)``) ran in half precision.  Native AMP covers only the regions
it is given: without one there, the migrated evaluation would run in float32 (correct, but as slow
as before apex).  Each such call, in the function that made the scaler and after it, runs under
autocast with the scaler's own condition (issue 21 §3).

A call qualifies when it hands the model to a project function that runs it (calls it, or one of
its methods that computes) and does not train it (no backward, no optimizer step), in a statement
of its own that no autocast (written or planned) covers yet.

An evaluation written in the training function itself (``model.eval()``, then ``with
torch.no_grad(): for x, y in test_loader: out = model(x); loss = criterion(out, y)``) ran in half
precision too: each forward of the model there, in a loop that trains nothing and under
``no_grad`` / ``inference_mode`` or after ``model.eval()``, runs under autocast with the loss
computed from its output (not the bookkeeping after it).  With bfloat16, an evaluation that
hands a tensor to numpy stays as it is: numpy has no bfloat16.

A trainer class that initializes ``self.model`` in ``__init__`` (or keeps a disabled scaler there)
evaluates it in its other methods (``predict``, ``evaluate_one_epoch``): each forward there that
only evaluates, directly or through a method of the class that runs the model and trains nothing
(``preds = self.eval_step(data)``), runs under autocast with the scaler the object keeps."""
from __future__ import annotations

import ast
from typing import Dict, Set

from ampfix.migration.flow import ancestors_stmts, assigned, loops_around, loss_from, other_branch, stmt_of
from ampfix.migration.seeds import Carrier, Seed, calls_model
from ampfix.migration.spell import autocast_call, bf16, disj
from ampfix.model.analysis import method_call
from ampfix.model.semantic import DEFS, block_of, dotted, walk
from ampfix.project.graph import CallSite


class EvaluationRewrites:
    """A mixin of :class:`ampfix.migration.amp.GroupPlan` (uses its ``p``, ``g``, ``s``,
    ``enabled``, ``regions`` and region helpers)."""

    def _evaluation_calls(self) -> None:
        for s in self.g.seeds:
            if not self._evaluates_after(s):
                continue
            cond = self.enabled.get(s.idx)
            if cond is None or cond == "False":
                continue
            module, caller = s.module, s.func
            # a model initialized without an optimizer beside it in the same function (`if
            # do_train: initialize(model, optimizer) else: initialize(model)`): apex cast the
            # evaluation on that path too, so its condition joins the scaler's
            for t in self.g.seeds:
                if t is not s and not t.training and t.module is module and t.func is caller and \
                        self.enabled.get(t.idx) not in (None, "False"):
                    cond = disj(cond, self.enabled[t.idx])
            self._class_evaluations(s)
            unit = caller.node if caller is not None else module.tree
            models = self._seed_models(s)
            self._wrap_inline_evaluations(module, unit, models | self._aliases(unit, models), cond, s.stmt)
            # the functions the plan hands the scaler to as a parameter (where a scaled backward is)
            carried = {id(u.func.node): c for u, c in self.g.needs
                       if u.func is not None and c is not None and c.kind == "param"}
            for f, names in self._wrap_evaluations(module, caller, unit, models, cond, s.stmt):
                # the training function the model is handed to, with the scaler (FixMatch's
                # `train(..., model, optimizer, ..., scaler=scaler)` evaluates inside its loop);
                # a function that only calls others (`validate(model, loaders)`) has no scaler
                c = carried.get(id(f.node))
                if c is None or not f.module.editable:
                    continue
                self._wrap_evaluations(f.module, f, f.node, names | self._aliases(f.node, names),
                                       self._autocast_enabled(f.module, f, c))

    def _wrap_evaluations(self, module, caller, unit, models: Set[str], cond: str, seed=None):
        """Each call after the ``seed`` statement (anywhere without one) in ``unit`` that hands one
        of ``models`` to a project function that only evaluates it runs under autocast(``cond``);
        returns the functions the models are handed to that train, each with the parameters that
        receive them.  A call in a branch the ``seed`` statement's excludes (``if mode == "train":
        <seed> elif mode == "predict": predict(model)``) never ran after apex's setup: it is left."""
        trains = []
        after = seed.end_lineno if seed is not None else 0
        partials = self._partials(module, caller, unit, models)
        for n in walk(unit):
            if not isinstance(n, ast.Call) or n.lineno <= after:
                continue
            st = stmt_of(n)
            if seed is not None and other_branch(seed, st, unit):
                continue
            runs = []  # the functions this call runs the model in (for bfloat16's numpy check)
            if isinstance(n.func, ast.Name) and n.func.id in partials:
                f, params = partials[n.func.id]  # `emb = get_emb_f(loader)`: the partial's function
            else:
                f, bound = self.p.resolve(module, n.func)
                if f is None or f is caller:
                    continue
                cs = CallSite(n, module, caller, f, bound)
                params = self._given(cs, models)
                if not params:
                    # `evaluate(get_emb_f, ...)`: a partial holding the model, handed to a function
                    # that only calls it
                    held = {q: partials[dotted(cs.argument(q))] for q in [*f.positional, *f.kwonly]
                            if dotted(cs.argument(q)) in partials}
                    if not held or not self._only_calls(f, set(held)) or \
                            not all(self._only_evaluates(g, given) for g, given in held.values()):
                        continue
                    runs = [g for g, _ in held.values()]
            if params and not self._only_evaluates(f, params):
                trains.append((f, params))
                continue
            if self._covered_inside(f):
                continue
            if params and _deferred(f, params):
                # `evaluator = create_evaluator(model)`: the model runs in the closure it returns,
                # later (`evaluator.run(loader)`); autocast around this call would cover nothing
                self.notes.add(f"`{f.qualname}` returns a function that runs the model later: that evaluation "
                               "runs in float32 now (apex ran it in half precision); wrap where it runs in "
                               "autocast by hand")
                continue
            if bf16(self.s) and any(method_call(x, "numpy") for g in [f, *runs]
                                    for x in walk(g.node, into_functions=True)):
                continue  # numpy has no bfloat16: the evaluation would fail on its outputs
            if not (isinstance(st, (ast.Expr, ast.Assign, ast.Return)) and st.value is not None and (
                    st.value is n or self._only_around(module, st, n))):
                continue
            if self._under_autocast(st) or self._inside_planned_region(st):
                continue
            owner, field, block = block_of(st)
            i = next(k for k, x in enumerate(block) if x is st)
            self._add_region(module, block, i, i, autocast_call(self.s, self._evaluation_cond(module, unit, st, models,
                                                                                      cond)), evaluation=True)
            self.notes.add(f"`{f.qualname}` ran the model in half precision under apex: its call runs under "
                           "autocast")
        return trains

    def _wrap_inline_evaluations(self, module, unit, models: Set[str], cond: str, seed,
                                 helpers: Dict[str, object] = None) -> None:
        """Each forward of one of ``models`` after the ``seed`` statement in ``unit`` itself (anywhere
        in it without one), and not in a branch its branch excludes, that only evaluates (see the
        module's doc) runs under autocast(``cond``), with the statements right after it that compute
        a loss from its output.  ``helpers``: methods of the object that run the model and train
        nothing (``self.eval_step``), by the dotted name they are called with: a call of one is a
        forward too."""
        helpers = helpers or {}
        after = seed.end_lineno if seed is not None else 0
        switches = sorted((n.lineno, n.func.attr) for n in walk(unit) if isinstance(n, ast.Call)
                          and method_call(n, "eval", "train") and dotted(n.func.value) in models)
        for n in walk(unit):
            helper = helpers.get(dotted(n.func)) if isinstance(n, ast.Call) else None
            if not (calls_model(n, models) or helper is not None) or n.lineno <= after:
                continue
            st = stmt_of(n)
            if seed is not None and other_branch(seed, st, unit):
                continue
            if helper is not None and bf16(self.s) and any(
                    method_call(x, "numpy") for x in walk(helper.node, into_functions=True)):
                continue
            if not isinstance(st, (ast.Assign, ast.AnnAssign, ast.Expr)) or st.value is None or \
                    any(isinstance(a, DEFS) for a in ancestors_stmts(st, unit)):
                continue
            if self._under_autocast(st) or self._inside_planned_region(st):
                continue
            loops = loops_around(st, unit)
            scope = loops[0] if loops else unit
            if any(method_call(x, "backward", "step", "zero_grad") for x in walk(scope)):
                continue  # a forward of the training loop, or one a step follows
            if bf16(self.s) and any(method_call(x, "numpy") for x in walk(scope)):
                continue
            quiet = any(isinstance(a, ast.With) and any(_quiet(it) for it in a.items)
                        for a in ancestors_stmts(st, unit))
            before = [m for line, m in switches if line < st.lineno]
            if not (quiet or (before and before[-1] == "eval")):
                continue
            owner, field, block = block_of(st)
            if len(block) == 1 and owner is not unit and _twin_branches(owner, st):
                # `if self.ema: preds = self.ema.module(x) else: preds = self.model(x)`: the model
                # chosen by a test, as apex's casting reached both; the whole `if` goes under autocast
                st = owner
                owner, field, block = block_of(st)
            i = next(k for k, x in enumerate(block) if x is st)
            j, made = i, assigned(st)
            while j + 1 < len(block) and loss_from(block[j + 1], made):
                j += 1
                made |= assigned(block[j])
            while i == 0 and j == len(block) - 1 and owner is not unit and self._no_grad_with(owner) is owner:
                # the whole body of a `with torch.no_grad():`: autocast joins that `with`, and the
                # loss computed from its output right after it (apex's casting reached it too)
                st = owner
                owner, field, block = block_of(st)
                i = j = next(k for k, x in enumerate(block) if x is st)
                while j + 1 < len(block) and loss_from(block[j + 1], made):
                    j += 1
                    made |= assigned(block[j])
            self._add_region(module, block, i, j, autocast_call(self.s, cond), evaluation=True)
            self.notes.add("the evaluation after amp.initialize ran the model in half precision under apex: "
                           "its forward runs under autocast")

    def _class_evaluations(self, s: Seed) -> None:
        """The other methods of the class whose method ``s`` initializes ``self.<model>`` in: their
        evaluations ran in half precision under apex (after the object was set up).  Only where
        the object always holds the scaler: made in ``__init__``, or a disabled one made there
        first (a method that evaluates may run before the one that sets up)."""
        f = s.func
        if f is None or f.cls is None or not f.is_method or not f.module.editable:
            return
        if f.node.name != "__init__" and id(f.cls) not in self.default_made:
            return
        targets = s.target_names
        attrs = {n for n in (s.model_names | ({targets[0]} if targets and targets[0] else set()))
                 if n.startswith("self.") and n.count(".") == 1}
        if not attrs:
            return
        module, cls = f.module, f.cls
        methods = [self.p.method(module, cls, m.name) for m in cls.body
                   if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m is not f.node]
        methods = [m for m in methods if m is not None and m.cls is cls and m.is_method]
        helpers = {"self." + m.node.name: m for m in methods if self._runs_only(m, attrs, methods)}
        carrier = Carrier("self", {s.idx}, "self." + self.name)
        for m in methods:
            if m.node.name in ("__init__", "forward") or m.node.name.startswith("__"):
                continue
            unit = m.node
            models = attrs | self._aliases(unit, attrs)
            own = {k: v for k, v in helpers.items() if v is not m}
            self._wrap_inline_evaluations(module, unit, models, self._autocast_enabled(module, m, carrier),
                                          None, own)

    @staticmethod
    def _runs_only(m, attrs: Set[str], methods, depth: int = 0) -> bool:
        """Method ``m`` runs the model (``self.model(x)``, or through another method of the class
        that does) and trains nothing; and none of them evaluates on its own (``with
        torch.no_grad():`` or ``self.model.eval()`` inside): the pass over that method wraps its
        forwards itself, and a region around the call would nest another."""
        body = list(walk(m.node, into_functions=True))
        if any(method_call(x, "backward", "step", "zero_grad") for x in body):
            return False
        if any(isinstance(x, ast.withitem) and _quiet(x) for x in body) or any(
                isinstance(x, ast.Call) and method_call(x, "eval") and dotted(x.func.value) in attrs for x in body):
            return False
        if any(calls_model(x, attrs) for x in body):
            return True
        if depth >= 2:
            return False
        by_name = {"self." + o.node.name: o for o in methods if o is not m}
        return any(isinstance(x, ast.Call) and dotted(x.func) in by_name and
                   EvaluationRewrites._runs_only(by_name[dotted(x.func)], attrs, methods, depth + 1) for x in body)

    def _evaluation_cond(self, module, unit, st, models: Set[str], cond: str) -> str:
        """The condition under which the model an evaluation at ``st`` runs was half precision under
        apex (``cond``: the plan's own, by default)."""
        return cond

    def _covered_inside(self, f) -> bool:
        """Whether the plan puts ``f``'s own forwards under autocast already (then its call is not
        wrapped as well)."""
        return False

    def _partials(self, module, caller, unit, models: Set[str]) -> Dict[str, tuple]:
        """Locals bound once, to ``functools.partial(f, ..., model=model)`` with ``f`` a project
        function and one of ``models`` among the arguments it binds (``get_emb_f =
        partial(get_emb, model=model, ds=ds)``): name -> (``f``, its parameters that hold a model)."""
        stores: Dict[str, int] = {}
        if isinstance(unit, (ast.FunctionDef, ast.AsyncFunctionDef)):  # a parameter is bound on entry too
            for a in ast.walk(unit.args):
                if isinstance(a, ast.arg):
                    stores[a.arg] = 1
        for n in walk(unit):
            if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
                stores[n.id] = stores.get(n.id, 0) + 1
            elif isinstance(n, (ast.Global, ast.Nonlocal)):
                for x in n.names:
                    stores[x] = stores.get(x, 0) + 2
        found = {}
        for n in walk(unit):
            if not (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
                    and stores.get(n.targets[0].id) == 1):
                continue
            v = n.value
            if not (isinstance(v, ast.Call) and (dotted(v.func) or "") in ("partial", "functools.partial")
                    and v.args and not any(isinstance(a, ast.Starred) for a in v.args)
                    and all(k.arg is not None for k in v.keywords)):
                continue
            f, bound = self.p.resolve(module, v.args[0])
            if f is None or f is caller:
                continue
            bound_call = ast.Call(func=v.args[0], args=v.args[1:], keywords=v.keywords)
            given = self._given(CallSite(bound_call, module, caller, f, bound), models)
            if given:
                found[n.targets[0].id] = (f, given)
        return found

    @staticmethod
    def _only_calls(f, names: Set[str]) -> bool:
        """``f`` only calls its parameters ``names`` (never stores or hands them on) and trains
        nothing itself."""
        for x in walk(f.node, into_functions=True):
            if isinstance(x, ast.Call) and method_call(x, "backward", "step", "zero_grad"):
                return False
            if isinstance(x, ast.Name) and x.id in names:
                p = getattr(x, "_p", None)
                if not (isinstance(x.ctx, ast.Load) and isinstance(p, ast.Call) and p.func is x):
                    return False
        return True

    @staticmethod
    def _given(cs, models: Set[str]) -> Set[str]:
        """The callee's parameters that the call hands one of ``models``."""
        g = cs.callee
        return {p for p in [*g.positional, *g.kwonly] if dotted(cs.argument(p)) in models}

    @staticmethod
    def _aliases(unit, names: Set[str]) -> Set[str]:
        """Locals bound to one of ``names`` or to another object, chosen by a test
        (``test_model = ema_model.ema if args.use_ema else model``, or the same in an ``if``):
        apex's casting reached both."""
        values = {}
        for n in walk(unit):
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
                v = n.value
                values.setdefault(n.targets[0].id, []).extend([v.body, v.orelse] if isinstance(v, ast.IfExp) else [v])
            elif isinstance(n, (ast.AugAssign, ast.AnnAssign)) and isinstance(n.target, ast.Name):
                values.setdefault(n.target.id, []).append(None)
        return {t for t, vs in values.items() if t not in names and all(v is not None and dotted(v) for v in vs)
                and any(dotted(v) in names for v in vs)}

    @staticmethod
    def _evaluates_after(s: Seed) -> bool:
        """A training seed that stays where it is (made in place, or moved to a caller)."""
        return bool(s.training) and s.use.kind == "initialize" and not getattr(s, "exported", False) and \
            not getattr(s, "dropped", None) and s.models is not None

    @staticmethod
    def _seed_models(s: Seed) -> Set[str]:
        """The local names of the initialized model: handed in, and what the seed assigns it to."""
        targets = s.target_names
        names = s.model_names | ({targets[0]} if targets and targets[0] else set())
        return {n for n in names if "." not in n}

    def _only_evaluates(self, f, params: Set[str], depth: int = 0) -> bool:
        """``f`` runs one of ``params`` (a model) under ``torch.no_grad()`` / ``inference_mode()``
        or after ``param.eval()``, and nothing in it trains; or it only hands the model on to
        functions that do so (UNITER's ``validate(model, loaders)`` dispatching to a
        ``validate_<task>(model, loader)`` per task)."""
        body = list(walk(f.node, into_functions=True))
        if any(method_call(x, "backward", "step", "zero_grad") for x in body):
            return False
        if not any(calls_model(x, params) for x in body):
            return depth < 2 and self._only_hands_on(f, params, depth)
        quiet = any((dotted(d.func if isinstance(d, ast.Call) else d) or "").split(".")[-1] in
                    ("no_grad", "inference_mode") for d in f.node.decorator_list)
        quiet = quiet or any(isinstance(x, ast.withitem) and _quiet(x) for x in body)
        quiet = quiet or any(method_call(x, "eval") and dotted(x.func.value) in params for x in body
                             if isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute))
        return quiet

    def _only_hands_on(self, f, params: Set[str], depth: int) -> bool:
        """Every call in ``f`` that hands it one of ``params`` is a call of a project function that
        only evaluates it (and there is at least one)."""
        found = False
        for n in walk(f.node, into_functions=True):
            if not isinstance(n, ast.Call) or not any(
                    dotted(a) in params for a in [*n.args, *(k.value for k in n.keywords)]):
                continue
            g, bound = self.p.resolve(f.module, n.func)
            if g is None or g is f:
                return False
            given = self._given(CallSite(n, f.module, f, g, bound), params)
            if not given or not self._only_evaluates(g, given, depth + 1):
                return False
            found = True
        return found

    def _only_around(self, module, st, call) -> bool:
        """``call`` inside a statement that does nothing else of the project's
        (``print(f"acc {evaluate(model, data)}")``, ``results.append(evaluate(model, data))``):
        the other calls in it are not functions of the project, so the statement can go under
        autocast whole."""
        inside = {id(x) for x in walk(call)}
        for x in walk(st.value):
            if isinstance(x, ast.Call) and x is not call and id(x) not in inside:
                f, _ = self.p.resolve(module, x.func)
                if f is not None:
                    return False
            if isinstance(x, (ast.Lambda, ast.GeneratorExp, ast.ListComp, ast.SetComp, ast.DictComp)) and \
                    any(y is call for y in walk(x)):
                return False  # a call that runs later, or many times, is not the statement's
        return True

    def _inside_planned_region(self, st) -> bool:
        """Whether a region this plan adds already holds ``st``."""
        for module, block, ranges in self.regions.values():
            for i, j, *_ in ranges:
                for x in block[i:j + 1]:
                    if x is st or any(y is st for y in walk(x, into_functions=False)):
                        return True
        return False


def _quiet(item: ast.withitem) -> bool:
    """``with torch.no_grad():`` / ``torch.inference_mode()``."""
    return isinstance(item.context_expr, ast.Call) and \
        (dotted(item.context_expr.func) or "").split(".")[-1] in ("no_grad", "inference_mode")


def _twin_branches(owner, st) -> bool:
    """``st`` is the whole of one branch of the ``if`` ``owner``, and the other branch is one
    statement too, that assigns the same names from a call that computes, with no call in the test
    (``if self.ema: preds = self.ema.module(batch) else: preds = self.model(batch)``)."""
    if not isinstance(owner, ast.If) or len(owner.body) != 1 or len(owner.orelse) != 1:
        return False
    other = owner.orelse[0] if owner.body[0] is st else owner.body[0] if owner.orelse[0] is st else None
    if not (isinstance(other, ast.Assign) and isinstance(st, ast.Assign) and isinstance(other.value, ast.Call)):
        return False
    if any(isinstance(x, ast.Call) for x in ast.walk(owner.test)):
        return False
    return assigned(other) == assigned(st) and not method_call(other.value, "cpu", "numpy", "item", "tolist")


def _deferred(f, params: Set[str]) -> bool:
    """Every forward of ``params`` in ``f`` is in a function ``f`` defines, does not call, and
    returns (``return Engine(_inference)``, ``return _step``): calling ``f`` runs none of them;
    whoever calls what it returns does, later."""
    calls = [x for x in walk(f.node, into_functions=True) if calls_model(x, params)]
    if not calls:
        return False
    called = {x.func.id for x in walk(f.node, into_functions=True)
              if isinstance(x, ast.Call) and isinstance(x.func, ast.Name)}
    returned = set()  # returned as it is, or kept by an object the return builds (`Engine(_update)`)
    for r in walk(f.node):
        if not isinstance(r, ast.Return) or r.value is None:
            continue
        v = r.value
        if isinstance(v, ast.Name):
            returned.add(v.id)
        elif isinstance(v, ast.Call) and ((dotted(v.func) or "").split(".")[-1][:1].isupper() or
                                          dotted(v.func) in ("partial", "functools.partial")):
            # a class keeps the function for later; `map(_one, data)` or `list(...)` would run it now
            returned |= {a.id for a in [*v.args, *(k.value for k in v.keywords)] if isinstance(a, ast.Name)}
    for x in calls:
        inner = x
        while inner is not None and inner is not f.node and not isinstance(inner, (*DEFS, ast.Lambda)):
            inner = getattr(inner, "_p", None)
        if inner is None or inner is f.node or isinstance(inner, ast.Lambda) or \
                inner.name in called or inner.name not in returned:
            return False
    return True
