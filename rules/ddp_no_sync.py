import ast

from ampfix.model.analysis import DDP, enclosing_loop, is_modulo_guarded, is_optimizer_step, is_training_loop, method_call
from ampfix.rule import Invalid, Rule, Valid
from ampfix.model.semantic import walk


class DdpNoSync(Rule):
    """
    ## What it does
    In a file that builds a `DistributedDataParallel` model, reports a backward pass in a
    gradient-accumulation loop (the optimizer steps only under `if step % N == 0`) that is not
    inside `with model.no_sync():` on the accumulating steps.

    ## Why is this bad?
    DDP all-reduces the gradients in every backward.  With accumulation only the last backward
    before the step needs it: the others send the whole gradient over the network for nothing,
    N-1 times per step.

    ## Example
    ```python
    for i, (x, y) in enumerate(loader):
        loss = model(x, y) / accum
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    for i, (x, y) in enumerate(loader):
        sync = (i + 1) % accum == 0
        with contextlib.nullcontext() if sync else model.no_sync():
            loss = model(x, y) / accum
            loss.backward()
        if sync:
            optimizer.step()
            optimizer.zero_grad()
    ```
    """

    code = "AMP305"
    name = "ddp-accumulation-no-sync"
    summary = "DDP gradient accumulation without no_sync(): every micro-batch all-reduces"
    since = "1.2"
    triggers = ("DistributedDataParallel",)

    VALID = [
        Valid(
            """
            import torch
            model = torch.nn.parallel.DistributedDataParallel(net)
            for i, x in enumerate(loader):
                ctx = model.no_sync() if (i + 1) % 4 else nullcontext()
                with ctx:
                    model(x).sum().backward()
                if (i + 1) % 4 == 0:
                    opt.step()
            """
        ),
        Valid(
            """
            import torch
            model = torch.nn.parallel.DistributedDataParallel(net)
            for x in loader:
                model(x).sum().backward()
                opt.step()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net, device_ids=[rank])
            for i, (x, y) in enumerate(loader):
                loss = model(x).sum() / accum
                loss.backward()
                if (i + 1) % accum == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """
        ),
    ]

    def visit_Module(self, node: ast.Module) -> None:
        nodes = list(walk(node, into_functions=True))
        if not any(isinstance(n, ast.Call) and self.qnames(n) & DDP for n in nodes):
            return
        if any(method_call(n, "no_sync") for n in nodes):
            return
        for loop in (n for n in nodes if isinstance(n, (ast.For, ast.AsyncFor, ast.While)) and is_training_loop(n)):
            body = [x for s in loop.body for x in [s, *walk(s)]]
            steps = [n for n in body if is_optimizer_step(n) and enclosing_loop(n) is loop]
            if not steps or not all(is_modulo_guarded(s, loop) for s in steps):
                continue
            for b in body:
                if method_call(b, "backward") and enclosing_loop(b) is loop and not is_modulo_guarded(b, loop):
                    self.report(b, "DDP all-reduces gradients in every backward; on the accumulating steps run "
                                   "forward and backward inside `with model.no_sync():`")
                    break
