from ampfix.rule import Invalid, Valid
from ampfix.rules._apex import ApexRule


class ApexOther(ApexRule):
    """
    ## What it does
    Reports every use of NVIDIA apex outside the areas that have their own rule (`apex.amp`
    AMP101, `apex.fp16_utils` AMP102, `apex.parallel` AMP103, `apex.optimizers` AMP104,
    `apex.normalization` AMP105): `apex.contrib`, `apex.transformer`, `apex.mlp`, a bare
    `apex` module object...

    ## Why is this bad?
    apex must be compiled against the exact torch and CUDA versions; most of its pieces have
    native equivalents, and a codebase that imports it cannot run where it is not built.

    ## Example
    ```python
    from apex.contrib.clip_grad import clip_grad_norm_
    ```

    ## Use instead
    The native counterpart (`torch.nn.utils.clip_grad_norm_(..., foreach=True)` here), or keep
    apex deliberately and say so with `# noqa: AMP100`.
    """

    code = "AMP100"
    name = "apex-other"
    summary = "other NVIDIA apex uses (contrib, transformer, mlp...)"
    since = "1.6"
    prefix = "apex"
    others = ("apex.amp", "apex.fp16_utils", "apex.parallel", "apex.optimizers", "apex.normalization")

    VALID = [Valid("apex = 1\nprint(apex)\n"), Valid("from apex import amp\namp.initialize(m)\n")]
    INVALID = [
        Invalid("from apex.contrib.clip_grad import clip_grad_norm_\nclip_grad_norm_(p, 1.0)\n"),
        Invalid("import apex.mlp\nm = apex.mlp.MLP([4, 4])\n"),
    ]


