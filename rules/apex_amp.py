"""AMP101: apex.amp, reported and rewritten to native torch.amp as one all-or-nothing fix."""
from typing import Dict, List, Optional, Set

import libcst as cst

from ampfix.analysis import (
    arg, bound_by_imports, dotted, enclosing_function, is_optimizer_step, line_of, method_call, receiver, statement_of,
    walk,
)
from ampfix.rule import Fix, ImportSpec, Invalid, Valid
from ampfix.rules._apex import ApexRule

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
STATIC_NOTE = ("static loss scale: GradScaler starts at it and never grows (growth_interval=2**31-1); it still skips "
               "a step whose gradients overflow and halves the scale, where apex applied it")


CUDA = '"cuda"'


class _Refuse(Exception):
    """The module cannot be migrated with confidence: the reason, for the person."""


def _names_in(node) -> Set[str]:
    out = set()
    for n in [node, *walk(node, into_functions=True)]:
        d = dotted(n) if isinstance(n, (cst.Name, cst.Attribute)) else None
        if d:
            out.add(d)
    return out


def _assigned(stmt) -> Set[str]:
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


def _imported(stmt) -> Set[str]:
    out = set()
    for x in stmt.body:
        if isinstance(x, (cst.Import, cst.ImportFrom)) and not isinstance(x.names, cst.ImportStar):
            out.update((a.evaluated_alias or a.evaluated_name).split(".")[0] for a in x.names)
    return out


def _as_bool(code: str, expr) -> str:
    """autocast(enabled=...) takes a bool only: comparisons, `not` and True/False are; wrap the rest."""
    if isinstance(expr, cst.Comparison) or (isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not)):
        return code
    if isinstance(expr, cst.Name) and expr.value in ("True", "False"):
        return code
    return f"bool({code})"


def _stmt(code: str) -> cst.BaseStatement:
    return cst.parse_statement(code + "\n")


