"""The rewrites of a group's uses: ``amp.scale_loss`` (the scaled backward, the autocast region
around what computes the loss), the optimizer steps and ``scaler.update()``, ``amp.master_params``
(unscale and clip), apex's state in checkpoints."""
from __future__ import annotations

import ast
import builtins
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional, Set

from ampfix.engine.tidy import pure
from ampfix.model.analysis import arg, exclusive, is_const, is_log_call, kwargs, method_call, receiver
from ampfix.model.apex import (
    feature_probe, fold_installed, none_test_of, object_alias_attrs, param_aliases, param_may_be_none, self_aliases,
)
from ampfix.migration.groups import Refuse, add_module_helper
from ampfix.migration.flow import (
    ancestors_stmts, assigned, code_body, dominates, follows, forward_region, guards, loops_around, mover_function,
    prep_function, read, stmt_of,
)
from ampfix.migration.spell import autocast_call
from ampfix.rule import ImportSpec
from ampfix.model.semantic import DEFS, block_of, dotted, enclosing_function, walk
from ampfix.migration.placement import Solver
from ampfix.migration.rewriter import runs_as_often
from ampfix.migration.seeds import (
    CLIP_SCALED_HELPER, SCALER_STATE_HELPER, UNSCALED_GRADS_HELPER, Carrier, Use, calls_model,
)
from ampfix.migration.switches import SwitchSeed, framework_autocast, low_mmcv_floors


def _input_leaves(unit) -> Set[str]:
    """Names of tensors the function marks as needing a gradient (``delta.requires_grad = True``,
    ``delta.requires_grad_()``, ``noise = Variable(x, requires_grad=True)``, ``delta =
    torch.zeros_like(x, requires_grad=True)``, ``d = x.clone().requires_grad_()``): inputs whose
    ``.grad`` is theirs, not a parameter's."""
    leaves: Set[str] = set()
    for n in walk(unit):
        if isinstance(n, ast.Assign) and is_const(n.value, True):
            leaves |= {t.value.id for t in n.targets if isinstance(t, ast.Attribute) and t.attr == "requires_grad"
                       and isinstance(t.value, ast.Name)}
        elif method_call(n, "requires_grad_") and isinstance(receiver(n), ast.Name):
            leaves.add(receiver(n).id)
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and (
                is_const(kwargs(n.value).get("requires_grad"), True)
                or (method_call(n.value, "requires_grad_") and not n.value.args
                    and not is_const(kwargs(n.value).get("requires_grad"), False))):
            leaves |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    return leaves


