"""What the rules for apex chosen through a framework's flags share (Lightning, Hugging Face,
Determined): a string argument that says "apex", and argparse options whose default picks it.

Not a rule itself (no registry line)."""
import ast
from ampfix.model.analysis import kwargs, string_value
from ampfix.rule import Rule

LIGHTNING_TRAINER = {
    "pytorch_lightning.Trainer", "pytorch_lightning.trainer.Trainer", "pytorch_lightning.trainer.trainer.Trainer",
    "lightning.Trainer", "lightning.pytorch.Trainer", "lightning.pytorch.trainer.Trainer",
    "lightning.pytorch.trainer.trainer.Trainer",
}
HF_ARGUMENTS = {
    "transformers.TrainingArguments", "transformers.training_args.TrainingArguments",
    "transformers.Seq2SeqTrainingArguments", "transformers.training_args_seq2seq.Seq2SeqTrainingArguments",
}


def is_apex(node) -> bool:
    return string_value(node) is not None and string_value(node).strip().lower() == "apex"


def argparse_default(rule: Rule, node: ast.Call, names: tuple, framework: str, packages: tuple = ()) -> None:
    """``parser.add_argument("--amp_backend", default="apex")``: reported, not fixed (what the
    option feeds is for a person to follow)."""
    if not (isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
        return
    flags = [string_value(a) for a in node.args]
    if not any(f and f.lstrip("-").replace("-", "_") in names for f in flags):
        return
    default = kwargs(node).get("default")
    if default is not None and is_apex(default):
        if packages and not imports_package(rule, packages):
            # the option has the framework's name, but this module does not import it: the
            # project's own code may read it (a trainer of its own with an apex branch)
            rule.report(default, f"an option whose default picks apex (its name is {framework}'s); make the "
                                 "native backend the default, and follow what reads it")
            return
        rule.report(default, f"an option whose default picks apex through {framework}, which no longer has it; "
                             "make the native backend the default (and drop the option where the framework "
                             "no longer takes it)")


def imports_package(rule: Rule, packages: tuple) -> bool:
    """The module imports one of ``packages`` (top-level names: ``("pytorch_lightning", "lightning")``)."""
    return any(names & set(packages) for names in _imported_tops(rule))


def _imported_tops(rule: Rule):
    """The top-level package of each import of the module, one set per import statement."""
    for n in rule.sem.imports:
        if isinstance(n, ast.Import):
            yield {a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ImportFrom) and not n.level and n.module:
            yield {n.module.split(".")[0]}
