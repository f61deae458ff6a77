"""NVIDIA apex's public names: what each becomes in native PyTorch, and where a module uses them
(by qualified name, through imports and aliases).  Read by the apex rules and the migration."""
from __future__ import annotations

import ast
from typing import Dict, List, Optional, Tuple

from ampfix.model.semantic import walk

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
    aliases = self_aliases(sem, tree)
    for n in walk(tree, into_functions=True):
        if not isinstance(n, (ast.Name, ast.Attribute)) or not isinstance(n.ctx, ast.Load):
            continue
        p = getattr(n, "_p", None)
        if isinstance(p, ast.Attribute) and p.value is n:
            continue
        q = apex_qname(sem, n)
        if q is None and aliases and isinstance(n, ast.Attribute):
            q = _through_alias(n, aliases)
        if q is not None:
            out.append((n, q))
    return out


def self_aliases(sem, tree) -> Dict[Tuple[int, str], Tuple[str, str]]:
    """``self.amp = amp`` (apex's amp module kept on the object, the only value ``self.amp`` is
    ever given in its class, besides ``None``): (id of the method, ``amp``) -> (``self``, ``apex.amp``)
    for every method of that class, so ``self.amp.scale_loss`` is ``apex.amp.scale_loss``."""
    out: Dict[Tuple[int, str], Tuple[str, str]] = {}
    for cls in walk(tree, into_functions=True):
        if not isinstance(cls, ast.ClassDef):
            continue
        methods = [f for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.args.args]
        given: Dict[str, List[Optional[str]]] = {}
        for f in methods:
            me = f.args.args[0].arg
            for n in walk(f, into_functions=True):
                if isinstance(n, ast.Assign):
                    targets, value = n.targets, n.value
                elif isinstance(n, (ast.AnnAssign, ast.AugAssign)):
                    targets, value = [n.target], None
                elif isinstance(n, (ast.For, ast.AsyncFor, ast.withitem)):
                    targets, value = [n.target if isinstance(n, (ast.For, ast.AsyncFor)) else n.optional_vars], None
                else:
                    continue
                flat = [e for t in targets if t is not None for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
                for t in flat:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == me:
                        q = None
                        if len(flat) == 1 and isinstance(value, (ast.Name, ast.Attribute)):
                            q = apex_qname(sem, value)
                        elif len(flat) == 1 and isinstance(value, ast.Constant) and value.value is None:
                            q = "None"
                        given.setdefault(t.attr, []).append(q)
        for attr, qs in given.items():
            if "apex.amp" in qs and all(q in ("apex.amp", "None") for q in qs):
                for f in methods:
                    out[(id(f), attr)] = (f.args.args[0].arg, "apex.amp")
    return out


def _through_alias(node: ast.Attribute, aliases) -> Optional[str]:
    """The apex name of ``self.amp.x.y`` in a method where ``self.amp`` aliases apex.amp."""
    chain = []
    n = node
    while isinstance(n, ast.Attribute):
        chain.append(n.attr)
        n = n.value
    if not isinstance(n, ast.Name) or not chain:
        return None
    attr, rest = chain[-1], list(reversed(chain[:-1]))
    f = getattr(node, "_p", None)
    while f is not None and not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
        f = getattr(f, "_p", None)
    hit = aliases.get((id(f), attr)) if f is not None else None
    if hit is None or hit[0] != n.id:
        return None
    return ".".join([hit[1], *rest])


def apex_qname(sem, node) -> Optional[str]:
    names = sorted(q for q in sem.qnames(node) if q == "apex" or q.startswith("apex."))
    return canonical(names[0]) if names else None
