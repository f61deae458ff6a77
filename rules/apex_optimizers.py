
from ampfix.model.analysis import has_star, is_const, kwargs
from ampfix.migration.exports import plan as exports_plan
from ampfix.migration.planner import plan as migration_plan
from ampfix.rule import Fix, Invalid, Valid
from ampfix.rules._apex import ApexRule

ADAM_KW = {"params", "lr", "betas", "eps", "weight_decay", "amsgrad", "adam_w_mode", "set_grad_none",
           "bias_correction", "capturable"}
SGD_KW = {"params", "lr", "momentum", "dampening", "weight_decay", "nesterov", "wd_after_momentum",
          "materialize_master_grads", "set_grad_none"}


class ApexOptimizers(ApexRule):
    """
    ## What it does
    Reports `apex.optimizers` and rewrites `FusedAdam` and `FusedSGD` to torch's optimizers.
    `FusedAdam` defaults to `adam_w_mode=True` (decoupled weight decay): it becomes
    `torch.optim.AdamW(..., fused=True)` with `weight_decay` passed explicitly (AdamW's own
    default is 0.01, apex's 0.0); with `adam_w_mode=False` it becomes `torch.optim.Adam`.
    `fused=True` is written only where the declared torch has it (AdamW 2.0, Adam 1.13).
    `FusedSGD` becomes `torch.optim.SGD` without `fused=True`: torch's fused SGD (2.3) takes over
    GradScaler's overflow handling and advances its momentum buffer on the steps the scaler skips,
    which can diverge under AMP; the default (foreach) SGD is multi-tensor already.
    `set_grad_none` is dropped (torch's `zero_grad` sets None by default).  `FusedLAMB`,
    `FusedNovoGrad`, `FusedMixedPrecisionLamb` have no torch equivalent: reported, not invented;
    so are calls with `bias_correction=False`, `wd_after_momentum=True` or positional options.

    ## Why is this bad?
    apex must be built from source against the exact torch and CUDA; torch has had fused
    (single-kernel, multi-tensor) Adam and AdamW since 2.0, and multi-tensor SGD by default.

    ## Example
    ```python
    from apex.optimizers import FusedAdam
    opt = FusedAdam(model.parameters(), lr=1e-3, weight_decay=0.01)
    ```

    ## Use instead
    ```python
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, fused=True)
    ```
    """

    code = "AMP104"
    name = "apex-optimizers"
    summary = "apex.optimizers: use torch.optim (fused=True where it exists and is safe)"
    fix_kind = "safe"
    since = "2.0"
    #: fused optimizers' exports; apex.optimizers.FP16_Optimizer is the migration's
    planner = (exports_plan, migration_plan)
    prefix = "apex.optimizers"
    #: apex.optimizers.FP16_Optimizer: the planner's own reports of its migration
    says_plan_reports = ("fp16", "dual")

    VALID = [Valid("import torch\nopt = torch.optim.AdamW(p, fused=True)\n")]
    INVALID = [
        Invalid(
            """
            import torch
            from apex.optimizers import FusedAdam
            opt = FusedAdam(model.parameters(), lr=1e-3)
            """,
            expected="""
            import torch
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, fused=True)
            """,
        ),
        Invalid(
            """
            import apex
            opt = apex.optimizers.FusedAdam(params, lr=args.lr, adam_w_mode=False, weight_decay=1e-4)
            sgd = apex.optimizers.FusedSGD(params, 0.1, momentum=0.9, set_grad_none=True)
            """,
            count=2,
            expected="""
            import torch

            opt = torch.optim.Adam(params, lr=args.lr, weight_decay=1e-4, fused=True)
            sgd = torch.optim.SGD(params, 0.1, momentum=0.9)
            """,
        ),
        Invalid("from apex.optimizers import FusedLAMB\nopt = FusedLAMB(p, lr=1e-3)\n", message="no torch equivalent"),
        Invalid(
            # torch 1.13 has no fused AdamW: the rewrite uses what the release has
            """
            import torch
            from apex.optimizers import FusedAdam
            opt = FusedAdam(model.parameters(), lr=1e-3)
            """,
            settings={"torch_version": "1.13"},
            expected="""
            import torch
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
            """,
        ),
    ]

    def fix_for(self, node, call, qname):
        if call is None or has_star(call):
            return None
        kind = qname.split(".")[-1]
        kws = kwargs(call)
        pos = call.args
        if kind == "FusedAdam":
            if len(pos) > 2 or set(kws) - ADAM_KW or is_const(kws.get("bias_correction"), False):
                return None
            if "adam_w_mode" in kws and not is_const(kws["adam_w_mode"], True, False):
                return None
            adamw = not is_const(kws.get("adam_w_mode"), False)
            func = "torch.optim.AdamW" if adamw else "torch.optim.Adam"
            drop = {"adam_w_mode", "set_grad_none", "bias_correction"}
            extra = ["weight_decay=0.0"] if adamw and "weight_decay" not in kws else []
            fused = self.settings.torch_version >= ((2, 0) if adamw else (1, 13))
        elif kind == "FusedSGD":
            if len(pos) > 2 or set(kws) - SGD_KW or is_const(kws.get("wd_after_momentum"), True):
                return None
            func = "torch.optim.SGD"
            drop = {"wd_after_momentum", "materialize_master_grads", "set_grad_none"}
            extra = []
            fused = False  # torch's fused SGD advances momentum on the steps GradScaler skips
        else:
            return None
        args = [self.code_of(a) for a in pos] + [f"{k.arg}={self.code_of(k.value)}" for k in call.keywords
                                                   if k.arg not in drop]
        args += [*extra, *(["fused=True"] if fused else [])]
        add, remove = self.import_edits(node)
        return Fix(f"apex.optimizers.{kind} -> {func}(...{', fused=True' if fused else ''})",
                   [self.edits.replace(call, f"{func}({', '.join(args)})")],
                   add_imports=add, remove_imports=remove)
