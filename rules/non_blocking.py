import libcst as cst

from ampfix.analysis import DATALOADER, arg, dotted, kwarg, method_call, receiver, walk, with_args
from ampfix.rule import Fix, Invalid, Rule, Valid

def _names(target):
    if isinstance(target, cst.Name):
        yield target.value
    elif isinstance(target, (cst.Tuple, cst.List)):
        for e in target.elements:
            yield from _names(e.value)


class NonBlocking(Rule):
    """
    ## What it does
    Where a DataLoader pins memory (`pin_memory=True`), reports `.to(device)` / `.cuda()` of
    the batches it yields without `non_blocking=True`, in the loop over that loader.

    ## Why is this bad?
    From pinned memory the copy can run asynchronously, overlapping the previous step's
    kernels; a blocking copy makes the host wait for it.  Pinning without `non_blocking` pays
    for pinning and gets none of the overlap.

    ## Example
    ```python
    loader = DataLoader(ds, pin_memory=True, num_workers=4)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
    ```

    ## Use instead
    ```python
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    ```
    The fix is safe: a copy on the current stream is ordered before the kernels that use it.
    """

    code = "AMP307"
    name = "copy-without-non-blocking"
    summary = "batch copied from pinned memory without non_blocking=True"
    fix_kind = "safe"
    since = "1.0"
    triggers = ("pin_memory",)

    VALID = [
        Valid(
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, pin_memory=True)
            for x, y in loader:
                x = x.to(device, non_blocking=True)
            """
        ),
        Valid("from torch.utils.data import DataLoader\nloader = DataLoader(ds)\nfor x in loader:\n    x = x.cuda()\n"),
    ]
    INVALID = [
        Invalid(
            """
            from torch.utils.data import DataLoader
            train_loader = DataLoader(ds, batch_size=32, pin_memory=True)
            for step, (x, y) in enumerate(train_loader):
                x, y = x.to(device), y.cuda()
            """,
            count=2,
            expected="""
            from torch.utils.data import DataLoader
            train_loader = DataLoader(ds, batch_size=32, pin_memory=True)
            for step, (x, y) in enumerate(train_loader):
                x, y = x.to(device, non_blocking=True), y.cuda(non_blocking=True)
            """,
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        pinned = set()
        for n in walk(node, into_functions=True):
            if isinstance(n, cst.Assign) and isinstance(n.value, cst.Call) and self.qnames(n.value) & DATALOADER:
                pin = arg(n.value, "pin_memory")
                if pin is not None and isinstance(pin.value, cst.Name) and pin.value.value == "True":
                    pinned.update(d for d in (dotted(t.target) for t in n.targets) if d)
        if not pinned:
            return
        for loop in walk(node, into_functions=True):
            if not isinstance(loop, cst.For):
                continue
            it = loop.iter
            if isinstance(it, cst.Call) and dotted(it.func) in ("enumerate", "tqdm", "tqdm.tqdm") and it.args:
                it = it.args[0].value
            if dotted(it) not in pinned:
                continue
            batch = set(_names(loop.target))
            for n in walk(loop.body):
                if method_call(n, "to", "cuda") and dotted(receiver(n)) in batch and not arg(n, "non_blocking"):
                    if n.func.attr.value == "to" and not n.args:
                        continue
                    def add(u):
                        return u.with_changes(args=with_args(u.args, [kwarg("non_blocking", cst.Name("True"))]))

                    self.report(n, "copy from pinned memory without `non_blocking=True`: the host waits for it",
                                Fix("add non_blocking=True", [(n, add)]))
