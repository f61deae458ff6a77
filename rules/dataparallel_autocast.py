import libcst as cst

from ampfix.analysis import (
    DATAPARALLEL, arg, autocast_call, autocast_dtype, dotted, enclosing_autocast, walk,
)
from ampfix.rule import Invalid, Rule, Valid

#: torch 1.7 (pytorch/pytorch#43102) made parallel_apply re-enter autocast in the replica
#: threads - with the enabled flag only, so the dtype falls back to float16 on CUDA.
PROPAGATES_SINCE = (1, 7)


class DataParallelAutocast(Rule):
    """
    ## What it does
    Reports a model wrapped in `nn.DataParallel` that is called inside an autocast region,
    when the wrapped module's `forward` does not enter autocast itself:

    * on torch < 1.7 always: autocast state is thread-local and DataParallel runs each replica
      in its own thread, so the replicas run in float32 and the region does nothing;
    * on torch >= 1.7 when the region asks for a dtype other than float16 (`bfloat16`):
      `parallel_apply` re-enters autocast in the replica threads but passes on only the
      *enabled* flag, so the replicas compute in float16, not the dtype you asked for.

    ## Why is this bad?
    The mixed precision you think you have is not what runs: no speed-up at all on old torch,
    or float16 (with its narrow range and overflow risk, and no GradScaler to protect it) where
    you chose bfloat16.

    ## Example
    ```python
    model = nn.DataParallel(Net())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(x)
    ```

    ## Use instead
    DistributedDataParallel (one process per GPU, autocast in each), or enter autocast in the
    module's `forward`:
    ```python
    class Net(nn.Module):
        @torch.autocast("cuda", dtype=torch.bfloat16)
        def forward(self, x):
            ...
    ```
    """

    code = "AMP201"
    name = "dataparallel-autocast"
    summary = "autocast around a DataParallel call does not reach its replicas as asked"
    since = "1.6"
    triggers = ("DataParallel",)

    VALID = [
        Valid(
            """
            import torch
            from torch import nn
            model = nn.DataParallel(Net())
            with torch.autocast("cuda"):
                out = model(x)
            """
        ),
        Valid(
            """
            import torch
            from torch import nn
            class Net(nn.Module):
                @torch.autocast("cuda", dtype=torch.bfloat16)
                def forward(self, x):
                    return x
            model = nn.DataParallel(Net())
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(x)
            """
        ),
        Valid(
            """
            import torch
            from torch import nn
            class Net(nn.Module):
                @torch.autocast("cuda", dtype=torch.bfloat16)
                def forward(self, x):
                    return x
            model = nn.DataParallel(Net().to("cuda"))
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(x)
            """
        ),
        Valid(
            """
            import torch
            model = torch.nn.parallel.DistributedDataParallel(Net())
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(x)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch import nn
            model = Net()
            model = nn.DataParallel(model)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(x)
            """,
            message="float16",
        ),
        Invalid(
            """
            import torch
            from torch.cuda.amp import autocast
            net = torch.nn.DataParallel(Net())
            def step(x):
                with autocast():
                    return net(x)
            """,
            settings={"torch_version": "1.6"},
            message="float32",
        ),
        Invalid(
            """
            import torch
            class Trainer:
                def __init__(self):
                    self.model = torch.nn.DataParallel(Net())
                def step(self, x):
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        return self.model(x)
            """,
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        self.wrapped = {}  # dotted name -> inner module expression
        self.classes = {c.name.value: c for c in walk(node, into_functions=True) if isinstance(c, cst.ClassDef)}
        assigned = {}
        for n in walk(node, into_functions=True):
            if isinstance(n, cst.Assign) and len(n.targets) == 1:
                name = dotted(n.targets[0].target)
                if not name:
                    continue
                if isinstance(n.value, cst.Call) and self.qnames(n.value) & DATAPARALLEL:
                    inner = arg(n.value, "module", 0)
                    self.wrapped[name] = inner.value if inner else None
                else:
                    assigned.setdefault(name, n.value)
        self.assigned = assigned

    def _class_of(self, expr):
        for _ in range(6):
            # Net().to(device), Net().cuda(): the module is the receiver's
            while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and \
                    expr.func.attr.value in ("to", "cuda", "float", "train", "eval"):
                expr = expr.func.value
            if isinstance(expr, cst.Call):
                return self.classes.get(dotted(expr.func) or "")
            d = dotted(expr) if expr is not None else None
            if d is None or d not in self.assigned:
                return None
            expr = self.assigned[d]
        return None

    def _forward_autocasts(self, cls: cst.ClassDef) -> bool:
        for n in cls.body.body:
            if isinstance(n, cst.FunctionDef) and n.name.value == "forward":
                if any(autocast_call(self, d) for d in n.decorators):
                    return True
                return any(isinstance(w, cst.With) and any(autocast_call(self, i) for i in w.items)
                           for w in walk(n))
        return False

    def visit_Call(self, node: cst.Call) -> None:
        name = dotted(node.func)
        if name is None or name not in getattr(self, "wrapped", {}):
            return
        region = enclosing_autocast(self, node)
        if region is None:
            return
        cls = self._class_of(self.wrapped[name])
        if cls is not None and self._forward_autocasts(cls):
            return
        dtype = autocast_dtype(self, region)
        if self.settings.torch_version < PROPAGATES_SINCE:
            self.report(node, f"`{name}` is nn.DataParallel: on torch < 1.7 autocast does not reach its replica "
                              "threads, which run in float32; use DistributedDataParallel or autocast inside forward")
        elif dtype not in (None, "float16"):
            self.report(node, f"`{name}` is nn.DataParallel under a {dtype} autocast: its replicas re-enter autocast "
                              "with the default dtype and compute in float16; use DistributedDataParallel or "
                              "autocast inside forward")