class UseRewrites:
    """The part of a group's plan (:class:`ampfix.migration.amp.GroupPlan`) that rewrites its uses."""

    def _key(self, u: Use):
        return Solver.key(u.module, u.func)

    def _scaler_in(self, module, func, c: Optional[Carrier]) -> str:
        return c.expr if c is not None else self.name

    def _autocast_enabled(self, module, func, c: Carrier) -> str:
        """What autocast's enabled= says in a function: the seed's condition where it is visible,
        else the scaler's own."""
        if c.sees_seed and len(c.seeds) == 1:
            idx = next(iter(c.seeds))
            return self.enabled.get(idx, "True")
        if getattr(c, "optional", None) and not self.defaults_scaler(func):
            # some callers pass none (they never reach the scaled backward): off there
            return f"bool({c.expr})" if self.bf16 else f"{c.expr} is not None and {c.expr}.is_enabled()"
        return c.expr if self.bf16 else f"{c.expr}.is_enabled()"

    def _scale_loss(self, u: Use, c: Carrier) -> None:
        call = u.call
        if call is None:
            raise Refuse(f"amp.scale_loss at line {u.line} is not called")
        item = getattr(call, "_p", None)
        w = getattr(item, "_p", None)
        if not (isinstance(item, ast.withitem) and isinstance(w, ast.With) and len(w.items) == 1):
            raise Refuse(f"amp.scale_loss at line {u.line} is not a plain `with` statement")
        loss = arg(call, "loss", 0)
        opt = arg(call, "optimizers", 1)
        if loss is None or opt is None:
            raise Refuse(f"amp.scale_loss at line {u.line} lacks its loss or optimizer")
        kws = kwargs(call)
        if "loss_id" in kws:
            self.notes.add("loss_id: one GradScaler serves every loss")
        if "delay_unscale" in kws:
            self.notes.add("delay_unscale: GradScaler unscales only in scaler.step()")
        for k in kws:
            if k not in ("loss", "optimizers", "loss_id", "delay_unscale", "model", "delay_overflow_check"):
                raise Refuse(f"amp.scale_loss argument {k!r} has no native mapping")
        code = u.module.src.code
        fc = self.fc(u.module)
        key = self._key(u)
        if isinstance(opt, (ast.List, ast.Tuple)):
            names = [code(e) for e in opt.elts]
        else:
            names = [code(opt)]
        self.scaled.setdefault(key, set()).update(names)
        scaler = c.expr
        alias = item.optional_vars.id if isinstance(item.optional_vars, ast.Name) else None
        if item.optional_vars is not None and alias is None:
            raise Refuse(f"amp.scale_loss at line {u.line} binds something other than a name")
        body = w.body
        first = body[0]
        clips = [x for y in body[1:] for x in walk(y) if isinstance(x, ast.Call)
                 and "clip" in (dotted(x.func) or "").split(".")[-1].lower()]
        if clips and not self.noscale:
            # apex unscales when the block exits: a clip inside it saw the scaled gradients (O1)
            # or the master gradients of the step before (O2), never the true ones
            why = (f"the clip at line {clips[0].lineno} ran inside apex's scale_loss block, before apex unscaled "
                   "the gradients, so it did not clip the true gradients; the migration clips the true ones, as the "
                   "code meant: the numbers change")
            self.g.unsafe = f"{self.g.unsafe}; {why}" if self.g.unsafe else why
            self._unscale_before_clip(u, w, clips, opt, scaler, kws)
        loss_code = code(loss)
        scaled = f"{scaler}.scale({loss_code})" if not self.noscale else loss_code
        if isinstance(loss, (ast.BinOp, ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr)):
            scaled = f"{scaler}.scale({loss_code})" if not self.noscale else f"({loss_code})"
        rest_uses = alias is not None and any(alias in read(x) for x in body[1:])
        if alias is not None and not rest_uses:
            # read after the block too (`amp_scale = scaled_loss.item() // loss.item()`: VILLA's
            # adversarial steps): the name must stay bound, to the scaled loss it was
            unit = u.func.node if u.func is not None else u.module.tree
            # a read in a block that binds the name again (another scale_loss's) is that block's
            inside = {id(n) for x in ast.walk(unit) if isinstance(x, ast.With) and any(
                isinstance(i.optional_vars, ast.Name) and i.optional_vars.id == alias for i in x.items)
                for n in ast.walk(x)}
            rest_uses = any(isinstance(n, ast.Name) and n.id == alias and isinstance(n.ctx, ast.Load)
                            and id(n) not in inside for n in ast.walk(unit))
        simple = (isinstance(first, ast.Expr) and method_call(first.value, "backward")
                  and dotted(receiver(first.value)) == alias and not rest_uses)
        if w.lineno == first.lineno:
            # `with amp.scale_loss(loss, opt) as s: s.backward()` on one line
            if not (simple and len(body) == 1):
                raise Refuse(f"line {w.lineno}: the body of `with amp.scale_loss` shares its line")
            call = first.value
            fc.replace_statement(w, [f"{scaled}{u.module.src.code(call)[len(u.module.src.code(receiver(call))):]}"])
            site = self._collapse(u, w, loss_code)
            self.backward_sites.setdefault(key, []).append(site)
            if not self.pure:
                self._plan_region(u, c, site, loss)
            return
        if simple:
            fc.replace(receiver(first.value), scaled)
        else:
            fc.insert_before(first, [f"{alias or '_'} = {scaled}"])
        fc.unwrap(w, body)
        fc.touched.add(id(w))
        site = self._collapse(u, w, loss_code)
        self.backward_sites.setdefault(key, []).append(site)
        if not self.pure:
            self._plan_region(u, c, site, loss)

    def _unscale_before_clip(self, u: Use, w, clips, opt, scaler: str, kws) -> None:
        """``with amp.scale_loss(loss, opt) as s: s.backward(); clip_grad_norm_(model.parameters(),
        c)`` then ``opt.step()``: the clip of the model's own parameters needs the gradients unscaled
        first (a clip of ``amp.master_params(opt)`` gets its ``unscale_`` where that is mapped).  Only
        where the optimizer steps right after the block, in the same block, every time (one
        ``unscale_`` a step), with no ``delay_unscale`` and no other ``master_params`` read in the
        function; elsewhere the self-check refuses what would be left."""
        code = u.module.src.code
        if len(clips) != 1 or "delay_unscale" in kws or not isinstance(opt, (ast.Name, ast.Attribute)):
            return
        stmt = next((x for x in w.body[1:] if isinstance(x, ast.Expr) and x.value is clips[0]), None)
        unit = u.func.node if u.func is not None else u.module.tree
        if stmt is None or any(isinstance(n, ast.Call) and (dotted(n.func) or "").endswith("master_params")
                               for n in walk(unit)):
            return
        _, _, block = block_of(w)
        i = next((k for k, x in enumerate(block) if x is w), None)
        if i is None or not any(isinstance(x, ast.Expr) and method_call(x.value, "step") and
                                code(receiver(x.value)) == code(opt) for x in block[i + 1:]):
            return
        self.fc(u.module).insert_before(stmt, [f"{scaler}.unscale_({code(opt)})"])

    @staticmethod
    def _apex_import(stmt, module) -> bool:
        """An import of apex, or a ``try:`` of apex imports (``except ImportError: raise ...``):
        the migration removes it, so it does not stop a branch from being the fp32 one's twin."""
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            return "apex" in module.src.code(stmt)
        return isinstance(stmt, ast.Try) and bool(stmt.body) and all(
            isinstance(s, (ast.Import, ast.ImportFrom)) and "apex" in module.src.code(s) for s in stmt.body)

    def _collapse(self, u: Use, w: ast.With, loss_code: str):
        """``if fp16: <scaled backward ...> else: <loss.backward() ...>`` becomes the scaled path
        alone when the else branch is its fp32 twin; returns the statement the backward is in now."""
        got = self._collapse_target(u, w, loss_code)
        if got is None:
            return w
        gd, scaled = got
        fc = self.fc(u.module)
        fc.unwrap(gd, scaled)
        fc.touched.add(id(gd))
        return gd

    def _collapse_target(self, u: Use, w: ast.With, loss_code: str):
        """(the ``if``, its scaled branch) when :meth:`_collapse` collapses it; else None."""
        gd = getattr(w, "_p", None)
        if not (isinstance(gd, ast.If) and gd.orelse):
            return None
        # `if fp16: <scaled> else: <fp32>`, or mirrored: `if fp32: <fp32> else: <scaled>`
        if any(x is w for x in gd.body):
            scaled, twin = gd.body, gd.orelse
        elif any(x is w for x in gd.orelse) and not (len(gd.orelse) == 1 and isinstance(gd.orelse[0], ast.If)):
            scaled, twin = gd.orelse, gd.body
        else:
            return None
        if not any(isinstance(x, ast.Expr) and method_call(x.value, "backward") and
                   u.module.src.code(receiver(x.value)) == loss_code for x in twin):
            return None
        # `if opt is not None: <scaled> else: loss.backward()` (fast_adversarial's attack, given
        # an optimizer when training and none when evaluating): the test is not AMP's switch, so
        # the plain branch runs with AMP on too, and stays
        # (with bfloat16 both branches are the plain backward: the `if` goes whatever it tests)
        opt = arg(u.call, "optimizers", 1) if u.call is not None else None
        held = {dotted(e) for e in (opt.elts if isinstance(opt, (ast.Tuple, ast.List)) else [opt])} - {None}
        if not self.noscale and held & {dotted(n) for n in walk(gd.test) if isinstance(n, (ast.Name, ast.Attribute))}:
            return None
        # every statement of the twin must be the twin of one in the scaled branch: the backward, a clip
        body_kinds = [self._kind(x, u.module) for x in scaled if x is not w and not self._apex_import(x, u.module)
                      and not _read_by_apex_alone(x, u)]
        else_kinds = [self._kind(x, u.module) for x in twin if not (
            isinstance(x, ast.Expr) and method_call(x.value, "backward"))]
        if sorted(body_kinds, key=str) != sorted(else_kinds, key=str) or any(k[0] == "other" for k in else_kinds):
            return None
        return gd, scaled

    def _region_in_callers(self, u: Use) -> bool:
        """Whether :meth:`_plan_region` will put this scaled backward's autocast region in the
        callers (the loss is a parameter, rescaled or derived only): decided before anything is
        rewritten, for :meth:`carriers_not_read`."""
        func = u.func
        call = u.call
        item = getattr(call, "_p", None) if call is not None else None
        w = getattr(item, "_p", None)
        loss = arg(call, "loss", 0) if call is not None else None
        if func is None or loss is None or not (isinstance(item, ast.withitem) and isinstance(w, ast.With)):
            return False
        if not self.p.callers(func) or self.p.references(func):
            return False
        got = self._collapse_target(u, w, u.module.src.code(loss))
        site = got[0] if got is not None else w
        if self._under_autocast(site):
            return False
        barriers = [s.stmt for s in self.g.seeds if s.module is u.module]
        region, missing = forward_region(site, loss, func.node, barriers, self._models(u.module, func),
                                         prep_calls=_prep_methods(func))
        if region is not None:
            return self._only_rescales(region, loss, func) or _only_derives(region, func, u.module) is not None
        return len(missing & (set(func.positional) | set(func.kwonly))) == 1

    def carriers_not_read(self) -> Set[object]:
        """bfloat16: the functions whose scaled backwards all take their loss from the callers,
        whose forward passes (and so their autocast regions) are there: nothing in the function
        reads the AMP switch, so it does not come in as a parameter (``loss_backward(opt, losses,
        optimizer)`` stays as it was)."""
        by_key: Dict[object, list] = {}
        for u, c in self.g.needs:
            by_key.setdefault(self._key(u), []).append((u, c))
        out = set()
        for key, items in by_key.items():
            if all(u.kind == "scale_loss" and c is not None and c.kind == "param" and not getattr(c, "rename", None)
                   and not getattr(c, "entry", None) for u, c in items) and \
                    all(self._region_in_callers(u) for u, _ in items):
                out.add(key)
        return out

    def _plan_region(self, u: Use, c: Carrier, site, loss) -> None:
        """The autocast region of the forward pass that computes ``loss``: before the scaled
        backward in its function, or in every caller when the loss is a parameter."""
        func = u.func
        unit = func.node if func is not None else u.module.tree
        barriers = [s.stmt for s in self.g.seeds if s.module is u.module]
        if self._under_autocast(site):
            return
        switched = _switched_autocast_before(unit, site, loss)
        if switched is not None:
            raise Refuse(f"the loss comes from line {switched.lineno}, which runs under a native autocast chosen "
                         f"by a condition (`{u.module.src.code(switched.items[0].context_expr)}`) that apex's path "
                         "does not meet: join apex's condition to it by hand")
        region, missing = forward_region(site, loss, unit, barriers, self._models(u.module, func),
                                         prep_calls=_prep_methods(func) | self._movers_called(u.module, unit))
        header = autocast_call(self.s, self._autocast_enabled(u.module, func, c))
        if region is not None and func is not None and self._only_rescales(region, loss, func):
            # `loss = loss / accumulation` on a parameter: the forward pass is in the callers
            region, missing = None, {loss.id}
        elif region is not None and func is not None:
            derived_from = _only_derives(region, func, u.module)
            if derived_from is not None:
                # `loss = sum(torch.mean(x) for x in losses)` of a parameter `losses`: the same
                region, missing = None, {derived_from}
        if region is not None:
            self._trim_backward_calls(u.module, region)
            if self._key(u) in self.no_carrier:
                raise Refuse(f"the autocast region of the scaled backward at line {u.line} was planned in the callers "
                             "and then found in its function: migrate it by hand (please report it)")
            if any(self._under_autocast(x) for x in region.stmts):
                return
            self._add_region(u.module, region.block, region.first, region.last, header)
            self._outer_region(u, func, unit, region, missing, barriers, header)
            return
        params = set(func.positional if func else []) | set(func.kwonly if func else [])
        missing_params = missing & params
        if func is None or not missing_params or len(missing_params) > 1:
            raise Refuse(f"the loss `{u.module.src.code(loss)}` is not computed before the scaled backward at line "
                         f"{u.line}: wrap its forward pass in {header} by hand")
        param = next(iter(missing_params))
        self._regions_in_callers(u, func, param)

    def _movers_called(self, module, unit) -> Set[str]:
        """The project's functions called by name in ``unit`` that only move their input to the
        device (:func:`~ampfix.migration.flow.mover_function`: ``batch = move_to_cuda(batch)``):
        input preparation, which a region does not start with."""
        out: Set[str] = set()
        for n in walk(unit):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id not in out:
                f, bound = self.p.resolve(module, n.func)
                if f is not None and not bound and f.cls is None and mover_function(f.node):
                    out.add(n.func.id)
        return out

    def _trim_backward_calls(self, module, region) -> None:
        """Leading statements of a region that call a project function running a backward of its
        own (an attack helper that takes its input's gradient: ``delta = attack(model, x, y, opt)``)
        stay out of the caller's region: the helper has its own, and a backward under autocast
        is what AMP207 warns of.  So do the plain statements between them and the forward."""
        def runs_backward(st) -> bool:
            for n in walk(st):
                if isinstance(n, ast.Call):
                    f, _ = self.p.resolve(module, n.func)
                    if f is not None and any(method_call(x, "backward") for x in walk(f.node)):
                        return True
            return False

        k = region.first
        last_helper = None
        while k < region.last:
            st = region.block[k]
            if runs_backward(st):
                last_helper = k
            elif not (isinstance(st, ast.Expr) and method_call(st.value, "zero_grad")):
                break
            k += 1
        if last_helper is not None:
            region.first = k

    def _outer_region(self, u: Use, func, unit, region, missing: Set[str], barriers, header: str) -> None:
        """The loss computed inside a branch from what the forward pass before the branch made
        (``outputs = model(samples)``, then ``if accumulating: loss = criterion(outputs, y) / n``
        ... ``else: loss = criterion(outputs, y)``): that forward pass gets a region of its own
        in the block around the branch (the loss's region stays in the branch, away from the
        backward beside it)."""
        params = set(func.positional if func else []) | set(func.kwonly if func else [])
        names = sorted(n for n in missing if n not in params and "." not in n)
        owner = getattr(region.block[0], "_p", None)
        if not names or not isinstance(owner, ast.If) or owner is unit:
            return
        wanted = ast.Tuple(elts=[ast.Name(id=n, ctx=ast.Load()) for n in names], ctx=ast.Load())
        models = self._models(u.module, func)
        outer, _ = forward_region(owner, wanted, unit, barriers, models)
        if outer is None or any(self._under_autocast(x) for x in outer.stmts):
            return
        if not any(calls_model(n, models) for x in outer.stmts for n in walk(x)):
            return  # nothing there runs the model (a known one): that is not the forward pass
        self._add_region(u.module, outer.block, outer.first, outer.last, header)

    def _regions_in_callers(self, u: Use, func, param: str, depth: int = 0) -> None:
        """The loss is the parameter ``param`` of ``func``: the autocast region goes around the
        forward pass in each caller, through callers that only pass it on (a wrapper method)."""
        sites = self.p.callers(func)
        if not sites and depth == 0 and self._framework_autocast(func):
            return
        if not sites and depth == 0 and self._own_forward(u, func):
            return
        if not sites and depth == 0 and self._hook_autocast(u, func, param):
            return
        if not sites or self.p.references(func):
            raise Refuse(f"the loss reaches line {u.line} as the parameter `{param}` of `{func.qualname}`, whose "
                         "callers cannot all be followed: wrap their forward passes in autocast by hand")
        for cs in sites:
            a = cs.argument(param)
            call_stmt = stmt_of(cs.node)
            if a is None or not (_arithmetic(a) or isinstance(a, (ast.Name, ast.Attribute, ast.Subscript))) or (
                    isinstance(a, ast.Subscript) and not isinstance(a.value, (ast.Name, ast.Attribute))):
                raise Refuse(f"`{func.qualname}` at {cs.module.path} line {cs.node.lineno} gets the loss as an "
                             "expression: compute it first, or wrap the forward in autocast by hand")
            cunit = cs.caller.node if cs.caller else cs.module.tree
            if self._under_autocast(call_stmt):
                continue
            # the region starts at the model's forward: the model is the name the caller puts in
            # training mode (XLM's `model = getattr(self, name); model.train()`), if one is
            r, still = forward_region(call_stmt, a, cunit, [s.stmt for s in self.g.seeds if s.module is cs.module],
                                      _trained_here(cunit) if cs.caller is not None else frozenset())
            if r is None and self._in_planned_region(call_stmt, a, cunit):
                continue  # computed before a loop, by a forward pass an earlier call's region covers
            if r is not None and cs.caller is not None and isinstance(a, ast.Name) and \
                    self._only_rescales(r, a, cs.caller):
                r, still = None, {a.id}
            if r is None and depth < 3 and cs.caller is not None and isinstance(a, ast.Name) and \
                    a.id in [*cs.caller.positional, *cs.caller.kwonly] and a.id in still:
                # `def backward(self, loss): return complex_backpropagate(loss, ...)`: one more up
                self._regions_in_callers(u, cs.caller, a.id, depth + 1)
                continue
            if r is None:
                raise Refuse(f"the loss passed to `{func.qualname}` at {cs.module.path} line {cs.node.lineno} is not "
                             "computed before it")
            cc = self.solver.solve(cs.module, cs.caller)
            hdr = autocast_call(self.s, self._autocast_enabled(cs.module, cs.caller, cc) if cc else "True")
            self._add_region(cs.module, r.block, r.first, r.last, hdr)

    def _framework_autocast(self, func) -> bool:
        """A hook that a framework calls with the loss its runner computed (no call in the project),
        in a class that makes the scaler itself (a switch), where every setup that initialized apex
        for it also set the framework's own mixed-precision flag on the model's modules: the
        framework runs the forward under autocast (mmcv's ``auto_fp16``), so no region is added."""
        homes = [s for s in self.g.seeds if isinstance(s, SwitchSeed) and func.cls is not None
                 and s.func.cls is func.cls]
        setups = [s for s in self.g.seeds if any(h in (getattr(s, "dropped", None) or ()) for h in homes)]
        if not homes or not setups or not all(framework_autocast(s) for s in setups):
            return False
        if self.bf16:
            raise Refuse("the framework's `fp16_enabled` flag autocasts the forward to float16 (mmcv's auto_fp16), "
                         "which --dtype bfloat16 cannot change, and float16 needs the loss scaling: migrate it "
                         "without --dtype bfloat16")
        self.notes.add("the forward runs under torch.autocast through the framework's `fp16_enabled` flag, set where "
                       "apex was initialized (mmcv's auto_fp16 does so from mmcv 1.3 with torch 1.6)")
        self._mmcv_floor()
        return True

    def _own_forward(self, u: Use, func) -> bool:
        """The loss comes to a method of an ``nn.Module`` that keeps the scaler on ``self`` (a
        training "box" whose ``forward`` computes the loss and whose ``update_params(loss)`` scales
        it), from callers that cannot be followed (the object comes from a factory): the region
        goes around the body of the class's own ``forward``, which ``box(...)`` runs.  Not when a
        subclass in the project has a ``forward`` of its own."""
        c = next((cc for uu, cc in self.g.needs if uu is u), None)
        cls = func.cls
        if c is None or c.kind != "self" or cls is None or not func.is_method or func.node.name == "forward":
            return False
        chain = [(u.module, cls), *self.p.ancestors(u.module, cls)]
        if not any(dotted(b) in ("Module", "nn.Module", "torch.nn.Module") for _, k in chain for b in k.bases):
            return False
        fwd = self.p.method(u.module, cls, "forward")
        if fwd is None or not any(fwd.cls is k for _, k in chain):
            return False
        for m in self.p.modules.values():
            for n in walk(m.tree, into_functions=True):
                if isinstance(n, ast.ClassDef) and n is not cls and any(
                        (dotted(b) or "").split(".")[-1] == cls.name for b in n.bases) and any(
                        isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef)) and x.name == "forward" for x in n.body):
                    return False
        body = fwd.node.body
        first = 1 if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
            isinstance(body[0].value.value, str) else 0
        if first >= len(body) or any(self._under_autocast(x) for x in body[first:]):
            return False
        header = autocast_call(self.s, self._autocast_enabled(fwd.module, fwd, c))
        self._add_region(fwd.module, body, first, len(body) - 1, header)
        self.notes.add(f"the loss comes to `{func.qualname}` from callers that cannot all be followed: autocast covers "
                       f"`{fwd.qualname}`, where the object computes its loss (`{cls.name.lower()}(...)` runs it)")
        return True

    #: the iteration hooks of mmcv's runners: ``before_train_iter(runner)``, then the forward pass
    #: (``batch_processor`` or ``model.train_step``), then ``after_train_iter(runner)``
    _ITER_HOOKS = ("before_train_iter", "after_train_iter")

    def _hook_autocast(self, u: Use, func, param: str) -> bool:
        """The loss comes to an mmcv hook's ``after_train_iter(runner)`` as ``runner.outputs``,
        from the runner, which ran the forward pass right after the hooks' ``before_train_iter``
        (OpenSelfSup's ``DistOptimizerHook``): no call in the project computes it, so the hook
        itself holds the autocast region: ``before_train_iter`` enters it, ``after_train_iter``
        leaves it before the backward.  Only for a hook class that keeps the scaler on ``self``,
        derives from mmcv's ``Hook`` / ``OptimizerHook``, and whose class, project bases and
        project subclasses define no ``before_train_iter`` (nor, below it, another
        ``after_train_iter``)."""
        c = next((cc for uu, cc in self.g.needs if uu is u), None)
        cls, m = func.cls, u.module
        if c is None or c.kind != "self" or cls is None or func.node.name != "after_train_iter":
            return False
        if [*func.positional[1:2]] != [param] or func.kwonly or func.node.args.vararg:
            return False
        if not self._reads_outputs(u, param):
            return False
        chain = [(m, cls), *self.p.ancestors(m, cls)]
        bases = [(mm, b) for mm, k in chain for b in k.bases]
        if not any(q.startswith("mmcv.") and q.split(".")[-1].endswith("Hook")
                   for mm, b in bases for q in mm.sem.qnames(b)):
            return False
        for mm, k in chain:
            if "mmcv" in Path(mm.path).parts[:-1]:
                continue  # mmcv's own classes (a copy in the project): their hooks do nothing
            if any(isinstance(x, DEFS) and x.name == "before_train_iter" for x in k.body):
                raise Refuse(f"`{k.name}` has a `before_train_iter` of its own: the autocast region of the runner's "
                             "forward pass cannot be planned around it; wrap the forward in autocast by hand")
        self.p.mentioned_elsewhere(cls.name)  # read every file of the run that names the class
        for mod in list(self.p.modules.values()):
            if cls.name not in mod.src.text:
                continue
            for x in walk(mod.tree, into_functions=True):
                if isinstance(x, ast.ClassDef) and x is not cls and any(k is cls for _, k in self.p.ancestors(mod, x)) \
                        and any(isinstance(y, DEFS) and y.name in self._ITER_HOOKS for y in x.body):
                    raise Refuse(f"`{x.name}` ({mod.path} line {x.lineno}) extends `{cls.name}` with iteration hooks "
                                 "of its own: wrap the runner's forward pass in autocast by hand")
        attr = "autocast"
        taken = {x.attr for x in walk(cls) if isinstance(x, ast.Attribute)}
        while attr in taken:
            attr = "_" + attr
        header = autocast_call(self.s, self._autocast_enabled(m, func, c))
        fc = self.fc(m)
        fc.insert_before(code_body(func.node.body)[0], [f"self.{attr}.__exit__(None, None, None)"])
        method = [f"def before_train_iter(self, {param}):", f"    self.{attr} = {header}",
                  f"    self.{attr}.__enter__()", ""]
        k = next(i for i, x in enumerate(cls.body) if x is func.node)
        top = fc.b.first_line(func.node)
        above = m.src.line_text(top - 1).strip() if top > 1 else ""
        if above.startswith("#") and k > 0:
            fc.insert_after(cls.body[k - 1], ["", *method[:-1]])
        else:
            fc.insert_before(func.node, method)
        self.notes.add(f"the runner runs the forward pass between `{cls.name}`'s iteration hooks: `before_train_iter` "
                       "enters autocast, `after_train_iter` leaves it before the backward (evaluation outside the "
                       "training iterations runs in float32)")
        return True

    @staticmethod
    def _reads_outputs(u: Use, param: str) -> bool:
        """The scaled loss is ``<param>.outputs[...]`` (``runner.outputs['loss']``)."""
        loss = arg(u.call, "loss", 0) if u.call is not None else None
        return isinstance(loss, ast.Subscript) and dotted(loss.value) == f"{param}.outputs"

    def _mmcv_floor(self) -> None:
        """The project's own mmcv floor below 1.3 (:func:`ampfix.migration.switches.low_mmcv_floors`)
        goes to 1.3.0, once, so an old install stops at import with the project's message."""
        for m, st in low_mmcv_floors(self.p, self.g.paths):
            fc = self.fc(m)
            if id(st.value) in fc.touched:
                continue
            quote = m.src.code(st.value)[0]
            fc.replace(st.value, f"{quote}1.3.0{quote}")
            self.g.anchors.setdefault(m.path, []).append(
                (st, "mmcv's auto_fp16 runs the forward under torch.autocast from mmcv 1.3 on: the migrated "
                     "hook needs it"))
            self.notes.add(f"{m.path}: mmcv_minimum_version {st.value.value} -> 1.3.0 (auto_fp16 autocasts from "
                           "mmcv 1.3)")

    def _in_planned_region(self, stmt, loss, unit) -> bool:
        """Whether the statement that last assigns ``loss`` (before ``stmt``, in a block around it)
        lies in a region already planned."""
        name = dotted(loss.value if isinstance(loss, ast.Subscript) else loss)
        cur = stmt
        while cur is not None and cur is not unit:
            owner, field, block = block_of(cur)
            i = next((k for k, x in enumerate(block) if x is cur), None)
            if i is None:
                return False
            for j in range(i - 1, -1, -1):
                if name in assigned(block[j]):
                    ranges = self.regions.get(id(block), (None, None, []))[2]
                    return any(a <= j <= b for a, b, *_ in ranges)
            cur = owner if isinstance(owner, ast.stmt) else None
        return False

    def _only_rescales(self, region, loss, func) -> bool:
        """The region only rescales the loss that came in as a parameter (``loss = loss / n``,
        ``loss = loss.mean()``, ``loss = self.adjust_loss(loss)`` where that method does only
        this): no forward pass is there."""
        if not (isinstance(loss, ast.Name) and loss.id in [*func.positional, *func.kwonly]):
            return False
        def reads_loss(st) -> bool:  # `loss /= n` reads it too
            return loss.id in read(st) or any(isinstance(n, ast.AugAssign) and dotted(n.target) == loss.id
                                              for n in [st, *walk(st)])

        return all(reads_loss(st) and loss.id in assigned(st) and self._calls_rescale(func.module, st, loss.id)
                   for st in region.stmts)

    def _calls_rescale(self, module, st, name: str, depth: int = 0) -> bool:
        """Every call in ``st`` is a method of ``name`` (``loss.mean()``) or a rescaler of it."""
        return all(not isinstance(n, ast.Call) or (isinstance(n.func, ast.Attribute) and dotted(n.func.value) == name)
                   or self._rescaler(module, n, name, depth) for n in walk(st))

    def _rescaler(self, module, call: ast.Call, name: str, depth: int = 0) -> bool:
        """``adjust_loss(loss)``: a project function given only the loss, whose body only
        rescales its parameter and returns it."""
        if depth > 2 or call.keywords or len(call.args) != 1 or dotted(call.args[0]) != name:
            return False
        f, bound = self.p.resolve(module, call.func)
        if f is None:
            return False
        params = f.positional[1:] if bound else f.positional
        if not params:
            return False
        p = params[0]
        body = code_body(f.node.body)
        if not body or not (isinstance(body[-1], ast.Return) and dotted(body[-1].value) == p):
            return False
        return all(p in assigned(st) and not any(isinstance(n, (ast.Return, *DEFS)) for n in walk(st))
                   and self._calls_rescale(f.module, st, p, depth + 1) for st in body[:-1])

    def _models(self, module, func) -> Set[str]:
        """Names that hold an initialized model where a region is planned (a region starts at
        the first statement that uses one: input preparation stays outside)."""
        out: Set[str] = set()
        if module.path in self.twins:
            # a model initialized beside the trained one (a teacher, a momentum encoder) runs in
            # the step too, under names the plan does not follow: the region starts at the first
            # statement the loss comes from
            return out
        def names_of(s) -> Set[str]:
            names = set(s.model_names)
            if isinstance(s.stmt, ast.Assign) and not getattr(s, "exported_from", None):
                names |= set(s.target_names)
            names.discard(None)
            return names

        if func is not None and not func.is_method and not self.p.references(func) and self.p.callers(func):
            # a function the seeds' functions hand the model to (`train_one_epoch(model, ...)`;
            # one `train_model` that several scripts import): the parameter that receives it at
            # every call, each from a seed's function
            by_func: Dict[int, Set[str]] = {}
            for s in self.g.seeds:
                if s.models is not None and s.func is not None and s.func is not func:
                    by_func.setdefault(id(s.func.node), set()).update(names_of(s))
            sites = self.p.callers(func)
            if all(cs.caller is not None and id(cs.caller.node) in by_func for cs in sites):
                for pname in [*func.positional, *func.kwonly]:
                    got = [(cs.argument(pname), by_func[id(cs.caller.node)]) for cs in sites]
                    if all(a is not None and dotted(a) in names for a, names in got):
                        out.add(pname)
        for s in self.g.seeds:
            if s.models is not None and s.module is not module and func is not None and func.cls is not None and \
                    s.func is not None and s.func.cls is not None and self.solver.related(func, s.func):
                # a subclass's setup (nnUNet's `_maybe_init_amp` with O2) initializes what a base
                # class's method trains (`run_iteration`), or the other way round: what it keeps on self
                out |= {n for n in names_of(s) if n.startswith("self.")}
                continue
            if s.models is None or s.module is not module:
                continue
            names = names_of(s)
            if s.func is func:
                out |= names
            elif func is not None and s.func is not None and func.cls is not None and func.cls is s.func.cls:
                # another method of the seed's class: what the seed's method keeps on self
                out |= {n for n in names if n.startswith("self.")}
                for x in walk(s.func.node):
                    if isinstance(x, ast.Assign) and dotted(x.value) in names:
                        out |= {dotted(t) for t in x.targets if (dotted(t) or "").startswith("self.")}
        return out - {"self", None}

    # -- steps and update ----------------------------------------------------------------------
    def _steps(self) -> None:
        """Every ``opt.step()`` of a scaled optimizer that follows a scaled backward in its function
        becomes ``scaler.step(opt)``; one ``scaler.update()`` follows the last of them."""
        done = set()
        for u, c in self.g.needs:
            if u.kind != "scale_loss":
                continue
            key = self._key(u)
            if key in done:
                continue
            done.add(key)
            unit = u.func.node if u.func is not None else u.module.tree
            names = self.scaled.get(key, set())
            loop_vars = self._loop_vars(unit, names)
            backs = self.backward_sites.get(key, [])
            steps = []
            held = names | self._same_object(unit, names)
            for n in walk(unit):
                if method_call(n, "step") and not n.args and not n.keywords:
                    r = u.module.src.code(receiver(n))
                    if r in held or r in loop_vars:
                        steps.append(n)
            converted = [s for s in steps if follows(stmt_of(s), backs, unit)]
            self.steps_of[key] = converted
            if not converted:
                if not steps and self._input_gradient(unit, backs):
                    self.notes.add("a scaled backward for an input's gradient (an attack's `delta.grad`) steps nothing: "
                                   "the scaler scales it as apex did; the step that follows unscales the "
                                   "parameters' gradients at the same scale")
                    continue
                if not self._steps_through_wrapper(u, c, names, unit, backs, key):
                    self._steps_elsewhere(u, c, names)
                continue
            if self.shared_by_setups and any(not runs_as_often(b, stmt_of(s), unit) for b in backs for s in converted):
                # one scaler for the optimizers of two setups: the other optimizer's update()
                # would change the scale between this one's accumulated backwards
                raise Refuse(f"one GradScaler serves the optimizers of {self.shared_by_setups}, and the step at "
                             f"{u.module.path} line {converted[0].lineno} runs on fewer iterations than the scaled "
                             "backward (accumulation): the other optimizer's scaler.update() would change the scale "
                             "mid-accumulation; make a scaler per optimizer by hand")
            fc = self.fc(u.module)
            if not self.noscale:
                self._backwards_before_the_step(u, c, unit, backs, converted)
            self._step_through(u.module, converted, c.expr)
            self._unscale_for_gradient_reads(u, c, unit, backs, converted)
            self._unscale_at_the_step(u, c, unit, backs, converted)
            for last, anchor in self._update_anchors(converted, unit):
                # after a loop over the optimizers, once
                for a in ancestors_stmts(anchor, unit):
                    if isinstance(a, (ast.For, ast.AsyncFor)) and u.module.src.code(receiver(last)) in self._targets(a):
                        anchor = a
                fc.insert_after(anchor, [f"{c.expr}.update()"])

    @staticmethod
    def _input_gradient(unit, backs) -> bool:
        """The scaled backward is taken for an input's gradient, not for a step: a tensor the
        function marks ``x.requires_grad = True`` (or ``requires_grad_()``) has its ``x.grad`` read
        after the backward (an adversarial attack's ``delta.grad``; fast_adversarial's PGD).  apex
        left that gradient scaled too (only the optimizer's parameters are unscaled), and the
        parameters' gradients the scaled backward leaves are scaled at the scale the next step
        unscales by (GradScaler changes it only in ``update()``, after a step)."""
        leaves = _input_leaves(unit)
        if not leaves:
            return False
        last = max((b.end_lineno for b in backs), default=None)
        return last is not None and any(
            isinstance(n, ast.Attribute) and n.attr == "grad" and isinstance(n.value, ast.Name)
            and n.value.id in leaves and isinstance(n.ctx, ast.Load) and n.lineno > last for n in walk(unit))

    def _backwards_before_the_step(self, u: Use, c: Carrier, unit, backs, steps) -> None:
        """Another ``x.backward()`` between the scaled backward and the step (an adversarial loss,
        UER-py's FGM/PGD): apex had unscaled the first backward's gradients when its block exited,
        so this one added true gradients to true ones; GradScaler unscales every gradient at the
        step, so this one is scaled too (``scaler.scale(x).backward()``), where ``x`` comes from
        the same model's forward and the optimizer is the group's only one (each seed initializes
        one).  Otherwise its gradients would shrink by the loss scale: refuse."""
        inside = {id(n) for b in backs for n in walk(b)}

        def pos(n):
            return (n.lineno, n.col_offset)

        others = []
        for n in walk(unit):
            if not (method_call(n, "backward") and id(n) not in inside):
                continue
            st = stmt_of(n)
            if any(pos(b) < pos(st) and not exclusive(b, st, unit) for b in backs) and any(
                    pos(st) < pos(stmt_of(x)) and not exclusive(st, stmt_of(x), unit) for x in steps):
                others.append(n)
        if not others:
            return
        models = self._models(u.module, u.func)
        single = all(s.optimizers is None or not isinstance(s.optimizers, (ast.List, ast.Tuple))
                     for s in self.g.seeds if getattr(s, "training", False))
        code = u.module.src.code
        fc = self.fc(u.module)
        for n in others:
            x = receiver(n)
            made = [a for a in walk(unit) if isinstance(a, (ast.Assign, ast.AugAssign)) and isinstance(x, ast.Name)
                    and x.id in assigned(a) and any(calls_model(k, models) for k in walk(a))] if models else []
            if not (single and made and isinstance(stmt_of(n), ast.Expr)):
                raise Refuse(f"`{code(n)}` at line {n.lineno} is another backward before the step: apex had unscaled "
                             "the scaled backward's gradients before it added its own; GradScaler unscales every "
                             f"gradient at the step, so scale it too (`{c.expr}.scale({code(x)}).backward()`) if its "
                             "gradients go to the same optimizer, and migrate it by hand")
            fc.replace(x, f"{c.expr}.scale({code(x)})")
            self.notes.add(f"`{code(n)}` (another backward before the step) is scaled too: the scaler unscales every "
                           "gradient at the step, as apex had unscaled the first backward's before it")
            # its forward pass ran in float16 under apex (O1 patched every call): autocast too
            st = stmt_of(n)
            barriers = [s.stmt for s in self.g.seeds if s.module is u.module]
            r, _ = forward_region(st, x, unit, barriers, models)
            if r is not None and not any(self._under_autocast(y) for y in [st, *r.stmts]) and \
                    any(calls_model(k, models) for y in r.stmts for k in walk(y)):
                self._add_region(u.module, r.block, r.first, r.last,
                                 autocast_call(self.s, self._autocast_enabled(u.module, u.func, c)))

    @staticmethod
    def _update_anchors(steps, unit) -> List[tuple]:
        """Where ``scaler.update()`` goes: once after the steps of each path that steps (steps in
        other branches of an ``if``, `if accumulating: ... step ... else: step`, each get their
        own, and so do steps in different loops), after the statement that holds every step of
        the path (``opt1.step(); if c: opt2.step()``: after the ``if``, so a path that skips the
        second step updates too).
        Pairs of (the path's last step, the statement to insert after)."""
        left = sorted(steps, key=lambda n: (n.lineno, n.col_offset))

        def loops(n) -> List[int]:
            return [id(x) for x in loops_around(stmt_of(n), unit)]

        out = []
        while left:
            last = left[-1]
            # steps in other loops (two training loops one after the other, a step in the epoch
            # loop after the batch loop's) repeat apart: each loop's needs its own update, or the
            # second iteration's step finds the first's not updated (GradScaler raises)
            path = [s for s in left if not exclusive(stmt_of(s), stmt_of(last), unit) and loops(s) == loops(last)]
            left = [s for s in left if s not in path]
            anchor = stmt_of(last)
            chains = [[stmt_of(s), *ancestors_stmts(stmt_of(s), unit)] for s in path]
            for cand in [stmt_of(last), *ancestors_stmts(stmt_of(last), unit)]:
                _, _, block = block_of(cand)
                if all(any(x is y for x in ch for y in block) for ch in chains):
                    anchor = cand  # the statement of the block that holds every step of the path
                    break
            out.append((last, anchor))
        return out

    @staticmethod
    def _same_object(unit, names: Set[str]) -> Set[str]:
        """``optimizer = self.optimizer`` before ``model, optimizer = amp.initialize(model,
        optimizer)`` (which hands the same object back): ``self.optimizer.step()`` steps it too.
        The local may be bound only by that copy and by initialize."""
        out: Set[str] = set()
        binds: Dict[str, List[ast.Assign]] = {}
        for x in walk(unit):
            if isinstance(x, ast.Assign):
                for t in x.targets:
                    for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]):
                        if isinstance(e, ast.Name):
                            binds.setdefault(e.id, []).append(x)
            elif isinstance(x, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor, ast.NamedExpr, ast.withitem)):
                target = x.optional_vars if isinstance(x, ast.withitem) else x.target
                for e in [target, *walk(target)] if target is not None else []:
                    if isinstance(e, ast.Name) and isinstance(e.ctx, ast.Store):
                        binds.setdefault(e.id, []).append(None)
        for name in names:
            copies = [a for a in binds.get(name, []) if a is not None and len(a.targets) == 1
                      and isinstance(a.targets[0], ast.Name) and isinstance(a.value, ast.Attribute)
                      and (dotted(a.value) or "").startswith("self.")]
            others = [a for a in binds.get(name, []) if a not in copies]
            if len(copies) != 1 or not all(
                    a is not None and isinstance(a.value, ast.Call) and (dotted(a.value.func) or "").endswith(
                        "amp.initialize") for a in others):
                continue
            out.add(dotted(copies[0].value))
        return out

    def _unscale_for_gradient_reads(self, u: Use, c: Carrier, unit, backs, steps, opt: Optional[str] = None) -> None:
        """apex unscaled the gradients when ``scale_loss`` exited: code between the backward and
        the step that reads them (a clip of the model's parameters, a gradient norm logged) read
        true gradients.  ``scaler.unscale_(opt)`` right after the backward keeps that, where the
        step runs on every iteration the backward does (no accumulation: unscale_ may run once
        per step).  A clip of ``amp.master_params`` is left to its own rewrite.  ``opt``: the
        optimizer, where the steps are calls of a wrapper's method that steps it."""
        m = u.module
        leaves = _input_leaves(unit)
        for site in backs:
            owner, field, block = block_of(site)
            i = next((k for k, x in enumerate(block) if x is site), None)
            if i is None:
                continue
            for s in steps:
                j = next((k for k in range(i + 1, len(block)) if block[k] is stmt_of(s) or any(
                    y is s for y in walk(block[k]))), None)
                if j is None or not runs_as_often(site, stmt_of(s), unit):
                    continue
                between = block[i + 1:j + 1]
                if not any(self._reads_gradients(x, leaves) for x in between):
                    continue
                later = [b for b in backs if b is not site and any(b is x or any(b is y for y in walk(x))
                                                                    for x in between)]
                if later:
                    # unscale_ may run once per step: the gradients of the backward after it would
                    # reach the step still scaled
                    raise Refuse(f"the gradients are read between the scaled backwards at lines {site.lineno} and "
                                 f"{later[0].lineno}, before one step: migrate it by hand")
                if any("master_params" in m.src.code(x) for x in between):
                    continue
                o = opt or m.src.code(receiver(s))
                if any(mm is m and oo == o and dominates(prev, block[i + 1]) for mm, oo, prev in self.unscaled):
                    continue
                self.unscaled.append((m, o, site))
                fc = self.fc(m)
                fc.insert_after(site, [f"{c.expr}.unscale_({o})"])
                self.notes.add("the gradients are read before the step (a clip, a norm): scaler.unscale_ right after "
                               "the backward, as apex unscaled them there")

    def _unscale_at_the_step(self, u: Use, c: Carrier, unit, backs, steps) -> None:
        """Accumulation: ``if every_n(...): clip(...); opt.step()``.  apex unscaled the gradients
        on every backward, so a clip at the step read true gradients; here they are still scaled,
        so ``scaler.unscale_(opt)`` goes right before the first statement of the step's block that
        reads them (inside its ``if`` when that is where the read is), once per step."""
        m = u.module
        for s in steps:
            st = stmt_of(s)
            if any(runs_as_often(site, st, unit) for site in backs):
                continue  # the backward's own block: _unscale_for_gradient_reads
            owner, field, block = block_of(st)
            j = next((k for k, x in enumerate(block) if x is st), None)
            if j is None:
                continue
            before = block[:j]
            if any(b is y or any(b is z for z in walk(y)) for b in backs for y in before):
                continue
            reads = [x for x in before if self._reads_gradients(x)]
            if not reads or any("master_params" in m.src.code(x) for x in reads):
                continue
            o = m.src.code(receiver(s))
            target = reads[0]
            while isinstance(target, ast.If) and not target.orelse:
                inner = [x for x in target.body if self._reads_gradients(x)]
                if not inner:
                    break
                target = inner[0]
            if any(mm is m and oo == o and dominates(prev, target) for mm, oo, prev in self.unscaled):
                continue
            self.unscaled.append((m, o, target))
            self.fc(m).insert_before(target, [f"{c.expr}.unscale_({o})"])
            self.notes.add("the gradients are read at the step (a clip, a norm): scaler.unscale_ right before, as "
                           "apex had unscaled them on every backward")

    def _steps_in_callers(self, u: Use, c: Carrier, names: Set[str], why: str) -> None:
        """``def backward(loss, optimizer): with amp.scale_loss(loss, optimizer) ...`` called as
        ``backward(loss, opt); opt.step()``: the caller's step, after the call, is the scaler's (the
        caller has the scaler: it hands it to the helper).  Every call must be followed by its step,
        with no other backward between them."""
        func = u.func
        sites = self.p.callers(func)
        if not sites or self.p.references(func):
            raise Refuse(f"{why}, and not all its callers can be followed: migrate the step by hand")
        plan = []
        for cs in sites:
            cc = self.solver.solve(cs.module, cs.caller)
            if cc is None:
                raise Refuse(f"{why}, and `{cs.caller.qualname if cs.caller else 'module level'}` has no scaler")
            for n in names:
                a = cs.argument(n)
                o = dotted(a) if a is not None else None
                if o is None:
                    raise Refuse(f"{why}, and the optimizer passed at {cs.module.path} line {cs.node.lineno} is not a "
                                 "name: migrate the step by hand")
                plan.extend(self._steps_after(cs, cc, o, why))
        done = set()
        for cs, cc, o, steps in plan:
            steps = [x for x in steps if id(x) not in done]
            done |= {id(x) for x in steps}
            self._step_through(cs.module, steps, cc.expr)
            for x in steps:
                self.fc(cs.module).insert_after(stmt_of(x), [f"{cc.expr}.update()"])
            # in the caller, the call is the scaled backward: a clip or a gradient read between it
            # and the step (`amp.master_params` too) gets the scaler's unscale_ as apex's had
            cunit = cs.caller.node if cs.caller else cs.module.tree
            call_st = stmt_of(cs.node)
            key = Solver.key(cs.module, cs.caller)
            self.backward_sites.setdefault(key, []).append(call_st)
            self.steps_of[key] = self.steps_of.get(key, []) + steps
            at = SimpleNamespace(module=cs.module)
            self._unscale_for_gradient_reads(at, cc, cunit, [call_st], steps)
            self._unscale_at_the_step(at, cc, cunit, [call_st], steps)
            self.reads_after_calls.append((cs, cunit, call_st, o, steps, why))
        self.notes.add(f"the optimizer steps where `{func.qualname}` is called: the scaler steps it there")

    def _check_reads_after_calls(self) -> None:
        """After every rewrite of the group: a gradient read between a helper's scaled backward and
        the caller's step must come after an unscale_ (apex's gradients were true ones there);
        one that cannot (a clip on micro-batches where the optimizer does not step) refuses."""
        for cs, cunit, call_st, o, steps, why in self.reads_after_calls:
            fc = self.fc(cs.module)
            for r in walk(cunit):
                if not (isinstance(r, (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign))
                        and self._reads_gradients(r) and follows(r, [call_st], cunit)
                        and any(follows(stmt_of(x), [r], cunit) for x in steps)):
                    continue
                if any(id(a) in fc.touched for a in [r, *ancestors_stmts(r, cunit)]) or any(
                        mm is cs.module and oo == o and dominates(prev, r) for mm, oo, prev in self.unscaled):
                    continue  # rewritten with its unscale_ (a master_params clip and its fp32 twin)
                raise Refuse(f"{why}, and the gradients are read at {cs.module.path} line {r.lineno} before they "
                             "can be unscaled (on micro-batches where the optimizer does not step): migrate it by "
                             "hand")

    def _steps_after(self, cs, cc: Carrier, o: str, why: str, depth: int = 0) -> list:
        """The steps of ``o`` after the call ``cs`` in its caller; where the caller only wraps the
        call (``def backward(self, loss): return backpropagate(loss, self.opt, ...)``), after the
        calls of the caller, one level up at a time."""
        cunit = cs.caller.node if cs.caller else cs.module.tree
        call_st = stmt_of(cs.node)
        steps = [x for x in walk(cunit) if method_call(x, "step") and not x.args and not x.keywords
                 and dotted(receiver(x)) == o and follows(stmt_of(x), [call_st], cunit)]
        others = [x for x in walk(cunit) if method_call(x, "backward") and x is not cs.node]
        if others:
            raise Refuse(f"{why}, and `{cs.module.src.code(others[0])}` at {cs.module.path} line "
                         f"{others[0].lineno} is another backward before a step: migrate the step by hand")
        if steps:
            return [(cs, cc, o, steps)]
        f = cs.caller
        body = code_body(f.node.body) if f is not None else []
        lost = Refuse(f"{why} nor after the call at {cs.module.path} line {cs.node.lineno}: migrate the step by hand")
        if depth >= 2 or not body or body[-1] is not call_st or self.p.references(f) or not self.p.callers(f):
            raise lost
        out = []
        for up in self.p.callers(f):
            if o.startswith("self.") and f.is_method and up.bound_self and up.caller is not None and \
                    up.caller.cls is f.cls and dotted(up.node.func) == "self." + f.node.name:
                o2 = o
            elif o in [*f.positional, *f.kwonly] and up.argument(o) is not None:
                o2 = dotted(up.argument(o))
            else:
                o2 = None
            ucc = self.solver.solve(up.module, up.caller)
            if o2 is None or ucc is None:
                raise lost
            out.extend(self._steps_after(up, ucc, o2, why, depth + 1))
        return out

    @staticmethod
    def _reads_gradients(stmt, leaves: Set[str] = frozenset()) -> bool:
        """A read of parameters' gradients (``leaves``: inputs whose ``.grad`` is their own)."""
        for n in [stmt, *walk(stmt)]:
            if isinstance(n, ast.Attribute) and n.attr == "grad" and isinstance(n.ctx, ast.Load) and not (
                    isinstance(n.value, ast.Name) and n.value.id in leaves):
                return True
            if isinstance(n, ast.Call):
                name = (dotted(n.func) or "").split(".")[-1]
                if name in ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_grads"):
                    return True
                if ("grad" in name.lower() or "norm" in name.lower()) and any(
                        method_call(a, "parameters", "named_parameters") for a in n.args):
                    return True
        return False

    def _step_through(self, module, steps, scaler: str) -> None:
        """Each ``opt.step()`` of ``steps`` (a statement of its own) becomes ``scaler.step(opt)``."""
        fc = self.fc(module)
        for n in steps:
            st = stmt_of(n)
            if not (isinstance(st, ast.Expr) and st.value is n):
                raise Refuse(f"`{module.src.code(n)}` at line {n.lineno} is not a statement of its own")
            fc.replace(n, f"{scaler}.step({module.src.code(receiver(n))})")

    def _loop_vars(self, unit, names: Set[str]) -> Set[str]:
        out = set()
        for n in walk(unit):
            if isinstance(n, (ast.For, ast.AsyncFor)) and isinstance(n.target, ast.Name):
                it = n.iter
                if dotted(it) in names or (isinstance(it, ast.Call) and method_call(it, "values") and dotted(receiver(it)) in names):
                    out.add(n.target.id)
        return out

    @staticmethod
    def _targets(loop) -> Set[str]:
        return {dotted(t) for t in ([loop.target] if not isinstance(loop.target, ast.Tuple) else loop.target.elts)}

    def _steps_elsewhere(self, u: Use, c: Carrier, names: Set[str]) -> None:
        """A trainer whose ``backward_step(loss)`` scales the loss and whose ``optim_step()`` steps:
        the scaler lives on ``self``, so the step of another method of the class is the scaler's,
        when every backward of the class is the scaled one (no step there follows a plain
        backward)."""
        func = u.func
        why = (f"the step of `{', '.join(sorted(names))}` after the scaled backward at line {u.line} is not in "
               f"`{func.qualname if func else 'module level'}`")
        # the optimizer comes in as a parameter: its step is the callers' (whatever carries the
        # scaler here: a parameter, or `self.scaler` of a trainer whose `train` calls
        # `self._training_step(model, inputs, optimizer)` and steps after it)
        if func is not None and all(n in func.positional or n in func.kwonly for n in names):
            self._steps_in_callers(u, c, names, why)
            return
        if func is None or func.cls is None or not func.is_method or not c.expr.startswith("self.") or not all(
                n.startswith("self.") for n in names):
            raise Refuse(f"{why}: migrate the step by hand")
        m = u.module
        fc = self.fc(m)
        methods = [x for x in func.cls.body if isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef))]
        scaled_withs = {id(w) for x in methods for w in walk(x)
                        if isinstance(w, (ast.With, ast.AsyncWith)) and id(w) in fc.touched}
        for x in methods:
            for n in walk(x):
                if not (method_call(n, "backward") and isinstance(getattr(n, "_p", None), ast.Expr)):
                    continue
                st = n._p
                ok = any(id(a) in scaled_withs for a in ancestors_stmts(st, x))
                gd = getattr(st, "_p", None)
                ok = ok or (isinstance(gd, ast.If) and id(gd) in fc.touched and any(e is st for e in gd.orelse))
                if not ok:
                    raise Refuse(f"{why}, and `{m.src.code(n)}` at line {n.lineno} is a backward that is not "
                                 "scaled: migrate the step by hand")
        found = []
        for x in methods:
            if x is func.node:
                continue
            steps = [n for n in walk(x) if method_call(n, "step") and not n.args and not n.keywords
                     and m.src.code(receiver(n)) in names]
            if steps:
                found.append((x, steps))
        if not found:
            raise Refuse(f"{why} nor in another method of `{func.cls.name}`: migrate the step by hand")
        for x, steps in found:
            self._step_through(m, steps, c.expr)
            for _, anchor in self._update_anchors(steps, x):
                fc.insert_after(anchor, [f"{c.expr}.update()"])
            key = ("f", id(x))
            self.steps_of[key] = steps
            self.step_methods.add(key)
        self.notes.add(f"the optimizer steps in another method of `{func.cls.name}`: the scaler on self steps it")

    # -- master_params, state ---------------------------------------------------------------------
    def _master_params(self, u: Use, c: Carrier) -> None:
        """``amp.master_params(opt)`` -> the optimizer's parameters, unscaled first where the
        gradients are read after a scaled backward.  ``scaler.unscale_`` may run once per step: a
        clip that runs more often than the step (every micro-batch of an accumulation) moves to
        the step (:meth:`_clip_at_the_step`)."""
        call = u.call
        opt = arg(call, "optimizer", 0) if call is not None else None
        if opt is None:
            raise Refuse(f"amp.master_params at line {u.line} is not called with an optimizer")
        code = u.module.src.code
        o = code(opt)
        fc = self.fc(u.module)
        params = (self._twin_params(u, call) or self._parameters_named(u, opt)
                  or f'(p for group in {o}.param_groups for p in group["params"])')
        st = stmt_of(call)
        key = self._key(u)
        unit = u.func.node if u.func is not None else u.module.tree
        backs = self.backward_sites.get(key, [])
        # the steps this read can be followed by (not those of another branch: `if accumulating:
        # clip; if every_n: step` beside `else: clip; step`)
        steps = [x for x in self.steps_of.get(key, []) if not exclusive(stmt_of(x), st, unit)]
        if not self.noscale and follows(st, backs, unit) and steps and not any(
                runs_as_often(st, stmt_of(s), unit) for s in steps):
            if not self._clip_scaled(u, c, call, params):
                if not self._read_unscaled(u, c, call, o, params):
                    self._clip_at_the_step(u, c, call, steps, o, params)
            return
        twin = getattr(call, "_p", None)
        if isinstance(twin, ast.IfExp) and (twin.body is call or twin.orelse is call) and \
                "master_params" not in code(twin.orelse if twin.body is call else twin.body) and \
                pure(twin.test):
            # `amp.master_params(opt) if self.apex else [p for g in opt.param_groups ...]`: the
            # branches are one now, by the other's words
            fc.replace(twin, code(twin.orelse if twin.body is call else twin.body))
        else:
            fc.replace(call, params)
        fc.drop_stale_comment(st, ("master",))
        # in the method that steps after another's scaled backward, a clip before the step
        before_step = key in self.step_methods and any(follows(stmt_of(x), [st], unit) for x in steps)
        if self.noscale:
            # no scaler to unscale: the clip and its fp32 twin are one statement now
            self._collapse_clip(u, st)
            return
        if not (follows(st, backs, unit) or before_step):
            if u.func is not None and self._reads_gradients(unit):
                self._unscale_at_callers(u, c, o)
            return
        if any(m is u.module and oo == o and dominates(prev, st) for m, oo, prev in self.unscaled):
            return
        self.unscaled.append((u.module, o, st))
        fc.insert_before(st, [f"{c.expr}.unscale_({o})"])
        self._collapse_clip(u, st)

    def _unscale_at_callers(self, u: Use, c: Carrier, o: str) -> None:
        """``amp.master_params`` read in a helper that clips or reads the gradients
        (``self._clip_gradients()``), called after the scaled backward and before the step of
        another method: apex had unscaled them when its scale_loss block ended, so the scaler
        unscales them before each such call (once per step: the first call of the method).  A
        caller that is not such a method, or calls it more often than it steps, is refused."""
        f = u.func
        sites = self.p.callers(f)
        why = (f"amp.master_params at line {u.line} is read in `{f.node.name}`, which reads the gradients "
               "where apex had unscaled them")
        if not sites or self.p.references(f) or not c.expr.startswith("self.") or f.cls is None:
            raise Refuse(f"{why}, and its callers cannot all be followed: unscale them by hand")
        for cs in sites:
            caller = cs.caller
            if caller is None or caller.cls is not f.cls:
                raise Refuse(f"{why}, and it is called from outside its class at line {cs.node.lineno}: "
                             "unscale them by hand")
            key = Solver.key(cs.module, caller)
            st = stmt_of(cs.node)
            backs = self.backward_sites.get(key, [])
            steps = [x for x in self.steps_of.get(key, []) if not exclusive(stmt_of(x), st, caller.node)]
            if not (backs and steps and follows(st, backs, caller.node)
                    and _a_step_follows(st, [stmt_of(x) for x in steps], caller.node)):
                raise Refuse(f"{why}, and its call at line {cs.node.lineno} is not between the scaled backward "
                             "and one step: unscale them by hand")
            self.caller_unscales.append((cs.module, o, st, c.expr))

    def _unscale_before_calls(self) -> None:
        """The unscales :meth:`_unscale_at_callers` asked for, once all are known: before the
        first of the calls in each method (one unscale per step)."""
        asked = self.caller_unscales
        first = [(m, o, st, expr) for m, o, st, expr in asked
                 if not any(mm is m and oo == o and x is not st and dominates(x, st) for mm, oo, x, _ in asked)]
        for k, (m, o, st, _) in enumerate(first):
            unit = enclosing_function(st)
            for mm, oo, x, _ in first[k + 1:]:
                if mm is m and oo == o and x is not st and enclosing_function(x) is unit and \
                        not exclusive(x, st, unit):
                    raise Refuse(f"helpers that read the gradients where apex had unscaled them are called at "
                                 f"lines {st.lineno} and {x.lineno}, and neither runs first on every path: "
                                 "unscale them by hand")
        for m, o, st, expr in first:
            if any(mm is m and oo == o and (x is st or dominates(x, st)) for mm, oo, x in self.unscaled):
                continue
            self.unscaled.append((m, o, st))
            self.fc(m).insert_before(st, [f"{expr}.unscale_({o})"])

    def _twin_params(self, u: Use, call) -> Optional[str]:
        """``if fp16: clip(amp.master_params(opt), n) else: clip(model.parameters(), n)``: the
        parameters the fp32 twin clipped, by the name the code has, once the two branches become one."""
        clip = getattr(call, "_p", None)
        if not (isinstance(clip, ast.Call) and clip.args and clip.args[0] is call):
            return None
        st = stmt_of(clip)
        gd = getattr(st, "_p", None)
        code = u.module.src.code
        test = None
        if isinstance(gd, ast.If) and gd.body == [st] and not gd.orelse:
            # `if max_norm > 0: clip(...)` in each branch
            test, st, gd = code(gd.test), gd, getattr(gd, "_p", None)
        if not (isinstance(gd, ast.If) and any(x is st for x in gd.body) and gd.orelse):
            return self._twin_params_around(u, call, clip)
        clips = [x for x in gd.orelse if test is None] + [
            x.body[0] for x in gd.orelse if test is not None and isinstance(x, ast.If) and len(x.body) == 1
            and not x.orelse and code(x.test) == test]
        found = [x.value.args[0] for x in clips if isinstance(x, (ast.Expr, ast.Assign, ast.AugAssign))
                 and isinstance(x.value, ast.Call) and dotted(x.value.func) == dotted(clip.func) and x.value.args]
        if len(found) != 1 or "master_params" in code(found[0]):
            return None
        return code(found[0])

    def _twin_params_around(self, u: Use, call, clip) -> Optional[str]:
        """``if params.amp == -1: ... for name in names: clip(self.parameters[name], n)`` beside
        ``else: ... for name in names: clip(amp.master_params(self.optimizers[name]), n)``, further
        apart than :meth:`_twin_params` looks: the fp32 arm of an ``if`` around the clip clips one
        thing with the same function and arguments, by names the apex clip reads too (its loop
        variable, ``self``): the names the code has."""
        code = u.module.src.code

        def rest_of(c) -> List[str]:  # the clip's arguments after the parameters
            return [code(a) for a in c.args[1:]] + [f"{k.arg}={code(k.value)}" for k in c.keywords]

        rest = rest_of(clip)
        mine = {n.split(".")[0] for n in read(call.args[0] if call.args else call)} | {"self"}
        unit = u.func.node if u.func is not None else u.module.tree
        for gd in ancestors_stmts(stmt_of(clip), unit):
            if not isinstance(gd, ast.If) or not gd.orelse:
                continue
            inside = any(x is stmt_of(clip) for b in gd.body for x in [b, *walk(b)])
            other = gd.orelse if inside else gd.body
            found = [x for b in other for x in [b, *walk(b)] if isinstance(x, ast.Call) and x is not clip
                     and dotted(x.func) == dotted(clip.func) and x.args and rest_of(x) == rest]
            if not found:
                continue
            if len(found) != 1 or "master_params" in code(found[0].args[0]) or \
                    not {n.split(".")[0] for n in read(found[0].args[0])} <= mine:
                return None
            return code(found[0].args[0])
        return None

    def _parameters_named(self, u: Use, opt) -> Optional[str]:
        """``model.parameters()`` where the optimizer was built from it in the same function (and
        ``model`` is bound nowhere else there but by amp.initialize or a DDP/DataParallel wrap,
        which keep its parameters): the names the code has, not the optimizer's param_groups."""
        if not isinstance(opt, ast.Name):
            return None
        unit = u.func.node if u.func is not None else u.module.tree
        made = [n for n in walk(unit) if isinstance(n, ast.Assign) and any(
            isinstance(tg, ast.Name) and tg.id == opt.id for tg in n.targets)]
        built = [n for n in made if isinstance(n.value, ast.Call) and n.value.args]
        if len(built) != 1:
            return None
        first = built[0].value.args[0]
        if not (method_call(first, "parameters") and not first.args and not first.keywords
                and isinstance(receiver(first), ast.Name)):
            return None
        name = receiver(first).id
        for n in walk(unit):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, (ast.AugAssign, ast.AnnAssign)) else []
            flat = [e for tg in targets for e in (tg.elts if isinstance(tg, ast.Tuple) else [tg])]
            if not any(isinstance(e, ast.Name) and e.id == name for e in flat):
                continue
            value = n.value if isinstance(n, ast.Assign) else None
            call = value if isinstance(value, ast.Call) else None
            wraps = call is not None and (dotted(call.func) or "").split(".")[-1] in (
                "initialize", "DistributedDataParallel", "DataParallel", "DDP") and any(
                isinstance(a, ast.Name) and a.id == name for a in call.args[:1])
            if n.lineno > built[0].lineno and not wraps:
                return None
        return f"{name}.parameters()"

    def _clip_scaled(self, u: Use, c: Carrier, call, params: str) -> bool:
        """``clip_grad_norm_(amp.master_params(opt), n)`` on every micro-batch, where the optimizer
        steps less often: apex had unscaled the gradients after each backward, native AMP unscales
        once per step.  The clip stays where it was, on the scaled gradients, through a helper that
        divides their norm by the scale on the device (no host copy, unlike ``n * get_scale()``):
        the same clip of the same partial sums, and the same norm returned.  False where it does
        not apply (another clip, options the helper lacks); below torch 1.9 the helper uses ``torch.norm``."""
        clip = getattr(call, "_p", None)
        if not (isinstance(clip, ast.Call) and clip.args and clip.args[0] is call
                and (dotted(clip.func) or "").split(".")[-1] in ("clip_grad_norm_", "clip_grad_norm")):
            return False
        if len(clip.args) > 3 or any(
                k.arg not in ("max_norm", "norm_type") for k in clip.keywords):
            return False
        code = u.module.src.code
        rest = [code(a) for a in clip.args[1:]] + [f"{k.arg}={code(k.value)}" for k in clip.keywords]
        if not rest:
            return False
        fc = self.fc(u.module)
        st = stmt_of(clip)
        fc.replace(clip, f"_clip_scaled_grad_norm_({c.expr}, {params}, {', '.join(rest)})")
        fc.drop_stale_comment(st, ("master",))
        helper = CLIP_SCALED_HELPER
        if self.s.torch_version < (1, 9):  # torch.linalg.vector_norm came in 1.9
            helper = helper.replace("torch.linalg.vector_norm(", "torch.norm(")
        add_module_helper(fc, u.module, helper, "_clip_scaled_grad_norm_")
        self._collapse_clip(u, st)
        self.notes.add("the clip of every micro-batch stays there: _clip_scaled_grad_norm_() clips the scaled "
                       "gradients by the unscaled norm, the scale kept on the GPU")
        return True

    def _read_unscaled(self, u: Use, c: Carrier, call, o: str, params: str) -> bool:
        """``grad_norm = get_grad_norm(amp.master_params(opt))``, ``clipper.step(amp.master_params(opt))``
        on every micro-batch: apex had unscaled the gradients after each backward; here they are
        scaled until the step, and ``unscale_`` may run once per step.  The call runs in
        ``with _unscaled_grads(scaler, opt):``, which divides the gradients by the scale and
        multiplies them back after: exact for the dynamic scale (a power of two), so a static loss
        scale refuses.  False where it does not apply (``clip_grad_norm_``, which the callers
        handle; a statement over several lines)."""
        outer = getattr(call, "_p", None)
        st = stmt_of(call)
        if not isinstance(outer, ast.Call) or call not in outer.args or "clip" in (dotted(outer.func) or "") or \
                not isinstance(st, (ast.Expr, ast.Assign)) or st.lineno != st.end_lineno:
            return False
        if self._static_scale_at() is not None:
            return False
        m = u.module
        text = m.src.code(st)
        a = call.col_offset - st.col_offset
        b = call.end_col_offset - st.col_offset
        self.fc(m).replace_statement(st, [f"with _unscaled_grads({c.expr}, {o}):", "    " + text[:a] + params + text[b:]])
        self.fc(m).adds.append(ImportSpec("contextlib"))
        add_module_helper(self.fc(m), m, UNSCALED_GRADS_HELPER, "_unscaled_grads")
        self.notes.add("a gradient read on every micro-batch runs in _unscaled_grads(): the gradients divided by the "
                       "scale for it and scaled back (the scale kept on the GPU)")
        return True

    def _static_scale_at(self) -> Optional[int]:
        """The line of an amp.initialize of the group whose loss scale may be static (not the
        literal "dynamic"): there, gradients cannot be unscaled exactly outside the step."""
        for s in self.g.seeds:
            call = getattr(s, "call", None)
            scale = kwargs(call).get("loss_scale") if call is not None else None
            if scale is not None and not is_const(scale, "dynamic"):
                return call.lineno
        return None

    def _clip_at_the_step(self, u: Use, c: Carrier, call, steps, o: str, params: str) -> None:
        """A clip of ``amp.master_params(opt)`` on every micro-batch, where the optimizer steps less
        often (gradient accumulation): apex had unscaled the gradients after each backward, native
        AMP unscales once per step.  Scaling the threshold by ``scaler.get_scale()`` would keep the
        numbers but copy the scale to the host on every micro-batch (a sync, AMP303), so the clip
        moves to the step, after ``scaler.unscale_(opt)``: once per step, on the accumulated
        gradients.  That differs from clipping each partial sum when accumulating, so the fix is
        unsafe and says so."""
        code = u.module.src.code
        clip = getattr(call, "_p", None)
        if not (isinstance(clip, ast.Call) and "clip_grad" in (dotted(clip.func) or "") and clip.args
                and clip.args[0] is call):
            static = self._static_scale_at()
            raise Refuse(f"amp.master_params at line {u.line} is read on micro-batches where the optimizer does "
                         "not step" + (f", and amp.initialize at line {static} may set a static loss scale (the "
                                       "gradients cannot be unscaled exactly there)" if static else "")
                         + ": migrate it by hand")
        st = stmt_of(clip)
        if not (isinstance(st, ast.Expr) and st.value is clip):
            raise Refuse(f"the clip at line {clip.lineno} runs on every micro-batch and its result is used; native AMP "
                         "unscales once per optimizer step: move the clip to the step by hand")
        if len(steps) != 1:
            raise Refuse(f"the clip at line {clip.lineno} runs on every micro-batch and the optimizer steps in "
                         f"{len(steps)} places: move the clip to the step by hand")
        fc = self.fc(u.module)
        unit = u.func.node if u.func is not None else u.module.tree
        # a clip under its own condition (`if max_norm > 0:`) moves with it
        gd = getattr(st, "_p", None)
        mover = st
        if isinstance(gd, ast.If) and gd.body == [st] and not gd.orelse and id(gd) not in fc.touched:
            mover, gd = gd, getattr(gd, "_p", None)
        # only where both precisions clipped alike: under no guard, or under the fp16/fp32 branches
        # the migration made one (else the fp32 path would clip twice)
        step_st = stmt_of(steps[0])
        la = loops_around(mover, unit)
        common = next((l for l in loops_around(step_st, unit) if any(l is x for x in la)), None)
        twin = isinstance(gd, ast.If) and gd.body == [mover] and len(gd.orelse) == 1 \
            and self._kind(gd.orelse[0], u.module) == self._kind(mover, u.module)
        left = [g for g in guards(mover, common) if id(g) not in fc.touched and not (twin and g is gd)]
        # the fp16 branch that stays (its fp32 twin does more than clip): the clip moves to the step
        # under that branch's own condition, and the fp32 path is left as it was
        backs = self.backward_sites.get(self._key(u), [])
        fp16_only = None
        if len(left) == 1 and isinstance(gd, ast.If) and left[0] is gd and any(mover is s for s in gd.body) \
                and any(any(b is s for s in gd.body) for b in backs):
            fp16_only, left = gd, []
        if left:
            raise Refuse(f"the clip at line {clip.lineno} runs on every micro-batch under the condition at line "
                         f"{left[0].lineno}, and native AMP unscales once per optimizer step: move the clip to the "
                         "step by hand (scaler.unscale_ first)")
        # the fp32 branch beside it often clips the same parameters by their own name: reuse it
        gone = gd if twin else mover
        for sib in (gd.orelse if isinstance(gd, ast.If) and any(mover is s for s in gd.body) else []):
            sib = sib.body[0] if isinstance(sib, ast.If) and len(sib.body) == 1 and not sib.orelse else sib
            v = sib.value if isinstance(sib, (ast.Expr, ast.Assign, ast.AugAssign)) else None
            if isinstance(v, ast.Call) and dotted(v.func) == dotted(clip.func) and v.args:
                params = code(v.args[0])
        if clip.lineno == clip.end_lineno:
            text = code(clip)
            i = text.index(code(call))
            moved = text[:i] + params + text[i + len(code(call)):]
        else:
            copy = ast.Call(func=clip.func, args=[ast.parse(params, mode="eval").body, *clip.args[1:]],
                            keywords=clip.keywords)
            moved = ast.unparse(copy)
        fc.remove(gone)
        lines = [moved]
        if mover is not st:
            lines = [f"if {code(mover.test)}:", self._indent_unit(u.module, mover, st) + moved]
        lines = [f"{c.expr}.unscale_({o})", *lines]
        if fp16_only is not None:
            step_in = self._indent_unit(u.module, fp16_only, mover)
            lines = [f"if {code(fp16_only.test)}:", *(step_in + line for line in lines)]
        fc.insert_before(step_st, lines)
        self.g.unsafe = ("the gradient clip ran on every micro-batch and now runs once per optimizer step, after "
                         "scaler.unscale_, on the accumulated gradients: with accumulation the two differ; "
                         "no host sync is added")

    @staticmethod
    def _indent_unit(module, outer, inner) -> str:
        """The indentation one block adds in this file (``inner`` sits one block inside ``outer``)."""
        a, b = module.src.line_text(outer.lineno), module.src.line_text(inner.lineno)
        return b[len(a) - len(a.lstrip()):len(b) - len(b.lstrip())] or "    "

    def _collapse_clip(self, u: Use, st) -> None:
        """``if fp16: clip(amp.master_params(opt)) else: clip(model.parameters())`` -> the first."""
        gd = getattr(st, "_p", None)
        if not (isinstance(gd, ast.If) and gd.body == [st] and len(gd.orelse) == 1) or id(gd) in self.fc(u.module).touched:
            return
        if self._kind(gd.orelse[0], u.module) == self._kind(st, u.module) and self._kind(st, u.module)[0] == "clip":
            fc = self.fc(u.module)
            fc.unwrap(gd, gd.body)
            fc.touched.add(id(gd))

    def _state_dict(self, u: Use, c: Carrier) -> None:
        """``amp.state_dict()`` -> the scaler's; ``amp.load_state_dict(x)`` -> the scaler's, through a
        helper that also reads what apex saved before the migration (its
        ``{"loss_scaler0": {"loss_scale", "unskipped"}}``), so old checkpoints still resume."""
        if self.pure:
            raise Refuse(f"amp.{u.kind} at line {u.line}: O3 has no loss scaler to save")
        fc = self.fc(u.module)
        if c is not None and c.kind == "dropped":
            self._drop_state(u, c)
            return
        if self.bf16:
            # bfloat16 has no loss scaler: nothing to save, nothing to restore
            call = getattr(u.node, "_p", None)
            if not (isinstance(call, ast.Call) and call.func is u.node):
                raise Refuse(f"amp.{u.kind} at line {u.line} is not called: migrate it by hand")
            if u.kind == "state_dict":
                fc.replace(call, "{}")
            else:
                st = stmt_of(call)
                if not (isinstance(st, ast.Expr) and st.value is call):
                    raise Refuse(f"amp.load_state_dict at line {u.line} is not a statement of its own")
                fc.remove(st)
            self.notes.add("bfloat16 has no loss scaler: the checkpoint keeps an empty 'amp' entry, loading ignores it")
            return
        if getattr(c, "optional", None) and not self.defaults_scaler(u.func):
            self._only_with_a_scaler(u, c)
        st = stmt_of(u.node)
        if st is not None:
            fc.drop_comment_above(st, named=True)  # a pointer to apex's checkpointing docs
        if u.kind == "state_dict":
            fc.replace(u.node, f"{c.expr}.state_dict")
            return
        call = u.call
        if call is None or len(call.args) != 1 or call.keywords:
            raise Refuse(f"amp.load_state_dict at line {u.line} is not called with one state")
        code = u.module.src.code
        fc.replace(call, f"{c.expr}.load_state_dict(_scaler_state({c.expr}, {code(call.args[0])}))")
        from ampfix.migration.groups import add_module_helper

        add_module_helper(fc, u.module, SCALER_STATE_HELPER, "_scaler_state")
        self.notes.add("old checkpoints: _scaler_state() reads apex's loss-scaler state too")

    def _only_with_a_scaler(self, u: Use, c: Carrier) -> None:
        """The statement that saves or loads apex's state runs only where a scaler was given:
        ``if "amp" in ckpt and ...:`` whose whole body it is gets ``scaler is not None and`` first;
        a statement of its own is put under ``if scaler is not None:``."""
        st = stmt_of(u.node)
        if not isinstance(st, (ast.Expr, ast.Assign)) or (isinstance(st, ast.Assign) and st.value is not u.call):
            raise Refuse(f"amp.{u.kind} at line {u.line} is part of an expression in `{u.func.qualname}`, which some "
                         f"callers reach with no scaler ({c.optional})")
        fc = self.fc(u.module)
        gd = getattr(st, "_p", None)
        if isinstance(gd, ast.If) and gd.body == [st] and not gd.orelse:
            if id(gd) not in self.guarded:
                self.guarded.add(id(gd))
                test = gd.test
                text = u.module.src.code(test)
                if isinstance(test, (ast.IfExp, ast.NamedExpr, ast.Lambda)) or (
                        isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or)):
                    text = f"({text})"
                fc.replace(test, f"{c.expr} is not None and {text}")
            return
        fc.wrap(st, st, f"if {c.expr} is not None:")

    def _drop_state(self, u: Use, c: Carrier) -> None:
        """apex's state saved or loaded where no scaler can reach (a checkpoint helper of a runner
        built from the configuration, when the scaler lives in a hook): the statement goes;
        ``if "amp" in checkpoint: amp.load_state_dict(...); log(...)`` goes whole."""
        call = u.call
        st = stmt_of(u.node)
        if call is None:
            raise Refuse(f"amp.{u.kind} at line {u.line} is not called: migrate it by hand")
        fc = self.fc(u.module)
        if u.kind == "state_dict":
            if not (isinstance(st, ast.Assign) and st.value is call and len(st.targets) == 1 and
                    isinstance(st.targets[0], (ast.Subscript, ast.Name, ast.Attribute))):
                raise Refuse(f"amp.state_dict at line {u.line} is part of an expression; the scaler that would "
                             "replace it lives in the hook: migrate it by hand")
        elif not (isinstance(st, ast.Expr) and st.value is call):
            raise Refuse(f"amp.load_state_dict at line {u.line} is not a statement of its own")
        gd = getattr(st, "_p", None)
        if isinstance(gd, ast.If) and not gd.orelse and any(x is st for x in gd.body) and \
                all(x is st or is_log_call(x) for x in gd.body):
            fc.remove(gd, described=True)
        else:
            fc.remove(st, described=True)
        if getattr(c, "unreached", False):
            self.notes.add("no amp.initialize in the project comes before this code, and no other apex use is in "
                           "the code it imports or that imports it: apex's state is no longer saved or loaded "
                           "(that needed apex installed); an old checkpoint's 'amp' entry is ignored")
            return
        self.notes.add("checkpoints no longer carry apex's loss scale: the GradScaler lives in a hook that the "
                       "checkpoint code cannot reach, so a resumed run starts from the initial scale and finds its "
                       "own again within a few steps")

    @staticmethod
    def _as_test(u: Use):
        """(the expression, negated) when a bare apex.amp is a parameter tested for being given:
        ``amp``, ``not amp``, ``amp is None``, ``amp is not None`` in an ``if``/``while``/``assert``
        test, a boolean operation or a conditional expression."""
        m = u.module
        bs = m.sem.bindings_of(u.node) if isinstance(u.node, ast.Name) else []
        if not bs or any(b.kind != "param" for b in bs):
            return None
        return none_test_of(u.node)

    def _param_goes(self, u: Use) -> None:
        """The setup's parameter that apex's amp was handed in goes (its test went with the
        initialize); each call's argument for it goes in :meth:`_bare`."""
        f = u.seed.func
        if id(f.node) in self.params_gone:
            return
        self.params_gone.add(id(f.node))
        fc = self.fc(f.module)
        fc.edits.append(fc.b.remove_last_param(f.node))

    def _bare(self, u: Use, c: Carrier) -> None:
        """``apex.amp`` handed over as a value (``amp=apex.amp`` to a checkpoint helper that calls its
        state_dict/load_state_dict): the scaler has both."""
        p = getattr(u.node, "_p", None)
        if isinstance(u.node, ast.Call) and u.func is None and isinstance(p, ast.Assign):
            self._module_import_goes(u, p)
            return
        if self._outside_test(u, c):
            return
        if self.bf16:
            if self._alias_goes(u, p):
                return
            raise Refuse(f"`apex.amp` is handed over as a value at line {u.line}; with bfloat16 there is no scaler to "
                         "hand over: migrate it by hand")
        if isinstance(p, ast.keyword) or (isinstance(p, ast.Call) and u.node in p.args):
            call = getattr(p, "_p", None) if isinstance(p, ast.keyword) else p
            f, _ = self.p.resolve(u.module, call.func) if isinstance(call, ast.Call) else (None, False)
            if isinstance(p, ast.keyword):
                param = p.arg
            else:
                i = call.args.index(u.node)
                param = f.positional[i] if f is not None and i < len(f.positional) else None
            if f is not None and (id(f.node), param) in self.planner.dropped_params:
                fc = self.fc(u.module)
                fc.edits.append(fc.b.remove_arg(call, p if isinstance(p, ast.keyword) else u.node))
                return
            if isinstance(p, ast.keyword) and f is not None and p.arg != c.expr and \
                    (id(f.node), p.arg) in param_aliases(f.module.sem):
                # `prepare(args, model, amp=amp)`: the parameter is the scaler's now
                self.fc(u.module).replace(p, f"{self.name}={c.expr}")
                return
            self.fc(u.module).replace(u.node, c.expr)
            return
        test = self._as_test(u)
        if test is not None:
            # `if amp:` / `if amp is not None:` where amp is apex's amp handed in, or None
            node, negated = test
            made = [s for s in self.g.seeds if s.idx in c.seeds and getattr(s, "func", None) is u.func
                    and getattr(s, "stmt", None) is not None and s.stmt.lineno > u.line]
            if made and u.func is not None:
                # `if amp: optimizer.state = {}` above the initialize that makes the scaler here: the
                # scaler does not exist yet at the test (microsoft/unilm s2s-ft)
                raise Refuse(f"`{u.node.id}` is tested at line {u.line}, before the scaler is made where "
                             f"amp.initialize was (line {made[0].stmt.lineno}): migrate it by hand")
            text = f"{'not ' if negated else ''}{c.expr}.is_enabled()"
            b = u.module.sem.bindings_of(u.node)[0]
            if param_may_be_none(u.module.sem, b.scope.node, u.node.id):
                # some call hands it None (apex off), as before
                text = f"{c.expr} is None or not {c.expr}.is_enabled()" if negated else \
                    f"{c.expr} is not None and {c.expr}.is_enabled()"
                top = getattr(node, "_p", None)
                if not (isinstance(top, (ast.If, ast.While, ast.Assert)) and top.test is node):
                    text = f"({text})"
            self.fc(u.module).replace(node, text)
            return
        if self._alias_goes(u, p):
            return
        raise Refuse(f"`apex.amp` is used as a value at line {u.line}: migrate it by hand")

    def _outside_test(self, u: Use, c: Carrier) -> bool:
        """``if self.amp is not None:`` in a class whose ``self.amp`` a setup function set
        (placement.OutsideSetter): whether the scaler the setup made there is enabled.  An ``if``
        rewritten whole already (the scaled backward and its plain ``else`` collapsed) is left."""
        h = getattr(c, "outside", None)
        if h is None or not isinstance(u.node, ast.Attribute) or u.node.attr != h.attr:
            return False
        t = none_test_of(u.node)
        if t is None:
            return False
        fc = self.fc(u.module)
        top = stmt_of(u.node)
        if any(id(a) in fc.touched or any(a is r for r in fc.removed) for a in [top, *ancestors_stmts(top, None)]):
            return True
        node, negated = t
        text = f"{'not ' if negated else ''}{c.expr}.is_enabled()" if not self.bf16 else \
            f"{'not ' if negated else ''}{c.expr}"
        p = getattr(node, "_p", None)
        if not (isinstance(p, (ast.If, ast.While, ast.Assert)) and p.test is node):
            text = f"({text})"
        fc.replace(node, text)
        return True

    def _installed_test_folds(self, u: Use) -> None:
        """``if amp is not None:`` where ``amp`` is None when apex is not installed (``try: from apex
        import amp / except ImportError: amp = None``): a test of whether apex is installed, which
        native AMP always is.  The test folds: an ``if`` that held keeps its body (its ``else``,
        a "please install apex" error, goes), ``not fp16 or amp is None`` becomes ``not fp16``."""
        m = u.module
        fc = self.fc(m)
        top = u.node
        while not isinstance(top, (ast.stmt, ast.IfExp)):
            top = getattr(top, "_p", None)
        if any(id(a) in fc.touched for a in [top, *ancestors_stmts(stmt_of(top), None)]) or \
                id(top) in self.installed_folded:
            return  # rewritten whole already (a collapsed `if fp32: ... else: <scaled>`)
        self.installed_folded.add(id(top))
        test = getattr(top, "test", None)
        try:
            f = fold_installed(m.sem, m.src.code, test) if test is not None else None
        except ValueError:
            f = None
        if f is None or isinstance(top, ast.While) or (isinstance(top, ast.Assert) and f is False):
            raise Refuse(f"`apex.amp` is used as a value at line {u.line}: migrate it by hand")
        if isinstance(f, str):
            fc.replace(test, f)
        elif isinstance(top, ast.IfExp):
            fc.replace(top, m.src.code(top.body if f else top.orelse))
        elif isinstance(top, ast.Assert) or (f is False and not top.orelse):
            fc.remove(top)
        elif f is True and all(any(x is y for y in fc.removed) for x in top.body):
            # its body went (the initialize it guarded): the `else` ("install apex") goes too,
            # and the `if` with them
            for x in top.orelse:
                fc.remove(x)
        elif f is False and top.orelse and all(any(x is y for y in fc.removed) for x in top.orelse):
            # `if amp is None: <warn, turn AMP off> else: <initialize>`: the initialize went, and
            # what ran where apex was missing goes with the `if` (native AMP is always there)
            for x in top.body:
                fc.remove(x)
        else:
            fc.unwrap(top, top.body if f else top.orelse)
            fc.touched.add(id(top))
        probe = feature_probe(u.node)
        asked = m.src.code(probe) if probe is not None else "amp is not None"
        self.notes.add(f"`{asked}` asked whether apex is installed: native AMP always is, so the test folds")

    def _module_import_goes(self, u: Use, p: ast.Assign) -> None:
        """``amp = importlib.import_module("apex.amp")`` at module level goes where every read of
        ``amp`` in the module is one of this group's apex uses (rewritten with it)."""
        name = p.targets[0].id
        inside = {id(x) for n in self.g.uses.get(u.module.path, []) for x in ast.walk(n)}
        reads = [n for n in walk(u.module.tree, into_functions=True) if isinstance(n, ast.Name) and n.id == name
                 and isinstance(n.ctx, ast.Load)]
        if any(id(n) not in inside for n in reads):
            raise Refuse(f"apex is imported with importlib at line {u.line} and `{name}` is read where nothing "
                         "is rewritten: migrate it by hand")
        self.fc(u.module).remove(p)

    def _alias_goes(self, u: Use, p) -> bool:
        """``self.amp = amp`` / ``args.amp = amp``: every read of the attribute is an apex use
        rewritten with this one (model.apex.self_aliases, object_aliases), so the alias goes
        (with bfloat16 too: the reads become the plain backward)."""
        if isinstance(p, ast.Assign) and p.value is u.node and len(p.targets) == 1 and u.func is not None:
            t = p.targets[0]
            on_self = isinstance(t, ast.Attribute) and (id(u.func.node), t.attr) in self_aliases(u.module.sem,
                                                                                                u.module.tree)
            on_object = isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and \
                t.attr in object_alias_attrs(u.module.sem, u.module.tree)
            if on_self or on_object:
                fc = self.fc(u.module)
                fc.remove(p)
                # `self.amp = None` where AMP is off goes too: nothing reads self.amp any more (nor
                # `args.amp`, anywhere in the module)
                cls = u.func.cls if on_self else u.module.tree
                for n in (walk(cls, into_functions=True) if cls is not None else []):
                    if (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Attribute)
                            and n.targets[0].attr == t.attr and isinstance(n.targets[0].value, ast.Name)
                            and isinstance(n.value, ast.Constant) and n.value.value is None
                            and id(n) not in self.alias_nones):
                        self.alias_nones.add(id(n))
                        fc.remove(n)
                return True
        return False


