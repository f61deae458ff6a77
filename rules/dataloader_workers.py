import ast

from ampfix.model.analysis import DATALOADER, arg, has_star, is_const
from ampfix.rule import Invalid, Rule, Valid
from ampfix.model.semantic import walk


class DataLoaderWorkers(Rule):
    """
    ## What it does
    In a file that uses CUDA, reports a `DataLoader(...)` with `num_workers` unset or 0, or
    with `pin_memory` unset or False.  Opt-in (`extend-select = ["AMP306"]`): whether workers
    help depends on how heavy loading is, which a linter cannot see.

    ## Why is this bad?
    With `num_workers=0` the training process loads and collates every batch itself, while the
    GPU waits.  Without pinned memory, host-to-device copies go through a staging buffer and
    cannot overlap with compute (`non_blocking=True` needs pinned memory).

    ## Example
    ```python
    loader = DataLoader(ds, batch_size=64, shuffle=True)
    ```

    ## Use instead
    ```python
    loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=4, pin_memory=True,
                        persistent_workers=True)
    ```
    """

    code = "AMP306"
    name = "dataloader-workers-pin-memory"
    summary = "DataLoader for a GPU loop without worker processes or pinned memory"
    default = False
    since = "1.0"
    triggers = ("DataLoader",)

    VALID = [
        Valid("from torch.utils.data import DataLoader\nl = DataLoader(ds, num_workers=4, pin_memory=True)\nx.cuda()\n"),
        Valid("from torch.utils.data import DataLoader\nl = DataLoader(ds)\n"),
    ]
    INVALID = [
        Invalid("from torch.utils.data import DataLoader\nl = DataLoader(ds, batch_size=8)\nx = x.cuda()\n",
                message="num_workers"),
        Invalid("import torch\nl = torch.utils.data.DataLoader(ds, num_workers=0, pin_memory=True)\ndevice = 'cuda'\n"),
    ]

    def visit_Module(self, node: ast.Module) -> None:
        nodes = list(walk(node, into_functions=True))
        uses_cuda = any(
            (isinstance(n, ast.Attribute) and n.attr == "cuda")
            or (isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("cuda"))
            for n in nodes)
        if not uses_cuda:
            return
        for n in nodes:
            if not (isinstance(n, ast.Call) and self.qnames(n) & DATALOADER) or has_star(n):
                continue
            problems = []
            workers = arg(n, "num_workers")
            if workers is None or is_const(workers, 0):
                problems.append("num_workers=0 (batches are loaded in the training process)")
            pin = arg(n, "pin_memory")
            if pin is None or is_const(pin, False):
                problems.append("no pin_memory (copies cannot overlap compute)")
            if problems:
                self.report(n, "DataLoader feeding the GPU with " + " and ".join(problems))
