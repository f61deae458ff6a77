from ampfix.rule import Invalid, Valid
from ampfix.rules._apex import ApexRule


class ApexFp16Utils(ApexRule):
    """
    ## What it does
    Reports `apex.fp16_utils`: `FP16_Optimizer` (with its `optimizer.backward(loss)` and
    `clip_master_grads`), `network_to_half`, `BN_convert_float`, `prep_param_lists`.

    ## Why is this bad?
    `FP16_Optimizer` is apex's oldest mixed-precision scheme: a float16 model with float32
    master weights kept by hand.  Native AMP keeps the model in float32 and casts per op under
    autocast, with `GradScaler` for loss scaling: no master copies, no float16 batch norm.

    ## Example
    ```python
    model = network_to_half(model)
    optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)
    optimizer.backward(loss)
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
    No automatic rewrite yet: the float16 model and inputs must go, which needs a person.
    """

    code = "AMP102"
    name = "apex-fp16-utils"
    summary = "apex.fp16_utils (FP16_Optimizer, network_to_half): use torch.autocast + GradScaler"
    since = "1.6"
    prefix = "apex.fp16_utils"

    VALID = [Valid("from mylib.fp16_utils import FP16_Optimizer\nopt = FP16_Optimizer(opt)\n")]
    INVALID = [
        Invalid("from apex.fp16_utils import FP16_Optimizer, network_to_half\nmodel = network_to_half(model)\n"
                "opt = FP16_Optimizer(opt, dynamic_loss_scale=True)\n", count=2),
        Invalid("import apex.fp16_utils as fu\nopt = fu.FP16_Optimizer(opt, static_loss_scale=128.0)\n",
                message="GradScaler"),
    ]
