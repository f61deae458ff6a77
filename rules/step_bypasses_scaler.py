import ast

from ampfix.model.analysis import (
    functions_and_module, is_optimizer_step, is_scaler_call, receiver, scaled_backward, scalers_for, unit_nodes,
)
from ampfix.rule import Fix, Invalid, Rule, Valid
from ampfix.model.semantic import dotted


class StepBypassesScaler(Rule):
    """
    ## What it does
    Reports `optimizer.step()` in code that backpropagates a scaled loss
    (`scaler.scale(loss).backward()`) but never calls `scaler.step(optimizer)`.

    ## Why is this bad?
    The gradients are multiplied by the loss scale (65536 at first).  `optimizer.step()`
    applies them without unscaling: every update is tens of thousands of times too large, and
    steps whose gradients overflowed to inf/NaN are applied instead of skipped.  The model
    diverges, or trains "fine" with a tiny learning rate that hides the bug.  On torch 2.x a
    following `scaler.update()` fails at once ("No inf checks were recorded prior to update",
    seen by `ampfix verify` on an H100); without `update()` the bug is silent.

    ## Example
    ```python
    scaler.scale(loss).backward()
    optimizer.step()
    ```

    ## Use instead
    ```python
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    ```
    The fix (unsafe: it changes what the step does, which is the point) rewrites the call and
    adds `scaler.update()` when the function has none.
    """

    code = "AMP204"
    name = "step-bypasses-scaler"
    summary = "optimizer.step() after scaler.scale(loss).backward(): steps on scaled gradients"
    fix_kind = "unsafe"
    since = "1.6"
    triggers = ("scale(",)

    VALID = [
        Valid(
            """
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            """
        ),
        Valid(
            """
            def train(opt):
                loss.backward()
                opt.step()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.scale(model(x)).backward()
                optimizer.step()  # update
                optimizer.zero_grad()
            """,
            unsafe=True,
            expected="""
            import torch
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.scale(model(x)).backward()
                scaler.step(optimizer)  # update
                scaler.update()
                optimizer.zero_grad()
            """,
        ),
        Invalid(
            """
            def step(self, loss):
                self.scaler.scale(loss).backward()
                self.opt.step()
                self.scaler.update()
            """,
            unsafe=True,
            expected="""
            def step(self, loss):
                self.scaler.scale(loss).backward()
                self.scaler.step(self.opt)
                self.scaler.update()
            """,
        ),
    ]

    def visit_Module(self, node: ast.Module) -> None:
        for unit in functions_and_module(node):
            scalers = scalers_for(self.ctx, unit)
            if not scalers:
                continue
            nodes = list(unit_nodes(unit))
            backs = [n for n in nodes if scaled_backward(n, scalers)]
            if not backs:
                continue
            scaler = dotted(receiver(receiver(backs[0])))
            if any(is_scaler_call(n, scalers, "step") for n in nodes):
                continue
            has_update = any(is_scaler_call(n, {scaler}, "update") for n in nodes)
            for n in nodes:
                if is_optimizer_step(n) and not n.args and not n.keywords and dotted(receiver(n)) not in scalers:
                    self.report(n, f"`{self.code_of(n)}` steps on scaled gradients and skips the inf/NaN check; "
                                   f"call `{scaler}.step({self.code_of(receiver(n))})` and `{scaler}.update()`",
                                self._fix(n, scaler, has_update))
                    has_update = True

    def _fix(self, call, scaler, has_update):
        opt = self.code_of(receiver(call))
        edits = [self.edits.replace(call, f"{scaler}.step({opt})")]
        stmt = self.parent(call)
        if has_update or not (isinstance(stmt, ast.Expr) and self.edits.own_lines(stmt)):
            return Fix(f"{opt}.step() -> {scaler}.step({opt})", edits, safe=False)
        edits.append(self.edits.insert_after(stmt, [f"{scaler}.update()"]))
        return Fix(f"{opt}.step() -> {scaler}.step({opt}); {scaler}.update()", edits, safe=False)
