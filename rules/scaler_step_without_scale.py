import ast

from ampfix.model.analysis import (
    functions_and_module, is_scaler_call, scalers_for, unit_nodes,
)
from ampfix.migration.flow import follows, stmt_of
from ampfix.rule import Invalid, Rule, Valid


class ScalerStepWithoutScale(Rule):
    """
    ## What it does
    Reports `scaler.step(optimizer)` that can run before any `scaler.scale(loss).backward()` of
    the same scaler in its function: a step placed before the training loop (the
    `optimizer.zero_grad(); optimizer.step()` some repositories run once, for an old apex
    quirk), or on a path that never scaled a loss.

    ## Why is this bad?
    `GradScaler.step` asserts that `scale()` ran first in the iteration: the program stops with
    `AssertionError: Attempted step but _scale is None. This may indicate your script did not
    use scaler.scale(loss or outputs) earlier in the iteration.`  A step with no gradients has
    nothing to unscale: it belongs to the plain optimizer.

    ## Example
    ```python
    optimizer.zero_grad()
    scaler.step(optimizer)          # before any scaled backward
    for x, y in loader:
        scaler.scale(loss_fn(model(x), y)).backward()
        scaler.step(optimizer)
        scaler.update()
    ```

    ## Use instead
    ```python
    optimizer.zero_grad()
    optimizer.step()
    for x, y in loader:
        scaler.scale(loss_fn(model(x), y)).backward()
        scaler.step(optimizer)
        scaler.update()
    ```
    """

    code = "AMP211"
    name = "scaler-step-without-scale"
    summary = "scaler.step() that can run before any scaler.scale(loss).backward() of its iteration"
    since = "1.6"
    triggers = ("scaler", "GradScaler")

    VALID = [
        Valid("scaler.scale(loss).backward()\nscaler.step(opt)\nscaler.update()\n"),
        Valid(
            # the step in a function of its own: its caller scales first
            """
            def step(scaler, opt):
                scaler.step(opt)
                scaler.update()
            """
        ),
        Valid(
            """
            for i, x in enumerate(loader):
                if i % 4 == 0:
                    scaler.step(opt)
                    scaler.update()
                scaler.scale(model(x)).backward()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            optimizer.zero_grad()
            scaler.step(optimizer)
            for x in loader:
                scaler.scale(model(x)).backward()
                scaler.step(optimizer)
                scaler.update()
            """,
            message="before any",
        ),
    ]

    def visit_Module(self, node: ast.Module) -> None:
        for unit in functions_and_module(node):
            scalers = scalers_for(self.ctx, unit)
            if not scalers:
                continue
            nodes = list(unit_nodes(unit))
            for s in sorted(scalers):
                scales = [stmt_of(n) for n in nodes if is_scaler_call(n, {s}, "scale")]
                if not scales:
                    continue  # the scaled backward is elsewhere (a caller, a helper)
                for n in nodes:
                    if is_scaler_call(n, {s}, "step") and not follows(stmt_of(n), scales, unit):
                        self.report(n, f"`{self.code_of(n)}` can run before any `{s}.scale(...).backward()`: "
                                       "GradScaler asserts there ('Attempted step but _scale is None'); a step "
                                       "with no scaled gradients belongs to the optimizer itself")
