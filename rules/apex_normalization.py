import ast

from ampfix.model.analysis import arg, has_star, kwargs
from ampfix.migration.exports import plan as exports_plan
from ampfix.rule import Fix, Invalid, Valid
from ampfix.rules._apex import ApexRule


class ApexNormalization(ApexRule):
    """
    ## What it does
    Reports `apex.normalization` and rewrites `FusedLayerNorm` / `MixedFusedLayerNorm` to
    `torch.nn.LayerNorm`, and `FusedRMSNorm` to `torch.nn.RMSNorm` (torch 2.4+, with apex's
    `eps=1e-5` made explicit: torch's default is the dtype's machine epsilon).

    ## Why is this bad?
    torch's LayerNorm has been a fused kernel for years and RMSNorm is native since 2.4;
    apex's versions only add a build dependency.  Parameter names (`weight`, `bias`) match, so
    checkpoints load.

    ## Example
    ```python
    from apex.normalization import FusedLayerNorm
    self.ln = FusedLayerNorm(hidden, eps=1e-6)
    ```

    ## Use instead
    ```python
    self.ln = torch.nn.LayerNorm(hidden, eps=1e-6)
    ```
    """

    code = "AMP105"
    name = "apex-normalization"
    summary = "apex.normalization: use torch.nn.LayerNorm / torch.nn.RMSNorm"
    fix_kind = "safe"
    since = "1.0"
    planner = staticmethod(exports_plan)
    prefix = "apex.normalization"

    VALID = [Valid("import torch\nln = torch.nn.LayerNorm(8)\n")]
    INVALID = [
        Invalid(
            """
            import torch
            from apex.normalization import FusedLayerNorm, FusedRMSNorm
            ln = FusedLayerNorm(512, eps=1e-6)
            rms = FusedRMSNorm(512)
            """,
            count=2,
            expected="""
            import torch
            ln = torch.nn.LayerNorm(512, eps=1e-6)
            rms = torch.nn.RMSNorm(512, eps=1e-5)
            """,
        ),
        Invalid(
            # a reference to the class: LayerNorm takes the same arguments and defaults
            """
            import torch
            from apex.normalization.fused_layer_norm import FusedLayerNorm as LayerNorm
            BertLayerNorm = LayerNorm
            """,
            expected="""
            import torch
            BertLayerNorm = torch.nn.LayerNorm
            """,
        ),
        Invalid("from apex.normalization import FusedRMSNorm\nrms = FusedRMSNorm(512)\n",
                settings={"torch_version": "2.3"}, expected="from apex.normalization import FusedRMSNorm\nrms = FusedRMSNorm(512)\n"),
    ]

    def fix_for(self, node, call, qname):
        kind = qname.split(".")[-1]
        if call is None and kind in ("FusedLayerNorm", "MixedFusedLayerNorm") and isinstance(node.ctx, ast.Load):
            # a reference (`BertLayerNorm = LayerNorm`, isinstance): torch.nn.LayerNorm takes the
            # same arguments with the same defaults
            add, remove = self.import_edits(node)
            return Fix(f"apex.normalization.{kind} -> torch.nn.LayerNorm", [self.edits.replace(node, "torch.nn.LayerNorm")],
                       add_imports=add, remove_imports=remove)
        if call is None or has_star(call):
            return None
        kind = qname.split(".")[-1]
        kws = set(kwargs(call))
        if kws - {"normalized_shape", "eps", "elementwise_affine"} or len(call.args) > 3:
            return None
        edits = []
        if kind in ("FusedLayerNorm", "MixedFusedLayerNorm"):
            func = "torch.nn.LayerNorm"
        elif kind == "FusedRMSNorm" and self.settings.torch_version >= (2, 4):
            func = "torch.nn.RMSNorm"
            if arg(call, "eps", 1) is None:
                edits.append(self.edits.insert_arg(call, "eps=1e-5"))
        else:
            return None
        add, remove = self.import_edits(node)
        return Fix(f"apex.normalization.{kind} -> {func}", [self.edits.replace(call.func, func), *edits],
                   add_imports=add, remove_imports=remove)
