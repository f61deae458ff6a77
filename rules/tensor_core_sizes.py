import ast

from ampfix.model.analysis import AUTOCAST, arg, autocast_dtype
from ampfix.rule import Invalid, Rule, Valid
from ampfix.model.semantic import walk

LAYERS = {"torch.nn.Linear": ("in_features", "out_features"), "torch.nn.Embedding": ("num_embeddings", "embedding_dim")}


class TensorCoreSizes(Rule):
    """
    ## What it does
    In a file trained under float16 autocast, reports `nn.Linear` / `nn.Embedding` sizes given
    as integer literals that are not multiples of 8.  Opt-in and informational.

    ## Why is this bad?
    Tensor cores run float16 matrix products on tiles whose dimensions are multiples of 8;
    other sizes are padded or fall back to slower kernels (a vocabulary of 50257 instead of
    50304 is the classic case).

    ## Example
    ```python
    nn.Linear(1000, 10)
    ```

    ## Use instead
    ```python
    nn.Linear(1000, 16)   # pad the output and ignore the extra logits, or choose sizes % 8 == 0
    ```
    """

    code = "AMP312"
    name = "tensor-core-alignment"
    summary = "Linear/Embedding size not a multiple of 8 under float16 autocast"
    default = False
    since = "1.6"
    triggers = ("autocast",)

    VALID = [Valid("import torch\nl = torch.nn.Linear(64, 128)\nwith torch.autocast('cuda'):\n    y = l(x)\n")]
    INVALID = [Invalid("import torch\nl = torch.nn.Linear(1000, 10)\nwith torch.autocast('cuda'):\n    y = l(x)\n",
                       message="10")]

    def visit_Module(self, node: ast.Module) -> None:
        calls = [n for n in walk(node, into_functions=True) if isinstance(n, ast.Call)]
        if not any(self.qnames(c) & AUTOCAST and autocast_dtype(self.sem, c) in (None, "float16") for c in calls):
            return
        for c in calls:
            for layer, names in LAYERS.items():
                if layer in self.qnames(c):
                    for i, kw in enumerate(names):
                        a = arg(c, kw, i)
                        if isinstance(a, ast.Constant) and type(a.value) is int and a.value % 8:
                            self.report(a, f"{kw}={a.value} is not a multiple of 8: float16 tensor "
                                           "cores work on multiples of 8")
