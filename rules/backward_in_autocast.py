import ast

from ampfix.model.analysis import autocast_enabled_literal, enclosing_autocast, method_call
from ampfix.rule import Invalid, Rule, Valid


class BackwardInAutocast(Rule):
    """
    ## What it does
    Reports `.backward()` (and `scaler.scale(loss).backward()`) called inside an autocast
    region.

    ## Why is this bad?
    Autocast is meant for the forward pass only.  Backward ops run in the dtype their forward
    ops chose anyway; running backward under autocast is not recommended by PyTorch, wastes
    casts on the way, and keeps the region (and its cast cache) open longer than needed.

    ## Example
    ```python
    with torch.autocast("cuda"):
        loss = criterion(model(x), y)
        scaler.scale(loss).backward()
    ```

    ## Use instead
    ```python
    with torch.autocast("cuda"):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    ```
    """

    code = "AMP207"
    name = "backward-in-autocast"
    summary = "backward() called inside an autocast region"
    since = "1.6"
    triggers = ("autocast",)

    VALID = [
        Valid("import torch\nwith torch.autocast('cuda'):\n    loss = model(x)\nloss.backward()\n"),
        Valid("import torch\nwith torch.autocast('cuda', enabled=False):\n    loss.backward()\n"),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.cuda.amp import autocast
            def step(x):
                with autocast():
                    loss = model(x)
                    scaler.scale(loss).backward()
            """
        ),
    ]

    def visit_Call(self, node: ast.Call) -> None:
        if not method_call(node, "backward"):
            return
        region = enclosing_autocast(self.sem, node)
        if region is not None and autocast_enabled_literal(region) is not False:
            self.report(node, "`backward()` inside an autocast region: autocast is for the forward pass; "
                              "dedent backward out of the `with` block")
