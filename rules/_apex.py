"""What the apex rules share: finding apex uses by qualified name, and the import bookkeeping.

Not a rule itself (no registry line): each apex area is its own rule, built on ApexRule.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import libcst as cst

from ampfix.analysis import base_name, bound_by_imports, import_of, with_args
from ampfix.rule import Fix, ImportSpec, Rule

REPLACEMENTS: Dict[str, str] = {
    "apex.amp.initialize": "torch.amp.GradScaler('cuda') plus a torch.autocast('cuda') region around the forward pass",
    "apex.amp.scale_loss": "scaler.scale(loss).backward(), then scaler.step(optimizer) and scaler.update()",
    "apex.amp.master_params": "scaler.unscale_(optimizer), then clip the optimizer's own parameters",
    "apex.amp.state_dict": "scaler.state_dict()",
    "apex.amp.load_state_dict": "scaler.load_state_dict(...)",
    "apex.amp": "native torch.amp (torch.autocast + torch.amp.GradScaler)",
    "apex.fp16_utils.FP16_Optimizer": "the plain optimizer with torch.amp.GradScaler (scaler.scale(loss).backward())",
    "apex.fp16_utils.network_to_half": "torch.autocast (keep the weights in float32)",
    "apex.fp16_utils.BN_convert_float": "torch.autocast (it keeps batch norm in float32 itself)",
    "apex.fp16_utils": "native torch.amp",
    "apex.parallel.DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel",
    "apex.parallel.convert_syncbn_model": "torch.nn.SyncBatchNorm.convert_sync_batchnorm",
    "apex.parallel.SyncBatchNorm": "torch.nn.SyncBatchNorm",
    "apex.parallel": "torch.nn.parallel / torch.distributed",
    "apex.optimizers.FusedAdam": "torch.optim.AdamW/Adam(..., fused=True)",
    "apex.optimizers.FusedSGD": "torch.optim.SGD(..., fused=True)",
    "apex.optimizers.FusedLAMB": "no torch equivalent: keep apex for it or choose another optimizer",
    "apex.optimizers.FusedNovoGrad": "no torch equivalent: keep apex for it or choose another optimizer",
    "apex.optimizers.FusedAdagrad": "torch.optim.Adagrad(..., fused=True) on recent torch",
    "apex.optimizers": "torch.optim with fused=True where it exists",
    "apex.normalization.FusedLayerNorm": "torch.nn.LayerNorm",
    "apex.normalization.MixedFusedLayerNorm": "torch.nn.LayerNorm",
    "apex.normalization.FusedRMSNorm": "torch.nn.RMSNorm (torch>=2.4)",
    "apex.normalization": "torch.nn normalization layers",
    "apex": "native PyTorch (torch.amp, torch.nn.parallel, fused torch.optim)",
}


def replacement_for(qname: str) -> str:
    best = max((k for k in REPLACEMENTS if qname == k or qname.startswith(k + ".")), key=len, default="apex")
    return REPLACEMENTS[best]


def join_args(args):
    """Arguments with ', ' between them and no trailing comma."""
    return with_args(list(args)[:-1], list(args)[-1:]) if args else []


class ApexRule(Rule):
    """Reports each use of apex under ``prefix`` (the outermost name of a dotted chain, outside
    import statements); subclasses may offer a fix through :meth:`fix_for`."""

    prefix: str = "apex"
    #: prefixes handled by a more specific apex rule (for the catch-all)
    others: Tuple[str, ...] = ()
    triggers = ("apex",)

    def visit_Module(self, node: cst.Module) -> None:
        # names bound by apex imports: only chains starting with one need a qualified-name lookup
        self.apex_bound = bound_by_imports(node, "apex")

    def apex_name(self, node) -> Optional[str]:
        base = base_name(node.func if isinstance(node, cst.Call) else node)
        if base is None or base.value not in getattr(self, "apex_bound", ()):
            return None
        names = sorted(q for q in self.qnames(node) if q == "apex" or q.startswith("apex."))
        if not names:
            return None
        q = names[0]
        if not (q == self.prefix or q.startswith(self.prefix + ".")):
            return None
        if any(q == o or q.startswith(o + ".") for o in self.others):
            return None
        return q

    def _check(self, node) -> None:
        parent = self.parent(node)
        if isinstance(parent, cst.Attribute) and parent.value is node:
            return  # the outer attribute reports
        q = self.apex_name(node)
        if q is None:
            return
        if any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in self.ancestors(node)):
            return
        call = parent if isinstance(parent, cst.Call) and parent.func is node else None
        fix = self.fix_for(node, call, q)
        self.report(node, self.message(q, fix, call), fix)

    def message(self, qname: str, fix: Optional[Fix], call: Optional[cst.Call] = None) -> str:
        return f"`{qname}` is NVIDIA apex; use {replacement_for(qname)}"

    def fix_for(self, node, call: Optional[cst.Call], qname: str) -> Optional[Fix]:
        return None

    def import_edits(self, node):
        """(add, remove) ImportSpecs: add ``import torch``, drop the apex import if it ends unused."""
        base = base_name(node)
        spec = import_of(self, base) if base is not None else None
        removes = [spec] if spec is not None and spec.module.split(".")[0] == "apex" else []
        return [ImportSpec("torch")], removes

    def visit_Name(self, node: cst.Name) -> None:
        self._check(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._check(node)
