"""What the apex rules share: finding apex uses by qualified name, and the import bookkeeping.

Not a rule itself (no registry line): each apex area is its own rule, built on ApexRule.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import libcst as cst
from libcst.metadata import ScopeProvider

from ampfix.analysis import base_name, bound_by_imports, dotted, import_of, walk, with_args
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


#: what ``from apex.X import *`` binds, for the areas with a rewrite (libcst cannot see through a star)
STAR_EXPORTS: Dict[str, Tuple[str, ...]] = {
    "apex.fp16_utils": ("FP16_Optimizer", "network_to_half", "BN_convert_float", "FP16Model", "tofp16",
                        "prep_param_lists", "master_params_to_model_params", "model_grads_to_master_grads",
                        "to_python_float", "clip_grad_norm", "convert_module", "convert_network", "LossScaler",
                        "DynamicLossScaler"),
    "apex.parallel": ("DistributedDataParallel", "SyncBatchNorm", "convert_syncbn_model", "Reducer"),
    "apex.optimizers": ("FusedAdam", "FusedSGD", "FusedLAMB", "FusedNovoGrad", "FusedAdagrad", "FusedMixedPrecisionLamb"),
    "apex.normalization": ("FusedLayerNorm", "FusedRMSNorm", "MixedFusedLayerNorm", "MixedFusedRMSNorm"),
}


def star_imports(module: cst.Module) -> Dict[str, str]:
    """Names bound by ``from apex.X import *`` (X an area above): name -> apex.X."""
    out: Dict[str, str] = {}
    for imp in walk(module):  # module level, guarded imports (try/if) included
        if isinstance(imp, cst.ImportFrom) and isinstance(imp.names, cst.ImportStar) and imp.module is not None:
            mod = dotted(imp.module) or ""
            out.update({n: mod for n in STAR_EXPORTS.get(mod, ())})
    return out


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
        self.apex_star = star_imports(node)

    def apex_name(self, node) -> Optional[str]:
        base = base_name(node.func if isinstance(node, cst.Call) else node)
        if base is None:
            return None
        if base.value in getattr(self, "apex_star", {}) and base.value not in self.apex_bound and self._unbound(base):
            names = [f"{self.apex_star[base.value]}.{dotted(node.func if isinstance(node, cst.Call) else node)}"]
        elif base.value not in getattr(self, "apex_bound", ()):
            return None
        else:
            names = sorted(q for q in self.qnames(node) if q == "apex" or q.startswith("apex."))
        if not names:
            return None
        q = names[0]
        if not (q == self.prefix or q.startswith(self.prefix + ".")):
            return None
        if any(q == o or q.startswith(o + ".") for o in self.others):
            return None
        return q

    def _unbound(self, name: cst.Name) -> bool:
        """No assignment of ``name`` is visible where it is used (so a star import binds it)."""
        scope = self.get_metadata(ScopeProvider, name, None)
        return scope is not None and not scope[name.value]

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

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        """``from apex.X import *`` that nothing uses any more (its uses were rewritten) goes:
        left behind it would fail where apex is not installed."""
        if not isinstance(node.names, cst.ImportStar) or node.module is None or dotted(node.module) != self.prefix:
            return
        exports = STAR_EXPORTS.get(self.prefix, ())
        line = self.parent(node)
        if not exports or not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            return
        for n in walk(self.module, into_functions=True):
            if isinstance(n, cst.Name) and n.value in exports and self._unbound(n):
                parent = self.parent(n)
                if not (isinstance(parent, cst.Attribute) and parent.attr is n):
                    return
        self.report(node, f"`from {self.prefix} import *` is NVIDIA apex, and nothing in this module uses it",
                    Fix(f"remove the unused `from {self.prefix} import *`", [(line, cst.RemovalSentinel.REMOVE)]))

    def visit_Name(self, node: cst.Name) -> None:
        self._check(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._check(node)
