import ast

from ampfix.model.analysis import (
    CLIP, exclusive, enclosing_loop, functions_and_module, is_scaler_call, method_call, receiver, scaled_backward, scalers_for,
    unit_nodes,
)
from ampfix.rule import Fix, Invalid, Rule, Valid
from ampfix.model.semantic import dotted


def _scaled_threshold(clip, scalers) -> bool:
    """``clip_grad_norm_(params, max_norm * scaler.get_scale())``."""
    from ampfix.model.semantic import walk

    thr = clip.args[1] if len(clip.args) > 1 else next(
        (k.value for k in clip.keywords if k.arg in ("max_norm", "clip_value")), None)
    return thr is not None and any(is_scaler_call(n, scalers, "get_scale") for n in [thr, *walk(thr)])


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
    The fix (offered when the function steps exactly one optimizer through the scaler) inserts
    `scaler.unscale_(optimizer)` before the clipping; when the scaled backward runs under tests
    the clip is outside of (`if args.amp and scaler is not None:`, the scaler None otherwise),
    under the same tests.

    The fix is unsafe: it changes training.  The clip then limits the true gradients, where it
    limited the scaled ones before (in effect a threshold `max_norm / scale`, clipping nearly every
    step); that is what the code means, and what its float32 path does, but the numbers change, so
    a run tuned with the old behaviour may want its learning rate or `max_norm` looked at.
    `ampfix migrate` treats apex code that clipped inside `amp.scale_loss` the same way: it
    migrates it only with `--unsafe-fixes`.
    """

    code = "AMP206"
    name = "clip-scaled-grads"
    summary = "gradient clipping of scaled gradients (no scaler.unscale_ first), or before backward"
    fix_kind = "unsafe"
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
        Valid(
            # the fp32 branch of `if fp16: <scaled> else: <plain>` clips plain gradients
            """
            import torch
            if args.fp16:
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            else:
                loss.backward()
                total_norm += torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            """
        ),
        Valid(
            # accumulation: a clip on every micro-batch, where unscale_ may run once per step
            """
            import torch
            for i, x in enumerate(data):
                scaler.scale(model(x)).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0 * scaler.get_scale())
                if i % 4 == 0:
                    scaler.step(opt)
                    scaler.update()
            """
        ),
        Valid(
            # after the step: `scaler.step` unscaled the gradients in place (a clip there is late,
            # not scaled)
            """
            import torch
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
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
            unsafe=True,
        ),
        Invalid(
            # the scaler exists on one path only (`scaler = None` otherwise): unscale_ where it ran
            """
            import torch
            scaler = None
            if args.amp:
                scaler = torch.amp.GradScaler("cuda")
            for x in data:
                loss = model(x)
                if args.amp and scaler is not None:
                    scaler.scale(loss).backward()
                else:
                    loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                if scaler is not None:
                    scaler.step(opt)
                    scaler.update()
                else:
                    opt.step()
            """,
            expected="""
            import torch
            scaler = None
            if args.amp:
                scaler = torch.amp.GradScaler("cuda")
            for x in data:
                loss = model(x)
                if args.amp and scaler is not None:
                    scaler.scale(loss).backward()
                else:
                    loss.backward()
                if args.amp and scaler is not None:
                    scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                if scaler is not None:
                    scaler.step(opt)
                    scaler.update()
                else:
                    opt.step()
            """,
            unsafe=True,
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

    def visit_Module(self, node: ast.Module) -> None:
        for unit in functions_and_module(node):
            nodes = list(unit_nodes(unit))
            clips = [n for n in nodes if isinstance(n, ast.Call) and self.qnames(n) & CLIP]
            if not clips:
                continue
            scalers = scalers_for(self.ctx, unit)
            backs = [n for n in nodes if scaled_backward(n, scalers)]
            plain_backs = [n for n in nodes if method_call(n, "backward")]
            unscales = [n for n in nodes if is_scaler_call(n, scalers, "unscale_")]
            steps = [n for n in nodes if is_scaler_call(n, scalers, "step")]
            for clip in clips:
                line = clip.lineno
                # a scaled backward on another branch of the same `if` does not come first
                before = [b for b in backs if b.lineno < line and not exclusive(b, clip, unit)]
                if before and _scaled_threshold(clip, scalers):
                    continue  # clipping scaled gradients at a threshold scaled alike is the same clip
                if before:
                    last = max(b.lineno for b in before)
                    # `scaler.step(opt)` unscales what `unscale_` has not: past it the gradients are true
                    if not any(last < u.lineno < line for u in [*unscales, *steps]):
                        self.report(clip, "clipping scaled gradients: the threshold applies to gradients times the "
                                          "loss scale; call `scaler.unscale_(optimizer)` before clipping",
                                    self._fix(clip, before[-1], steps))
                    continue
                loop = enclosing_loop(clip)
                if loop is not None and any(enclosing_loop(b) is loop and b.lineno > line for b in plain_backs) and not any(
                        enclosing_loop(b) is loop and b.lineno < line for b in plain_backs):
                    self.report(clip, "gradient clipping before `backward()` in the same step clips the previous "
                                      "gradients; clip after backward, before the optimizer step")

    def _fix(self, clip, back, steps):
        stmt = self.parent(clip)
        opts = {self.code_of(s.args[0]) for s in steps if s.args}
        if len(opts) != 1 or not isinstance(stmt, (ast.Expr, ast.Assign)) or stmt.value is not clip \
                or not self.edits.own_lines(stmt):
            return None
        scaler = dotted(receiver(receiver(back)))
        cond = self._only_where(back, stmt)
        if cond is False:
            return None
        line = f"{scaler}.unscale_({opts.pop()})"
        lines = [line] if cond is None else [f"if {cond}:", self.edits.unit() + line]
        return Fix("insert scaler.unscale_(optimizer) before clipping: the clip then limits the true gradients, "
                   "not the scaled ones (the numbers of training change)",
                   [self.edits.insert_before(stmt, lines)], safe=False)

    def _only_where(self, back, stmt):
        """The condition under which the scaled backward ran and the clip does not test
        (``if args.use_apex: if scaler is not None: scaler.scale(loss).backward()`` and an
        unguarded clip: ``scaler`` is None on the other path, so ``unscale_`` must run only
        where the backward did): None when the clip runs under all of them, False when it
        cannot be said (a loop or ``try`` of the backward's own, a test that calls or whose
        names are set between the two)."""
        around = set()
        p = getattr(stmt, "_p", None)
        while p is not None:
            around.add(id(p))
            p = getattr(p, "_p", None)
        parts, tests = [], []
        child, p = back, getattr(back, "_p", None)
        while p is not None and id(p) not in around:
            if isinstance(p, ast.If):
                tests.append(p.test)
                if any(child is x for x in p.body):
                    parts.append(self._test(p.test, False))
                elif any(child is x for x in p.orelse):
                    parts.append(self._test(p.test, True))
                else:
                    return False  # the backward is in the test itself
            elif isinstance(p, ast.stmt) and child is not back and not isinstance(child, ast.expr):
                return False  # a loop, a `with`, a `try` the clip is not in
            child, p = p, getattr(p, "_p", None)
        if not parts:
            return None
        if any(x is None for x in parts):
            return False
        names = {n.id for t in tests for n in ast.walk(t) if isinstance(n, ast.Name)}
        for n in ast.walk(p) if p is not None else ():  # the block both are in
            if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.NamedExpr)) and \
                    back.lineno < n.lineno < stmt.lineno:
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                if any(isinstance(x, ast.Name) and x.id in names for t in targets for x in ast.walk(t)):
                    return False
        return " and ".join(reversed(parts))

    def _test(self, test, negated: bool):
        if any(isinstance(n, (ast.Call, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)) for n in ast.walk(test)):
            return None  # evaluated again, it might not say the same
        code = self.code_of(test)
        # an `or`, a conditional or a lambda binds looser than `and`; `not` binds tighter than any
        looser = isinstance(test, (ast.IfExp, ast.Lambda)) or (
            isinstance(test, ast.BoolOp) and (negated or isinstance(test.op, ast.Or)))
        if looser:
            code = f"({code})"
        return f"not {code}" if negated else code
