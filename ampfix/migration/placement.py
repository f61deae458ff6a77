"""Where the scaler lives and how it gets there: :class:`Solver` finds, for every use of a group,
how it reaches the scaler its seed makes; :class:`CarrierRewrites` adds the parameters and the
call-site arguments that carry it (across modules too)."""
from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set

from ampfix.migration.flow import ancestors_stmts, code_body, dominates, stmt_of
from ampfix.migration.groups import Refuse
from ampfix.migration.rewriter import insert_edit
from ampfix.migration.spell import scaler_call
from ampfix.migration.seeds import Carrier, Seed
from ampfix.model.analysis import method_call
from ampfix.model.semantic import dotted, walk


class Solver:
    def __init__(self, project, seeds: List[Seed], name: str) -> None:
        self.p = project
        self.seeds = seeds
        self.name = name
        self.memo: Dict[object, Optional[Carrier]] = {}
        self.why: Dict[object, str] = {}
        #: the functions (keys) that no amp.initialize reaches through the calls in the project:
        #: module-level code with none before it, a method of a class a registry builds, and a
        #: function whose every caller is one of those
        self.unreached: Set[object] = set()
        self.stack: List[object] = []
        self._outside: Optional[Dict[int, OutsideSetter]] = None

    @staticmethod
    def key(module, func):
        return ("f", id(func.node)) if func is not None else ("m", module.path)

    def solve(self, module, func) -> Optional[Carrier]:
        k = self.key(module, func)
        if k in self.memo:
            return self.memo[k]
        if k in self.stack:
            return None
        self.stack.append(k)
        try:
            c = self._solve(module, func)
        finally:
            self.stack.pop()
        self.memo[k] = c
        return c

    def fail(self, module, func, why: str) -> None:
        self.why.setdefault(self.key(module, func), why)
        return None

    def nobody(self, module, func, why: str) -> None:
        """A failure that says no amp.initialize comes before this code in the project."""
        self.unreached.add(self.key(module, func))
        return self.fail(module, func, why)

    def _solve(self, module, func) -> Optional[Carrier]:
        own = [s for s in self.seeds if s.training and s.module is module and s.func is func
               and not getattr(s, "exported", False)]
        if own:
            # a seed in a method keeps the scaler on self, for the other methods of the class
            expr = "self." + self.name if func is not None and func.is_method else self.name
            holder = self.outside_setters().get(own[0].idx)
            if holder is not None and len(own) == 1:
                # the setup function keeps it on the object it was handed (argus's initialize_amp)
                expr = f"{holder.param}.{self.name}"
            return Carrier("local", {s.idx for s in own}, expr)
        if func is None:
            return self.nobody(module, func, f"module-level code of {module.path} has no amp.initialize before it")
        if func.outer is not None:
            c = self.solve(module, func.outer)
            if c is not None and c.kind in ("local", "closure", "global") and not self._binds(func, c.expr):
                # a closure of a closure that reads its factory's parameter reads it too
                return _reading(c) if c.outer is not None else Carrier("closure", c.seeds, c.expr)
        top = [s for s in self.seeds if s.training and s.module is module and s.func is None]
        if top and not self._binds(func, self.name):
            return Carrier("global", {s.idx for s in top}, self.name)
        if func.cls is not None and func.is_method:
            same = [s for s in self.seeds if s.training and s.func is not None and s.func.cls is not None
                    and s.func.is_method and self.related(s.func, func)]
            if same:
                return Carrier("self", {s.idx for s in same}, "self." + self.name)
            held = self._held(module, func)
            if held is not None:
                return held
            outside = self._set_outside(module, func)
            if outside is not None:
                return outside

        if func.cls is not None and func.is_method and func.node.name != "__init__":
            # whoever builds the object hands it the scaler: its __init__ keeps it on self
            c = self._via_init(module, func)
            if c is not None:
                return c
        refs = self.p.references(func)
        if refs:
            r = refs[0]
            c = self._from_factory(module, func)
            if isinstance(c, Carrier):
                return c
            return self.fail(module, func, f"`{func.qualname}` is used other than by a call (line {r.lineno}), "
                                           "so the scaler cannot be passed to it" + (c or ""))
        sites = self.p.callers(func)
        if not sites and func.cls is not None and any(
                "register" in (dotted(d.func if isinstance(d, ast.Call) else d) or "") for d in func.cls.decorator_list):
            deco = next(d for d in func.cls.decorator_list
                        if "register" in (dotted(d.func if isinstance(d, ast.Call) else d) or ""))
            return self.nobody(module, func, f"`{func.cls.name}` is built by a registry from the configuration "
                                           f"(@{module.src.code(deco)}), so no call can hand it the GradScaler: keep "
                                           "one where the optimizer lives (the runner) by hand")
        if not sites and self.seeds and func.is_method and func.cls is not None and (
                func.node.name == "forward" or (func.node.name.startswith("__") and func.node.name != "__init__")):
            # nn.Module.__call__ runs forward (`model(x)`), Python runs the dunders: no call in the
            # project names them, and none of those calls would pass a scaler
            return self.fail(module, func, f"`{func.qualname}` runs when the object is called (`obj(...)`) or "
                                           "by Python itself, so the scaler cannot be passed to it")
        if not sites:
            name = func.cls.name if func.node.name == "__init__" and func.cls is not None else func.node.name
            elsewhere = self.p.mentioned_elsewhere(name)
            if elsewhere:
                return self.fail(module, func, f"`{func.qualname}` is used in {elsewhere[0]}, which was not given: run "
                                               "ampfix on the files that call it too")
            if self.name in func.positional or self.name in func.kwonly:
                return self.fail(module, func, f"`{func.qualname}` already has a parameter `{self.name}`")
            if func.cls is None and func.positional[:1] == ["self"]:
                # `def train_fn(self, ...)` at module level: a class decorator or a registry makes it
                # a method at run time, and its calls (`self.train_fn(...)`) cannot be followed
                return self.fail(module, func, f"`{func.qualname}` takes `self` outside a class: it becomes a method "
                                               "at run time, so its calls cannot be followed to pass the scaler")
            # nothing in the project calls it: dead code, or an entry point of the project's API;
            # it takes the scaler as a keyword-only parameter (and the report says so)
            c = Carrier("param", set(), self.name, [])
            c.entry = func
            return c
        seeds: Set[int] = set()
        good, missing, bad = [], None, []
        for s in sites:
            c = self.solve(s.module, s.caller)
            if c is None:
                bad.append(s)
                where = f"{s.caller.qualname}" if s.caller else "module level"
                missing = missing or (f"`{func.qualname}` is also called from `{where}` ({s.module.path} line "
                                      f"{s.node.lineno}), where no amp.initialize comes first")
                continue
            good.append(s)
            seeds |= c.seeds
        if missing and not good:
            if all(self.key(s.module, s.caller) in self.unreached for s in bad):
                return self.nobody(module, func, missing)
            return self.fail(module, func, missing)
        alias = self.alias_of(func)
        if self.name in func.positional or self.name in func.kwonly:
            return self.fail(module, func, f"`{func.qualname}` already has a parameter `{self.name}`")
        if missing and alias:
            return self.fail(module, func, missing)
        c = Carrier("param", seeds, self.name, good)
        c.rename = alias
        # some callers have no scaler to give (an evaluation script that loads the same
        # checkpoints): the parameter is optional, and only saving or loading the scaler's state
        # may use it there (the planner checks), under `scaler is not None`
        c.optional = missing
        c.missing_sites = bad
        return c

    @staticmethod
    def alias_of(func) -> Optional[str]:
        """The parameter that is apex's amp handed in (``def prepare(args, model, amp)``): it
        becomes the scaler's parameter."""
        from ampfix.model.apex import param_aliases

        hit = [name for (k, name) in param_aliases(func.module.sem) if k == id(func.node)]
        return hit[0] if hit else None

    def _via_init(self, module, func) -> Optional[Carrier]:
        init = self.p.method(module, func.cls, "__init__")
        if init is None:
            return None
        c = self.solve(init.module, init)
        if c is None or c.kind != "param":
            return None
        carrier = Carrier("self", c.seeds, "self." + self.name)
        carrier.via_init = (init, c)
        return carrier

    def _from_factory(self, module, func):
        """A nested function handed on as a value (``return Engine(_update)``: ignite's step
        closures) cannot take the scaler as a parameter, but it reads the names of the function
        that defines it: the factory takes the scaler from its callers, the closure reads it (a
        factory method's closure reads ``self.scaler`` through its ``self``).  Not where some
        caller of the factory has no scaler to give (the closure would call ``None.scale``).
        Returns the carrier, or what the refusal adds about the factory."""
        if func.outer is None or self._binds(func, self.name):
            return None
        c = self.solve(module, func.outer)
        if c is None:
            why = self.why.get(self.key(module, func.outer))
        elif c.kind in ("self", "held"):
            # a factory method (`def build(self): def _update(...): ...; return Engine(_update)`):
            # the closure reads `self.scaler` through the method's `self`
            return None if self._binds(func, c.expr.split(".")[0]) else _reading(c)
        elif c.kind == "param" and not getattr(c, "rename", None):
            why = getattr(c, "optional", None)
            if not why:
                return _reading(c)
        else:
            why = getattr(c, "optional", None)
        return f"; nor to `{func.outer.qualname}`, which defines it: {why}" if why else None

    def _held(self, module, func) -> Optional[Carrier]:
        """The method reads ``self.gan.<...>``, and its class keeps in ``self.gan`` only objects of
        one project class (``self.gan = GAN(...)``, or None) whose methods initialize apex: the
        scaler those keep on themselves is ``self.gan.scaler`` here (stylegan2's Trainer and
        its StyleGAN2)."""
        cls = func.cls
        read = sorted({n.value.attr for n in walk(func.node) if isinstance(n, ast.Attribute)
                       and isinstance(n.value, ast.Attribute) and isinstance(n.value.value, ast.Name)
                       and n.value.value.id == "self" and isinstance(n.value.ctx, ast.Load)})
        for attr in read:
            made = set()
            for n in walk(cls, into_functions=True):
                if not isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                    continue
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                if not any(dotted(t) == "self." + attr for x in targets for t in [x, *walk(x)]):
                    continue
                v = n.value if isinstance(n, ast.Assign) and len(n.targets) == 1 and \
                    dotted(n.targets[0]) == "self." + attr else None
                if isinstance(v, ast.Constant) and v.value is None:
                    continue
                f, _ = self.p.resolve(module, v.func) if isinstance(v, ast.Call) else (None, False)
                if f is None or f.node.name != "__init__" or f.cls is None:
                    made = set()
                    break
                made.add(id(f.cls))
            if len(made) != 1:
                continue
            seeds = {s.idx for s in self.seeds if s.training and s.func is not None and s.func.is_method
                     and s.func.cls is not None and id(s.func.cls) in made and not getattr(s, "exported", False)}
            if seeds:
                return Carrier("held", seeds, f"self.{attr}.{self.name}")
        return None

    def _set_outside(self, module, func) -> Optional[Carrier]:
        """A method of a class that only ever sets ``self.amp`` to None and reads apex's amp from
        it, where a setup function of the project puts apex there (:meth:`outside_setters`): the
        scaler that function keeps on the object is ``self.scaler`` here."""
        for idx, h in self.outside_setters().items():
            if h.cls is func.cls:
                c = Carrier("self", {idx}, "self." + self.name)
                c.outside = h
                return c
        return None

    def outside_setters(self) -> Dict[int, "OutsideSetter"]:
        """seed index -> :class:`OutsideSetter`, computed once (see :func:`outside_setter`)."""
        if self._outside is None:
            self._outside = {}
            for s in self.seeds:
                h = outside_setter(self.p, s, self.name)
                if h is not None:
                    self._outside[s.idx] = h
        return self._outside

    def related(self, a, b) -> bool:
        """Methods of one class, or of a class and its project base; or, further up, methods one
        of whose classes inherits the other (``self`` is one object in both: nnUNet's
        ``NetworkTrainer._maybe_init_amp`` and a grandchild's ``run_iteration``)."""
        if a.cls is b.cls:
            return True
        if any(c is a.cls for _, c in self.p.ancestors(b.module, b.cls)) or any(
                c is b.cls for _, c in self.p.ancestors(a.module, a.cls)):
            return True
        # a base named as the other class, where the name cannot be followed: only in one module
        # (three copies of a `Trainer` in three packages are three classes)
        if a.module is b.module and (any(isinstance(x, ast.Name) and x.id == a.cls.name for x in b.cls.bases) or any(
                isinstance(x, ast.Name) and x.id == b.cls.name for x in a.cls.bases)):
            return True
        return self.p.method(b.module, b.cls, a.node.name) is a or self.p.method(a.module, a.cls, b.node.name) is b

    @staticmethod
    def _binds(func, name: str) -> bool:
        return name in func.positional or name in func.kwonly or any(
            isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in walk(func.node))