def _read_by_apex_alone(st, u: Use) -> bool:
    """``delay_unscale = i != (iter_size - 1)`` right before ``amp.scale_loss(loss, optimizer,
    delay_unscale=delay_unscale)``: a name bound from a value that calls nothing and read only
    inside apex's call, which goes; so does the statement (``_dropped_argument_names``)."""
    if u.call is None or not (isinstance(st, ast.Assign) and len(st.targets) == 1
                              and isinstance(st.targets[0], ast.Name)):
        return False
    if any(isinstance(x, (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)) for x in ast.walk(st.value)):
        return False
    name = st.targets[0].id
    inside = {id(x) for x in ast.walk(u.call)}
    unit = u.func.node if u.func is not None else u.module.tree
    reads = [x for x in walk(unit, into_functions=True) if isinstance(x, ast.Name) and x.id == name
             and isinstance(x.ctx, ast.Load)]
    return bool(reads) and all(id(x) in inside for x in reads)


def _arithmetic(e) -> bool:
    """``loss / args.grad_acc``, ``-loss``: arithmetic on names, attributes, subscripts of names
    and constants (no call: the forward pass that makes the loss is before the call that gets it)."""
    if isinstance(e, ast.BinOp):
        return _arithmetic(e.left) and _arithmetic(e.right)
    if isinstance(e, ast.UnaryOp):
        return _arithmetic(e.operand)
    if isinstance(e, ast.Subscript):
        return isinstance(e.value, (ast.Name, ast.Attribute)) and isinstance(e.slice, (ast.Constant, ast.Name))
    return isinstance(e, (ast.Name, ast.Attribute, ast.Constant))


