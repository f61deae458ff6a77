import ast

from ampfix.model.analysis import DATAPARALLEL, arg, autocast_call, autocast_dtype, enclosing_autocast
from ampfix.rule import Invalid, Rule, Valid
from ampfix.model.semantic import dotted, walk

#: torch 1.7 (pytorch/pytorch#43102) made parallel_apply re-enter autocast in the replica
#: threads - with the enabled flag only, so the dtype falls back to float16 on CUDA.
PROPAGATES_SINCE = (1, 7)
PEEL = ("to", "cuda", "float", "train", "eval")


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

    def _values(self, expr):
        """What a name (resolved in its own scope) or ``self.x`` (assigned in the class's
        methods) may hold."""
        if isinstance(expr, ast.Name):
            return self.sem.values_of(expr)
        d = dotted(expr)
        if d and d.startswith("self.") and d.count(".") == 1:
            cls = next((a for a in self.ancestors(expr) if isinstance(a, ast.ClassDef)), None)
            if cls is None:
                return []
            out = []
            for n in walk(cls, into_functions=True):
                if isinstance(n, ast.Assign) and any(dotted(t) == d for t in n.targets):
                    out.append(n.value)
            return out
        return []

    def _dataparallel_inner(self, func):
        """For a called name that holds nn.DataParallel(...): (True, the wrapped module expression)."""
        for v in self._values(func):
            if isinstance(v, ast.Call) and self.qnames(v) & DATAPARALLEL:
                return True, arg(v, "module", 0)
        return False, None

    def _class_of(self, expr):
        for _ in range(6):
            # Net().to(device), Net().cuda(): the module is the receiver's
            while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in PEEL:
                expr = expr.func.value
            if isinstance(expr, ast.Call):
                if isinstance(expr.func, ast.Name):
                    for b in self.sem.bindings_of(expr.func):
                        if b.kind == "class":
                            return b.node
                return None
            values = self._values(expr) if expr is not None else []
            if len(values) != 1:
                return None
            expr = values[0]
        return None

    def _forward_autocasts(self, cls: ast.ClassDef) -> bool:
        for n in cls.body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "forward":
                if any(autocast_call(self.sem, d) for d in n.decorator_list):
                    return True
                return any(isinstance(w, (ast.With, ast.AsyncWith)) and any(autocast_call(self.sem, i) for i in w.items)
                           for w in walk(n))
        return False

    def visit_Call(self, node: ast.Call) -> None:
        name = dotted(node.func)
        if name is None:
            return
        region = enclosing_autocast(self.sem, node)
        if region is None:
            return
        is_dp, inner = self._dataparallel_inner(node.func)
        if not is_dp:
            return
        cls = self._class_of(inner)
        if cls is not None and self._forward_autocasts(cls):
            return
        dtype = autocast_dtype(self.sem, region)
        if self.settings.torch_version < PROPAGATES_SINCE:
            self.report(node, f"`{name}` is nn.DataParallel: on torch < 1.7 autocast does not reach its replica "
                              "threads, which run in float32; use DistributedDataParallel or autocast inside forward")
        elif dtype not in (None, "float16"):
            self.report(node, f"`{name}` is nn.DataParallel under a {dtype} autocast: its replicas re-enter autocast "
                              "with the default dtype and compute in float16; use DistributedDataParallel or "
                              "autocast inside forward")