def _reading(c: Carrier) -> Carrier:
    """The carrier of a closure that reads what the function of ``c`` holds (its parameter, or
    ``self.scaler``): what ``c`` needs is carried with it."""
    inner = Carrier("closure", c.seeds, c.expr)
    inner.outer = c
    return inner


class CarrierRewrites:
    """The part of a group's plan (:class:`ampfix.migration.amp.GroupPlan`) that carries the scaler."""

    def _carriers(self) -> None:
        """Parameters and call sites that bring the scaler where it is used."""
        todo = [c for _, c in self.g.needs if c is not None]
        no_carrier = getattr(self, "no_carrier", set())
        dropped = {id(c) for u, c in self.g.needs if c is not None and Solver.key(u.module, u.func) in no_carrier}
        seen = set()
        kept = set()
        while todo:
            c = todo.pop()
            if id(c) in seen:
                continue
            seen.add(id(c))
            via = getattr(c, "via_init", None)
            if via is not None:
                init, ic = via
                todo.append(ic)
                if id(init.node) not in kept:
                    kept.add(id(init.node))
                    self._keep_in_init(init)
            if c.outer is not None:
                todo.append(c.outer)
            h = getattr(c, "outside", None)
            if h is not None and id(h.cls) not in self.outside_made:
                # `self.amp = None` in the class's __init__: a disabled scaler there instead, for the
                # objects no setup function is handed (AMP off, as apex's was)
                self.outside_made.add(id(h.cls))
                self.fc(h.module).replace_statement(h.nones[0], [self._disabled(f"self.{self.name}")])
            if c.kind != "param":
                continue
            if id(c) in dropped:
                # bfloat16, the switch read only in the callers' regions: not carried in
                todo.extend(cc for cc in (self.solver.solve(cs.module, cs.caller) for cs in c.sites)
                            if cc is not None)
                continue
            entry = getattr(c, "entry", None)
            if entry is not None and id(entry.node) not in self.param_added:
                self.param_added.add(id(entry.node))
                self._add_param(entry)
                what = entry.cls.name if entry.node.name == "__init__" and entry.cls is not None else entry.qualname
                made = self._made_as(entry)
                carried = "the autocast switch" if self.bf16 else "the GradScaler"
                self.notes.add(f"`{what}` is not called in the project: it now takes {carried} as `{self.name}=`"
                               + (f"; its callers pass {made}" if made else ""))
            for cs in c.sites:
                cc = self.solver.solve(cs.module, cs.caller)
                todo.append(cc)
                f = cs.callee
                k = id(f.node)
                rename = getattr(c, "rename", None)
                if k not in self.param_added:
                    self.param_added.add(k)
                    if rename:
                        self._rename_param(f, rename)
                    elif getattr(c, "optional", None):
                        add_keyword_param(self.fc(f.module), f, f"{self.name}=None")
                        if self.defaults_scaler(f):
                            self._default_when_none(f)
                            self.notes.add(f"`{f.qualname}` takes the GradScaler as an optional `{self.name}=`: a "
                                           "caller that passes none gets a disabled one (float32, as apex left it)")
                        else:
                            self.notes.add(f"`{f.qualname}` takes the GradScaler as an optional `{self.name}=`: some "
                                           "of its callers have none")
                    else:
                        self._add_param(f)
                if rename and cs.argument(rename) is not None:
                    continue  # the argument is apex's amp: its own rewrite passes the scaler
                self._passed_before_made(cs, cc)
                self._pass(cs, cc.expr)
        self._dispatches_agree()

    def _passed_before_made(self, cs, cc) -> None:
        """A call handed the scaler of its own function must run after the scaler is made:
        ``fitter = Fitter(...)`` first, then ``fitter.model, fitter.optimizer =
        amp.initialize(fitter.model, ...)`` would pass a name not yet set (its options read the
        object the call builds, so the scaler cannot simply move up)."""
        if cc is None or cc.kind != "local":
            return
        made = sorted((self.made_line[s.idx], s.use.line) for s in self.g.seeds if s.idx in cc.seeds
                      and s.idx in self.made_line and s.module is cs.module and s.func is cs.caller)
        if made and cs.node.lineno < made[0][0]:
            raise Refuse(f"`{cs.callee.qualname}` is called at {cs.module.path} line {cs.node.lineno}, before the "
                         f"scaler is made (line {made[0][0]}, for amp.initialize at line {made[0][1]}): it would be "
                         "handed a name not yet set; make the scaler before that call by hand")

    def _dispatches_agree(self) -> None:
        """A ``globals()["train_" + args.target](...)`` call that now passes the scaler calls
        whichever function of that name the run picks: each must take it."""
        for module, node in self.dispatch_passed.values():
            targets = self.p.dispatch_targets(module, node)
            missing = [f for f in targets if id(f.node) not in self.param_added]
            if missing:
                raise Refuse(f"the call at {module.path} line {node.lineno} picks its function by name from globals(): "
                             f"`{missing[0].qualname}`, one it may pick, does not train with this optimizer; pass "
                             "the scaler there by hand")

    def _made_as(self, entry) -> str:
        """What a caller of a library entry passes, where every scaled backward in it ran under one
        test (``if config.use_amp:``): ``scaler=torch.amp.GradScaler("cuda", enabled=config.use_amp)``
        keeps the function's fp32 path where it was."""
        tests = set()
        for u, _ in self.g.needs:
            if u.kind != "scale_loss" or u.func is not entry:
                continue
            st = u.node
            while st is not None and not isinstance(st, ast.With):
                st = getattr(st, "_p", None)
            gd = getattr(st, "_p", None)
            if not (isinstance(gd, ast.If) and any(x is st for x in gd.body)):
                return ""
            tests.add(entry.module.src.code(gd.test))
        if len(tests) != 1:
            return ""
        test = tests.pop()
        if self.bf16:
            return f"`{self.name}={test}`"
        return f"`{self.name}={scaler_call(self.s, ['enabled=' + test], one_line=True)}`"

    def _keep_in_init(self, init) -> None:
        """``self.scaler = scaler`` first in __init__ (after ``super().__init__(...)``), so that
        what __init__ calls finds it."""
        body = init.node.body
        fc = self.fc(init.module)
        line = f"self.{self.name} = {self.name}"
        i = 0
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            i = 1
        for j, b in enumerate(body):
            if isinstance(b, ast.Expr) and method_call(b.value, "__init__"):
                fc.insert_after(b, [line])
                return
        if i < len(body):
            fc.insert_before(body[i], [line])
        else:
            fc.insert_after(body[-1], [line])

    def _rename_param(self, f, old: str) -> None:
        """``def prepare(args, model, amp)`` -> ``def prepare(args, model, scaler)``: apex's amp
        handed in becomes the scaler; every read of it is an apex use, rewritten on its own."""
        a = f.node.args
        p = next(x for x in [*getattr(a, "posonlyargs", []), *a.args, *a.kwonlyargs] if x.arg == old)
        fc = self.fc(f.module)
        src = f.module.src
        at = src.offset(p.lineno, p.col_offset)
        fc.edits.append(fc.b.replace_range(at, at + len(old), self.name))

    def _add_param(self, f) -> None:
        add_keyword_param(self.fc(f.module), f, self.name)

    def _pass(self, cs, expr: str) -> None:
        if self.p.dispatch_targets(cs.module, cs.node):
            # one call that picks its function by name: the argument once, for all of them
            if id(cs.node) in self.dispatch_passed:
                return
            self.dispatch_passed[id(cs.node)] = (cs.module, cs.node)
        fc = self.fc(cs.module)
        fc.edits.append(fc.b.insert_arg(cs.node, f"{self.name}={expr}"))
        self.g.anchors.setdefault(cs.module.path, []).append(
            (cs.node, f"`{cs.callee.qualname}` now takes the GradScaler of the apex.amp migration: pass it here"))

    def defaults_scaler(self, func) -> bool:
        """Whether the optional scaler parameter of ``func`` (callers without one never reach the
        scaled backward) gets a disabled scaler when none is passed: where ``func`` scales a loss
        (float16).  A caller from outside the project that passes the optimizer and no scaler then
        trains in float32, as it did with apex left uninitialized, and no test of the scaler's
        presence is needed around the backward, the step or the checkpoint."""
        if self.bf16 or func is None:
            return False
        return any(u.kind == "scale_loss" and u.func is not None and u.func.node is func.node and
                   c is not None and getattr(c, "optional", None) and c.kind == "param" for u, c in self.g.needs)

    def _default_when_none(self, f) -> None:
        """``if scaler is None: scaler = GradScaler(enabled=False)`` first in ``f``'s body (after its
        docstring)."""
        body = code_body(f.node.body) or f.node.body
        line = scaler_call(self.s, ["enabled=False"])
        self.fc(f.module).insert_before(body[0], [f"if {self.name} is None:", f"    {self.name} = {line}"])


