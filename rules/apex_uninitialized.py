from ampfix.migration.planner import plan as migration_plan
from ampfix.rule import Invalid, Valid
from ampfix.rules._apex import ApexRule


class ApexUninitialized(ApexRule):
    """
    ## What it does
    Reports `amp.scale_loss` and `amp.master_params` in a project where no `amp.initialize`
    (nor the old `amp.init`) is left: in no file given, and in no other file of the project.

    ## Why is this bad?
    apex raises at the first scaled backward when it was never initialized.  This is what a
    half-done migration leaves behind: the launcher that called `amp.initialize` was rewritten,
    the engine module that scales the loss was not.

    ## Example
    ```python
    # engine.py; the launcher no longer calls amp.initialize
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    ```

    ## Use instead
    Migrate the whole project at once (`ampfix migrate src/`): the scaler the launcher makes is
    passed to the engine, which calls `scaler.scale(loss).backward()`.
    """

    code = "AMP106"
    name = "apex-amp-uninitialized"
    summary = "apex amp.scale_loss/master_params where no amp.initialize is left in the project"
    since = "1.6"
    prefix = "apex.amp"
    planner = staticmethod(migration_plan)

    VALID = [Valid("from apex import amp\nmodel, opt = amp.initialize(model, opt)\n"
                   "with amp.scale_loss(loss, opt) as s:\n    s.backward()\n")]
    INVALID = [
        Invalid(
            """
            from apex import amp
            def backward(loss, opt):
                with amp.scale_loss(loss, opt) as s:
                    s.backward()
            """,
            message="no amp.initialize",
        ),
    ]

    def _check(self, node) -> None:
        import ast

        p = getattr(node, "_p", None)
        if isinstance(p, ast.Attribute) and p.value is node:
            return  # the outer attribute is the use
        plan = self.ctx.plan
        if not plan or not plan.flags.get((node.lineno, node.col_offset)) == "uninitialized":
            return
        q = self.apex_name(node)
        self.report(node, f"`{q}` but no amp.initialize is left in the project: apex raises at the first scaled "
                          "backward; migrate the whole project (`ampfix migrate` on its folder)")
