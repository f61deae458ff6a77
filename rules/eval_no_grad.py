import ast

from ampfix.model.analysis import method_call, receiver
from ampfix.rule import Invalid, Rule, Valid
from ampfix.model.semantic import dotted, walk

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

    def visit_FunctionDef(self, node) -> None:
        if any(self.qnames(d) & NO_GRAD for d in node.decorator_list):
            return
        nodes = [x for s in node.body for x in [s, *walk(s)]]
        evals = [n for n in nodes if method_call(n, "eval") and not n.args and dotted(receiver(n))]
        if not evals:
            return
        if any(isinstance(n, ast.Call) and self.qnames(n) & NO_GRAD for n in nodes):
            return
        if any(method_call(n, "backward", "step", "train") for n in nodes):
            return
        models = {dotted(receiver(e)) for e in evals}
        for loop in (n for n in nodes if isinstance(n, (ast.For, ast.AsyncFor, ast.While))):
            if any(isinstance(c, ast.Call) and dotted(c.func) in models for s in loop.body for c in [s, *walk(s)]):
                self.report(evals[0], "the model is evaluated without torch.no_grad()/inference_mode(): autograd "
                                      "still records every forward; decorate the function with "
                                      "@torch.inference_mode()")
                return

    visit_AsyncFunctionDef = visit_FunctionDef
