import ast

from ampfix.model.analysis import arg, arg_node, is_const, method_call, receiver
from ampfix.rule import Fix, Invalid, Rule, Valid
from ampfix.model.semantic import dotted


def _is_grad_zero(expr, var: str) -> bool:
    """``var.grad.zero_()`` or ``var.grad.data.zero_()``."""
    if not method_call(expr, "zero_") or expr.args or expr.keywords:
        return False
    return dotted(receiver(expr)) in (f"{var}.grad", f"{var}.grad.data")


def _statements(block):
    """Statements of a loop body, looking into if-blocks (not nested loops or functions)."""
    for stmt in block:
        yield stmt
        if isinstance(stmt, ast.If):
            yield from _statements(stmt.body)


class ZeroGrad(Rule):
    """
    ## What it does
    Reports `zero_grad(set_to_none=False)`, a bare `zero_grad()` on torch releases before 2.0
    (where `False` was the default), and loops over parameters that call `p.grad.zero_()` or
    `p.grad.data.zero_()`.

    ## Why is this bad?
    Writing zeros into every gradient is a memory-bound kernel per parameter, and the next
    backward then adds into those zeros.  Setting gradients to `None` skips the writes, lets
    backward assign instead of accumulate, and frees the memory between steps.

    ## Example
    ```python
    optimizer.zero_grad(set_to_none=False)
    for p in model.parameters():
        p.grad.zero_()
    ```

    ## Use instead
    ```python
    optimizer.zero_grad()            # set_to_none=True is the default since torch 2.0
    for p in model.parameters():
        p.grad = None
    ```
    The fix is **unsafe**: it can change training.  An optimizer skips a parameter whose
    gradient is `None`, but steps one whose gradient is zero: with momentum or weight decay
    (SGD, Adam, AdamW) a parameter that took no part in a step (a frozen branch, an unused
    embedding row's module, a layer skipped this iteration) still moves with zeros and does not
    move with `None` (tests/test_zero_grad_semantics.py shows it with three SGD steps).
    Code that reads `.grad` between `zero_grad` and `backward` must also handle `None`.
    It is applied only with `--unsafe-fixes`: check that every parameter gets a gradient each
    step, or that skipping those that do not is what you want.
    """

    code = "AMP301"
    name = "zero-grad-set-to-none"
    summary = "zero_grad writes zeros into every gradient instead of setting them to None"
    fix_kind = "unsafe"
    since = "1.7"
    triggers = ("zero_grad", "zero_(")

    VALID = [
        Valid("optimizer.zero_grad()\n"),
        Valid("optimizer.zero_grad(set_to_none=True)\n"),
        Valid("for p in model.parameters():\n    p.grad = None\n"),
        Valid("buf.zero_()\n"),
    ]
    INVALID = [
        Invalid("optimizer.zero_grad(set_to_none=False)\n", expected="optimizer.zero_grad()\n", unsafe=True),
        Invalid("model.zero_grad(set_to_none=False)\n", expected="model.zero_grad(set_to_none=True)\n",
                settings={"torch_version": "1.13"}, unsafe=True),
        Invalid("opt.zero_grad()\n", expected="opt.zero_grad(set_to_none=True)\n", settings={"torch_version": "1.12"}, unsafe=True),
        Invalid(
            """
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.data.zero_()  # reset
            """,
            expected="""
            for p in model.parameters():
                if p.grad is not None:
                    p.grad = None  # reset
            """,
            unsafe=True,
        ),
        Invalid(
            """
            def step(net):
                for name, param in net.named_parameters():
                    param.grad.zero_()
            """,
            expected="""
            def step(net):
                for name, param in net.named_parameters():
                    param.grad = None
            """,
            unsafe=True,
        ),
    ]

    def visit_Call(self, node: ast.Call) -> None:
        if not method_call(node, "zero_grad") or self.settings.torch_version < (1, 7):
            return  # set_to_none came in 1.7
        modern = self.settings.torch_version >= (2, 0)
        a = arg(node, "set_to_none", 0)
        if a is None:
            if modern or node.args or node.keywords:
                return
            fix = Fix("zero_grad() -> zero_grad(set_to_none=True)", [self.edits.insert_arg(node, "set_to_none=True")],
                      safe=False)
            self.report(node, "`zero_grad()` writes zeros on torch < 2.0; pass `set_to_none=True`", fix)
            return
        if not is_const(a, False):
            return
        if modern and len(node.args) + len(node.keywords) == 1:
            fix = Fix("zero_grad(set_to_none=False) -> zero_grad()",
                      [self.edits.remove_arg(node, arg_node(node, "set_to_none", 0))], safe=False)
        else:
            fix = Fix("set_to_none=False -> set_to_none=True", [self.edits.replace(a, "True")], safe=False)
        self.report(node, "`zero_grad(set_to_none=False)` writes zeros into every gradient; let it set them to None", fix)

    def visit_For(self, node: ast.For) -> None:
        it = node.iter
        if not method_call(it, "parameters", "named_parameters"):
            return
        target = node.target
        if method_call(it, "named_parameters") and isinstance(target, ast.Tuple) and len(target.elts) == 2:
            target = target.elts[1]
        if not isinstance(target, ast.Name):
            return
        var = target.id
        for stmt in _statements(node.body):
            if isinstance(stmt, ast.Expr) and _is_grad_zero(stmt.value, var):
                fix = Fix(f"{var}.grad.zero_() -> {var}.grad = None", [self.edits.replace(stmt, f"{var}.grad = None")],
                          safe=False)
                self.report(stmt.value, f"`{self.code_of(stmt.value)}` writes zeros; set `{var}.grad = None` instead", fix)
