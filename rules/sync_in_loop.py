import libcst as cst

from ampfix.analysis import (
    dotted, enclosing_loop, is_modulo_guarded, is_tensor_expr, is_training_loop,
    method_call, receiver, tensor_names, walk,
)
from ampfix.rule import Invalid, Rule, Valid

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
    return any(isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Modulo) for n in [expr, *walk(expr)])


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

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._scan(node)

    def visit_Module(self, node: cst.Module) -> None:
        self._scan(node)

    def _scan(self, scope_node) -> None:
        loops = [n for n in walk(scope_node) if isinstance(n, (cst.For, cst.While)) and is_training_loop(n)]
        if not loops:
            return
        tensors = tensor_names(self, scope_node)
        for loop in loops:
            for n in walk(loop.body):
                if enclosing_loop(self, n) is not loop:
                    continue
                hit = self._sync(n, tensors)
                if hit and not is_modulo_guarded(self, n, loop):
                    what, kind = hit
                    self.report(n, f"{what} makes the host wait for the GPU in the training loop; {ADVICE[kind]}")

    def _sync(self, n, tensors):
        if isinstance(n, cst.Call):
            if method_call(n, *SYNC_METHODS):
                attr = n.func.attr.value
                rec = receiver(n)
                if method_call(rec, *SYNC_METHODS):
                    return None  # the inner call of the chain is reported
                if attr in ("tolist", "cpu", "numpy") and not (is_tensor_expr(self, rec, tensors) or attr == "cpu"):
                    return None
                if attr == "item" and n.args:
                    return None
                return f"`.{attr}()`", attr
            names = self.qnames(n)
            if names & {"torch.cuda.synchronize", "torch.cuda.current_stream().synchronize"}:
                return "`torch.cuda.synchronize()`", "synchronize"
            if names & {"torch.nonzero"}:
                return "`torch.nonzero()`", "nonzero"
            if names & {"builtins.print"}:
                for a in n.args:
                    if self._tensor_value(a.value, tensors):
                        return "`print()` of a tensor", "print"
            if names & {"builtins.float", "builtins.int", "builtins.bool"} and len(n.args) == 1:
                if self._tensor_value(n.args[0].value, tensors):
                    return f"`{dotted(n.func)}()` of a tensor", "cast"
        if isinstance(n, (cst.If, cst.While)) and self._tensor_test(n.test, tensors):
            return f"`{'if' if isinstance(n, cst.If) else 'while'}` on a tensor's value", "branch"
        return None

    def _tensor_value(self, expr, tensors) -> bool:
        if isinstance(expr, cst.FormattedString):
            return any(isinstance(p, cst.FormattedStringExpression) and self._tensor_value(p.expression, tensors)
                       for p in expr.parts)
        if isinstance(expr, cst.Call) and method_call(expr, *SYNC_METHODS):
            return False  # reported as the method call
        return is_tensor_expr(self, expr, tensors)

    def _tensor_test(self, test, tensors) -> bool:
        if isinstance(test, cst.Comparison):
            if any(isinstance(c.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn)) for c in test.comparisons):
                return False
            return any(self._tensor_value(e, tensors) for e in [test.left, *(c.comparator for c in test.comparisons)])
        if isinstance(test, cst.BooleanOperation):
            if isinstance(test.operator, cst.And) and _has_modulo(test.left):
                return False  # `step % N == 0 and loss > x` reads the tensor every N steps only
            return self._tensor_test(test.left, tensors) or self._tensor_test(test.right, tensors)
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return self._tensor_test(test.expression, tensors)
        return self._tensor_value(test, tensors)
