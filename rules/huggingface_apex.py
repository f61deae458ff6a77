import ast

from ampfix.model.analysis import kwargs
from ampfix.rule import Fix, Invalid, Rule, Valid
from ampfix.rules._framework import HF_ARGUMENTS, argparse_default, is_apex


class HuggingFaceApex(Rule):
    """
    ## What it does
    Finds Hugging Face `TrainingArguments` that pick apex: `fp16_backend="apex"`,
    `half_precision_backend="apex"`, with their `fp16_opt_level`, and argparse options whose
    default is `"apex"`.  The fix drops those arguments and keeps `fp16=True`, which is native AMP.

    ## Why is this bad?
    `fp16_backend` is deprecated in transformers and the apex backend depends on `apex.amp`,
    which NVIDIA removed from apex in May 2025: a fresh environment cannot run it.  With
    `fp16=True` alone the Trainer uses `torch.autocast` and a GradScaler.

    ## Example
    ```python
    args = TrainingArguments("out", fp16=True, fp16_backend="apex", fp16_opt_level="O2")
    ```

    ## Use instead
    ```python
    args = TrainingArguments("out", fp16=True)
    ```
    """

    code = "AMP109"
    name = "huggingface-apex-backend"
    summary = "Hugging Face TrainingArguments(fp16_backend/half_precision_backend=\"apex\", fp16_opt_level): use fp16=True alone"
    fix_kind = "safe"
    since = "1.6"
    triggers = ("fp16_backend", "half_precision_backend", "fp16_opt_level")

    VALID = [
        Valid('from transformers import TrainingArguments\nargs = TrainingArguments("out", fp16=True)\n'),
        Valid('from transformers import TrainingArguments\nargs = TrainingArguments("out", fp16=True, '
              'half_precision_backend="auto", fp16_opt_level="O1")\n'),
    ]
    INVALID = [
        Invalid('from transformers import TrainingArguments\nargs = TrainingArguments("out", fp16=True, '
                'fp16_backend="apex", fp16_opt_level="O2")\n',
                expected='from transformers import TrainingArguments\nargs = TrainingArguments("out", fp16=True)\n'),
        Invalid('import transformers\nargs = transformers.Seq2SeqTrainingArguments(\n    output_dir="o",\n'
                '    half_precision_backend="apex",\n    fp16=True,\n)\n',
                expected='import transformers\nargs = transformers.Seq2SeqTrainingArguments(\n    output_dir="o",\n'
                         '    fp16=True,\n)\n'),
        Invalid('parser.add_argument("--fp16_backend", default="apex")\n', message="its name is Hugging Face"),
        Invalid('import transformers\nparser.add_argument("--fp16_backend", default="apex")\n',
                message="picks apex through Hugging Face transformers"),
    ]

    def visit_Call(self, node: ast.Call) -> None:
        argparse_default(self, node, ("fp16_backend", "half_precision_backend"), "Hugging Face transformers",
                         ("transformers",))
        if not self.qnames(node) & HF_ARGUMENTS:
            return
        kw = kwargs(node)
        chosen = [k for k in node.keywords if k.arg in ("fp16_backend", "half_precision_backend") and is_apex(k.value)]
        if not chosen:
            return
        drop = chosen + [k for k in node.keywords if k.arg == "fp16_opt_level"]
        fp16 = kw.get("fp16")
        note = "" if fp16 is not None else " (and `fp16=True`, which this call does not set: apex was never used)"
        self.report(node, "the apex backend of Hugging Face's Trainer relies on apex.amp, which NVIDIA removed in May "
                          f"2025; `fp16=True` alone is native AMP (torch.autocast + GradScaler){note}",
                    Fix("drop fp16_backend/half_precision_backend=\"apex\" and fp16_opt_level",
                        self.edits.remove_args(node, drop)))
