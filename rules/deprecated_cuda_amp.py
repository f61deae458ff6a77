import ast

from ampfix.model.analysis import (CPU_AMP_AUTOCAST, CPU_AMP_GRADSCALER, CUDA_AMP_AUTOCAST, CUDA_AMP_GRADSCALER,
                                   bound_by_imports, import_spec)
from ampfix.model.edits import Edit
from ampfix.rule import Fix, ImportSpec, Invalid, Rule, Valid
from ampfix.model.semantic import base_name

CUSTOM = {"torch.cuda.amp.custom_fwd": "custom_fwd", "torch.cuda.amp.custom_bwd": "custom_bwd",
          "torch.cuda.amp.autocast_mode.custom_fwd": "custom_fwd",
          "torch.cuda.amp.autocast_mode.custom_bwd": "custom_bwd"}


class DeprecatedCudaAmp(Rule):
    """
    ## What it does
    Reports the `torch.cuda.amp` spellings `autocast(...)`, `GradScaler(...)`, `custom_fwd`
    and `custom_bwd`, and the `torch.cpu.amp` spellings `autocast(...)` and `GradScaler(...)`,
    when the project targets `torch.amp` (the default), and rewrites them to
    `torch.autocast("cuda", ...)` / `torch.autocast("cpu", ...)`,
    `torch.amp.GradScaler("cuda", ...)` / `torch.amp.GradScaler("cpu", ...)` and
    `torch.amp.custom_fwd(device_type="cuda", ...)`, fixing the imports.

    ## Why is this bad?
    Since torch 2.4 the `torch.cuda.amp` and `torch.cpu.amp` entry points emit a FutureWarning on
    every call and are slated for removal; `torch.amp` has had the device-generic API since 2.3.

    ## Example
    ```python
    from torch.cuda.amp import autocast, GradScaler
    scaler = GradScaler()
    with autocast(dtype=torch.float16):
        ...
    ```

    ## Use instead
    ```python
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        ...
    ```
    Projects pinned below torch 2.3 (found in their dependencies, or `torch-version`) or with
    `target = "torch.cuda.amp"` keep the old spelling, and this rule is silent.
    """

    code = "AMP202"
    name = "deprecated-cuda-amp"
    summary = "torch.cuda.amp / torch.cpu.amp autocast, GradScaler, custom_fwd are deprecated spellings of torch.amp"
    fix_kind = "safe"
    since = "2.3"
    triggers = ("amp",)

    VALID = [
        Valid("import torch\nwith torch.autocast('cuda'):\n    pass\n"),
        Valid("from torch.cuda.amp import autocast\nwith autocast():\n    pass\n", settings={"target": "torch.cuda.amp"}),
        Valid("from torch.amp import GradScaler\ns = GradScaler('cuda')\n"),
        Valid("import torch\ns = torch.cuda.amp.GradScaler()\n", settings={"torch_version": "1.13"}),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.cuda.amp import autocast, GradScaler

            scaler = GradScaler()  # keep me
            with autocast(dtype=torch.float16):
                pass
            """,
            expected="""
            import torch

            scaler = torch.amp.GradScaler("cuda")  # keep me
            with torch.autocast("cuda", dtype=torch.float16):
                pass
            """,
            count=2,
        ),
        Invalid(
            """
            import torch
            with torch.cuda.amp.autocast(enabled=use_amp):
                y = model(x)
            """,
            expected="""
            import torch
            with torch.autocast("cuda", enabled=use_amp):
                y = model(x)
            """,
        ),
        Invalid(
            """
            import torch.cuda.amp as amp

            class F(torch.autograd.Function):
                @staticmethod
                @amp.custom_fwd
                def forward(ctx, x):
                    return x

                @staticmethod
                @amp.custom_bwd
                def backward(ctx, g):
                    return g
            """,
            expected="""
            import torch

            class F(torch.autograd.Function):
                @staticmethod
                @torch.amp.custom_fwd(device_type="cuda")
                def forward(ctx, x):
                    return x

                @staticmethod
                @torch.amp.custom_bwd(device_type="cuda")
                def backward(ctx, g):
                    return g
            """,
            count=2,
        ),
        Invalid(
            """
            from torch.cuda.amp import custom_fwd
            import torch
            @custom_fwd(cast_inputs=torch.float32)
            def f(ctx, x):
                return x
            """,
            expected="""
            import torch
            @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
            def f(ctx, x):
                return x
            """,
        ),
        Invalid("from torch.cuda.amp import GradScaler\nisinstance(s, GradScaler)\n", message="no automatic fix"),
        Invalid("import torch\nfrom torch.cuda.amp import custom_fwd\nnms = custom_fwd(_C.nms)\n",
                expected='import torch\nnms = torch.amp.custom_fwd(_C.nms, device_type="cuda")\n'),
        Invalid("import torch\nwith torch.cpu.amp.autocast(dtype=torch.bfloat16):\n    pass\n",
                expected='import torch\nwith torch.autocast("cpu", dtype=torch.bfloat16):\n    pass\n'),
        Invalid("import torch\nfrom torch.cpu.amp import autocast\nwith autocast():\n    pass\n",
                expected='import torch\nwith torch.autocast("cpu"):\n    pass\n'),
        Invalid("import torch\ns = torch.cpu.amp.GradScaler()\n", expected='import torch\ns = torch.amp.GradScaler("cpu")\n'),
    ]

    def _imports(self, node):
        base = base_name(node.func if isinstance(node, ast.Call) else node)
        spec = import_spec(self.sem, base) if base is not None else None
        removes = [spec] if spec is not None and spec.module.startswith(("torch.cuda", "torch.cpu")) else []
        return [ImportSpec("torch")], removes

    def visit_Call(self, node: ast.Call) -> None:
        if self.settings.target != "torch.amp":
            return  # below torch 2.3 (the target follows the torch release) the old spelling is right
        names = self.qnames(node)
        device = "cuda"
        if names & (CPU_AMP_AUTOCAST | CPU_AMP_GRADSCALER):
            device = "cpu"
        if names & (CUDA_AMP_AUTOCAST | CPU_AMP_AUTOCAST):
            func, what, first = "torch.autocast", "autocast", f'"{device}"'
        elif names & (CUDA_AMP_GRADSCALER | CPU_AMP_GRADSCALER):
            func, what, first = "torch.amp.GradScaler", "GradScaler", f'"{device}"'
        elif names & set(CUSTOM):
            kind = CUSTOM[sorted(names & set(CUSTOM))[0]]
            adds, removes = self._imports(node)
            # a keyword after the positional arguments (`custom_fwd(fwd, device_type=...)`, the
            # function form), before the other keywords
            at = (Edit(self.edits.span(node.args[-1])[1], self.edits.span(node.args[-1])[1], ', device_type="cuda"')
                  if node.args else self.edits.insert_arg(node, 'device_type="cuda"', first=True))
            fix = Fix(f"torch.cuda.amp.{kind} -> torch.amp.{kind}(device_type=\"cuda\")",
                      [self.edits.replace(node.func, f"torch.amp.{kind}"), at],
                      add_imports=adds, remove_imports=removes)
            self.report(node, f"`torch.cuda.amp.{kind}` is deprecated; use `torch.amp.{kind}(device_type=\"cuda\")`", fix)
            return
        else:
            return
        adds, removes = self._imports(node)
        fix = Fix(f"torch.{device}.amp.{what} -> {func}({first}, ...)",
                  [self.edits.replace(node.func, func), self.edits.insert_arg(node, first, first=True)],
                  add_imports=adds, remove_imports=removes)
        self.report(node, f"`torch.{device}.amp.{what}(...)` is deprecated since torch 2.4; use `{func}({first}, ...)`",
                    fix)

    def visit_Module(self, node: ast.Module) -> None:
        self.torch_bound = bound_by_imports(node, "torch")

    def _reference(self, node) -> None:
        """A non-call reference (isinstance, a bare decorator): report; fix bare custom_fwd."""
        if self.settings.target != "torch.amp":
            return  # below torch 2.3 (the target follows the torch release) the old spelling is right
        base = base_name(node)
        if base is None or base.id not in self.torch_bound:
            return
        parent = self.parent(node)
        if isinstance(parent, ast.Call) and parent.func is node:
            return
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return
        names = self.qnames(node)
        if names & set(CUSTOM) and isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and any(d is node for d in parent.decorator_list):
            kind = CUSTOM[sorted(names & set(CUSTOM))[0]]
            adds, removes = self._imports(node)
            fix = Fix(f"torch.cuda.amp.{kind} -> torch.amp.{kind}(device_type=\"cuda\")",
                      [self.edits.replace(node, f'torch.amp.{kind}(device_type="cuda")')],
                      add_imports=adds, remove_imports=removes)
            self.report(node, f"`torch.cuda.amp.{kind}` is deprecated; use `torch.amp.{kind}(device_type=\"cuda\")`", fix)
        elif names & (CUDA_AMP_AUTOCAST | CUDA_AMP_GRADSCALER | CPU_AMP_AUTOCAST | CPU_AMP_GRADSCALER):
            device = "cpu" if names & (CPU_AMP_AUTOCAST | CPU_AMP_GRADSCALER) else "cuda"
            self.report(node, f"`torch.{device}.amp` name is deprecated; refer to `torch.amp` instead "
                              "(no automatic fix for a reference that is not a call)")

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self._reference(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.ctx, ast.Load):
            self._reference(node)