def _trained_here(unit) -> Set[str]:
    """Local names (and parameters) of ``unit`` put in training mode in it (``model.train()``)."""
    return {x.func.value.id for x in walk(unit) if isinstance(x, ast.Call) and method_call(x, "train")
            and isinstance(x.func.value, ast.Name) and x.func.value.id != "self"
            and not x.keywords and (not x.args or (isinstance(x.args[0], ast.Constant) and x.args[0].value is True))}


def _only_derives(region, func, module) -> Optional[str]:
    """The parameter of ``func`` that is all the region reads, besides builtins and modules the
    file imports (``losses = [torch.mean(x) for x in losses]; loss = sum(losses)``): no model,
    no input, so no forward pass runs there; it ran in the callers.  None otherwise."""
    loads: Set[str] = set()
    stores: Set[str] = set()
    for st in region.stmts:
        for n in [st, *walk(st)]:
            if isinstance(n, DEFS) or isinstance(n, ast.Lambda):
                return None
            if isinstance(n, ast.Name):
                (loads if isinstance(n.ctx, ast.Load) else stores).add(n.id)
            elif isinstance(n, ast.arg):
                stores.add(n.arg)
    modules = {(a.asname or a.name).split(".")[0] for st in module.tree.body if isinstance(st, ast.Import)
               for a in st.names}
    params = set(func.positional) | set(func.kwonly)
    free = loads - (stores - params) - modules - set(dir(builtins))
    if len(free) != 1 or not free <= params or free & {"self", "cls"}:
        return None
    p = next(iter(free))
    for st in region.stmts:
        for n in walk(st):
            # `model(x)`, `model.forward(x)`, `net.module(x)`: the parameter runs a forward pass
            if isinstance(n, ast.Call) and (dotted(n.func) == p or (
                    isinstance(n.func, ast.Attribute) and (dotted(n.func) or "").startswith(p + ".") and
                    n.func.attr in ("forward", "module", "__call__", "model"))):
                return None
    return p


