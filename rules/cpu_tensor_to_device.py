import ast

from ampfix.model.analysis import arg, has_star, kwargs, method_call, receiver, string_value
from ampfix.model.edits import Edit
from ampfix.rule import Fix, Invalid, Rule, Valid
from ampfix.model.semantic import dotted

DETERMINISTIC = {"zeros", "ones", "empty", "full", "arange", "linspace", "logspace", "eye", "tensor",
                 "empty_strided"}
RANDOM = {"rand", "randn", "randint", "randperm", "normal"}
DEVICE_WORDS = ("device", "dev", "gpu", "rank")


class CpuTensorToDevice(Rule):
    """
    ## What it does
    Reports tensors created on the CPU by a factory and moved to the GPU at once:
    `torch.zeros(n).cuda()`, `torch.tensor(data).to(device)`, `torch.randn(b, d).to("cuda")`.

    What is rewritten, and how:
    * `.cuda()` / `.cuda(d)` -> `device="cuda"` / `device=d` in the factory.
    * `.to(x)` with one argument: when `x` is a device (a string such as `"cuda:0"`, a
      `torch.device(...)` call, or a name that says device: `device`, `args.device`,
      `self.dev`...), `device=x`.  A dtype (`.to(torch.half)`) or another tensor
      (`.to(other)`) is not this rule's business and is left alone.
    * `.to(device, dtype)` / `.to(device=..., dtype=...)` -> both in the factory, unless the
      factory already sets a dtype (the conversion then is a real second step).
    * `non_blocking=` is dropped (nothing is copied any more); `copy=` or `memory_format=`
      leave the code alone, and so does a factory with `generator=`.

    ## Why is this bad?
    The tensor is built in host memory, then copied over PCIe with a synchronizing transfer,
    every time the line runs.  Creating it on the device costs one kernel and no copy.

    Random factories (`rand`, `randn`, `randint`, `randperm`, `normal`) draw from the CUDA
    generator when created on the device, so the numbers change (for a fixed seed): their fix
    is *unsafe*.

    ## Example
    ```python
    mask = torch.zeros(b, t).cuda()
    noise = torch.randn(b, d).to(device)
    ```

    ## Use instead
    ```python
    mask = torch.zeros(b, t, device="cuda")
    noise = torch.randn(b, d, device=device)
    ```
    """

    code = "AMP302"
    name = "cpu-tensor-to-device"
    summary = "tensor made on the CPU by a factory, then copied to the GPU"
    fix_kind = "sometimes"
    since = "1.0"
    triggers = ("cuda", ".to(")

    VALID = [
        Valid("import torch\nx = torch.zeros(3, device='cuda')\n"),
        Valid("import torch\nx = torch.zeros(3).to(torch.float16)\n"),
        Valid("import torch\nx = torch.zeros(3).to(other)\n"),
        Valid("import torch\nx = torch.from_numpy(a).cuda()\n"),
        Valid("import torch\nx = torch.rand(3, generator=g).cuda()\n"),
        Valid("import torch\nx = torch.zeros(3, device='cpu').cuda()\n"),
    ]
    INVALID = [
        Invalid("import torch\nx = torch.zeros(3, 4).cuda()\n",
                expected='import torch\nx = torch.zeros(3, 4, device="cuda")\n'),
        Invalid("import torch\nx = torch.tensor([1, 2]).to(device)\n",
                expected="import torch\nx = torch.tensor([1, 2], device=device)\n"),
        Invalid("import torch as T\nx = T.ones(5).to(args.device, non_blocking=True)\n",
                expected="import torch as T\nx = T.ones(5, device=args.device)\n"),
        Invalid("import torch\nx = torch.arange(10).to(device, torch.float16)\n",
                expected="import torch\nx = torch.arange(10, device=device, dtype=torch.float16)\n"),
        Invalid("import torch\nx = torch.eye(3).to('cuda:1')\n", expected="import torch\nx = torch.eye(3, device='cuda:1')\n"),
        Invalid("import torch\nx = torch.full((2,), 1.0).cuda(rank)\n",
                expected="import torch\nx = torch.full((2,), 1.0, device=rank)\n"),
        Invalid("import torch\nx = torch.randn(8, 16).cuda()\n", message="numbers change",
                expected="import torch\nx = torch.randn(8, 16).cuda()\n"),
        Invalid("import torch\nx = torch.randn(8, 16).cuda()\n", unsafe=True,
                expected='import torch\nx = torch.randn(8, 16, device="cuda")\n'),
        Invalid("from torch import zeros\ndef f(dev):\n    return zeros(2).to(device=dev)\n",
                expected="from torch import zeros\ndef f(dev):\n    return zeros(2, device=dev)\n"),
    ]

    def _is_device(self, expr) -> bool:
        s = string_value(expr)
        if s is not None:
            return s.split(":")[0] in ("cuda", "cpu", "mps", "xpu")
        if isinstance(expr, ast.Call) and self.qnames(expr) & {"torch.device"}:
            return True
        d = dotted(expr)
        if d:
            last = d.split(".")[-1].lower()
            return any(w in last for w in DEVICE_WORDS) and not self.qnames(expr) & {f"torch.{last}"}
        return False

    def visit_Call(self, node: ast.Call) -> None:
        if not method_call(node, "cuda", "to"):
            return
        factory = receiver(node)
        if not isinstance(factory, ast.Call):
            return
        fname = next((q[len("torch."):] for q in self.qnames(factory) if q.startswith("torch.")), None)
        if fname not in DETERMINISTIC | RANDOM:
            return
        if has_star(factory) or arg(factory, "device") is not None or arg(factory, "generator") is not None:
            return
        kws = kwargs(node)
        pos = node.args
        if has_star(node) or set(kws) - {"device", "dtype", "non_blocking"}:
            return
        device = dtype = None
        if node.func.attr == "cuda":
            if len(pos) > 1 or "dtype" in kws:
                return
            device = self.code_of(pos[0]) if pos else (self.code_of(kws["device"]) if "device" in kws else '"cuda"')
        else:
            if len(pos) > 2:
                return
            if pos:
                if not self._is_device(pos[0]):
                    return
                device = self.code_of(pos[0])
                if len(pos) == 2:
                    dtype = self.code_of(pos[1])
            if "device" in kws:
                device = self.code_of(kws["device"])
            if "dtype" in kws:
                dtype = self.code_of(kws["dtype"])
            if device is None:
                return
        if dtype is not None and arg(factory, "dtype") is not None:
            return
        random = fname in RANDOM
        extra = f"device={device}" + (f", dtype={dtype}" if dtype is not None else "")
        # the factory gets the arguments; the `.cuda()` / `.to(...)` goes, from its dot on (what
        # lies between, a comment or a line break inside brackets, stays)
        dot = self._dot(factory, node)
        if dot is None:
            return
        fix = Fix(f"create the tensor on the device (torch.{fname}(..., device=...))",
                  [self.edits.insert_arg(factory, extra), Edit(dot, self.src.span(node)[1], "")], safe=not random)
        move = node.func.attr + "(...)"
        msg = f"`torch.{fname}(...).{move}` builds the tensor on the CPU and copies it; pass `device=` to the factory"
        if random:
            msg += " (unsafe fix: the numbers change, the device's generator draws them)"
        self.report(node, msg, fix)

    def _dot(self, factory, node):
        text = self.src.text
        i = self.src.span(factory)[1]
        end = self.src.span(node.func)[1]
        while i < end:
            c = text[i]
            if c == ".":
                return i
            if c == "#":
                while i < end and text[i] not in "\r\n":
                    i += 1
                continue
            if c not in " \t\r\n\\":
                return None
            i += 1
        return None