def add_keyword_param(fc, f, name: str) -> None:
    """A keyword-only parameter ``name``, last (before ``**kwargs``), on the function ``f``."""
    node = f.node
    a = node.args
    src = f.module.src
    if a.kwarg is not None:
        star = a.kwarg
        at = src.offset(star.lineno, star.col_offset) - 2
        text = f"{name}, " if (a.vararg or a.kwonlyargs) else f"*, {name}, "
        fc.edits.append(insert_edit(at, text))
        return
    items = [*getattr(a, "posonlyargs", []), *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs]
    if not items:
        p = fc.b.open_paren_def(node)
        fc.edits.append(insert_edit(p, f"*, {name}"))
        return
    last = max(items, key=lambda x: (x.end_lineno, x.end_col_offset))
    end = src.offset(last.end_lineno, last.end_col_offset)
    # a default after the last parameter
    for d in [d for d in [*a.defaults, *a.kw_defaults] if d is not None]:
        end = max(end, src.offset(d.end_lineno, d.end_col_offset))
    text = f", {name}" if (a.vararg or a.kwonlyargs) else f", *, {name}"
    lines = [x.lineno for x in items]
    pad = src.line_text(last.lineno)[:last.col_offset]
    if last.lineno != node.lineno and len(set(lines)) == len(lines) and not pad.strip():
        # one parameter a line: the new ones get lines of their own, at the same indentation
        text = f",\n{pad}{name}" if (a.vararg or a.kwonlyargs) else f",\n{pad}*,\n{pad}{name}"
    fc.edits.append(insert_edit(end, text))


