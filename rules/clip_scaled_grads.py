import libcst as cst

from ampfix.analysis import (
    CLIP, enclosing_loop, functions_and_module, is_scaler_call, line_of, method_call, scaled_backward,
    scaler_names, statement_of, walk, dotted, receiver,
)
from ampfix.rule import Fix, Invalid, Rule, Valid


class ClipScaledGrads(Rule):
    """
    ## What it does
    Reports gradient clipping (`clip_grad_norm_`, `clip_grad_value_`) of gradients that are
    still scaled: after `scaler.scale(loss).backward()` with no `scaler.unscale_(optimizer)`
    in between.  Also reports clipping placed before `backward()` in the same loop body.

    ## Why is this bad?
    Scaled gradients are the true ones times the loss scale (65536 at first): a threshold of
    `max_norm=1.0` then clips almost every step to a tiny fraction of the true gradient.
    Clipping before backward clips the previous (already used or zeroed) gradients.

    ## Example
    ```python
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    ```

    ## Use instead
    ```python
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    ```
    The fix (safe when the function steps exactly one optimizer through the scaler) inserts
    `scaler.unscale_(optimizer)` before the clipping.
    """

    code = "AMP206"
    name = "clip-scaled-grads"
    summary = "gradient clipping of scaled gradients (no scaler.unscale_ first), or before backward"
    fix_kind = "safe"
    since = "1.6"
    triggers = ("clip_grad",)

    VALID = [
        Valid(
            """
            import torch
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            """
        ),
        Valid(
            """
            import torch
            for x in data:
                loss = model(x)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.nn.utils import clip_grad_norm_
            def train_step(model, opt, scaler, loss):
                scaler.scale(loss).backward()
                clip_grad_norm_(model.parameters(), max_norm=1.0)
                scaler.step(opt)
                scaler.update()
            """,
            expected="""
            import torch
            from torch.nn.utils import clip_grad_norm_
            def train_step(model, opt, scaler, loss):
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                clip_grad_norm_(model.parameters(), max_norm=1.0)
                scaler.step(opt)
                scaler.update()
            """,
        ),
        Invalid(
            """
            import torch
            for x in data:
                opt.zero_grad()
                torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)
                loss = model(x)
                loss.backward()
                opt.step()
            """,
            message="before",
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        scalers = scaler_names(self, node)
        for unit in functions_and_module(node):
            nodes = list(walk(unit))
            clips = [n for n in nodes if isinstance(n, cst.Call) and self.qnames(n) & CLIP]
            if not clips:
                continue
            backs = [n for n in nodes if scaled_backward(n, scalers)]
            plain_backs = [n for n in nodes if method_call(n, "backward")]
            unscales = [n for n in nodes if is_scaler_call(n, scalers, "unscale_")]
            steps = [n for n in nodes if is_scaler_call(n, scalers, "step")]
            for clip in clips:
                line = line_of(self, clip)
                before = [b for b in backs if line_of(self, b) < line]
                if before:
                    last = max(line_of(self, b) for b in before)
                    if not any(last < line_of(self, u) < line for u in unscales):
                        self.report(clip, "clipping scaled gradients: the threshold applies to gradients times the "
                                          "loss scale; call `scaler.unscale_(optimizer)` before clipping",
                                    self._fix(clip, before[-1], steps))
                    continue
                loop = enclosing_loop(self, clip)
                if loop is not None and any(enclosing_loop(self, b) is loop and line_of(self, b) > line
                                            for b in plain_backs) and not any(
                        enclosing_loop(self, b) is loop and line_of(self, b) < line for b in plain_backs):
                    self.report(clip, "gradient clipping before `backward()` in the same step clips the previous "
                                      "gradients; clip after backward, before the optimizer step")

    def _fix(self, clip, back, steps):
        stmt = statement_of(self, clip)
        opts = {self.code_of(s.args[0].value) for s in steps if s.args}
        if stmt is None or len(opts) != 1 or stmt.body[0] is not clip and not (
                isinstance(stmt.body[0], (cst.Expr, cst.Assign)) and stmt.body[0].value is clip):
            return None
        scaler = dotted(receiver(receiver(back)))
        unscale = cst.parse_statement(f"{scaler}.unscale_({opts.pop()})\n")
        return Fix("insert scaler.unscale_(optimizer) before clipping",
                   [(stmt, lambda u: cst.FlattenSentinel([unscale.with_changes(leading_lines=u.leading_lines),
                                                          u.with_changes(leading_lines=[])]))])
