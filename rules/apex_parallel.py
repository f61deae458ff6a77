
from ampfix.model.analysis import has_star, is_const, kwargs, number_value
from ampfix.rule import Fix, Invalid, Valid
from ampfix.rules._apex import ApexRule

#: apex DDP keyword -> what happens to it
DDP_KEEP = {"delay_allreduce": "dropped: torch DDP overlaps all-reduce in buckets and gives the same gradients",
            "gradient_average": "dropped: torch DDP always averages",
            "gradient_predivide_factor": ("dropped: it only split apex's averaging around the all-reduce, against "
                                          "float16 overflow; torch DDP averages the gradients itself")}


class ApexParallel(ApexRule):
    """
    ## What it does
    Reports `apex.parallel`: `DistributedDataParallel`, `convert_syncbn_model`,
    `SyncBatchNorm`, and rewrites them to `torch.nn.parallel.DistributedDataParallel`,
    `torch.nn.SyncBatchNorm.convert_sync_batchnorm` and `torch.nn.SyncBatchNorm`.

    Arguments: `delay_allreduce` and `gradient_average=True` are dropped (torch DDP averages and
    its bucketed overlap gives the same gradients); `message_size` (elements) becomes
    `bucket_cap_mb` (4 bytes an element); `process_group` is kept.  Any other argument
    (`allreduce_always_fp32`, `gradient_predivide_factor`, `channel_last`, `fuse_relu`...) has
    no torch equivalent: the call is reported and left for a person.

    ## Why is this bad?
    apex's DDP predates torch's and is unmaintained; torch's overlaps communication with
    backward, supports `no_sync()`, static graphs and gradient-as-bucket views.

    ## Example
    ```python
    from apex.parallel import DistributedDataParallel as DDP, convert_syncbn_model
    model = convert_syncbn_model(model)
    model = DDP(model, delay_allreduce=True)
    ```

    ## Use instead
    ```python
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    ```
    """

    code = "AMP103"
    name = "apex-parallel"
    summary = "apex.parallel (DDP, SyncBatchNorm): use torch.nn.parallel / torch.nn.SyncBatchNorm"
    fix_kind = "safe"
    since = "1.1"
    prefix = "apex.parallel"

    VALID = [Valid("import torch\nm = torch.nn.parallel.DistributedDataParallel(m)\n")]
    INVALID = [
        Invalid(
            # a star import: the names it binds are found, and it goes with the last of them
            """
            import torch
            from apex.parallel import *

            model = DistributedDataParallel(model)
            """,
            expected="""
            import torch

            model = torch.nn.parallel.DistributedDataParallel(model)
            """,
        ),
        Invalid(
            """
            import torch
            from apex.parallel import DistributedDataParallel as DDP, convert_syncbn_model

            model = convert_syncbn_model(model)
            model = DDP(model, delay_allreduce=True)
            """,
            count=2,
            expected="""
            import torch

            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
            model = torch.nn.parallel.DistributedDataParallel(model)
            """,
        ),
        Invalid(
            """
            import apex
            bn = apex.parallel.SyncBatchNorm(64, eps=1e-3)
            m = apex.parallel.DistributedDataParallel(m, message_size=2500000)
            """,
            count=2,
            expected="""
            import torch

            bn = torch.nn.SyncBatchNorm(64, eps=1e-3)
            m = torch.nn.parallel.DistributedDataParallel(m, bucket_cap_mb=9.5367431640625)
            """,
        ),
        Invalid(
            # ViT-pytorch's call
            """
            import torch
            from apex.parallel import DistributedDataParallel as DDP
            model = DDP(model, message_size=250000000, gradient_predivide_factor=get_world_size())
            """,
            expected="""
            import torch
            model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=953.67431640625)
            """,
        ),
        Invalid("from apex.parallel import DistributedDataParallel as DDP\nisinstance(m, DDP)\n",
                message="a reference, not a call"),
        Invalid("import apex\nm = apex.parallel.DistributedDataParallel(m, allreduce_always_fp32=True)\n",
                message="`allreduce_always_fp32` has no torch equivalent",
                expected="import apex\nm = apex.parallel.DistributedDataParallel(m, allreduce_always_fp32=True)\n"),
    ]

    def message(self, qname, fix, call=None):
        text = super().message(qname, fix, call)
        if call is None:
            text += " (a reference, not a call: rename it by hand)"
        elif fix is None and qname.split(".")[-1] in ("DistributedDataParallel", "SyncBatchNorm", "convert_syncbn_model"):
            known = {*DDP_KEEP, "message_size", "module", "process_group", "gradient_average"}
            odd = [k.arg for k in call.keywords if k.arg is not None and k.arg not in known]
            what = f"`{odd[0]}` has" if odd else "an argument has"
            text += f" ({what} no torch equivalent: left for a person)"
        return text

    def fix_for(self, node, call, qname):
        if call is None or has_star(call):
            return None
        kind = qname.split(".")[-1]
        add, remove = self.import_edits(node)
        kws = kwargs(call)
        pos = call.args
        notes = []
        if kind == "DistributedDataParallel":
            if len(pos) + ("module" in kws) != 1 or set(kws) - set(DDP_KEEP) - {"message_size", "module"}:
                return None
            ga = kws.get("gradient_average")
            if ga is not None and not is_const(ga, True):
                return None
            args = [self.code_of(pos[0] if pos else kws["module"])]
            if "message_size" in kws:
                ms = number_value(kws["message_size"])
                if ms is None:
                    return None
                args.append(f"bucket_cap_mb={float(ms) * 4 / 2 ** 20!r}")
            notes = [f"{k} {v}" for k, v in DDP_KEEP.items() if k in kws]
            func = "torch.nn.parallel.DistributedDataParallel"
        elif kind == "convert_syncbn_model":
            if len(pos) != 1 or set(kws) - {"process_group"}:
                return None
            args = None
            func = "torch.nn.SyncBatchNorm.convert_sync_batchnorm"
        elif kind == "SyncBatchNorm":
            if set(kws) & {"channel_last", "fuse_relu"} or len(pos) > 6:
                return None
            args = None
            func = "torch.nn.SyncBatchNorm"
        else:
            return None
        if args is None:
            edits = [self.edits.replace(call.func, func)]
        else:
            edits = [self.edits.replace(call, f"{func}({', '.join(args)})")]
        desc = f"apex.parallel.{kind} -> {func}" + (f" ({'; '.join(notes)})" if notes else "")
        return Fix(desc, edits, add_imports=add, remove_imports=remove)
