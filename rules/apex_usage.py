import libcst as cst

from ampfix.rule import Invalid, Rule, Valid

# qualified-name prefix -> (what it is, the native replacement)
REPLACEMENTS = {
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
    "apex.optimizers.FusedAdam": "torch.optim.Adam/AdamW(..., fused=True)",
    "apex.optimizers.FusedSGD": "torch.optim.SGD(..., fused=True)",
    "apex.optimizers.FusedLAMB": "no torch equivalent: keep apex or choose another optimizer",
    "apex.optimizers.FusedNovoGrad": "no torch equivalent: keep apex or choose another optimizer",
    "apex.optimizers.FusedAdagrad": "torch.optim.Adagrad(..., fused=True) (torch>=2.5)",
    "apex.optimizers": "torch.optim with fused=True where it exists",
    "apex.normalization.FusedLayerNorm": "torch.nn.LayerNorm",
    "apex.normalization.FusedRMSNorm": "torch.nn.RMSNorm (torch>=2.4)",
    "apex.normalization": "torch.nn normalization layers",
    "apex": "native PyTorch (torch.amp, torch.nn.parallel, fused torch.optim)",
}


def replacement_for(qname: str) -> str:
    best = max((k for k in REPLACEMENTS if qname == k or qname.startswith(k + ".")), key=len, default="apex")
    return REPLACEMENTS[best]


class ApexUsage(Rule):
    """
    ## What it does
    Reports every use of NVIDIA apex: `apex.amp` (`initialize`, `scale_loss`,
    `master_params`, `state_dict`, `load_state_dict`), `apex.fp16_utils`, `apex.parallel`,
    `apex.optimizers`, `apex.normalization` and the rest of the package, however it was
    imported (`from apex import amp as A` is resolved through the alias).

    ## Why is this bad?
    apex's AMP was superseded by native PyTorch AMP in torch 1.6 and is in maintenance mode:
    it monkey-patches every op globally (O1) or keeps its own master weights (O2), builds only
    against matching CUDA/torch versions, and many of its pieces have fused native equivalents.

    ## Example
    ```python
    from apex import amp
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    ```

    ## Use instead
    ```python
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    ```
    `ampfix migrate` rewrites the common patterns (see AMP1xx fixes as they land).
    """

    code = "AMP101"
    name = "apex-usage"
    summary = "NVIDIA apex is used where native PyTorch has a replacement"
    since = "1.6"
    triggers = ("apex",)

    VALID = [
        Valid("import torch\nscaler = torch.amp.GradScaler('cuda')\n"),
        Valid("apex = 1\nprint(apex)\n", count=0),
        Valid("from mylib import amp\nmodel = amp.initialize(model)\n"),
    ]
    INVALID = [
        Invalid("from apex import amp\nmodel, opt = amp.initialize(model, opt, opt_level='O1')\n",
                message="GradScaler"),
        Invalid("from apex import amp as A\nwith A.scale_loss(loss, opt) as s:\n    s.backward()\n",
                message="scaler.scale(loss)"),
        Invalid("import apex\nmodel = apex.parallel.DistributedDataParallel(model)\n",
                message="torch.nn.parallel.DistributedDataParallel"),
        Invalid("from apex.optimizers import FusedAdam, FusedLAMB\nopt = FusedAdam(p)\nopt2 = FusedLAMB(p)\n", count=2),
        Invalid("from apex.fp16_utils import FP16_Optimizer\nopt = FP16_Optimizer(opt, dynamic_loss_scale=True)\n"),
        Invalid("from apex.normalization import FusedLayerNorm\nclass M:\n    def __init__(self):\n"
                "        self.ln = FusedLayerNorm(10)\n", message="torch.nn.LayerNorm"),
        Invalid("import apex.amp as amp\nsd = amp.state_dict()\nclip(amp.master_params(opt), 1.0)\n", count=2),
    ]

    def _check(self, node) -> None:
        names = [q for q in self.qnames(node) if q == "apex" or q.startswith("apex.")]
        if not names:
            return
        parent = self.parent(node)
        if isinstance(parent, cst.Attribute) and parent.value is node:
            return  # the outer attribute reports
        if any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in self.ancestors(node)):
            return
        qname = sorted(names)[0]
        self.report(node, f"`{qname}` is NVIDIA apex; use {replacement_for(qname)}")

    def visit_Name(self, node: cst.Name) -> None:
        self._check(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._check(node)
