import ast

from ampfix.model.analysis import GRADSCALER, enclosing_loop, is_training_loop, loop_body_nodes
from ampfix.model.semantic import block_of, dotted
from ampfix.rule import Invalid, Rule, Valid


class ScalerInLoop(Rule):
    """
    ## What it does
    Reports a `GradScaler(...)` constructed inside a loop that trains (runs backward or an
    optimizer step), or inside a loop whose body uses that scaler.

    ## Why is this bad?
    The scaler's value is *dynamic*: it starts at 65536, backs off when gradients overflow and
    grows after 2000 good steps.  A new scaler every step restarts at the initial scale, so
    every step that overflows is skipped and the scale never settles; its state_dict is
    meaningless in checkpoints.

    ## Example
    ```python
    for x, y in loader:
        scaler = torch.amp.GradScaler("cuda")
        with torch.autocast("cuda"):
            loss = model(x, y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    ```

    ## Use instead
    Create the scaler once, before the loop (and save/load its state_dict with checkpoints).
    A scaler made together with the optimizer it steps (in the same block, right after it:
    `if epoch == start: optimizer = Adam(...); scaler = GradScaler(...)`) is not reported: a new
    optimizer starts with a new scale.
    """

    code = "AMP203"
    name = "gradscaler-in-loop"
    summary = "GradScaler created inside the training loop: its dynamic scale restarts every step"
    since = "1.6"
    triggers = ("GradScaler",)

    VALID = [
        Valid(
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.scale(model(x)).backward()
                scaler.step(opt)
                scaler.update()
            """
        ),
        Valid(
            """
            import torch
            for cfg in configs:
                scaler = torch.amp.GradScaler("cuda")
                train(cfg, scaler)
            """
        ),
        Valid(
            """
            import torch
            for epoch in range(epochs):
                if epoch == start_epoch:
                    optimizer = torch.optim.Adam(model.parameters())
                    scaler = torch.amp.GradScaler("cuda")
                for x in loader:
                    scaler.scale(model(x)).backward()
                    scaler.step(optimizer)
                    scaler.update()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            from torch.cuda.amp import GradScaler
            for epoch in range(3):
                for x in loader:
                    scaler = GradScaler()
                    scaler.scale(model(x)).backward()
                    scaler.step(opt)
                    scaler.update()
            """
        ),
        Invalid(
            """
            import paddle, torch
            def train():
                while True:
                    s = torch.amp.GradScaler("cuda", init_scale=1024)
                    loss = model(x)
                    loss.backward()
                    opt.step()
            """
        ),
    ]

    def visit_Call(self, node: ast.Call) -> None:
        if not self.qnames(node) & GRADSCALER:
            return
        loop = enclosing_loop(node)
        while loop is not None:
            uses_scaler = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                              and n.func.attr in ("scale", "step", "update") for n in loop_body_nodes(loop, True))
            if (is_training_loop(loop) or uses_scaler) and not self._made_with_its_optimizer(node, loop):
                self.report(node, "GradScaler created inside the training loop: its dynamic loss scale restarts "
                                  "every step; create it once before the loop")
                return
            loop = enclosing_loop(loop)

    @staticmethod
    def _made_with_its_optimizer(node: ast.Call, loop) -> bool:
        """The scaler's statement follows, in its own block, the assignment of an optimizer that
        ``scaler.step(...)`` steps in the loop: each new optimizer gets a new scaler."""
        stmt = node
        while stmt is not None and not isinstance(stmt, ast.stmt):
            stmt = getattr(stmt, "_p", None)
        if stmt is None:
            return False
        _, _, block = block_of(stmt)
        before = block[:next((i for i, x in enumerate(block) if x is stmt), 0)]
        made = {dotted(t) for x in before if isinstance(x, ast.Assign) for t in x.targets}
        stepped = {dotted(n.args[0]) for n in loop_body_nodes(loop, True) if isinstance(n, ast.Call)
                   and isinstance(n.func, ast.Attribute) and n.func.attr == "step" and n.args}
        return bool(made & stepped - {None})

