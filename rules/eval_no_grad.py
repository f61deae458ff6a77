import libcst as cst

from ampfix.analysis import dotted, method_call, receiver, walk
from ampfix.rule import Invalid, Rule, Valid

NO_GRAD = {"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad", "torch.autograd.grad_mode.no_grad",
           "torch.autograd.grad_mode.inference_mode", "torch.set_grad_enabled", "torch.autograd.set_grad_enabled"}


class EvalNoGrad(Rule):
    """
    ## What it does
    Reports a function that puts a model in `eval()` mode and then calls it in a loop, with no
    `torch.no_grad()` / `torch.inference_mode()` anywhere in the function (as a `with`, or a
    decorator) and no backward pass.

    ## Why is this bad?
    `model.eval()` only switches dropout and batch norm; it does not stop autograd.  Every
    forward in the loop still records the graph and keeps activations alive: more memory and
    slower evaluation for nothing.

    ## Example
    ```python
    def evaluate(model, loader):
        model.eval()
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum()
    ```

    ## Use instead
    ```python
    @torch.inference_mode()
    def evaluate(model, loader):
        model.eval()
        ...
    ```
    """

    code = "AMP308"
    name = "eval-without-no-grad"
    summary = "evaluation loop after model.eval() without torch.no_grad()/inference_mode()"
    since = "1.0"
    triggers = ("eval()",)

    VALID = [
        Valid(
            """
            import torch
            @torch.no_grad()
            def evaluate(model, loader):
                model.eval()
                for x in loader:
                    model(x)
            """
        ),
        Valid(
            """
            import torch
            def evaluate(model, loader):
                model.eval()
                with torch.inference_mode():
                    for x in loader:
                        model(x)
            """
        ),
        Valid(
            """
            def train(model, loader):
                model.eval()
                for x in loader:
                    model(x).sum().backward()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            def validate(model, loader):
                model.eval()
                total = 0
                for x, y in loader:
                    total += (model(x).argmax(1) == y).sum()
                return total
            """
        ),
    ]

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if any(self.qnames(d.decorator) & NO_GRAD for d in node.decorators):
            return
        nodes = list(walk(node.body))
        evals = [n for n in nodes if method_call(n, "eval") and not n.args and dotted(receiver(n))]
        if not evals:
            return
        if any(isinstance(n, cst.Call) and self.qnames(n) & NO_GRAD for n in nodes):
            return
        if any(method_call(n, "backward", "step", "train") for n in nodes):
            return
        models = {dotted(receiver(e)) for e in evals}
        for loop in (n for n in nodes if isinstance(n, (cst.For, cst.While))):
            if any(isinstance(c, cst.Call) and dotted(c.func) in models for c in walk(loop.body)):
                self.report(evals[0], "the model is evaluated without torch.no_grad()/inference_mode(): autograd "
                                      "still records every forward; decorate the function with "
                                      "@torch.inference_mode()")
                return
