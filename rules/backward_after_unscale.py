import ast

from ampfix.model.analysis import (
    enclosing_loop, exclusive, functions_and_module, is_scaler_call, scaled_backward, scalers_for, unit_nodes,
)
from ampfix.rule import Invalid, Rule, Valid


class BackwardAfterUnscale(Rule):
    """
    ## What it does
    Reports a scaled backward (`scaler.scale(loss).backward()`) that runs after
    `scaler.unscale_(optimizer)` and before `scaler.step(optimizer)`, with no `scaler.update()`
    between: two backwards for one step (an adversarial loss, an attack's input gradient, a second
    objective) with the unscale after the first.

    ## Why is this bad?
    `scaler.step(optimizer)` unscales the gradients only when `unscale_` has not run since the last
    `update()`.  Here it has, so the step trusts that call: the gradients the later backward
    produced reach the optimizer still multiplied by the loss scale (65536 at the start), and its
    overflow check is the earlier one's.  Nothing raises; the run diverges or takes steps thousands
    of times too large.  Code migrated from apex by hand often does this: apex unscaled at the end
    of every `scale_loss` block, GradScaler unscales once per step.

    ## Example
    ```python
    scaler.scale(attack_loss).backward()
    scaler.unscale_(optimizer)
    delta = delta + alpha * delta.grad.sign()
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    ```

    ## Use instead
    Unscale once, after the last backward before the step (where the parameters' gradients are
    read); an input's gradient (`delta.grad`) needs no unscale when only its sign is used:
    ```python
    scaler.scale(attack_loss).backward()
    delta = delta + alpha * delta.grad.sign()
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    ```
    """

    code = "AMP214"
    name = "backward-after-unscale"
    summary = "a scaled backward after scaler.unscale_() and before the step: its gradients reach the step scaled"
    since = "1.6"
    triggers = ("unscale_",)

    VALID = [
        Valid(
            """
            def train(scaler, model, optimizer, loader):
                for x in loader:
                    scaler.scale(model(x)).backward()
                    scaler.unscale_(optimizer)
                    scaler.step(optimizer)
                    scaler.update()
            """
        ),
        Valid(
            """
            def train(scaler, model, optimizer, loader, delta):
                for x in loader:
                    scaler.scale(model(x + delta)).backward()
                    delta = delta + delta.grad.sign()
                    optimizer.zero_grad()
                    scaler.scale(model(x + delta)).backward()
                    scaler.unscale_(optimizer)
                    scaler.step(optimizer)
                    scaler.update()
            """
        ),
        Valid(
            """
            def train(scaler, model, optimizer, loader, fp16):
                for x in loader:
                    if fp16:
                        scaler.scale(model(x)).backward()
                        scaler.unscale_(optimizer)
                    else:
                        scaler.scale(model(x)).backward()
                    scaler.step(optimizer)
                    scaler.update()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            def train(scaler, model, optimizer, loader, delta):
                for x in loader:
                    scaler.scale(model(x + delta)).backward()
                    scaler.unscale_(optimizer)
                    delta = delta + delta.grad.sign()
                    optimizer.zero_grad()
                    scaler.scale(model(x + delta)).backward()
                    scaler.step(optimizer)
                    scaler.update()
            """,
            message="still scaled",
        ),
    ]

    def visit_Module(self, node: ast.Module) -> None:
        for unit in functions_and_module(node):
            scalers = scalers_for(self.ctx, unit)
            if not scalers:
                continue
            nodes = list(unit_nodes(unit))

            def pos(n):
                return (n.lineno, n.col_offset)

            for s in sorted(scalers):
                unscales = [n for n in nodes if is_scaler_call(n, {s}, "unscale_") and n.args]
                if not unscales:
                    continue
                steps = [n for n in nodes if is_scaler_call(n, {s}, "step") and n.args]
                updates = [n for n in nodes if is_scaler_call(n, {s}, "update")]
                backs = [n for n in nodes if scaled_backward(n, {s})]
                for u in unscales:
                    opt = ast.dump(u.args[0])
                    loop = enclosing_loop(u)
                    for st in steps:
                        if ast.dump(st.args[0]) != opt or pos(st) < pos(u) or exclusive(u, st, unit) or \
                                enclosing_loop(st) is not loop:
                            continue
                        b = next((b for b in backs if pos(u) < pos(b) < pos(st) and enclosing_loop(b) is loop
                                  and not exclusive(u, b, unit) and not exclusive(b, st, unit)
                                  and not any(pos(u) < pos(x) < pos(b) for x in updates)), None)
                        if b is not None:
                            self.report(b, f"this backward runs after `{s}.unscale_()` (line {u.lineno}) and before "
                                           f"`{s}.step()` (line {st.lineno}): the step does not unscale again, so "
                                           "these gradients reach the optimizer still scaled; unscale once, after "
                                           "the last backward before the step")
                            break
