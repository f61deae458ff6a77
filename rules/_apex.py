"""What the apex rules share: finding apex uses by qualified name, and the import bookkeeping.

Not a rule itself (no registry line): each apex area is its own rule, built on ApexRule.
"""
from __future__ import annotations

import ast
from typing import Dict, List, Optional, Tuple

from ampfix.analysis import STAR_EXPORTS, import_spec
from ampfix.rule import Fix, ImportSpec, Rule
from ampfix.semantic import base_name, walk
from ampfix.tidy import Remover

REPLACEMENTS: Dict[str, str] = {
    "apex.amp.initialize": "torch.amp.GradScaler('cuda') plus a torch.autocast('cuda') region around the forward pass",
    "apex.amp.scale_loss": "scaler.scale(loss).backward(), then scaler.step(optimizer) and scaler.update()",
    "apex.amp.master_params": "scaler.unscale_(optimizer), then clip the optimizer's own parameters",
    "apex.amp.state_dict": "scaler.state_dict()",
    "apex.amp.load_state_dict": "scaler.load_state_dict(...)",
    "apex.amp.float_function": "running the function with autocast off, on float32 inputs",
    "apex.amp.half_function": "running the function under float16 autocast",
    "apex.amp.promote_function": "autocast (it promotes mixed inputs itself)",
    "apex.amp.register_float_function": "autocast's own float32 op list (or the function run with autocast off)",
    "apex.amp.register_half_function": "autocast's own float16 op list",
    "apex.amp.register_promote_function": "autocast (it promotes mixed inputs itself)",
    "apex.amp.disable_casts": "torch.autocast('cuda', enabled=False)",
    "apex.amp.init": "torch.amp.GradScaler('cuda') plus torch.autocast('cuda') regions",
    "apex.amp": "native torch.amp (torch.autocast + torch.amp.GradScaler)",
    "apex.fp16_utils.FP16_Optimizer": "the plain optimizer with torch.amp.GradScaler (scaler.scale(loss).backward())",
    "apex.fp16_utils.network_to_half": "torch.autocast (keep the weights in float32)",
    "apex.fp16_utils.BN_convert_float": "torch.autocast (it keeps batch norm in float32 itself)",
    "apex.fp16_utils": "native torch.amp",
    "apex.parallel.DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel",
    "apex.parallel.convert_syncbn_model": "torch.nn.SyncBatchNorm.convert_sync_batchnorm",
    "apex.parallel.SyncBatchNorm": "torch.nn.SyncBatchNorm",
    "apex.parallel": "torch.nn.parallel / torch.distributed",
    "apex.optimizers.FP16_Optimizer": "the plain optimizer with torch.amp.GradScaler (scaler.scale(loss).backward())",
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


def canonical(qname: str) -> str:
    """apex's submodule spellings as one name (``apex.normalization.fused_layer_norm.FusedLayerNorm``
    is ``apex.normalization.FusedLayerNorm``; ``apex.parallel.distributed.X`` is ``apex.parallel.X``)."""
    parts = qname.split(".")
    if len(parts) >= 4 and parts[0] == "apex" and parts[1] in ("normalization", "parallel", "optimizers",
                                                                 "fp16_utils"):
        return ".".join(parts[:2] + parts[-1:])
    return qname


def apex_uses(sem, tree) -> List[Tuple[ast.AST, str]]:
    """Each apex reference outside imports: (outermost Name/Attribute, canonical qualified name)."""
    out = []
    for n in walk(tree, into_functions=True):
        if not isinstance(n, (ast.Name, ast.Attribute)) or not isinstance(n.ctx, ast.Load):
            continue
        p = getattr(n, "_p", None)
        if isinstance(p, ast.Attribute) and p.value is n:
            continue
        q = apex_qname(sem, n)
        if q is not None:
            out.append((n, q))
    return out


def apex_qname(sem, node) -> Optional[str]:
    names = sorted(q for q in sem.qnames(node) if q == "apex" or q.startswith("apex."))
    return canonical(names[0]) if names else None


class ApexRule(Rule):
    """Reports each use of apex under ``prefix`` (the outermost name of a dotted chain, outside
    import statements); subclasses may offer a fix through :meth:`fix_for`."""

    prefix: str = "apex"
    #: prefixes handled by a more specific apex rule (for the catch-all)
    others: Tuple[str, ...] = ()
    triggers = ("apex",)

    def apex_name(self, node) -> Optional[str]:
        q = apex_qname(self.sem, node)
        if q is None or not (q == self.prefix or q.startswith(self.prefix + ".")):
            return None
        if any(q == o or q.startswith(o + ".") for o in self.others):
            return None
        return q

    def _check(self, node) -> None:
        if not isinstance(node.ctx, ast.Load):
            return
        parent = self.parent(node)
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return  # the outer attribute reports
        q = self.apex_name(node)
        if q is None:
            return
        call = parent if isinstance(parent, ast.Call) and parent.func is node else None
        plan = self.ctx.plan
        fix = plan.fix_at(node) if plan else None
        if fix is None:
            fix = self.fix_for(node, call, q)
        text = self.message(q, fix, call)
        note = plan.note_at(node) if plan else None
        if note:
            text += f" ({note})"
        self.report(node, text, fix)

    def message(self, qname: str, fix: Optional[Fix], call=None) -> str:
        return f"`{qname}` is NVIDIA apex; use {replacement_for(qname)}"

    def fix_for(self, node, call, qname: str) -> Optional[Fix]:
        return None

    def import_edits(self, node):
        """(add, remove) ImportSpecs: add ``import torch``, drop the apex import if it ends unused."""
        base = base_name(node)
        spec = import_spec(self.sem, base) if base is not None else None
        removes = [spec] if spec is not None and spec.module.split(".")[0] == "apex" else []
        return [ImportSpec("torch")], removes

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        """``from apex.X import *`` that nothing uses any more (its uses were rewritten) goes:
        left behind it would fail where apex is not installed."""
        if not any(a.name == "*" for a in node.names) or node.level or node.module != self.prefix:
            return
        exports = STAR_EXPORTS.get(self.prefix, ())
        if not exports:
            return
        for n in walk(self.module, into_functions=True):
            if isinstance(n, ast.Name) and n.id in exports and isinstance(n.ctx, ast.Load):
                if any(b.node is node for b in self.sem.bindings_of(n)):
                    return
        self.report(node, f"`from {self.prefix} import *` is NVIDIA apex, and nothing in this module uses it",
                    Fix(f"remove the unused `from {self.prefix} import *`",
                        Remover(self.src, self.sem, self.edits).remove([node])))

    def visit_Module(self, node: ast.Module) -> None:
        """Reports the migration planner makes itself (a file it edits where apex is not used:
        a caller that now passes the scaler); one apex rule says them."""
        plan = self.ctx.plan
        if plan and getattr(type(self), "says_plan_reports", False):
            for r in plan.reports:
                self.report_at(r.line, r.col, r.end_line, r.end_col, r.message, r.fix)

    def visit_Name(self, node: ast.Name) -> None:
        self._check(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._check(node)