class ApexAmp(ApexRule):
    """
    ## What it does
    Reports every use of `apex.amp` (`initialize`, `scale_loss`, `master_params`,
    `state_dict`, `load_state_dict`, ...) and rewrites a module that uses it to native AMP:

    * `model, opt = amp.initialize(model, opt, opt_level="O1", ...)` becomes
      `scaler = torch.amp.GradScaler("cuda")` (or `self.scaler` when initialize runs in one
      method and the step in another of the same class).  `O0` / `enabled=False` give
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

    When a part cannot be rewritten with confidence (O3, a use of `apex.amp` not listed above,
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
            """
            from apex import amp as A
            A.initialize(m, opt_level="O3")
            """,
            message="O3",
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

    # ------------------------------------------------------------------ reporting
    def visit_Module(self, node: cst.Module) -> None:
        super().visit_Module(node)
        self.plan_fix: Optional[Fix] = None
        self.refusal: Optional[str] = None
        self.init_func = None
        self._told = False
        try:
            self.plan_fix = self._plan(node)
        except _Refuse as exc:
            self.refusal = str(exc)

    def fix_for(self, node, call, qname):
        if qname == "apex.amp.initialize" and call is not None and call.func is self.init_func:
            return self.plan_fix
        return None

    def message(self, qname, fix, call=None):
        text = super().message(qname, fix, call)
        # the reason the module was left whole goes with initialize, or with the first use
        # when initialize lives in another module
        if self.refusal and (qname == "apex.amp.initialize" or (self.init_func is None and not self._told)):
            text += f" (not rewritten: {self.refusal})"
            self._told = True
        return text

    # ------------------------------------------------------------------ planning
    def _uses(self, module):
        uses: Dict[str, List[cst.Call]] = {}
        for n in walk(module, into_functions=True):
            if not isinstance(n, (cst.Name, cst.Attribute)):
                continue
            parent = self.parent(n)
            if isinstance(parent, cst.Attribute) and parent.value is n:
                continue
            q = self.apex_name(n)
            if q is None or any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in self.ancestors(n)):
                continue
            kind = q[len("apex.amp."):] if q.startswith("apex.amp.") else q
            if not (isinstance(parent, cst.Call) and parent.func is n):
                raise _Refuse(f"`{q}` is used other than by calling it (line {line_of(self, n)})")
            uses.setdefault(kind, []).append(parent)
        return uses

    def _plan(self, module: cst.Module) -> Optional[Fix]:
        uses = self._uses(module)
        if not uses:
            return None
        unknown = sorted(set(uses) - {"initialize", "scale_loss", "master_params", "state_dict", "load_state_dict"})
        if unknown:
            raise _Refuse(f"apex.amp.{unknown[0]} has no automatic rewrite")
        inits = uses.get("initialize", [])
        if len(inits) != 1:
            raise _Refuse("amp.initialize must be called exactly once in the module" if inits else
                          "amp.initialize is not called in this module, so the scaler has no home here")
        init = inits[0]
        self.init_func = init.func
        edits = []  # (original node, replacement)
        expand: Dict[int, int] = {}  # id(statement) -> how many statements it becomes

        # -- where the scaler lives -----------------------------------------------------------
        func = enclosing_function(self, init)
        cls = None
        if func is not None and func.params.params and func.params.params[0].name.value == "self":
            cls = next((a for a in self.ancestors(func) if isinstance(a, cst.ClassDef)), None)
        taken = _names_in(module)
        base = "scaler" if "scaler" not in taken and "self.scaler" not in taken else "grad_scaler"
        scaler = f"self.{base}" if cls is not None else base

        def reachable(site) -> bool:
            if func is None:
                return True
            if cls is None:
                return any(a is func for a in self.ancestors(site))
            f = enclosing_function(self, site)
            return (f is not None and any(a is cls for a in self.ancestors(f)) and f.params.params
                    and f.params.params[0].name.value == "self")

        for kind, calls in uses.items():
            for c in calls:
                if c is not init and not reachable(c):
                    raise _Refuse(f"the scaler made at line {line_of(self, init)} cannot reach amp.{kind} at line "
                                  f"{line_of(self, c)}")

        # -- initialize ------------------------------------------------------------------------
        enabled, notes, scaler_args = self._initialize_options(init)
        stmt = statement_of(self, init)
        assign = stmt.body[0] if stmt is not None and len(stmt.body) == 1 else None
        if not isinstance(assign, (cst.Assign, cst.Expr)) or assign.value is not init:
            raise _Refuse("amp.initialize is not a statement of its own")
        def make(extra=()):
            return _stmt(f"{scaler} = torch.amp.GradScaler({', '.join([CUDA, *scaler_args, *extra])})")

        new_stmts = [make()]
        if isinstance(assign, cst.Assign):
            models = arg(init, "models", 0)
            opts = arg(init, "optimizers", 1)
            src = [a.value for a in (models, opts) if a is not None]
            target = assign.targets[0].target
            if self._leaves(target) != [leaf for e in src for leaf in self._leaves(e)]:
                new_stmts.append(_stmt(f"{self.code_of(target)} = {', '.join(self.code_of(e) for e in src)}"))
        guard = self.parent(self.parent(stmt))
        if (isinstance(guard, cst.If) and guard.orelse is None and len(guard.body.body) == 1
                and guard.body.body[0] is stmt and enabled == "True"):
            cond = guard.test
            enabled = _as_bool(self.code_of(cond), cond)
            new_stmts = [make([f"enabled={enabled}"]), *new_stmts[1:]]
            init_node = guard
        else:
            if enabled != "True":
                new_stmts[0] = make([f"enabled={enabled}"])
            init_node = stmt
        self._put(edits, expand, init_node, new_stmts)

        # -- scale_loss sites ------------------------------------------------------------------
        model_arg = arg(init, "models", 0)
        stop = {"init": init_node, "models": _names_in(model_arg.value) if model_arg else set()}
        autocast = 'torch.autocast("cuda", dtype=torch.float16' + ("" if enabled == "True" else f", enabled={enabled}") + ")"
        optimizers: Dict[cst.CSTNode, Set[str]] = {}  # unit -> optimizer names
        wraps: Dict[int, tuple] = {}
        for call in uses.get("scale_loss", []):
            item = self.parent(call)
            with_node = self.parent(item)
            if not (isinstance(item, cst.WithItem) and isinstance(with_node, cst.With) and len(with_node.items) == 1):
                raise _Refuse(f"amp.scale_loss at line {line_of(self, call)} is not a plain `with` statement")
            loss = arg(call, "loss", 0)
            opt = arg(call, "optimizers", 1)
            if loss is None or opt is None:
                raise _Refuse(f"amp.scale_loss at line {line_of(self, call)} lacks its loss or optimizer")
            opt_names = ([self.code_of(e.value) for e in opt.value.elements]
                         if isinstance(opt.value, (cst.List, cst.Tuple)) else [self.code_of(opt.value)])
            unit = enclosing_function(self, call) or module
            optimizers.setdefault(unit, set()).update(opt_names)
            if "loss_id" in {a.keyword.value for a in call.args if a.keyword}:
                notes.add("loss_id: one GradScaler serves every loss")
            if arg(call, "delay_unscale") is not None:
                notes.add("delay_unscale: GradScaler unscales only in scaler.step()")
            site = with_node
            guard = self.parent(self.parent(with_node))
            if (isinstance(guard, cst.If) and isinstance(guard.orelse, cst.Else) and guard.body.body == (with_node,)
                    and len(guard.orelse.body.body) == 1):
                other = guard.orelse.body.body[0]
                if (isinstance(other, cst.SimpleStatementLine) and len(other.body) == 1
                        and isinstance(other.body[0], cst.Expr) and method_call(other.body[0].value, "backward")
                        and self.code_of(receiver(other.body[0].value)) == self.code_of(loss.value)):
                    site = guard  # `if fp16: <scaled> else: loss.backward()` -> the scaled path alone
            self._scale_loss(edits, expand, site, with_node, item, loss.value, scaler)
            self._wrap(wraps, site, loss.value, autocast, stop)

        # -- steps and update ------------------------------------------------------------------
        for unit, names in optimizers.items():
            steps = [n for n in walk(unit) if is_optimizer_step(n) or (method_call(n, "step") and not n.args)]
            steps = [s for s in steps if not s.args and self.code_of(receiver(s)) in names]
            found = {self.code_of(receiver(s)) for s in steps}
            missing = sorted(names - found)
            if missing:
                raise _Refuse(f"`{missing[0]}.step()` is not in the function that scales the loss")
            last = max(steps, key=lambda n: line_of(self, n))
            for s in steps:
                line = statement_of(self, s)
                if line is None or len(line.body) != 1 or not isinstance(line.body[0], cst.Expr):
                    raise _Refuse(f"`{self.code_of(s)}` at line {line_of(self, s)} is not a statement of its own")
                new = [_stmt(f"{scaler}.step({self.code_of(receiver(s))})").with_changes(
                    leading_lines=line.leading_lines, trailing_whitespace=line.trailing_whitespace)]
                if s is last:
                    new.append(_stmt(f"{scaler}.update()"))
                self._put(edits, expand, line, new)

        # -- master_params, state_dict ---------------------------------------------------------
        for call in uses.get("master_params", []):
            opt = arg(call, "optimizer", 0)
            clip = self.parent(self.parent(call))
            line = statement_of(self, call)
            if opt is None or not (isinstance(clip, cst.Call) and "clip_grad" in (dotted(clip.func) or "")) or \
                    line is None or len(line.body) != 1:
                raise _Refuse(f"amp.master_params at line {line_of(self, call)} is not the parameters of a clipping call")
            o = self.code_of(opt.value)
            params = cst.parse_expression(f'(p for group in {o}.param_groups for p in group["params"])')
            edits.append((call, params))
            self._put(edits, expand, line, [_stmt(f"{scaler}.unscale_({o})"), None])
        for kind in ("state_dict", "load_state_dict"):
            for call in uses.get(kind, []):
                edits.append((call.func, cst.parse_expression(f"{scaler}.{kind}")))

        # -- the blocks whose statements get an autocast region --------------------------------
        for block_id, (block, ranges) in wraps.items():
            edits.append((block, self._wrapper(block, ranges, expand, autocast)))

        self._guard_imports(module, uses, edits)
        add = [ImportSpec("torch")]
        remove = [s for s in (self.import_edits(c.func)[1] for calls in uses.values() for c in calls) for s in s]
        desc = "apex.amp -> torch.autocast + torch.amp.GradScaler"
        if notes:
            desc += " (" + "; ".join(sorted(notes)) + ")"
        return Fix(desc, edits, add_imports=add, remove_imports=remove)

    def _leaves(self, expr) -> List[str]:
        """``[a, b], c`` -> ['a', 'b', 'c']: the names a target or an argument list holds."""
        if isinstance(expr, (cst.Tuple, cst.List)):
            return [leaf for e in expr.elements for leaf in self._leaves(e.value)]
        return [self.code_of(expr)]

    def _guard_imports(self, module, uses, edits) -> None:
        """Remove ``try: from apex import amp / except ImportError: amp = None`` once nothing else
        uses the names it binds (the uses being rewritten do not count)."""
        rewritten = {id(c.func) for calls in uses.values() for c in calls}
        for t in walk(module, into_functions=True):
            if not isinstance(t, cst.Try) or t.orelse is not None or t.finalbody is not None:
                continue
            imports = [s for s in t.body.body if isinstance(s, cst.SimpleStatementLine)
                       and all(isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body)]
            if not imports or len(imports) != len(t.body.body):
                continue
            if any(bound_by_imports(s, "apex") != _imported(s) for s in imports):
                continue
            if not all(h.type is None or dotted(h.type) in ("ImportError", "ModuleNotFoundError") for h in t.handlers):
                continue
            names = set().union(*(_assigned(h) for h in t.handlers), *(_imported(s) for s in imports))
            inside = {id(n) for n in walk(t, into_functions=True)}
            for n in walk(module, into_functions=True):
                if isinstance(n, cst.Name) and n.value in names and id(n) not in inside:
                    outer = n
                    while isinstance(self.parent(outer), cst.Attribute) and self.parent(outer).value is outer:
                        outer = self.parent(outer)
                    if id(outer) not in rewritten:
                        break
            else:
                edits.append((t, cst.RemovalSentinel.REMOVE))

    def _initialize_options(self, init: cst.Call):
        kws = {a.keyword.value: a.value for a in init.args if a.keyword is not None}
        if len([a for a in init.args if a.keyword is None]) > 2 or any(a.star for a in init.args):
            raise _Refuse("amp.initialize has arguments that cannot be read")
        notes: Set[str] = set()
        scaler_args: List[str] = []
        enabled = "True"
        level = kws.get("opt_level")
        if level is None:
            notes.add("opt_level defaulted to O1")
        elif isinstance(level, cst.SimpleString):
            lv = level.evaluated_value.upper()
            if lv == "O3":
                raise _Refuse("opt_level O3 is pure float16: convert the model with model.half() by hand "
                              "(no GradScaler, no autocast)")
            if lv == "O0":
                enabled = "False"
            elif lv not in ("O1", "O2"):
                raise _Refuse(f"unknown opt_level {lv}")
        else:
            enabled = f'{self.code_of(level)} != "O0"'
            notes.add("opt_level is not a literal: AMP is enabled unless it is O0 (O3 runs as O1)")
        if "enabled" in kws:
            e = _as_bool(self.code_of(kws["enabled"]), kws["enabled"])
            enabled = e if enabled == "True" else f"({e}) and ({enabled})"
            if enabled == "False" or e == "False":
                enabled = "False"
        ls = kws.get("loss_scale")
        if ls is not None:
            if isinstance(ls, cst.SimpleString) and ls.evaluated_value == "dynamic":
                pass
            elif isinstance(ls, (cst.Integer, cst.Float)):
                scaler_args += [f"init_scale={ls.value}", "growth_interval=2**31 - 1"]
                notes.add(STATIC_NOTE)
            else:
                raise _Refuse("loss_scale is neither 'dynamic' nor a number")
        for k in kws:
            if k in NOTES:
                notes.add(f"{k}: {NOTES[k]}")
            elif k not in ("opt_level", "enabled", "loss_scale", "models", "optimizers"):
                raise _Refuse(f"amp.initialize argument {k!r} has no native mapping")
        return enabled, notes, scaler_args

    @staticmethod
    def _put(edits, expand, stmt, new_stmts):
        """Replace a statement by several; None in new_stmts stands for the (updated) statement itself."""
        expand[id(stmt)] = len(new_stmts)
        first = stmt.leading_lines

        def rep(u, new_stmts=new_stmts):
            out = [u if s is None else s for s in new_stmts]
            out = [out[0].with_changes(leading_lines=first)] + [s.with_changes(leading_lines=[]) for s in out[1:]]
            return cst.FlattenSentinel(out)

        edits.append((stmt, rep))

    def _scale_loss(self, edits, expand, site, with_node, item, loss, scaler):
        alias = item.asname.name.value if item.asname is not None and isinstance(item.asname.name, cst.Name) else None
        body = list(with_node.body.body)
        loss_code = self.code_of(loss)
        first = body[0] if body else None
        rest_uses = any(alias and alias in _names_in(s) for s in body[1:])
        simple = (isinstance(first, cst.SimpleStatementLine) and len(first.body) == 1 and isinstance(first.body[0], cst.Expr)
                  and method_call(first.body[0].value, "backward")
                  and dotted(receiver(first.body[0].value)) == alias and not rest_uses)
        count = sum(expand.get(id(s), 1) for s in body) + (0 if simple else 1)
        expand[id(site)] = count
        leading = site.leading_lines

        def rep(u):
            w = u if isinstance(u, cst.With) else u.body.body[0]
            stmts = list(w.body.body)
            if simple:
                call = stmts[0].body[0].value
                new_call = call.with_changes(func=call.func.with_changes(
                    value=cst.parse_expression(f"{scaler}.scale({loss_code})")))
                stmts[0] = stmts[0].with_changes(body=[stmts[0].body[0].with_changes(value=new_call)])
            else:
                stmts.insert(0, _stmt(f"{alias or '_'} = {scaler}.scale({loss_code})"))
            stmts[0] = stmts[0].with_changes(leading_lines=leading)
            return cst.FlattenSentinel(stmts)

        edits.append((site, rep))

    def _wrap(self, wraps, site, loss, autocast, stop):
        block = self.parent(site)
        stmts = list(block.body)
        idx = next(i for i, s in enumerate(stmts) if s is site)
        needed = _names_in(loss)
        first = last = None
        for j in range(idx - 1, -1, -1):
            s = stmts[j]
            if s is stop["init"] or isinstance(s, (cst.FunctionDef, cst.ClassDef)) or _assigned(s) & stop["models"]:
                break
            if any(method_call(n, "backward") or is_optimizer_step(n) or isinstance(n, cst.With)
                   and any(self.apex_name(i.item.func) for i in n.items if isinstance(i.item, cst.Call))
                   for n in [s, *walk(s)]):
                break
            assigned = _assigned(s)
            if assigned & needed:
                needed |= _names_in(s)
                first = j
                last = last if last is not None else j
        if first is None:
            raise _Refuse(f"the loss `{self.code_of(loss)}` is not computed in the block that scales it (line "
                          f"{line_of(self, site)}): wrap its forward pass in {autocast} by hand")
        entry = wraps.setdefault(id(block), (block, []))
        entry[1].append((stmts[first], stmts[last]))

    @staticmethod
    def _wrapper(block, ranges, expand, autocast):
        originals = list(block.body)

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
                with_stmt = cst.parse_statement(f"with {autocast}:\n    pass\n")
                body = [inner[0].with_changes(leading_lines=[])] + inner[1:]
                with_stmt = with_stmt.with_changes(body=with_stmt.body.with_changes(body=body),
                                                   leading_lines=inner[0].leading_lines)
                new[lo:hi] = [with_stmt]
            return u.with_changes(body=new)

        return rep
