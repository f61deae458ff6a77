import ast

from ampfix.model.analysis import arg
from ampfix.rule import Fix, Invalid, Rule, Valid

NAMES = {"torch.amp.custom_fwd", "torch.amp.custom_bwd", "torch.amp.autocast_mode.custom_fwd",
         "torch.amp.autocast_mode.custom_bwd"}


class CustomFwdDevice(Rule):
    """
    ## What it does
    Reports `torch.amp.custom_fwd` / `custom_bwd` used without `device_type`.

    ## Why is this bad?
    The device-generic decorators (torch 2.4+) take a keyword-only `device_type`; without it
    the decorator raises a TypeError when the module is imported (bare `@custom_fwd`) or
    applies to no device.  People hit this when replacing `torch.cuda.amp.custom_fwd` by hand.

    ## Example
    ```python
    @torch.amp.custom_fwd
    def forward(ctx, x): ...
    ```

    ## Use instead
    ```python
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, x): ...
    ```
    """

    code = "AMP210"
    name = "custom-fwd-device-type"
    summary = "torch.amp.custom_fwd/custom_bwd without device_type"
    fix_kind = "safe"
    since = "2.4"
    triggers = ("custom_fwd", "custom_bwd")

    VALID = [Valid("import torch\n@torch.amp.custom_fwd(device_type='cuda')\ndef f(ctx, x):\n    return x\n")]
    INVALID = [
        Invalid("import torch\n@torch.amp.custom_fwd\ndef f(ctx, x):\n    return x\n",
                expected='import torch\n@torch.amp.custom_fwd(device_type="cuda")\ndef f(ctx, x):\n    return x\n'),
        Invalid("from torch.amp import custom_bwd\n@custom_bwd()\ndef b(ctx, g):\n    return g\n",
                expected='from torch.amp import custom_bwd\n@custom_bwd(device_type="cuda")\ndef b(ctx, g):\n    return g\n'),
    ]

    def visit_FunctionDef(self, node) -> None:
        for dec in node.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            if not self.qnames(target) & NAMES:
                continue
            if isinstance(dec, ast.Call):
                if arg(dec, "device_type") is not None:
                    continue
                fix = Fix('add device_type="cuda"', [self.edits.insert_arg(dec, 'device_type="cuda"', first=True)])
            else:
                fix = Fix('add device_type="cuda"', [self.edits.replace(dec, f'{self.code_of(dec)}(device_type="cuda")')])
            self.report(dec, "`custom_fwd`/`custom_bwd` from torch.amp need `device_type=`", fix)

    visit_AsyncFunctionDef = visit_FunctionDef
