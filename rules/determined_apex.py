import ast

from ampfix.model.analysis import string_value
from ampfix.model.semantic import walk
from ampfix.migration.spell import conj
from ampfix.rule import Fix, Invalid, Rule, Valid


class DeterminedApex(Rule):
    """
    ## What it does
    Finds Determined's `context.configure_apex_amp(models=..., optimizers=...)` in a PyTorch
    trial.

    ## Why is this bad?
    It runs apex.amp under the hood, which NVIDIA removed from apex in May 2025, and it binds
    the trial to an apex build.  Determined has native AMP through the same context.

    ## Example
    ```python
    self.model, self.opt = self.context.configure_apex_amp(models=model, optimizers=opt, opt_level="O1")
    ...
    self.context.backward(loss)
    self.context.step_optimizer(self.opt)
    ```

    ## Use instead
    ```python
    self.context.experimental.use_amp()  # before the first wrap_model
    self.model = self.context.wrap_model(model)
    self.opt = self.context.wrap_optimizer(opt)
    ...
    self.context.backward(loss)
    self.context.step_optimizer(self.opt)
    ```
    `use_amp()` is Determined's native AMP for what configure_apex_amp covered: the forward pass
    under autocast, the loss scaled in `context.backward`, the gradients unscaled before
    `clip_grads`, the optimizer stepped and the scale updated in `step_optimizer`.  It wraps a
    GradScaler, which Determined takes only before `wrap_model`, so the fix puts it there (under
    the same condition as the apex call), and removes `configure_apex_amp`.  Refused, with the
    reason: opt_level O3 (pure float16), a static `loss_scale` or `num_losses` (use_amp's scaler is
    dynamic and single), apex-only options, no `wrap_model` before it in the same method.
    """

    code = "AMP110"
    name = "determined-apex"
    summary = "Determined context.configure_apex_amp: use context.experimental.use_amp() before wrap_model"
    fix_kind = "safe"
    since = "1.6"
    triggers = ("configure_apex_amp",)

    VALID = [Valid("self.context.experimental.use_amp()\n")]
    INVALID = [
        Invalid(
            """
            class T(PyTorchTrial):
                def __init__(self, context):
                    self.context = context
                    self.model = self.context.wrap_model(Net())
                    self.opt = self.context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))
                    self.model, self.opt = self.context.configure_apex_amp(
                        models=self.model, optimizers=self.opt, opt_level="O1")
            """,
            expected="""
            class T(PyTorchTrial):
                def __init__(self, context):
                    self.context = context
                    self.context.experimental.use_amp()
                    self.model = self.context.wrap_model(Net())
                    self.opt = self.context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))
            """,
        ),
        Invalid(
            # under the trial's own flag, with the flag's level: the same condition, once
            """
            class T(PyTorchTrial):
                def __init__(self, context):
                    self.context = context
                    self.hparams = context.get_hparams()
                    model = self.context.wrap_model(Net())
                    opt = self.context.wrap_optimizer(make_opt(model))
                    if self.hparams["fp16"]:
                        model, opt = self.context.configure_apex_amp(models=model, optimizers=opt,
                                                                     opt_level=self.hparams["opt_level"])
                    self.model, self.opt = model, opt
            """,
            expected="""
            class T(PyTorchTrial):
                def __init__(self, context):
                    self.context = context
                    self.hparams = context.get_hparams()
                    if self.hparams["fp16"] and self.hparams["opt_level"] != "O0":
                        self.context.experimental.use_amp()
                    model = self.context.wrap_model(Net())
                    opt = self.context.wrap_optimizer(make_opt(model))
                    self.model, self.opt = model, opt
            """,
        ),
        Invalid(
            """
            class T(PyTorchTrial):
                def __init__(self, context):
                    self.context = context
                    self.model = self.context.wrap_model(Net())
                    self.opt = self.context.wrap_optimizer(SGD(self.model.parameters(), lr=0.1))
                    self.model, self.opt = self.context.configure_apex_amp(
                        models=self.model, optimizers=self.opt, opt_level="O2", loss_scale=128.0)
            """,
            message="static",
        ),
        Invalid("class T(PyTorchTrial):\n    def __init__(self, context):\n        self.context = context\n"
                "        self.model, self.opt = self.context.configure_apex_amp(models=m, optimizers=o)\n",
                message="wrap_model"),
    ]

    def visit_Call(self, node: ast.Call) -> None:
        if not (isinstance(node.func, ast.Attribute) and node.func.attr == "configure_apex_amp"):
            return
        ctx = self.code_of(node.func.value)
        try:
            fix = self._fix(node, ctx)
            why = ""
        except _Refuse as exc:
            fix, why = None, f" (not rewritten: {exc})"
        self.report(node, "Determined's configure_apex_amp runs apex.amp, which NVIDIA removed in May 2025; use "
                          f"Determined's native AMP: `{ctx}.experimental.use_amp()` before the first wrap_model "
                          f"(autocast, loss scaling and the scaler's step and update are then done by the "
                          f"context){why}", fix)

    # -- the fix ----------------------------------------------------------------------------------
    def _fix(self, node: ast.Call, ctx: str) -> Fix:
        st = self.parent(node)
        if not (isinstance(st, (ast.Assign, ast.Expr)) and st.value is node):
            raise _Refuse("configure_apex_amp is not a statement of its own")
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise _Refuse("its arguments cannot be read")
        names = ["models", "optimizers", "enabled", "opt_level"]
        kw = {k.arg: k.value for k in node.keywords}
        for i, a in enumerate(node.args):
            if i >= len(names):
                raise _Refuse("its arguments cannot be read")
            kw[names[i]] = a
        code = self.code_of
        conds = []
        level = kw.get("opt_level")
        if level is not None:
            lv = string_value(level)
            if lv is None:
                conds.append(f"{code(level)} != \"O0\"")
            elif lv.upper() == "O3":
                raise _Refuse("opt_level O3 is pure float16: convert the model with .half() by hand")
            elif lv.upper() == "O0":
                conds.append("False")
            elif lv.upper() not in ("O1", "O2"):
                raise _Refuse(f"unknown opt_level {lv}")
        enabled = kw.get("enabled")
        if enabled is not None and not (isinstance(enabled, ast.Constant) and enabled.value is True):
            conds.insert(0, "False" if isinstance(enabled, ast.Constant) and enabled.value is False
                         else code(enabled))
        ls = kw.get("loss_scale")
        if ls is not None and not (string_value(ls) == "dynamic" or (isinstance(ls, ast.Constant) and ls.value is None)):
            raise _Refuse("a static loss_scale: use_amp's GradScaler is dynamic; wrap_scaler(torch.amp.GradScaler("
                          "\"cuda\", init_scale=..., growth_interval=2**31 - 1)) before wrap_model by hand")
        nl = kw.get("num_losses")
        if nl is not None and not (isinstance(nl, ast.Constant) and nl.value == 1):
            raise _Refuse("num_losses: use_amp keeps one loss scale for every loss")
        for k in kw:
            if k not in ("models", "optimizers", "enabled", "opt_level", "loss_scale", "num_losses",
                         "keep_batchnorm_fp32", "verbosity", "max_loss_scale"):
                raise _Refuse(f"argument {k!r} has no native counterpart")
        func = next((a for a in self.ancestors(node) if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
        if func is None:
            raise _Refuse("it is not in a method of the trial")
        # the guards it runs under: their tests join the condition; other control flow refuses
        guards = []
        child = st
        p = self.parent(st)
        while p is not None and p is not func:
            if isinstance(p, ast.If) and any(x is child for x in p.body):
                guards.append(p)
            elif isinstance(p, ast.stmt):
                raise _Refuse(f"it runs inside the {type(p).__name__.lower()} at line {p.lineno}: call "
                              f"{ctx}.experimental.use_amp() before wrap_model by hand")
            child, p = p, self.parent(p)
        for g in reversed(guards):
            conds.insert(0, code(g.test))
        cond = "True"
        for c in reversed(conds):
            cond = conj(c, cond)
        top = guards[-1] if guards else st
        first = next((x for x in func.body if any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "wrap_model"
            for n in walk(x)) and x.lineno < st.lineno), None)
        if first is None:
            raise _Refuse(f"wrap_model is not called before it in `{func.name}`: Determined takes the scaler only "
                          f"before wrap_model; call {ctx}.experimental.use_amp() there by hand")
        if first is top or any(x is st for x in walk(first)):
            raise _Refuse(f"wrap_model and configure_apex_amp share the statement at line {first.lineno}")
        i, j = func.body.index(first), next(k for k, x in enumerate(func.body) if x is top or any(
            y is top for y in walk(x)))
        read = {n.id for g in guards for n in walk(g.test) if isinstance(n, ast.Name)}
        read |= {n.id for v in kw.values() if v is not None for n in walk(v) if isinstance(n, ast.Name)} - {
            n.id for n in [kw.get("models"), kw.get("optimizers")] for n in ([] if n is None else walk(n))
            if isinstance(n, ast.Name)}
        bound = {t.id for x in func.body[i:j] for n in walk(x) if isinstance(n, (ast.Assign, ast.AugAssign))
                 for tt in (n.targets if isinstance(n, ast.Assign) else [n.target])
                 for t in ([tt] if not isinstance(tt, ast.Tuple) else tt.elts) if isinstance(t, ast.Name)}
        if read & bound:
            raise _Refuse(f"`{', '.join(sorted(read & bound))}` is set after wrap_model (line {first.lineno}); "
                          f"call {ctx}.experimental.use_amp() before wrap_model by hand")
        call = f"{ctx}.experimental.use_amp()"
        edits = []
        if cond != "False":
            unit = self.edits.unit(st)
            lines = [call] if cond == "True" else [f"if {cond}:", unit + call]
            edits.append(self.edits.insert_before(first, lines))
        after = self._reassign(st, kw)
        if after:
            edits.append(self.edits.replace_statement(st, after))
        else:
            gone = st
            for g in guards:  # an `if` left empty goes with it
                if len(g.body) == 1 and not g.orelse and g.body[0] is gone:
                    gone = g
                else:
                    break
            edits.append(self.edits.remove_statement(gone))
        return Fix(f"configure_apex_amp -> {call} before wrap_model", edits)

    def _reassign(self, st, kw):
        if not isinstance(st, ast.Assign):
            return []
        if len(st.targets) != 1:
            raise _Refuse("configure_apex_amp assigns several targets")
        t = st.targets[0]
        tn = list(t.elts) if isinstance(t, (ast.Tuple, ast.List)) else [t]
        vals = [kw.get("models"), kw.get("optimizers")]
        vals = [v for v in vals if v is not None]
        if len(tn) != len(vals):
            raise _Refuse("configure_apex_amp's targets do not match its models and optimizers")
        pairs = [(self.code_of(a), self.code_of(b)) for a, b in zip(tn, vals) if self.code_of(a) != self.code_of(b)]
        if not pairs:
            return []
        return [f"{', '.join(a for a, _ in pairs)} = {', '.join(b for _, b in pairs)}"]


class _Refuse(Exception):
    pass
