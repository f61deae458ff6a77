import ast

from ampfix.model.analysis import DATAPARALLEL
from ampfix.rule import Invalid, Rule, Valid


class DataParallel(Rule):
    """
    ## What it does
    Reports every `nn.DataParallel(...)`.

    ## Why is this bad?
    DataParallel runs one Python process that scatters inputs, replicates the model to every
    GPU on every forward, runs the replicas in threads (held back by the GIL) and gathers the
    outputs on GPU 0, which is then overloaded.  DistributedDataParallel runs one process per
    GPU, overlaps gradient all-reduce with backward, and is faster even on one machine; PyTorch
    recommends it over DataParallel.

    ## Example
    ```python
    model = nn.DataParallel(model)
    ```

    ## Use instead
    ```python
    # torchrun --nproc_per_node=N train.py
    dist.init_process_group("nccl")
    model = nn.parallel.DistributedDataParallel(model.to(local_rank), device_ids=[local_rank])
    ```
    """

    code = "AMP304"
    name = "dataparallel"
    summary = "nn.DataParallel: DistributedDataParallel is faster, even on one machine"
    since = "1.0"
    triggers = ("DataParallel",)

    VALID = [Valid("import torch\nm = torch.nn.parallel.DistributedDataParallel(m)\n"),
             Valid("class DataParallel: pass\nm = DataParallel()\n")]
    INVALID = [Invalid("import torch.nn as nn\nmodel = nn.DataParallel(model, device_ids=[0, 1])\n")]

    def visit_Call(self, node: ast.Call) -> None:
        if self.qnames(node) & DATAPARALLEL:
            self.report(node, "nn.DataParallel replicates the model every step and runs replicas in threads; "
                              "use DistributedDataParallel (one process per GPU)")
