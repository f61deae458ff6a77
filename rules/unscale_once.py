import ast

from ampfix.model.analysis import (
    enclosing_loop, exclusive, functions_and_module, in_loop_body, is_scaler_call, scalers_for, unit_nodes,
)
from ampfix.rule import Invalid, Rule, Valid


class UnscaleOnce(Rule):
    """
    ## What it does
    Reports `scaler.unscale_(optimizer)` in a loop where it can run on an iteration that does not
    step that optimizer: under a gradient-accumulation test, the step is guarded by an `if` that
    the unscale is not (`scaler.unscale_(opt)` after every backward, `scaler.step(opt)` every N).

    ## Why is this bad?
    `unscale_` may run once per optimizer step: a second call before `scaler.update()` raises
    `RuntimeError: unscale_() has already been called on this optimizer since the last update()`.
    The run dies at the second micro-batch of an accumulation (or, with accumulation off in the
    default configuration, the day someone turns it on).

    ## Example
    ```python
    for i, (x, y) in enumerate(loader):
        with torch.autocast("cuda"):
            loss = model(x, y) / accumulation
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if (i + 1) % accumulation == 0:
            scaler.step(optimizer)
            scaler.update()
    ```

    ## Use instead
    Unscale and clip where the optimizer steps, once per step:
    ```python
        if (i + 1) % accumulation == 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
    ```
    """

    code = "AMP213"
    name = "unscale-once-per-step"
    summary = "scaler.unscale_() that can run again before the optimizer steps (raises at the second call)"
    since = "1.6"
    triggers = ("unscale_",)

    VALID = [
        Valid(
            """
            def train(scaler, model, optimizer, loader, n):
                for i, x in enumerate(loader):
                    scaler.scale(model(x)).backward()
                    if (i + 1) % n == 0:
                        scaler.unscale_(optimizer)
                        scaler.step(optimizer)
                        scaler.update()
            """
        ),
        Valid(
            """
            def train(scaler, model, optimizer, loader, accumulate):
                for i, x in enumerate(loader):
                    scaler.scale(model(x)).backward()
                    if accumulate:
                        if (i + 1) % 2 == 0:
                            scaler.step(optimizer)
                            scaler.update()
                    else:
                        scaler.unscale_(optimizer)
                        scaler.step(optimizer)
                        scaler.update()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            def train(scaler, model, optimizer, loader, n):
                for i, x in enumerate(loader):
                    scaler.scale(model(x)).backward()
                    scaler.unscale_(optimizer)
                    if (i + 1) % n == 0:
                        scaler.step(optimizer)
                        scaler.update()
            """,
            message="already been called",
        ),
    ]

    def visit_Module(self, node: ast.Module) -> None:
        for unit in functions_and_module(node):
            scalers = scalers_for(self.ctx, unit)
            if not scalers:
                continue
            nodes = list(unit_nodes(unit))
            for s in sorted(scalers):
                steps = [n for n in nodes if is_scaler_call(n, {s}, "step") and n.args]
                for u in (n for n in nodes if is_scaler_call(n, {s}, "unscale_") and n.args):
                    loop = enclosing_loop(u)
                    if loop is None:
                        continue
                    mine = [st for st in steps if ast.dump(st.args[0]) == ast.dump(u.args[0])
                            and not exclusive(u, st, unit) and in_loop_body(st, loop)]
                    if mine and not any(_guarded_alike(u, st, loop) for st in mine):
                        self.report(u, f"`{s}.unscale_()` here runs on iterations where `{s}.step()` does not: the "
                                       "second call before an update raises 'unscale_() has already been called'; "
                                       "unscale (and clip) where the optimizer steps")


def _ifs_holding(node, loop):
    """The tests of the ``if`` statements between ``node`` and ``loop``, with the branch that
    holds it."""
    out = []
    child, p = node, getattr(node, "_p", None)
    while p is not None and p is not loop:
        if isinstance(p, ast.If) and child is not p.test:
            # by its test: `if fp16: unscale_...` then `if fp16: step...` are guarded alike
            out.append((ast.dump(p.test), any(child is x for x in p.body)))
        child, p = p, getattr(p, "_p", None)
    return out


def _guarded_alike(unscale, step, loop) -> bool:
    """No ``if`` that skips the step leaves the unscale to run alone: every ``if`` with the step
    in its body and no ``else`` (inside the loop) holds the unscale too, as the same statement or
    one with the same test.  A chain of back ends (``if tpu: xm.optimizer_step(opt) elif fp16:
    scaler.step(opt) else: ...``) holds alternatives, not a skipped step."""
    held = set(_ifs_holding(unscale, loop))
    child, p = step, getattr(step, "_p", None)
    while p is not None and p is not loop:
        if isinstance(p, ast.If) and child is not p.test and not p.orelse and any(child is x for x in p.body) \
                and (ast.dump(p.test), True) not in held:
            return False
        child, p = p, getattr(p, "_p", None)
    return True
