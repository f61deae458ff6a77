import ast

from ampfix.rule import Invalid, Rule, Valid


class DeterminedApex(Rule):
    """
    ## What it does
    Finds Determined's `context.configure_apex_amp(models=..., optimizers=...)` in a PyTorch
    trial.

    ## Why is this bad?
    It runs apex.amp under the hood, which NVIDIA removed from apex in May 2025, and it binds
    the trial to an apex build.  Determined has native AMP through the same context.

    ## Example
    ```python
    self.model, self.opt = self.context.configure_apex_amp(models=model, optimizers=opt, opt_level="O1")
    ...
    self.context.backward(loss)
    self.context.step_optimizer(self.opt)
    ```

    ## Use instead
    ```python
    self.scaler = self.context.wrap_scaler(torch.amp.GradScaler("cuda"))
    ...
    with torch.autocast("cuda", dtype=torch.float16):
        loss = self.loss_fn(self.model(batch))
    self.context.backward(self.scaler.scale(loss))
    self.context.step_optimizer(self.opt, scaler=self.scaler)
    ```
    No automatic fix yet: the forward passes that autocast must cover are in `train_batch`, a
    step a person moves by hand.
    """

    code = "AMP110"
    name = "determined-apex"
    summary = "Determined context.configure_apex_amp: use context.wrap_scaler(GradScaler) with torch.autocast"
    since = "1.6"
    triggers = ("configure_apex_amp",)

    VALID = [Valid("self.scaler = self.context.wrap_scaler(torch.amp.GradScaler('cuda'))\n")]
    INVALID = [
        Invalid("class T(PyTorchTrial):\n    def __init__(self, context):\n        self.context = context\n"
                "        self.model, self.opt = self.context.configure_apex_amp(models=m, optimizers=o)\n",
                message="wrap_scaler"),
    ]

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Attribute) and node.func.attr == "configure_apex_amp":
            self.report(node, "Determined's configure_apex_amp runs apex.amp, which NVIDIA removed in May 2025; use "
                              "native AMP through the context: `self.scaler = self.context.wrap_scaler("
                              "torch.amp.GradScaler(\"cuda\"))`, torch.autocast around the forward pass and the loss in "
                              "train_batch, `self.context.backward(self.scaler.scale(loss))` and "
                              "`self.context.step_optimizer(opt, scaler=self.scaler)`")
