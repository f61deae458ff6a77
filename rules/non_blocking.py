import ast

from ampfix.model.analysis import DATALOADER, arg, is_const, method_call, receiver
from ampfix.rule import Fix, Invalid, Rule, Valid
from ampfix.model.semantic import dotted, walk


def _names(target):
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for e in target.elts:
            yield from _names(e)


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

    def _pinned(self, it) -> bool:
        """Whether the loop's iterable is a DataLoader with pin_memory=True (a name resolved in
        its scope; ``self.x`` assigned anywhere in the module)."""
        if isinstance(it, ast.Name):
            values = self.sem.values_of(it)
        else:
            d = dotted(it)
            values = [n.value for n in self.assigns if any(dotted(t) == d for t in n.targets)] if d else []
        return any(isinstance(v, ast.Call) and self.qnames(v) & DATALOADER and is_const(arg(v, "pin_memory"), True)
                   for v in values)

    def visit_Module(self, node: ast.Module) -> None:
        self.assigns = [n for n in walk(node, into_functions=True) if isinstance(n, ast.Assign)]

    def visit_For(self, loop: ast.For) -> None:
        it = loop.iter
        if isinstance(it, ast.Call) and dotted(it.func) in ("enumerate", "tqdm", "tqdm.tqdm") and it.args:
            it = it.args[0]
        if not self._pinned(it):
            return
        batch = set(_names(loop.target))
        for s in loop.body:
            for n in [s, *walk(s)]:
                if method_call(n, "to", "cuda") and dotted(receiver(n)) in batch and arg(n, "non_blocking") is None:
                    if n.func.attr == "to" and not n.args and not n.keywords:
                        continue
                    self.report(n, "copy from pinned memory without `non_blocking=True`: the host waits for it",
                                Fix("add non_blocking=True", [self.edits.insert_arg(n, "non_blocking=True")]))
