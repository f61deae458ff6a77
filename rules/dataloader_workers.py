import libcst as cst

from ampfix.analysis import DATALOADER, arg, walk
from ampfix.rule import Invalid, Rule, Valid

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

    def visit_Module(self, node: cst.Module) -> None:
        uses_cuda = any(
            (isinstance(n, cst.Attribute) and n.attr.value == "cuda")
            or (isinstance(n, cst.SimpleString) and n.evaluated_value.startswith("cuda"))
            for n in walk(node, into_functions=True))
        if not uses_cuda:
            return
        for n in walk(node, into_functions=True):
            if not (isinstance(n, cst.Call) and self.qnames(n) & DATALOADER):
                continue
            if any(a.star for a in n.args):
                continue
            problems = []
            workers = arg(n, "num_workers")
            if workers is None or (isinstance(workers.value, cst.Integer) and workers.value.evaluated_value == 0):
                problems.append("num_workers=0 (batches are loaded in the training process)")
            pin = arg(n, "pin_memory")
            if pin is None or (isinstance(pin.value, cst.Name) and pin.value.value == "False"):
                problems.append("no pin_memory (copies cannot overlap compute)")
            if problems:
                self.report(n, "DataLoader feeding the GPU with " + " and ".join(problems))
