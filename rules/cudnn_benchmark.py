import ast

from ampfix.model.analysis import is_training_loop
from ampfix.rule import Invalid, Rule, Valid
from ampfix.model.semantic import walk

CONVS = {f"torch.nn.Conv{d}d" for d in (1, 2, 3)} | {f"torch.nn.modules.conv.Conv{d}d" for d in (1, 2, 3)}


class CudnnBenchmark(Rule):
    """
    ## What it does
    In a script that trains (a loop with backward or an optimizer step) a model with
    convolutions, reports that `torch.backends.cudnn.benchmark` is never set.  Opt-in
    (`extend-select = ["AMP310"]`): it helps only when input shapes are fixed.

    ## Why is this bad?
    With benchmark mode cuDNN times its convolution algorithms on the first batch of each shape
    and keeps the fastest; without it a heuristic picks one that is often slower, especially
    for float16 and channels-last.

    ## Example
    ```python
    model = nn.Sequential(nn.Conv2d(3, 64, 3), ...)
    for x, y in loader: ...
    ```

    ## Use instead
    ```python
    torch.backends.cudnn.benchmark = True   # fixed input shapes
    ```
    """

    code = "AMP310"
    name = "cudnn-benchmark-unset"
    summary = "convolutional training script never sets torch.backends.cudnn.benchmark"
    default = False
    since = "1.0"
    triggers = ("Conv",)

    VALID = [Valid("import torch\ntorch.backends.cudnn.benchmark = True\nc = torch.nn.Conv2d(3, 8, 3)\n"
                   "for x in d:\n    c(x).sum().backward()\n")]
    INVALID = [Invalid("import torch.nn as nn\nc = nn.Conv2d(3, 8, 3)\nfor x in d:\n    c(x).sum().backward()\n")]

    def visit_Module(self, node: ast.Module) -> None:
        nodes = list(walk(node, into_functions=True))
        if any(isinstance(n, ast.Attribute) and n.attr == "benchmark" for n in nodes):
            return
        if not any(isinstance(n, (ast.For, ast.AsyncFor, ast.While)) and is_training_loop(n) for n in nodes):
            return
        conv = next((n for n in nodes if isinstance(n, ast.Call) and self.qnames(n) & CONVS), None)
        if conv is not None:
            self.report(conv, "convolutions trained without torch.backends.cudnn.benchmark = True: with fixed "
                              "input shapes cuDNN can pick its fastest algorithm")
