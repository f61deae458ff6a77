import ast

from ampfix.model.analysis import functions_and_module, is_scaler_call, scalers_for, unit_nodes
from ampfix.rule import Invalid, Rule, Valid


class ScalerUpdate(Rule):
    """
    ## What it does
    Reports `scaler.step(...)` in a function (or module body) that never calls
    `scaler.update()`, and a second `scaler.update()` where one scaler steps several
    optimizers in the same function.

    ## Why is this bad?
    `update()` is what adjusts the scale: without it the scale never backs off after an
    overflow (every later step is skipped, silently) and never grows.  With several optimizers,
    `update()` must run once per iteration, after all the `scaler.step(opt)` calls; updating
    after each one changes the scale between optimizers and misreads their inf checks.

    ## Example
    ```python
    scaler.scale(loss).backward()
    scaler.step(opt_g)
    scaler.update()
    scaler.step(opt_d)
    scaler.update()
    ```

    ## Use instead
    ```python
    scaler.step(opt_g)
    scaler.step(opt_d)
    scaler.update()
    ```
    """

    code = "AMP205"
    name = "scaler-update"
    summary = "scaler.step() without scaler.update(), or update() once per optimizer"
    since = "1.6"
    triggers = ("scaler", "GradScaler")

    VALID = [
        Valid("scaler.scale(loss).backward()\nscaler.step(o1)\nscaler.step(o2)\nscaler.update()\n"),
        Valid("def f():\n    scaler.step(opt)\n    scaler.update()\n"),
    ]
    INVALID = [
        Invalid("def f(scaler):\n    scaler.scale(loss).backward()\n    scaler.step(opt)\n", message="never calls"),
        Invalid("scaler.scale(l).backward()\nscaler.step(o1)\nscaler.update()\nscaler.step(o2)\nscaler.update()\n",
                message="once per iteration"),
    ]

    def visit_Module(self, node: ast.Module) -> None:
        for unit in functions_and_module(node):
            scalers = scalers_for(self.ctx, unit)
            if not scalers:
                continue
            nodes = list(unit_nodes(unit))
            for s in sorted(scalers):
                steps = [n for n in nodes if is_scaler_call(n, {s}, "step")]
                updates = [n for n in nodes if is_scaler_call(n, {s}, "update")]
                if steps and not updates:
                    self.report(steps[0], f"`{s}.step()` here but this function never calls `{s}.update()`: "
                                          "the loss scale never adapts; call it once after the optimizer steps")
                elif len(steps) > 1 and len(updates) > 1:
                    self.report(updates[1], f"`{s}.update()` called once per optimizer; call it once per iteration, "
                                            "after every `scaler.step(...)`")
