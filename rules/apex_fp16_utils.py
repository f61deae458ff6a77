"""AMP102: apex.fp16_utils (FP16_Optimizer, network_to_half), rewritten to native AMP as one
all-or-nothing fix per module."""

import ast

from ampfix.migration.planner import plan as migration_plan
from ampfix.rule import Fix, Invalid, Valid
from ampfix.rules._apex import ApexRule


class ApexFp16Utils(ApexRule):
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
    planner = staticmethod(migration_plan)
    #: the planner's own reports of FP16_Optimizer migrations (a file edited without apex use)
    says_plan_reports = ("fp16", "dual")

    VALID = [Valid("from mylib.fp16_utils import FP16_Optimizer\nopt = FP16_Optimizer(opt)\n")]
    INVALID = [
        Invalid(
            # apex binds fp16_utils.clip_grad_norm to torch.nn.utils.clip_grad_norm_
            """
            from apex import fp16_utils
            fp16_utils.clip_grad_norm(model.parameters(), 5.0)
            """,
            expected="""
            import torch

            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            """,
        ),
        Invalid(
            """
            from apex.fp16_utils import to_python_float
            losses.update(to_python_float(reduced_loss), n)
            """,
            expected="""
            losses.update(reduced_loss.item(), n)
            """,
        ),
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
                torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
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

    def fix_for(self, node, call, qname):
        """``to_python_float(t)`` is ``t.item()`` for a tensor (apex's helper also took a
        one-element sequence: ``t[0]``, which ``.item()`` handles for a list of one number too
        rarely to matter; the fix is safe for tensors, what the helper was for)."""
        if qname == "apex.fp16_utils.clip_grad_norm" and call is not None:
            # apex's fp16util binds the name to torch.nn.utils.clip_grad_norm_ (torch >= 0.5): the
            # same function, under its own name
            add, remove = self.import_edits(node)
            return Fix("apex.fp16_utils.clip_grad_norm -> torch.nn.utils.clip_grad_norm_",
                       [self.edits.replace(call.func, "torch.nn.utils.clip_grad_norm_")],
                       add_imports=add, remove_imports=remove)
        if qname == "apex.fp16_utils.to_python_float" and call is not None and len(call.args) == 1 \
                and not call.keywords and not isinstance(call.args[0], ast.Starred):
            a = call.args[0]
            text = self.code_of(a)
            if not isinstance(a, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
                text = f"({text})"
            return Fix("to_python_float(x) -> x.item()", [self.edits.replace(call, f"{text}.item()")],
                       remove_imports=self.import_edits(node)[1])
        return None
