import ast

from ampfix.model.analysis import (
    enclosing_loop, functions_and_module, is_modulo_guarded, is_training_loop, method_call, receiver, tensors,
    unit_nodes,
)
from ampfix.rule import Invalid, Rule, Valid
from ampfix.model.semantic import dotted, walk

SYNC_METHODS = {"item", "cpu", "numpy", "tolist", "nonzero"}
ADVICE = {
    "item": "accumulate on the device (`total += loss.detach()`) and call `.item()` every N steps",
    "cpu": "keep the value on the device, or move it every N steps",
    "numpy": "keep the value on the device, or convert it every N steps",
    "tolist": "keep the value on the device, or convert it every N steps",
    "nonzero": "use a mask (`torch.where`) or `nonzero_static`, whose output size is known",
    "synchronize": "remove it: CUDA orders the work on a stream by itself; time with CUDA events",
    "print": "log every N steps, and `.detach()` values on the device until then",
    "cast": "keep the value a tensor, or read it every N steps",
    "branch": "decide on the device (`torch.where`), or check every N steps",
}


def _has_modulo(expr) -> bool:
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in [expr, *walk(expr)])


class SyncInLoop(Rule):
    """
    ## What it does
    In a loop that runs a backward pass or an optimizer step (the hot loop), reports what makes
    the host wait for the GPU: `.item()`, `.cpu()`, `.numpy()`, `.tolist()`, `.nonzero()`,
    `print(<tensor>)`, `float()`/`int()`/`bool()` of a tensor, `if`/`while` on a tensor's value,
    and `torch.cuda.synchronize()`.

    Code guarded to run every N steps (`if step % 100 == 0:`) and code after the loop are not
    reported.  Tensors are recognised by a light inference (backward's receiver, results of
    torch functions, of model and loss calls, arithmetic on those).

    ## Why is this bad?
    CUDA work is asynchronous: the Python loop runs ahead and queues kernels.  Each of these
    calls stops the host until the GPU has caught up, so the next step's kernels are not queued
    in time and the GPU idles.  One `.item()` a step can cost several percent of step time on
    a small model and more with many launches.

    ## Example
    ```python
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        running += loss.item()
    ```

    ## Use instead
    ```python
    running = torch.zeros((), device="cuda")
    for step, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        running += loss.detach()
        if step % 100 == 0:
            print(running.item() / (step + 1))
    ```
    """

    code = "AMP303"
    name = "sync-in-hot-loop"
    summary = "host-device sync (.item(), .cpu(), print of a tensor, ...) in the training loop"
    since = "1.0"
    triggers = ("backward", "step")

    VALID = [
        Valid(
            """
            for step, (x, y) in enumerate(loader):
                loss = crit(model(x), y)
                loss.backward()
                opt.step()
                if step % 100 == 0:
                    print(loss.item())
            print(loss.item())
            """
        ),
        Valid("for x in data:\n    print(x.item())\n"),
        Valid(
            """
            for step, x in enumerate(loader):
                loss = model(x).sum()
                loss.backward()
                opt.step()
                if step % 50 == 0 and loss > 100:
                    print("diverging")
            """
        ),
        Valid(
            """
            for epoch in range(10):
                for x, y in loader:
                    loss = crit(model(x), y)
                    loss.backward()
                    opt.step()
                print(epoch, loss.item())
            """
        ),
        Valid(
            """
            for x, y in loader:
                loss = crit(model(x), y)
                loss.backward()
                opt.step()
                n = len(x)
                if n > 3:
                    pass
                print(f"epoch {epoch}")
                print(int(n))
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            for x, y in loader:
                loss = crit(model(x), y)
                loss.backward()
                opt.step()
                total += loss.item()
            """,
            message=".item()",
        ),
        Invalid(
            """
            import torch
            def train(model, loader, opt):
                for x, y in loader:
                    out = model(x)
                    loss = torch.nn.functional.cross_entropy(out, y)
                    loss.backward()
                    opt.step()
                    print(loss)
                    if loss > 10:
                        break
                    acc = float((out.argmax(1) == y).sum())
                    torch.cuda.synchronize()
                    preds = out.argmax(1).cpu().numpy()
            """,
            count=5,
        ),
        Invalid(
            """
            while True:
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
                idx = (x > 0).nonzero()
            """,
            message="nonzero",
        ),
    ]

    def visit_Module(self, node: ast.Module) -> None:
        for unit in functions_and_module(node):
            self._scan(unit)

    def _scan(self, unit) -> None:
        loops = [n for n in unit_nodes(unit) if isinstance(n, (ast.For, ast.AsyncFor, ast.While)) and is_training_loop(n)]
        if not loops:
            return
        t = tensors(self.ctx, unit)
        for loop in loops:
            for stmt in loop.body:
                for n in [stmt, *walk(stmt)]:
                    if enclosing_loop(n) is not loop:
                        continue
                    hit = self._sync(n, t)
                    if hit and not is_modulo_guarded(n, loop):
                        what, kind = hit
                        self.report(n, f"{what} makes the host wait for the GPU in the training loop; {ADVICE[kind]}")

    def _sync(self, n, t):
        if isinstance(n, ast.Call):
            if method_call(n, *SYNC_METHODS):
                attr = n.func.attr
                rec = receiver(n)
                if method_call(rec, *SYNC_METHODS):
                    return None  # the inner call of the chain is reported
                if attr in ("tolist", "cpu", "numpy") and not (t.is_tensor(rec) or attr == "cpu"):
                    return None
                if attr == "item" and (n.args or n.keywords):
                    return None
                return f"`.{attr}()`", attr
            names = self.qnames(n)
            if names & {"torch.cuda.synchronize"}:
                return "`torch.cuda.synchronize()`", "synchronize"
            if names & {"torch.nonzero"}:
                return "`torch.nonzero()`", "nonzero"
            if names & {"builtins.print"}:
                for a in n.args:
                    if self._tensor_value(a, t):
                        return "`print()` of a tensor", "print"
            if names & {"builtins.float", "builtins.int", "builtins.bool"} and len(n.args) == 1:
                if self._tensor_value(n.args[0], t):
                    return f"`{dotted(n.func)}()` of a tensor", "cast"
        if isinstance(n, (ast.If, ast.While)) and self._tensor_test(n.test, t):
            return f"`{'if' if isinstance(n, ast.If) else 'while'}` on a tensor's value", "branch"
        return None

    def _tensor_value(self, expr, t) -> bool:
        if isinstance(expr, ast.JoinedStr):
            return any(isinstance(p, ast.FormattedValue) and self._tensor_value(p.value, t) for p in expr.values)
        if isinstance(expr, ast.Call) and method_call(expr, *SYNC_METHODS):
            return False  # reported as the method call
        return t.is_tensor(expr)

    def _tensor_test(self, test, t) -> bool:
        if isinstance(test, ast.Compare):
            if any(isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for op in test.ops):
                return False
            return any(self._tensor_value(e, t) for e in [test.left, *test.comparators])
        if isinstance(test, ast.BoolOp):
            if isinstance(test.op, ast.And) and _has_modulo(test.values[0]):
                return False  # `step % N == 0 and loss > x` reads the tensor every N steps only
            return any(self._tensor_test(v, t) for v in test.values)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self._tensor_test(test.operand, t)
        return self._tensor_value(test, t)
