"""An optimizer that a project class wraps (a learning-rate schedule that owns it).

apex is handed the inner optimizer (``amp.initialize(model, optimizer._optimizer)``), the loss
is scaled for it, and the step runs in a method of the wrapper that training calls
(``optimizer.step_and_update_lr()``, which sets the rate and calls ``self._optimizer.step()``).
apex skipped that inner step on an overflow and left the rest of the method to run; native AMP
does the same when the method takes the GradScaler and steps through it:
``scaler.step(self._optimizer)`` then ``scaler.update()``.  Every call of the method passes the
scaler, so the method is changed only where every call can be found."""
from __future__ import annotations

import ast
from types import SimpleNamespace
from typing import List, Set

from ampfix.migration.flow import follows, stmt_of
from ampfix.migration.groups import Refuse
from ampfix.migration.placement import add_keyword_param
from ampfix.model.analysis import method_call, receiver
from ampfix.model.semantic import dotted, walk

#: the parameter the wrapper's method takes
NAME = "scaler"


class WrapperSteps:
    """The part of a group's plan (:class:`ampfix.migration.amp.GroupPlan`) that steps a wrapped
    optimizer through the method of its wrapper."""

    def _steps_through_wrapper(self, u, c, names: Set[str], unit, backs, key) -> bool:
        """Whether the step of the scaled optimizer ``W.inner`` is a call ``W.m()`` after the
        scaled backward, where ``m`` is a method of a project class that steps ``self.inner``
        (then planned here); False where no such call is there.  Refuses where one is, but
        the method cannot be changed safely."""
        m = u.module
        # `net, opt = amp.initialize(net, optim.optim)` then `optim.optim = opt`: the scaled `opt`
        # is the wrapper's inner optimizer again (CoinCheung/BiSeNet's fp16 script)
        handed_back = {dotted(x.targets[0]) for x in walk(unit) if isinstance(x, ast.Assign) and len(x.targets) == 1
                       and isinstance(x.targets[0], ast.Attribute) and isinstance(x.value, ast.Name)
                       and x.value.id in names}
        inner = sorted(n for n in names | handed_back if n and "." in n and not n.startswith("self."))
        calls = []
        for name in inner:
            base, attr = name.rsplit(".", 1)
            for n in walk(unit):
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and dotted(n.func.value) == base \
                        and n.func.attr not in ("zero_grad", "state_dict", "load_state_dict") \
                        and follows(stmt_of(n), backs, unit):
                    calls.append((n, base, attr))
        if not calls:
            return False
        found = []
        for n, base, attr in calls:
            f = self._wrapper_method(m, u.func, n)
            if f is None:
                continue
            me = f.positional[0] if f.positional else None
            steps = [x for x in walk(f.node) if method_call(x, "step") and dotted(receiver(x)) == f"{me}.{attr}"]
            if steps:
                found.append((n, base, attr, f, steps))
        if not found:
            return False
        why = f"the step of `{found[0][1]}.{found[0][2]}` runs in `{found[0][3].qualname}`"
        if len(found) != 1:
            raise Refuse(f"{why}, called more than once after the scaled backward: migrate the step by hand")
        call, base, attr, f, steps = found[0]
        if len(steps) != 1 or steps[0].args or steps[0].keywords:
            raise Refuse(f"{why}, which steps it more than once or with arguments: migrate the step by hand")
        st = stmt_of(call)
        if not (isinstance(st, ast.Expr) and st.value is call):
            raise Refuse(f"{why}, and its call at line {call.lineno} is not a statement of its own: migrate the step "
                         "by hand")
        if NAME in f.positional or NAME in f.kwonly or f.node.args.vararg or f.node.args.kwarg or any(
                isinstance(x, ast.Name) and x.id == NAME for x in walk(f.node)):
            raise Refuse(f"{why}, which already has a name `{NAME}`: migrate the step by hand")
        self._only_caller(f, call, steps, why)
        # the wrapper's own reads of the gradients before the step (a clip) were of true gradients:
        # apex had unscaled them when scale_loss exited; a read at the call site too would unscale twice
        reads = [x for x in walk(f.node) if isinstance(x, ast.stmt) and x is not stmt_of(steps[0])
                 and self._reads_gradients(x) and follows(stmt_of(steps[0]), [x], f.node)]
        between = [x for x in walk(unit) if isinstance(x, ast.stmt) and follows(x, backs, unit)
                   and follows(st, [x], unit) and (self._reads_gradients(x) or "master_params" in m.src.code(x))]
        if reads and between:
            raise Refuse(f"{why}, and the gradients are read both at line {between[0].lineno} and in "
                         f"`{f.qualname}`: migrate the step by hand")
        fc = self.fc(f.module)
        add_keyword_param(fc, f, NAME)
        self.fc(m).edits.append(self.fc(m).b.insert_arg(call, f"{NAME}={c.expr}"))
        self._step_through(f.module, steps, NAME)
        for _, anchor in self._update_anchors(steps, f.node):
            fc.insert_after(anchor, [f"{NAME}.update()"])
        self._unscale_at_the_step(SimpleNamespace(module=f.module), SimpleNamespace(expr=NAME), f.node, [], steps)
        # at the call site, a gradient read between the backward and the call: unscaled first
        self._unscale_for_gradient_reads(u, c, unit, backs, [call], opt=f"{base}.{attr}")
        self.steps_of[key] = [call]
        self.g.anchors.setdefault(f.module.path, []).append(
            (steps[0], f"`{f.qualname}` steps the optimizer apex scaled the loss for: it takes the GradScaler "
                       "of the apex.amp migration and steps through it"))
        self.notes.add(f"`{base}.{call.func.attr}()` steps `{attr}` in `{f.qualname}`: the method takes the scaler, "
                       "which steps it there and updates")
        return True

    def _wrapper_method(self, module, func, call: ast.Call):
        """The method of a project class that ``call`` (``w.m()``) runs: ``w`` made here from the
        class, or a parameter that every caller of ``func`` hands an object made from it."""
        f, bound = self.p.resolve(module, call.func)
        if f is not None:
            return f if bound and f.cls is not None and f.node.name != "__init__" else None
        base = call.func.value
        if func is None or not isinstance(base, ast.Name) or base.id not in [*func.positional, *func.kwonly]:
            return None
        sites = self.p.callers(func)
        if not sites or self.p.references(func):
            return None
        got = []
        for cs in sites:
            a = cs.argument(base.id)
            if not isinstance(a, ast.Name):
                return None
            made = self._made_from(cs.module, a, call.func.attr)
            if made is None:
                return None
            got.append(made)
        return got[0] if all(g is got[0] for g in got) else None

    def _made_from(self, module, name: ast.Name, method: str):
        values = module.sem.values_of(name)
        out = []
        for v in values:
            if not isinstance(v, ast.Call):
                return None
            init, bound = self.p.resolve(module, v.func)
            if init is None or init.cls is None or init.node.name != "__init__":
                return None
            out.append(self.p.method(init.module, init.cls, method))
        if not out or any(x is None or x is not out[0] for x in out):
            return None
        return out[0]

    def _only_caller(self, f, call: ast.Call, inner: List[ast.Call], why: str) -> None:
        """``call`` is the only call of the method ``f`` in the project: each other call of a
        method by that name (but the inner optimizer's own, ``inner``) must be known to run
        something else."""
        name = f.node.name
        for cs in self.p.callers(f):
            if cs.node is not call:
                raise Refuse(f"{why}, which is also called at {cs.module.path} line {cs.node.lineno}: migrate the "
                             "step by hand")
        for mod in list(self.p.modules.values()):
            for n in walk(mod.tree, into_functions=True):
                if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == name):
                    continue
                if n is call or any(n is x for x in inner):
                    continue
                g, _ = self.p.resolve(mod, n.func)
                if g is f:
                    raise Refuse(f"{why}, which is also called at {mod.path} line {n.lineno}: migrate the step by "
                                 "hand")
                if g is None and not self._not_the_wrapper(mod, n, f):
                    raise Refuse(f"{why}, and `{mod.src.code(n)}` at {mod.path} line {n.lineno} may call it too "
                                 "(ampfix cannot tell what it is called on): migrate the step by hand")

    def _not_the_wrapper(self, module, call: ast.Call, f) -> bool:
        """The receiver of ``call`` is bound only to what the project's class of ``f`` is not:
        a value made by a library call (``torch.optim.lr_scheduler.StepLR(...)``) or by another
        project class."""
        base = call.func.value
        if isinstance(base, ast.Name):
            values = module.sem.values_of(base)
        elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
            values = self._self_values(module, call, base)
        else:
            return False
        if not values:
            return False
        for v in values:
            if not isinstance(v, ast.Call):
                return False
            init, _ = self.p.resolve(module, v.func)
            if init is not None and (init.cls is None or init.cls is f.cls):
                return False
            if init is None and not module.sem.qnames(v.func):
                return False  # a local function's value, not followed
        return True

    @staticmethod
    def _self_values(module, call: ast.Call, attr: ast.Attribute) -> List[ast.expr]:
        """What the methods of the class around ``call`` assign to ``self.x`` (``attr``), where
        ``self`` is the first parameter of the method ``call`` is in; empty where not followed."""
        f = module.function_of(call)
        while f is not None and f.cls is None and f.outer is not None:
            f = f.outer
        if f is None or f.cls is None or not f.positional or attr.value.id != f.positional[0]:
            return []
        out = []
        for meth in f.cls.body:
            if not isinstance(meth, (ast.FunctionDef, ast.AsyncFunctionDef)) or not meth.args.args:
                continue
            me = meth.args.args[0].arg
            for n in walk(meth):
                if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    flat = [e for t in targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])]
                    if any(dotted(e) == f"{me}.{attr.attr}" for e in flat):
                        if len(flat) != 1 or not isinstance(n, ast.Assign):
                            return []
                        out.append(n.value)
        return out