class OutsideSetter:
    """A setup function ``F(model)`` that initializes apex on the object it is handed and keeps
    apex's amp on it (``model.nn_module, model.optimizer = amp.initialize(model.nn_module,
    model.optimizer, ...); model.amp = amp``), where every caller hands it an object of one project
    class made right there (``model = BirdModel(params)``), whose methods read apex from
    ``self.amp`` (:func:`ampfix.model.apex.set_outside`).  The scaler goes on the object:
    ``model.scaler`` in ``F``; ``self.scaler`` in the class, whose ``__init__`` makes a disabled
    one in place of ``self.amp = None``."""

    def __init__(self, seed: Seed, param: str, attr: str, store: ast.stmt, cls, module, init,
                 nones: List[ast.stmt]) -> None:
        self.seed = seed
        self.param = param
        self.attr = attr
        self.store = store
        self.cls = cls
        self.module = module
        self.init = init
        self.nones = nones


def outside_setter(project, s: Seed, name: str) -> Optional[OutsideSetter]:
    """The :class:`OutsideSetter` of seed ``s``, or None where its shape is not that one whole."""
    from ampfix.model.apex import apex_qname, self_aliases, set_outside

    f = s.func
    if not s.training or f is None or f.cls is not None or f.outer is not None or \
            not isinstance(s.stmt, ast.Assign) or s.call is None:
        return None
    params = set(f.positional) | set(f.kwonly)
    # the initialize's models and optimizers, and what it assigns, are attributes of one parameter
    heads = {(dotted(a) or "").split(".")[0] if isinstance(a, ast.Attribute) else None for a in s.call.args[:2]}
    t = s.stmt.targets[0]
    heads |= {(dotted(e) or "").split(".")[0] if isinstance(e, ast.Attribute) else None
              for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])}
    if len(heads) != 1 or next(iter(heads)) not in params:
        return None
    param = next(iter(heads))
    if any(isinstance(n, ast.Name) and n.id == param and not isinstance(n.ctx, ast.Load) for n in walk(f.node)):
        return None
    stores = [n for n in f.node.body if isinstance(n, ast.Assign) and len(n.targets) == 1
              and isinstance(n.targets[0], ast.Attribute) and isinstance(n.targets[0].value, ast.Name)
              and n.targets[0].value.id == param and apex_qname(s.module.sem, n.value) == "apex.amp"]
    if len(stores) != 1:
        return None
    store = stores[0]
    attr = store.targets[0].attr
    sites = project.callers(f)
    if not sites:
        return None
    classes = set()
    found = None
    for cs in sites:
        a = cs.argument(param)
        if not isinstance(a, ast.Name):
            return None
        unit = cs.caller.node if cs.caller is not None else cs.module.tree
        binds = [n for n in walk(unit) if isinstance(n, ast.Name) and n.id == a.id and not isinstance(n.ctx, ast.Load)]
        before = [b for b in binds if b.lineno < cs.node.lineno]
        if not before:
            return None
        # the last binding before the call, on every way to it, and no loop bringing a later one round
        b = max(before, key=lambda x: (x.lineno, x.col_offset))
        st = getattr(b, "_p", None)
        if not (isinstance(st, ast.Assign) and st.targets == [b] and isinstance(st.value, ast.Call)
                and dominates(st, cs.node)):
            return None
        if any(isinstance(lp, (ast.For, ast.AsyncFor, ast.While)) and not any(lp is x for x in ancestors_stmts(st))
               and any(x.lineno > cs.node.lineno and any(x is y for y in walk(lp)) for x in binds)
               for lp in ancestors_stmts(stmt_of(cs.node))):
            return None
        init, _ = project.resolve(cs.module, st.value.func)
        if init is None or init.node.name != "__init__" or init.cls is None:
            return None
        classes.add(id(init.cls))
        found = init
    if len(classes) != 1 or found is None:
        return None
    cls, module = found.cls, found.module
    methods = [x for x in cls.body if isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef)) and x.args.args]
    if not any(k[1] == attr for k in self_aliases(module.sem, module.tree) if k[0] in {id(m) for m in methods}):
        return None
    nones = [n for m in methods for n in walk(m, into_functions=True) if isinstance(n, ast.Assign)
             and len(n.targets) == 1 and isinstance(n.targets[0], ast.Attribute) and n.targets[0].attr == attr]
    if not set_outside(cls, methods, ["None"] * len(nones), attr):
        return None
    # nothing else in the project reads or sets `.amp` (a callback's `model.amp`, a subclass's
    # `self.amp`): it goes with the migration
    mine = {id(n) for m in methods for n in walk(m, into_functions=True)} | {id(n) for n in walk(store)}
    project.read_mentioning(attr)
    if _attribute_elsewhere(project, attr):
        return None  # a file under the root that this part does not read may use it
    for other in list(project.modules.values()):
        if "." + attr not in other.src.text:
            continue
        for n in walk(other.tree, into_functions=True):
            if isinstance(n, ast.Attribute) and n.attr == attr and id(n) not in mine and \
                    not _own_of_another_class(project, other, n, cls):
                return None
    # the disabled scaler takes the place of `self.amp = None` in the class's own __init__
    if not (len(nones) == 1 and any(n is nones[0] for n in found.node.body)) or \
            any(isinstance(n, ast.Attribute) and n.attr == name for n in walk(cls, into_functions=True)):
        return None
    return OutsideSetter(s, param, attr, store, cls, module, found, nones)


def _own_of_another_class(project, module, node: ast.Attribute, cls) -> bool:
    """``self.amp`` in a method of a class that neither is ``cls`` nor inherits it: that object's
    own attribute (argus-bengali-ai's stacking model keeps its own ``self.amp``)."""
    if not (isinstance(node.value, ast.Name) and node.value.id == "self"):
        return False
    f = module.function_of(node)
    while f is not None and f.cls is None and f.outer is not None:
        f = f.outer
    if f is None or f.cls is None or not f.is_method or f.cls is cls:
        return False
    return not any(c is cls for _, c in project.ancestors(module, f.cls))


def _attribute_elsewhere(project, attr: str) -> bool:
    """A Python file under the project's root that is not among its modules (another part of the
    run, or not given) reads or sets ``<something>.<attr>``."""
    import re

    pat = re.compile(r"\.\s*" + re.escape(attr) + r"(?![A-Za-z0-9_])")
    for path in project.mentioned_elsewhere(attr, other_parts=True):
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                if pat.search(fh.read()):
                    return True
        except OSError:
            return True
    return False
