"""AMP102: apex.fp16_utils (FP16_Optimizer, network_to_half), rewritten to native AMP as one
all-or-nothing fix per module."""
from typing import Dict, List, Optional, Set

import libcst as cst

from ampfix.analysis import arg, dotted, enclosing_function, line_of, method_call, receiver, statement_of, walk
from ampfix.rule import Fix, ImportSpec, Invalid, Valid
from ampfix.rules._native import (
    STATIC_NOTE, ModuleMigration, Refuse, as_bool, autocast_call, sole_expr, stmt,
    target_description,
)

#: the model converters: ``f(model)`` is the model itself once the model stays float32
CONVERTERS = ("network_to_half", "BN_convert_float", "FP16Model")
#: what a FP16_Optimizer offers beyond a plain optimizer, and what each becomes
METHODS = {"backward", "step", "zero_grad", "state_dict", "load_state_dict", "param_groups", "state",
           "clip_master_grads", "update_master_grads", "loss_scale", "optimizer", "add_param_group"}
HALF_TYPES = {"torch.cuda.HalfTensor", "torch.HalfTensor"}
CHECKPOINT_NOTE = ("optimizer.state_dict() is now the plain optimizer's: checkpoints that FP16_Optimizer wrote do "
                   "not load into it; save scaler.state_dict() beside it")
DEFAULTS_NOTE = ("dynamic loss scale: GradScaler starts at 2**16 and grows every 2000 steps (apex's "
                 "DynamicLossScaler: 2**32, every 1000)")


