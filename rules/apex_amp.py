"""AMP101: apex.amp, reported and rewritten to native torch.amp as one all-or-nothing fix."""
from typing import Dict, List, Optional, Set

import libcst as cst

from ampfix.analysis import arg, dotted, enclosing_function, line_of, method_call, receiver, statement_of, walk
from ampfix.rule import Fix, ImportSpec, Invalid, Valid
from ampfix.rules._native import (
    STATIC_NOTE, ModuleMigration, Refuse, as_bool, autocast_call, names_in, sole_expr, stmt,
    target_description,
)

NOTES = {
    "keep_batchnorm_fp32": "autocast keeps batch norm in float32 itself",
    "master_weights": "the model stays float32, so its weights are the master weights",
    "cast_model_type": "the model stays float32; autocast casts per op",
    "patch_torch_functions": "autocast replaces the patching",
    "cast_model_outputs": "autocast outputs follow each op's dtype",
    "num_losses": "one GradScaler serves every loss",
    "min_loss_scale": "GradScaler has no lower bound on the scale",
    "max_loss_scale": "GradScaler has no upper bound on the scale",
    "verbosity": "not needed",
}

class ApexAmp(ModuleMigration):
    """
    ## What it does
    Reports every use of `apex.amp` (`initialize`, `scale_loss`, `master_params`,
    `state_dict`, `load_state_dict`, ...) and rewrites a module that uses it to native AMP:

    * `model, opt = amp.initialize(model, opt, opt_level="O1", ...)` becomes
      `scaler = torch.amp.GradScaler("cuda")` (or `self.scaler` when initialize runs in one
      method and the step in another of the same class, or a module global, declared
      `global scaler`, when initialize runs in `main()` and the step in `train()`; autocast
      there follows `scaler.is_enabled()`).  `O0` / `enabled=False` give
      `enabled=False` on the scaler and autocast; a non-literal `opt_level` gives
      `enabled=<opt_level> != "O0"`; a numeric `loss_scale` gives `init_scale=` and no growth;
      the other options are mapped or named in the fix's description, never dropped silently.
    * The statements that compute the scaled loss (found by data flow back from the loss, in
      its block, stopping at an earlier backward or step) are wrapped in
      `with torch.autocast("cuda", dtype=torch.float16):`; backward stays outside.
    * `with amp.scale_loss(loss, opt) as s: s.backward()` becomes `scaler.scale(loss).backward()`;
      `opt.step()` becomes `scaler.step(opt)`, and `scaler.update()` follows the last step of the
      function, once (several optimizers and `loss_id`s share one scaler; `delay_unscale` is
      not needed).
    * `clip_grad_norm_(amp.master_params(opt), ...)` becomes `scaler.unscale_(opt)` and clipping
      of the optimizer's parameters; `amp.state_dict()` / `amp.load_state_dict()` become the
      scaler's.
    * A guard `if args.fp16: model, opt = amp.initialize(...)` becomes an unconditional scaler
      with `enabled=args.fp16`, and `if args.fp16: <scaled backward> else: loss.backward()`
      becomes the scaled backward alone: no dead apex path is left.

    * `O3` (pure float16) becomes `model = model.half()` plus a forward pre-hook that casts
      floating-point inputs to float16, as apex did; the backward is plain and the fix
      description says the model is pure float16 (no master weights, no loss scaling).  O3
      with a loss scale is refused: GradScaler cannot unscale float16 gradients.

    With `target = "torch.cuda.amp"` the same rewrite uses `torch.cuda.amp.GradScaler()` and
    `torch.cuda.amp.autocast(dtype=torch.float16)`.

    When a part cannot be rewritten with confidence (a use of `apex.amp` not listed above,
    a loss computed in another function, a scaler that cannot reach the step), nothing of
    `apex.amp` is rewritten in that module and the report says why.

    ## Why is this bad?
    apex.amp monkey-patches torch functions (O1) or keeps its own master weights (O2), must be
    built against the exact torch and CUDA, and is in maintenance mode.  Native AMP does the
    same job with `torch.autocast` and `GradScaler`, with fewer casts and no patching.

    ## Example
    ```python
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in loader:
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
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

    code = "AMP101"
    name = "apex-amp"
    summary = "apex.amp: use torch.autocast + torch.amp.GradScaler (rewritten by migrate)"
    fix_kind = "safe"
    since = "1.6"
    prefix = "apex.amp"

    VALID = [Valid("import torch\nscaler = torch.amp.GradScaler('cuda')\n"),
             Valid("from mylib import amp\nmodel = amp.initialize(model)\n")]
    INVALID = [
        Invalid(
            """
            import torch
            from apex import amp

            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for x, y in loader:
                out = model(x)
                loss = criterion(out, y)  # the loss
                optimizer.zero_grad()
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
            """,
            count=2,
            expected="""
            import torch

            scaler = torch.amp.GradScaler("cuda")
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.float16):
                    out = model(x)
                    loss = criterion(out, y)  # the loss
                optimizer.zero_grad()
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            """,
        ),
        Invalid(
            # initialize in main(), the step in train(): a module-level scaler, declared global
            """
            from apex import amp

            def train(model, loader, optimizer):
                for x, y in loader:
                    loss = criterion(model(x), y)
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                    optimizer.step()

            def main(args):
                model, optimizer = build()
                if args.fp16:
                    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
                train(model, loader, optimizer)
            """,
            count=2,
            expected="""
            import torch

            def train(model, loader, optimizer):
                for x, y in loader:
                    with torch.autocast("cuda", dtype=torch.float16, enabled=scaler.is_enabled()):
                        loss = criterion(model(x), y)
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()

            def main(args):
                model, optimizer = build()
                global scaler
                scaler = torch.amp.GradScaler("cuda", enabled=bool(args.fp16))
                train(model, loader, optimizer)
            """,
        ),
        Invalid(
            # the shape of the Hugging Face example scripts: the import and initialize under
            # one guard; the scaler is hoisted out of it, and the guard goes once empty
            """
            import torch

            def train(args, model, optimizer, loader):
                if args.fp16:
                    try:
                        from apex import amp
                    except ImportError:
                        raise ImportError("Please install apex")
                    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
                for batch in loader:
                    loss = model(**batch)[0]
                    if args.fp16:
                        with amp.scale_loss(loss, optimizer) as scaled_loss:
                            scaled_loss.backward()
                    else:
                        loss.backward()
                    optimizer.step()
            """,
            count=2,
            expected="""
            import torch

            def train(args, model, optimizer, loader):
                scaler = torch.amp.GradScaler("cuda", enabled=bool(args.fp16))
                for batch in loader:
                    with torch.autocast("cuda", dtype=torch.float16, enabled=bool(args.fp16)):
                        loss = model(**batch)[0]
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
            """,
        ),
        Invalid(
            # ViT-pytorch and its many copies set the first loss scale through apex's private state
            """
            from apex import amp
            if args.fp16:
                model, optimizer = amp.initialize(models=model, optimizers=optimizer, opt_level="O2")
                amp._amp_state.loss_scalers[0]._loss_scale = 2**20
            for x, y in loader:
                loss = model(x, y)
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
            """,
            count=3,
            expected="""
            import torch

            scaler = torch.amp.GradScaler("cuda", init_scale=2**20, enabled=bool(args.fp16))
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.float16, enabled=bool(args.fp16)):
                    loss = model(x, y)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            """,
        ),
        Invalid(
            """
            from apex import amp
            if args.amp:
                model, optimizer = amp.initialize(model, optimizer)
            else:
                model = model.half()
            """,
            message="runs inside an `if` with an `else`",
        ),
        Invalid(
            """
            from apex import amp as A
            model, opt = A.initialize(model, opt, opt_level="O3")
            for x, y in loader:
                loss = criterion(model(x), y)
                with A.scale_loss(loss, opt) as scaled:
                    scaled.backward()
                opt.step()
            """,
            count=2,
            message="O3 is pure float16",
            expected="""
            import torch

            model = model.half()
            model.register_forward_pre_hook(lambda module, args: tuple(
                a.half() if torch.is_tensor(a) and a.is_floating_point() else a for a in args))
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                opt.step()
            """,
        ),
        Invalid(
            """
            from apex import amp
            model, opt = amp.initialize(model, opt, opt_level="O2", loss_scale=128.0)
            for x, y in loader:
                loss = criterion(model(x), y)
                with amp.scale_loss(loss, opt) as scaled:
                    scaled.backward()
                opt.step()
            """,
            count=2,
            settings={"target": "torch.cuda.amp"},
            expected="""
            import torch

            scaler = torch.cuda.amp.GradScaler(init_scale=128.0, growth_interval=2**31 - 1)
            for x, y in loader:
                with torch.cuda.amp.autocast(dtype=torch.float16):
                    loss = criterion(model(x), y)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            """,
        ),
        Invalid(
            """
            from apex import amp
            model, opt = amp.initialize(model, opt, opt_level="O3", loss_scale="dynamic")
            """,
            message="O3 with loss scaling",
        ),
        Invalid(
            """
            from apex import amp
            def train(loss, optimizer):
                with amp.scale_loss(loss, optimizer) as s:
                    s.backward()
                optimizer.step()
            """,
            message="not rewritten: amp.initialize is not called in this module",
        ),
    ]

        # ------------------------------------------------------------------ planning
    def is_scaling_site(self, node) -> bool:
        return isinstance(node, cst.With) and any(
            isinstance(i.item, cst.Call) and self.apex_name(i.item.func) for i in node.items)

    def _uses(self, module):
        uses: Dict[str, List[cst.Call]] = {}
        for n, q in self.references(module):
            kind = q[len("apex.amp."):] if q.startswith("apex.amp.") else q
            scale = self._initial_scale(n) if kind == "_amp_state.loss_scalers" else None
            if scale is not None:
                uses.setdefault("initial_scale", []).append(scale)
            else:
                uses.setdefault(kind, []).append(self.called(n, q))
        return uses

    def _initial_scale(self, n) -> Optional[cst.Assign]:
        """``amp._amp_state.loss_scalers[0]._loss_scale = 2**20`` (a line the ViT-pytorch family
        of scripts copies after initialize): the scaler's ``init_scale``."""
        sub, attr = self.parent(n), self.parent(self.parent(n))
        line = statement_of(self, n)
        assign = line.body[0] if line is not None and len(line.body) == 1 else None
        if (isinstance(sub, cst.Subscript) and isinstance(attr, cst.Attribute) and attr.value is sub
                and attr.attr.value == "_loss_scale" and self.code_of(sub.slice[0].slice) == "0"
                and isinstance(assign, cst.Assign) and len(assign.targets) == 1 and assign.targets[0].target is attr):
            return assign
        return None

    def plan(self, module: cst.Module) -> Optional[Fix]:
        uses = self._uses(module)
        if not uses:
            return None
        unknown = sorted(set(uses) - {"initialize", "scale_loss", "master_params", "state_dict", "load_state_dict",
                                      "initial_scale"})
        if unknown:
            raise Refuse(f"apex.amp.{unknown[0]} has no automatic rewrite")
        inits = uses.get("initialize", [])
        if len(inits) != 1:
            raise Refuse("amp.initialize must be called exactly once in the module" if inits else
                         "amp.initialize is not called in this module, so the scaler has no home here")
        init = inits[0]
        self.anchor = init.func
        enabled, notes, scaler_args, pure = self._initialize_options(init)
        for assign in uses.pop("initial_scale", []):
            value = assign.value
            if pure or any(isinstance(x, (cst.Name, cst.Attribute, cst.Call)) for x in [value, *walk(value)]):
                raise Refuse(f"the loss scale set at line {line_of(self, assign)} is not a number")
            if self.parent(statement_of(self, assign)) is not self.parent(statement_of(self, init)):
                raise Refuse(f"the loss scale set at line {line_of(self, assign)} is not beside amp.initialize")
            scaler_args = [a for a in scaler_args if not a.startswith("init_scale=")]
            scaler_args.insert(0, f"init_scale={self.code_of(value)}")
            notes.add("apex's private _amp_state loss scale: the scaler's init_scale")
            self.remove(statement_of(self, assign))
        scaler = self.scaler_home(module, init, [c for calls in uses.values() for c in calls])

        # -- initialize ------------------------------------------------------------------------
        line = statement_of(self, init)
        assign = line.body[0] if line is not None and len(line.body) == 1 else None
        if not isinstance(assign, (cst.Assign, cst.Expr)) or assign.value is not init:
            raise Refuse("amp.initialize is not a statement of its own")
        models = arg(init, "models", 0)
        opts = arg(init, "optimizers", 1)
        src = [a.value for a in (models, opts) if a is not None]
        if pure:
            self.note = ("O3 is pure float16: migrate makes it model.half(), with no master weights and no loss "
                         "scaling; opt_level O1's autocast is the safer choice")
            new_stmts = self._pure_fp16(init, assign, models)
            init_node = line
            self.put(init_node, new_stmts)
        else:
            after = []
            if isinstance(assign, cst.Assign):
                target = assign.targets[0].target
                if self.leaves(target) != [leaf for e in src for leaf in self.leaves(e)]:
                    after.append(stmt(f"{self.code_of(target)} = {', '.join(self.code_of(e) for e in src)}"))
            init_node, enabled = self.place_scaler(line, scaler, scaler_args, enabled, after=after)

        # -- scale_loss sites ------------------------------------------------------------------
        stop = {"init": init_node, "models": names_in(models.value) if models else set()}
        if self.global_scaler and enabled != "True":
            enabled = f"{scaler}.is_enabled()"  # the other functions may not see the guard's names
        autocast = autocast_call(self.settings, enabled)
        optimizers: Dict[cst.CSTNode, Set[str]] = {}  # unit -> optimizer names
        for call in uses.get("scale_loss", []):
            item = self.parent(call)
            with_node = self.parent(item)
            if not (isinstance(item, cst.WithItem) and isinstance(with_node, cst.With) and len(with_node.items) == 1):
                raise Refuse(f"amp.scale_loss at line {line_of(self, call)} is not a plain `with` statement")
            loss = arg(call, "loss", 0)
            opt = arg(call, "optimizers", 1)
            if loss is None or opt is None:
                raise Refuse(f"amp.scale_loss at line {line_of(self, call)} lacks its loss or optimizer")
            opt_names = ([self.code_of(e.value) for e in opt.value.elements]
                         if isinstance(opt.value, (cst.List, cst.Tuple)) else [self.code_of(opt.value)])
            unit = enclosing_function(self, call) or module
            optimizers.setdefault(unit, set()).update(opt_names)
            if "loss_id" in {a.keyword.value for a in call.args if a.keyword}:
                notes.add("loss_id: one GradScaler serves every loss")
            if arg(call, "delay_unscale") is not None:
                notes.add("delay_unscale: GradScaler unscales only in scaler.step()")
            loss_code = self.code_of(loss.value)

            def plain(other, loss_code=loss_code):
                e = sole_expr(other)
                return e is not None and method_call(e, "backward") and self.code_of(receiver(e)) == loss_code

            self._scale_loss(with_node, item, loss.value, None if pure else scaler)
            site = self.collapse_guard(with_node, plain)
            if not pure:
                self.wrap(site, loss.value, autocast, stop)

        # -- steps and update ------------------------------------------------------------------
        if not pure:
            self.rewrite_steps(optimizers, scaler)

        # -- master_params, state_dict ---------------------------------------------------------
        for call in uses.get("master_params", []):
            opt = arg(call, "optimizer", 0)
            clip = self.parent(self.parent(call))
            clip_line = statement_of(self, call)
            if opt is None or not (isinstance(clip, cst.Call) and "clip_grad" in (dotted(clip.func) or "")) or \
                    clip_line is None or len(clip_line.body) != 1:
                raise Refuse(f"amp.master_params at line {line_of(self, call)} is not the parameters of a clipping call")
            o = self.code_of(opt.value)
            self.edits.append((call, cst.parse_expression(f'(p for group in {o}.param_groups for p in group["params"])')))
            if not pure:
                self.put(clip_line, [stmt(f"{scaler}.unscale_({o})"), None])
        for kind in ("state_dict", "load_state_dict"):
            for call in uses.get(kind, []):
                if pure:
                    raise Refuse(f"amp.{kind} at line {line_of(self, call)}: O3 has no loss scaler to save")
                self.edits.append((call.func, cst.parse_expression(f"{scaler}.{kind}")))

        self.finish_wraps(autocast)
        self.guard_imports(module, {id(c.func) for calls in uses.values() for c in calls})
        self.finish_carry()
        add = [ImportSpec("torch")]
        remove = [s for s in (self.import_edits(c.func)[1] for calls in uses.values() for c in calls) for s in s]
        desc = "apex.amp -> " + ("model.half() (O3 is pure float16: no autocast, no master weights, no loss scaling)"
                                 if pure else target_description(self.settings))
        if notes:
            desc += " (" + "; ".join(sorted(notes)) + ")"
        return Fix(desc, list(self.edits), add_imports=add, remove_imports=remove)

    def _pure_fp16(self, init, assign, models):
        """O3: the model itself in float16, and apex's cast of its floating-point inputs kept
        as a forward pre-hook."""
        if models is None or isinstance(models.value, (cst.List, cst.Tuple)):
            raise Refuse("opt_level O3 with a list of models: convert each with .half() by hand")
        m = self.code_of(models.value)
        out = [stmt(f"{m} = {m}.half()"),
               stmt(f"{m}.register_forward_pre_hook(lambda module, args: tuple(\n"
                    f"    a.half() if torch.is_tensor(a) and a.is_floating_point() else a for a in args))")]
        if isinstance(assign, cst.Assign):
            target = assign.targets[0].target
            names = self.leaves(target)
            opts = arg(init, "optimizers", 1)
            src = [m] + (self.leaves(opts.value) if opts else [])
            if names != src:
                out.append(stmt(f"{self.code_of(target)} = {', '.join(src)}"))
        return out

    def _initialize_options(self, init: cst.Call):
        kws = {a.keyword.value: a.value for a in init.args if a.keyword is not None}
        if len([a for a in init.args if a.keyword is None]) > 2 or any(a.star for a in init.args):
            raise Refuse("amp.initialize has arguments that cannot be read")
        notes: Set[str] = set()
        scaler_args: List[str] = []
        enabled = "True"
        pure = False
        level = kws.get("opt_level")
        if level is None:
            notes.add("opt_level defaulted to O1")
        elif isinstance(level, cst.SimpleString):
            lv = level.evaluated_value.upper()
            if lv == "O3":
                pure = True
            elif lv == "O0":
                enabled = "False"
            elif lv not in ("O1", "O2"):
                raise Refuse(f"unknown opt_level {lv}")
        else:
            enabled = f'{self.code_of(level)} != "O0"'
            notes.add("opt_level is not a literal: AMP is enabled unless it is O0 (O3 runs as O1)")
        if "enabled" in kws:
            e = as_bool(self.code_of(kws["enabled"]), kws["enabled"])
            if pure:
                raise Refuse("opt_level O3 with `enabled`: convert the model with .half() by hand")
            enabled = e if enabled == "True" else f"({e}) and ({enabled})"
            if enabled == "False" or e == "False":
                enabled = "False"
        ls = kws.get("loss_scale")
        if pure:
            if ls is not None and not (isinstance(ls, (cst.Integer, cst.Float)) and float(ls.value) == 1.0):
                raise Refuse("opt_level O3 with loss scaling: GradScaler cannot unscale float16 gradients; "
                             "use opt_level O1 (autocast) or scale the loss by hand")
            for k in kws:
                if k not in ("opt_level", "loss_scale", "models", "optimizers", "verbosity"):
                    raise Refuse(f"opt_level O3 with {k!r}: convert the model with .half() by hand")
            return enabled, notes, scaler_args, pure
        if ls is not None:
            if isinstance(ls, cst.SimpleString) and ls.evaluated_value == "dynamic":
                pass
            elif isinstance(ls, (cst.Integer, cst.Float)):
                scaler_args += [f"init_scale={ls.value}", "growth_interval=2**31 - 1"]
                notes.add(STATIC_NOTE)
            else:
                raise Refuse("loss_scale is neither 'dynamic' nor a number")
        for k in kws:
            if k in NOTES:
                notes.add(f"{k}: {NOTES[k]}")
            elif k not in ("opt_level", "enabled", "loss_scale", "models", "optimizers"):
                raise Refuse(f"amp.initialize argument {k!r} has no native mapping")
        return enabled, notes, scaler_args, pure

    def _scale_loss(self, with_node, item, loss, scaler):
        """The ``with amp.scale_loss(...)`` statement becomes its body, with the scaled loss
        taken from the scaler (or the loss itself for O3)."""
        alias = item.asname.name.value if item.asname is not None and isinstance(item.asname.name, cst.Name) else None
        body = list(with_node.body.body)
        loss_code = self.code_of(loss)
        scaled = f"{scaler}.scale({loss_code})" if scaler else loss_code
        rest_uses = any(alias and alias in names_in(s) for s in body[1:])
        e = sole_expr(body[0])
        simple = (e is not None and method_call(e, "backward") and dotted(receiver(e)) == alias and not rest_uses)
        leading = with_node.leading_lines
        carry = self.carry

        def rep(w):
            stmts = list(w.body.body)
            if simple:
                call = stmts[0].body[0].value
                new_call = call.with_changes(func=call.func.with_changes(value=cst.parse_expression(scaled)))
                stmts[0] = stmts[0].with_changes(body=[stmts[0].body[0].with_changes(value=new_call)])
            else:
                stmts.insert(0, stmt(f"{alias or '_'} = {scaled}"))
            stmts[0] = stmts[0].with_changes(leading_lines=[*carry.get(id(with_node), []), *leading,
                                                             *stmts[0].leading_lines])
            return cst.FlattenSentinel(stmts)

        self.expand[id(with_node)] = sum(self.expand.get(id(s), 1) for s in body) + (0 if simple else 1)
        self.edits.append((with_node, rep))
