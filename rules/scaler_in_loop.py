import ast

from ampfix.model.analysis import GRADSCALER, enclosing_loop, is_training_loop, loop_body_nodes
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
            if is_training_loop(loop) or uses_scaler:
                self.report(node, "GradScaler created inside the training loop: its dynamic loss scale restarts "
                                  "every step; create it once before the loop")
                return
            loop = enclosing_loop(loop)