class ApexFp16Utils(ModuleMigration):
    """
    ## What it does
    Reports `apex.fp16_utils` (`FP16_Optimizer`, `network_to_half`, `BN_convert_float`,
    `FP16Model`, ...) and rewrites a module that trains with `FP16_Optimizer` to native AMP:

    * `optimizer = FP16_Optimizer(optimizer, static_loss_scale=S, dynamic_loss_scale=D)`
      becomes `scaler = torch.amp.GradScaler("cuda", ...)` (or `self.scaler` across methods):
      dynamic scaling is GradScaler's default; a static scale `S` starts there and never grows;
      a scale chosen at run time (`dynamic_loss_scale=args.dynamic_loss_scale`) becomes a
      conditional `init_scale`/`growth_interval`; `dynamic_loss_args` map to `init_scale`,
      `growth_factor`/`backoff_factor` and `growth_interval`.  A guard
      `if args.fp16: optimizer = FP16_Optimizer(...)` becomes `enabled=bool(args.fp16)`.
    * The model stays float32: `network_to_half(model)`, `BN_convert_float(model.half())`,
      `FP16Model(model)`, `model.half()` and `model.type(torch.cuda.HalfTensor)` go, and so do
      the `.half()` casts of the inputs in the forward pass, which gets an autocast region
      (found by data flow back from the loss).
    * `optimizer.backward(loss)` becomes `scaler.scale(loss).backward()` (an
      `if fp16: ... else: loss.backward()` collapses); `optimizer.step()` becomes
      `scaler.step(optimizer)` and `scaler.update()`; `optimizer.clip_master_grads(n)` becomes
      `scaler.unscale_(optimizer)` and a clip of the optimizer's parameters;
      `update_master_grads()` goes (the scaler unscales in `step`); `optimizer.loss_scale` is
      `scaler.get_scale()`.

    The fix description names what changes in behaviour: the checkpoint format of
    `optimizer.state_dict()` and the scaler's defaults.  Anything else (another
    `apex.fp16_utils` helper, an attribute of FP16_Optimizer not listed, a closure passed to
    `step`) leaves the module whole, with the reason.

    ## Why is this bad?
    `FP16_Optimizer` is apex's oldest mixed-precision scheme: a float16 model with float32
    master weights kept by hand.  Native AMP keeps the model in float32 and casts per op under
    autocast, with `GradScaler` for loss scaling: no master copies, no float16 batch norm,
    nothing to build against your CUDA.

    ## Example
    ```python
    model = network_to_half(model)
    optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)
    for x, y in loader:
        loss = criterion(model(x.half()), y)
        optimizer.zero_grad()
        optimizer.backward(loss)
        optimizer.step()
    ```

    ## Use instead
    ```python
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(x), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    ```
    """

    code = "AMP102"
    name = "apex-fp16-utils"
    summary = "apex.fp16_utils (FP16_Optimizer, network_to_half): use torch.autocast + GradScaler (rewritten by migrate)"
    fix_kind = "safe"
    since = "1.6"
    prefix = "apex.fp16_utils"

    VALID = [Valid("from mylib.fp16_utils import FP16_Optimizer\nopt = FP16_Optimizer(opt)\n")]
    INVALID = [
        Invalid(
            """
            import torch
            from apex.fp16_utils import FP16_Optimizer, network_to_half

            model = network_to_half(Net().cuda())
            optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), dynamic_loss_scale=True)
            for x, y in loader:
                out = model(x.cuda().half())
                loss = criterion(out, y)
                optimizer.zero_grad()
                optimizer.backward(loss)
                optimizer.step()
            """,
            count=2,
            expected="""
            import torch

            model = Net().cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            scaler = torch.amp.GradScaler("cuda")
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.float16):
                    out = model(x.cuda())
                    loss = criterion(out, y)
                optimizer.zero_grad()
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            """,
        ),
        Invalid(
            # apex's own example: a star import, a static scale, model.half() in a chain
            """
            import torch
            from apex.fp16_utils import *

            model = torch.nn.Linear(1024, 16).cuda().half()
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
            optimizer = FP16_Optimizer(optimizer, static_loss_scale=128.0)
            for t in range(200):
                y_pred = model(x)
                loss = loss_fn(y_pred.float(), y.float())
                optimizer.zero_grad()
                optimizer.backward(loss)
                optimizer.clip_master_grads(5.0)
                optimizer.step()
            """,
            expected="""
            import torch

            model = torch.nn.Linear(1024, 16).cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
            scaler = torch.amp.GradScaler("cuda", init_scale=128.0, growth_interval=2**31 - 1)
            for t in range(200):
                with torch.autocast("cuda", dtype=torch.float16):
                    y_pred = model(x)
                    loss = loss_fn(y_pred.float(), y.float())
                optimizer.zero_grad()
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_((p for group in optimizer.param_groups for p in group["params"]), 5.0)
                scaler.step(optimizer)
                scaler.update()
            """,
        ),
        Invalid(
            """
            from apex.fp16_utils import FP16_Optimizer
            opt = FP16_Optimizer(opt, dynamic_loss_scale=True)
            def train(loss):
                opt.backward(loss)
                print(opt.overflow)
                opt.step()
            """,
            message="not rewritten: `opt.overflow`",
        ),
    ]

    # ------------------------------------------------------------------ planning
    def _uses(self, module) -> Dict[str, List[cst.Call]]:
        uses: Dict[str, List[cst.Call]] = {}
        for n, q in self.references(module):
            call = self.called(n, q)
            kind = q.rsplit(".", 1)[-1]
            if kind not in ("FP16_Optimizer", *CONVERTERS):
                raise Refuse(f"{q} has no automatic rewrite (line {line_of(self, n)})")
            uses.setdefault(kind, []).append(call)
        return uses

    def plan(self, module: cst.Module) -> Optional[Fix]:
        uses = self._uses(module)
        if not uses:
            return None
        ctors = uses.get("FP16_Optimizer", [])
        if len(ctors) != 1:
            raise Refuse("FP16_Optimizer must be made exactly once in the module" if ctors else
                         "no FP16_Optimizer in this module: a float16 model without one is pure float16 training; "
                         "keep the model float32 and add torch.autocast by hand")
        if bound_apex_amp(self):
            raise Refuse("the module also uses apex.amp: migrate it with AMP101 first")
        ctor = ctors[0]
        self.anchor = ctor.func
        line = statement_of(self, ctor)
        assign = line.body[0] if line is not None and len(line.body) == 1 else None
        if not (isinstance(assign, cst.Assign) and assign.value is ctor and len(assign.targets) == 1
                and dotted(assign.targets[0].target)):
            raise Refuse(f"FP16_Optimizer at line {line_of(self, ctor)} is not assigned to a name")
        opt = dotted(assign.targets[0].target)
        inner = arg(ctor, "init_optimizer", 0)
        if inner is None:
            raise Refuse("FP16_Optimizer has no optimizer argument")
        scaler_args, notes = self._scaler_args(ctor)
        notes.add(CHECKPOINT_NOTE)

        # -- every use of the optimizer --------------------------------------------------------
        backwards, clips, updates, scales, inners, zero_grads = [], [], [], [], [], []
        in_ctor = {id(n) for n in walk(line)}
        for n in walk(module, into_functions=True):
            if not isinstance(n, (cst.Name, cst.Attribute)) or dotted(n) != opt or id(n) in in_ctor:
                continue
            parent = self.parent(n)
            if isinstance(parent, cst.Attribute) and parent.value is n:
                attr = parent.attr.value
                call = self.parent(parent)
                call = call if isinstance(call, cst.Call) and call.func is parent else None
                if attr not in METHODS:
                    raise Refuse(f"`{opt}.{attr}` (line {line_of(self, n)}) has no native counterpart")
                if attr == "backward" and call is not None:
                    backwards.append(call)
                elif attr == "clip_master_grads" and call is not None:
                    clips.append(call)
                elif attr == "update_master_grads" and call is not None:
                    updates.append(call)
                elif attr == "zero_grad" and call is not None and call.args:
                    zero_grads.append(call)
                elif attr == "loss_scale" and call is None:
                    scales.append(parent)
                elif attr == "optimizer" and call is None:
                    inners.append(parent)
                elif attr == "step" and call is not None and call.args:
                    raise Refuse(f"`{opt}.step(closure)` at line {line_of(self, n)} has no automatic rewrite")
                elif attr in ("backward", "clip_master_grads", "update_master_grads", "loss_scale", "optimizer"):
                    raise Refuse(f"`{opt}.{attr}` at line {line_of(self, n)} is not used as FP16_Optimizer's")
        if not backwards:
            raise Refuse(f"`{opt}.backward(loss)` is not in this module")
        scaler = self.scaler_home(module, ctor, [*backwards, *clips, *scales])

        # -- the scaler replaces the FP16_Optimizer --------------------------------------------
        inner_code = self.code_of(inner.value)
        before = [stmt(f"{opt} = {inner_code}")] if inner_code != opt else []
        init_node, enabled = self.place_scaler(line, scaler, scaler_args, "True", before=before)

        # -- the model stays float32; its inputs too --------------------------------------------
        models = self._unhalf_models(module, uses)
        stop = {"init": init_node, "models": models}
        if self.global_scaler and enabled != "True":
            enabled = f"{scaler}.is_enabled()"  # the other functions may not see the guard's names
        autocast = autocast_call(self.settings, enabled)

        # -- backward, steps ---------------------------------------------------------------------
        optimizers: Dict[cst.CSTNode, Set[str]] = {}
        for call in backwards:
            site = statement_of(self, call)
            loss = arg(call, "loss", 0)
            if loss is None or site is None or sole_expr(site) is not call:
                raise Refuse(f"`{self.code_of(call)}` at line {line_of(self, call)} is not a statement of its own")
            extra = [self.code_of(a).rstrip(", ") for a in call.args if a.keyword and a.keyword.value == "retain_graph"]
            self.edits.append((call, cst.parse_expression(
                f"{scaler}.scale({self.code_of(loss.value)}).backward({', '.join(extra)})")))
            loss_code = self.code_of(loss.value)

            def plain(other, loss_code=loss_code):
                e = sole_expr(other)
                return e is not None and method_call(e, "backward") and self.code_of(receiver(e)) == loss_code

            outer = self.collapse_guard(site, plain)
            region = self.wrap(outer, loss.value, autocast, stop)
            for s in region:
                self._unhalf_inputs(s)
            optimizers.setdefault(enclosing_function(self, call) or module, set()).add(opt)
        self.rewrite_steps(optimizers, scaler)

        # -- clipping, master-grad updates, loss scale, the inner optimizer ------------------------------
        params = f'(p for group in {opt}.param_groups for p in group["params"])'
        for call in clips:
            site = statement_of(self, call)
            if site is None or len(site.body) != 1:
                raise Refuse(f"`{self.code_of(call)}` at line {line_of(self, call)} is not a statement of its own")
            rest = [self.code_of(a).rstrip(", ") for a in call.args]
            self.edits.append((call, cst.parse_expression(f"torch.nn.utils.clip_grad_norm_({', '.join([params, *rest])})")))
            self.put(site, [stmt(f"{scaler}.unscale_({opt})"), None])

            def clipping(other):
                e = sole_expr(other)
                return isinstance(e, cst.Call) and "clip_grad" in (dotted(e.func) or "")

            self.collapse_guard(site, clipping)
        for call in updates:
            site = statement_of(self, call)
            if site is None or sole_expr(site) is not call:
                raise Refuse(f"`{self.code_of(call)}` at line {line_of(self, call)} is not a statement of its own")
            self.remove(site)
        for call in zero_grads:
            for a in call.args:
                if a.keyword is None or a.keyword.value != "set_grads_to_None":
                    raise Refuse(f"`{self.code_of(call)}` at line {line_of(self, call)}: unknown argument")
                self.edits.append((a.keyword, cst.Name("set_to_none")))
        for node in scales:
            self.edits.append((node, cst.parse_expression(f"{scaler}.get_scale()")))
        for node in inners:
            self.edits.append((node, cst.parse_expression(opt)))

        self.finish_wraps(autocast)
        self.guard_imports(module, {id(c.func) for calls in uses.values() for c in calls})
        self.finish_carry()
        remove = [s for s in (self.import_edits(c.func)[1] for calls in uses.values() for c in calls) for s in s]
        desc = "apex.fp16_utils -> " + target_description(self.settings) + " (" + "; ".join(sorted(notes)) + ")"
        return Fix(desc, list(self.edits), add_imports=[ImportSpec("torch")], remove_imports=remove)

    def _scaler_args(self, ctor):
        kws = {a.keyword.value: a.value for a in ctor.args if a.keyword is not None}
        if len([a for a in ctor.args if a.keyword is None]) > 1 or any(a.star for a in ctor.args):
            raise Refuse("FP16_Optimizer has arguments that cannot be read")
        for k in kws:
            if k not in ("init_optimizer", "static_loss_scale", "dynamic_loss_scale", "dynamic_loss_args", "verbose"):
                raise Refuse(f"FP16_Optimizer argument {k!r} has no native mapping")
        notes: Set[str] = set()
        static = kws.get("static_loss_scale")
        static_code = self.code_of(static) if static is not None else "1.0"
        dynamic = kws.get("dynamic_loss_scale")
        dyn_args = self._dynamic_args(kws.get("dynamic_loss_args"))
        if dyn_args is None:
            notes.add(DEFAULTS_NOTE)
            dyn_args = {}
        dyn_init = dyn_args.get("init_scale", "2.0**16")
        dyn_interval = dyn_args.get("growth_interval", "2000")
        static_args = [f"init_scale={static_code}", "growth_interval=2**31 - 1"]
        if dynamic is None or (isinstance(dynamic, cst.Name) and dynamic.value == "False"):
            notes.add(STATIC_NOTE)
            return static_args, notes
        if isinstance(dynamic, cst.Name) and dynamic.value == "True":
            out = [f"{k}={v}" for k, v in dyn_args.items()]
            return out, notes
        cond = as_bool(self.code_of(dynamic), dynamic)
        cond = cond[len("bool("):-1] if cond.startswith("bool(") else cond
        notes.add(STATIC_NOTE)
        out = [f"init_scale={dyn_init} if {cond} else {static_code}",
               f"growth_interval={dyn_interval} if {cond} else 2**31 - 1"]
        out += [f"{k}={v}" for k, v in dyn_args.items() if k not in ("init_scale", "growth_interval")]
        return out, notes

    def _dynamic_args(self, node) -> Optional[Dict[str, str]]:
        """``dynamic_loss_args={'init_scale': 2**16, 'scale_window': 500, 'scale_factor': 2}`` ->
        GradScaler's arguments; None when not given."""
        if node is None:
            return None
        if not isinstance(node, cst.Dict) or not all(isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)
                                                     for e in node.elements):
            raise Refuse("dynamic_loss_args is not a literal dict")
        out = {}
        for e in node.elements:
            k, v = e.key.evaluated_value, self.code_of(e.value)
            if k == "init_scale":
                out["init_scale"] = v
            elif k == "scale_window":
                out["growth_interval"] = v
            elif k == "scale_factor":
                out["growth_factor"] = v
                out["backoff_factor"] = f"1 / {v}"
            else:
                raise Refuse(f"dynamic_loss_args key {k!r} has no native mapping")
        return out

    # -- float16 models and inputs -----------------------------------------------------------------
    def _is_half(self, call) -> bool:
        if method_call(call, "half") and not call.args:
            return True
        return (method_call(call, "type") and len(call.args) == 1
                and (dotted(call.args[0].value) or "") in HALF_TYPES)

    def _unhalf_models(self, module, uses) -> Set[str]:
        """Plan the edits that keep the model float32; return the model names."""
        models: Set[str] = set()
        for kind in CONVERTERS:
            for call in uses.get(kind, []):
                a = arg(call, None, 0)
                if a is None or len(call.args) != 1:
                    raise Refuse(f"`{self.code_of(call)}` at line {line_of(self, call)} cannot be read")
                m = self._peel(a.value)
                target = self._assign_target(call)
                if target is not None:
                    models.add(target)
                if dotted(m):
                    models.add(dotted(m))
        for n in walk(module, into_functions=True):
            if method_call(n, "parameters", "named_parameters") and dotted(receiver(n)):
                models.add(dotted(receiver(n)))
        # converters: f(model) -> model (the statement goes when it becomes `model = model`)
        for kind in CONVERTERS:
            for call in uses.get(kind, []):
                outer = call
                while isinstance(self.parent(self.parent(outer)), cst.Call) and \
                        self.apex_name(self.parent(self.parent(outer)).func):
                    outer = self.parent(self.parent(outer))
                if outer is call:
                    self._unwrap(call, arg(call, None, 0).value)
        # .half() of a model, and assignments of a half model
        for n in walk(module, into_functions=True):
            if not (isinstance(n, cst.Call) and self._is_half(n)):
                continue
            base = receiver(n)
            while isinstance(base, cst.Call) and isinstance(base.func, cst.Attribute):
                base = base.func.value
            if (dotted(base) in models) or (self._assign_target(n) in models):
                if not any(a is n for call in sum(uses.values(), []) for a in walk(call)):
                    self._unwrap(n, receiver(n))
        return models

    def _assign_target(self, node) -> Optional[str]:
        line = statement_of(self, node)
        a = line.body[0] if line is not None and len(line.body) == 1 else None
        if isinstance(a, cst.Assign) and len(a.targets) == 1 and (
                a.value is node or any(x is node for x in walk(a.value))):
            return dotted(a.targets[0].target)
        return None

    def _peel(self, expr):
        """``network_to_half(m.half())`` -> ``m``: the converters and .half() calls around it."""
        while isinstance(expr, cst.Call) and (self._is_half(expr) or self.apex_name(expr.func)):
            expr = receiver(expr) if self._is_half(expr) else arg(expr, None, 0).value
        return expr

    def _unwrap(self, call, inner) -> None:
        """Replace ``call`` by ``inner`` (a converter's argument, a receiver of .half()), with
        the apex converters and .half() calls inside it peeled too; a statement that becomes
        ``x = x`` or a bare ``x`` goes."""
        inner = self._peel(inner)
        line = statement_of(self, call)
        a = line.body[0] if line is not None and len(line.body) == 1 else None
        if isinstance(a, cst.Expr) and a.value is call and dotted(inner):
            self.remove(line)
        elif isinstance(a, cst.Assign) and a.value is call and len(a.targets) == 1 and \
                self.code_of(a.targets[0].target) == self.code_of(inner):
            self.remove(line)
        else:
            self.edits.append((call, inner))

    def _unhalf_inputs(self, statement) -> None:
        """The forward pass runs under autocast: its explicit float16 casts go."""
        for n in [statement, *walk(statement)]:
            if isinstance(n, cst.Call) and self._is_half(n) and self.expand.get(id(statement_of(self, n))) != 0:
                self._unwrap(n, receiver(n))  # (not in a statement already removed)


def bound_apex_amp(rule) -> bool:
    return any(q == "apex.amp" or q.startswith("apex.amp.")
               for n in walk(rule.module, into_functions=True) if isinstance(n, cst.Name) and n.value in rule.apex_bound
               and not any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in rule.ancestors(n))
               for q in rule.qnames(n))
