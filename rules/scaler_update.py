import ast

from ampfix.model.analysis import exclusive, functions_and_module, is_scaler_call, scalers_for, unit_nodes
from ampfix.rule import Invalid, Rule, Valid


class ScalerUpdate(Rule):
    """
    ## What it does
    Reports `scaler.step(...)` in a function (or module body) that never calls
    `scaler.update()` (or only in another branch of an `if`), and a second `scaler.update()`
    where one scaler steps several
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
        Valid("def f(scaler, acc):\n    if acc > 1:\n        scaler.step(opt)\n        scaler.update()\n"
              "    else:\n        scaler.step(opt)\n        scaler.update()\n"),
    ]
    INVALID = [
        Invalid("def f(scaler):\n    scaler.scale(loss).backward()\n    scaler.step(opt)\n", message="never calls"),
        Invalid("scaler.scale(l).backward()\nscaler.step(o1)\nscaler.update()\nscaler.step(o2)\nscaler.update()\n",
                message="once per iteration"),
        Invalid("def f(scaler, acc):\n    if acc > 1:\n        scaler.step(opt)\n    else:\n        scaler.step(opt)\n"
                "        scaler.update()\n", message="another branch"),
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
                alone = [st for st in steps if updates and self._no_update_after(unit, st, updates)]
                if steps and not updates:
                    self.report(steps[0], f"`{s}.step()` here but this function never calls `{s}.update()`: "
                                          "the loss scale never adapts; call it once after the optimizer steps")
                elif alone:
                    self.report(alone[0], f"`{s}.step()` here has no `{s}.update()` after it on its path (the "
                                          "update is in another branch): the next step raises; call it after this "
                                          "step too")
                elif len(steps) > 1 and len(updates) > 1:
                    second = self._second_update(unit, steps, updates)
                    if second is not None:
                        self.report(second, f"`{s}.update()` called once per optimizer; call it once per iteration, "
                                            "after every `scaler.step(...)`")

    @staticmethod
    def _no_update_after(unit, step, updates) -> bool:
        return not any((u.lineno, u.col_offset) > (step.lineno, step.col_offset) and not exclusive(step, u, unit)
                       for u in updates)

    @staticmethod
    def _second_update(unit, steps, updates):
        """An update that runs after another in the same pass, with a step of another optimizer
        between them (updates in different branches of an `if` each close their own path)."""
        def pos(n):
            return (n.lineno, n.col_offset)

        def opt(n):
            return ast.dump(n.args[0]) if n.args else None

        for i, u1 in enumerate(updates):
            for u2 in updates[i + 1:]:
                if exclusive(u1, u2, unit):
                    continue
                between = [st for st in steps if pos(u1) < pos(st) < pos(u2)
                           and not exclusive(st, u1, unit) and not exclusive(st, u2, unit)]
                before = [st for st in steps if pos(st) < pos(u1) and not exclusive(st, u1, unit)]
                if any(opt(a) != opt(b) for a in between for b in before):
                    return u2
        return None
