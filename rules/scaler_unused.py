import ast

from ampfix.model.analysis import FLOAT16, GRADSCALER, arg, enclosing_function, is_const, method_call
from ampfix.rule import Invalid, Rule, Valid
from ampfix.model.semantic import dotted, walk


class ScalerUnused(Rule):
    """
    ## What it does
    Reports a `GradScaler` that nothing uses (made, never read), and one that scales losses in a
    module with no autocast region and no float16 model or cast: training in float32 with loss
    scaling.

    ## Why is this bad?
    A GradScaler only guards float16 gradients against underflow; it does not make anything run
    in half precision.  Without autocast (or a `.half()` model) every op still runs in float32:
    no speed-up, no memory saved, and the scaler's inf checks cost a host sync every step.  A
    scaler made and never used is a migration that quietly dropped mixed precision.

    ## Example
    ```python
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        loss = loss_fn(model(x), y)          # float32
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    ```

    ## Use instead
    ```python
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    ```
    """

    code = "AMP212"
    name = "scaler-without-autocast"
    summary = "GradScaler that nothing uses, or that scales losses with no autocast or float16 model in the module"
    since = "1.6"
    triggers = ("GradScaler",)

    VALID = [
        Valid(
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            with torch.autocast("cuda"):
                loss = model(x)
            scaler.scale(loss).backward()
            """
        ),
        Valid(
            # passed on: whoever receives it may autocast
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            train(model, scaler)
            """
        ),
        Valid("import torch\nscaler = torch.amp.GradScaler('cuda', enabled=False)\n"),
        Valid(
            # a wrapper that scales the loss its caller computed (under the caller's autocast)
            """
            import torch
            class Scaler:
                def __init__(self):
                    self._scaler = torch.amp.GradScaler("cuda")
                def __call__(self, loss, optimizer):
                    self._scaler.scale(loss).backward()
                    self._scaler.step(optimizer)
                    self._scaler.update()
            """
        ),
        Valid(
            # a framework's hook: its runner computed the loss (under the framework's autocast)
            """
            import torch
            class OptimizerHook:
                def __init__(self, use_fp16=False):
                    self.scaler = torch.amp.GradScaler("cuda", enabled=use_fp16)
                def after_train_iter(self, runner):
                    self.scaler.scale(runner.outputs["loss"]).backward()
                    self.scaler.step(runner.optimizer)
                    self.scaler.update()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                loss = model(x)
                loss.backward()
                opt.step()
            """,
            message="nothing uses",
        ),
        Invalid(
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                loss = model(x)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            """,
            message="no autocast",
        ),
    ]

    def visit_Module(self, node: ast.Module) -> None:
        made = []
        for n in walk(node, into_functions=True):
            if isinstance(n, (ast.Assign, ast.AnnAssign)) and isinstance(n.value, ast.Call) and \
                    self.qnames(n.value) & GRADSCALER and not is_const(arg(n.value, "enabled"), False):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                made.append((n.value, [dotted(t) for t in targets if dotted(t)]))
        if not made:
            return
        reads = {}
        for n in walk(node, into_functions=True):
            if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load):
                d = dotted(n)
                if d:
                    reads.setdefault(d, []).append(n)
        text = self.src.text
        half = "half" in text or any(isinstance(n, (ast.Name, ast.Attribute)) and self.qnames(n) & FLOAT16
                                     for n in walk(node, into_functions=True))
        autocast = "autocast" in text
        for call, names in made:
            used = [r for name in names for r in reads.get(name, [])]
            if not used and (_inherited_reads(call, names) or _stored_on_a_parameter(call, names)):
                continue
            if not used:
                self.report(call, "a GradScaler that nothing uses: mixed precision was dropped here (no scaled "
                                  "backward, no autocast); remove it or use it")
                continue
            scales = any(method_call(getattr(r, "_p", None), "scale") for r in used if isinstance(
                getattr(r, "_p", None), ast.Attribute) for _ in [0]) or any(
                isinstance(getattr(r, "_p", None), ast.Attribute) and r._p.attr == "scale" for r in used)
            passed = any(not (isinstance(getattr(r, "_p", None), ast.Attribute) and r._p.value is r) for r in used)
            # a scaler that scales a loss its function receives (a wrapper class): the caller computes it
            passed = passed or any(_scales_a_parameter(r) for r in used)
            if scales and not passed and not autocast and not half:
                self.report(call, "a GradScaler with no autocast region and no float16 model in this module: "
                                  "every op still runs in float32; wrap the forward pass in torch.autocast")


def _inherited_reads(call, names) -> bool:
    """``self.scaler = GradScaler(...)`` in a class with a base class: the base (or a class between)
    may be what reads it (nnUNet: a subclass's ``_maybe_init_amp`` makes the scaler that the base's
    ``run_iteration`` uses), which this module does not show."""
    cls = getattr(call, "_p", None)
    while cls is not None and not isinstance(cls, ast.ClassDef):
        cls = getattr(cls, "_p", None)
    return cls is not None and any(n.startswith("self.") for n in names) and any(
        dotted(b) not in (None, "object") for b in cls.bases)


def _stored_on_a_parameter(call, names) -> bool:
    """``model.scaler = GradScaler(...)`` where ``model`` is a parameter of the function (not its
    ``self``): the scaler goes on an object the caller made, whose own methods read it, maybe in
    another module (a setup function, argus's ``initialize_amp(model)``)."""
    f = getattr(call, "_p", None)
    while f is not None and not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
        f = getattr(f, "_p", None)
    if f is None:
        return False
    params = [a.arg for a in f.args.posonlyargs + f.args.args + f.args.kwonlyargs]
    if params[:1] == ["self"] or isinstance(getattr(f, "_p", None), ast.ClassDef):
        params = params[1:]
    return any("." in n and n.split(".")[0] in params for n in names)


def _scales_a_parameter(ref) -> bool:
    """``scaler.scale(loss)`` where ``loss`` is a parameter of the function it is in, or is held
    by one (``runner.outputs["loss"]`` in a hook that a framework calls with its runner)."""
    attr = getattr(ref, "_p", None)
    call = getattr(attr, "_p", None)
    if not (isinstance(attr, ast.Attribute) and attr.attr == "scale" and isinstance(call, ast.Call) and call.args):
        return False
    func = enclosing_function(call)
    root = call.args[0]
    while isinstance(root, (ast.Attribute, ast.Subscript)):
        root = root.value
    if func is None or not isinstance(root, ast.Name) or root.id in ("self", "cls"):
        return False
    a = func.args
    return root.id in {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