def _prep_methods(func) -> Set[str]:
    """``self._parse_data`` where the method's class has a ``_parse_data`` that only unpacks and
    moves its inputs (flow.prep_function): a call of it is input preparation, before the region."""
    if func is None or func.cls is None or not func.node.args.args:
        return set()
    me = func.node.args.args[0].arg
    return {f"{me}.{x.name}" for x in func.cls.body if isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef))
            and prep_function(x)}


def _a_step_follows(st, steps, unit) -> bool:
    """A step follows ``st`` on every iteration it runs: ``st`` is in no loop a step is not in,
    every step comes after it, and one step runs whenever it does (one that ``if`` never skips
    where ``st`` runs, or one in each branch of an ``if/else``)."""
    loops = {id(x) for x in loops_around(st, unit)}
    if not steps or any(not loops <= {id(x) for x in loops_around(s, unit)} for s in steps):
        return False
    if not all(follows(s, [st], unit) for s in steps):
        return False
    if any(runs_as_often(st, s, unit) for s in steps):
        return True
    for s in steps:
        g = getattr(s, "_p", None)
        while g is not None and g is not unit:
            if isinstance(g, ast.If) and g.orelse and runs_as_often(st, g, unit):
                inside = {id(y) for x in g.body for y in [x, *walk(x)]}
                other = {id(y) for x in g.orelse for y in [x, *walk(x)]}
                if any(id(x) in inside for x in steps) and any(id(x) in other for x in steps):
                    return True
            g = getattr(g, "_p", None)
    return False


def _switched_autocast_before(unit, site, loss) -> Optional[ast.With]:
    """A ``with torch.cuda.amp.autocast() if self.using_amp else no_context():`` before ``site``
    in ``unit`` whose body binds a name the loss reads (sockeye: the native path's forward, the
    apex path's loss scaled below it): the forward already has a region, switched by a flag of
    the native path, so one around the loss would miss it on apex's path."""
    names = read(loss)
    for w in walk(unit):
        if not isinstance(w, (ast.With, ast.AsyncWith)) or w.lineno >= site.lineno:
            continue
        for item in w.items:
            e = item.context_expr
            if not isinstance(e, ast.IfExp):
                continue
            if not any(isinstance(x, ast.Call) and (dotted(x.func) or "").split(".")[-1] == "autocast"
                       for x in (e.body, e.orelse)):
                continue
            bound = {n.id for x in w.body for n in [x, *walk(x)] if isinstance(n, ast.Name)
                     and isinstance(n.ctx, ast.Store)}
            if bound & names:
                return w
    return None
