import ast
from typing import Optional, Tuple

from ampfix.model.analysis import has_star, kwargs, string_value
from ampfix.rule import Fix, Invalid, Rule, Valid
from ampfix.rules._framework import LIGHTNING_TRAINER, argparse_default, imports_package, is_apex


LIGHTNING = ("pytorch_lightning", "lightning")


class LightningApex(Rule):
    """
    ## What it does
    Finds PyTorch Lightning's apex switches: `Trainer(amp_backend="apex", amp_level="O2")`, an
    `amp_level` without it, the same keys set in a dict the Trainer is handed as `**kwargs`, and
    argparse options whose default is `"apex"`.  The fix drops
    `amp_backend` and `amp_level` and writes `precision="16-mixed"` for `precision=16`.

    ## Why is this bad?
    Lightning 2.0 removed apex: `amp_backend` and `amp_level` are no longer `Trainer` arguments,
    so the script stops at start-up with a `TypeError`.  Lightning 1.x already refused
    `amp_level` without the apex backend.  Native AMP (`precision="16-mixed"`) is what Lightning
    uses instead: float16 autocast and a GradScaler, float32 weights (what apex's O1 did; O2's
    float16 model copy is not needed).

    ## Example
    ```python
    trainer = pl.Trainer(gpus=1, precision=16, amp_backend="apex", amp_level="O2")
    ```

    ## Use instead
    ```python
    trainer = pl.Trainer(gpus=1, precision="16-mixed")
    ```
    """

    code = "AMP108"
    name = "lightning-apex-backend"
    summary = "PyTorch Lightning Trainer(amp_backend=\"apex\", amp_level=...): removed in Lightning 2.0; use precision=\"16-mixed\""
    fix_kind = "safe"
    since = "1.6"
    triggers = ("amp_backend", "amp_level")

    VALID = [
        Valid('import pytorch_lightning as pl\ntrainer = pl.Trainer(precision="16-mixed")\n'),
        Valid('import pytorch_lightning as pl\ntrainer = pl.Trainer(precision=16, amp_backend="native")\n'),
        Valid('trainer = MyTrainer(amp_backend="apex")\n'),
        Valid('import pytorch_lightning as pl\nconfig = Config(amp_backend="native")\n'),
        # a dict of keys that no Lightning Trainer receives
        Valid('import pytorch_lightning as pl\nparams = {}\nparams["amp_level"] = "O2"\nrun(**params)\n'),
    ]
    INVALID = [
        Invalid('import pytorch_lightning as pl\ntrainer = pl.Trainer(gpus=1, precision=16, amp_backend="apex", '
                'amp_level="O2")\n',
                expected='import pytorch_lightning as pl\ntrainer = pl.Trainer(gpus=1, precision="16-mixed")\n'),
        Invalid('from lightning.pytorch import Trainer\ntrainer = Trainer(\n    max_epochs=3,\n    amp_backend="apex",\n'
                '    precision=16,  # mixed\n)\n',
                expected='from lightning.pytorch import Trainer\ntrainer = Trainer(\n    max_epochs=3,\n'
                         '    precision="16-mixed",  # mixed\n)\n'),
        Invalid('import pytorch_lightning as pl\ntrainer = pl.Trainer(precision=16, amp_level="O1")\n',
                expected='import pytorch_lightning as pl\ntrainer = pl.Trainer(precision="16-mixed")\n'),
        Invalid('import pytorch_lightning as pl\ntrainer = pl.Trainer(precision=args.precision, amp_backend="apex")\n',
                expected='import pytorch_lightning as pl\ntrainer = pl.Trainer(precision=args.precision)\n',
                message="16-mixed"),
        Invalid('parser.add_argument("--amp_backend", type=str, default="apex")\n', message="default picks apex"),
        # chosen at run time: reported, not fixed (Lightning 2.0 takes neither argument)
        Invalid('import pytorch_lightning as pl\ntrainer = pl.Trainer(precision=config.precision, '
                'amp_backend=config.amp_backend, amp_level=config.amp_level)\n', message="chosen at run time"),
        # a configuration object a Trainer reads later, in a module that uses Lightning
        Invalid('import pytorch_lightning as pl\nconfig = Config(precision=16, amp_backend="apex", amp_level="O2")\n',
                message="a setting that picks NVIDIA apex"),
        # keys set in a dict the Trainer is handed as `**train_params` (Hugging Face's lightning_base.py)
        Invalid('import pytorch_lightning as pl\n\n\ndef build(args):\n    train_params = {}\n    if args.fp16:\n'
                '        train_params["precision"] = 16\n        train_params["amp_level"] = args.fp16_opt_level\n'
                '    return pl.Trainer.from_argparse_args(args, **train_params)\n',
                expected='import pytorch_lightning as pl\n\n\ndef build(args):\n    train_params = {}\n'
                         '    if args.fp16:\n        train_params["precision"] = "16-mixed"\n'
                         '    return pl.Trainer.from_argparse_args(args, **train_params)\n'),
        # the only statement of its block: reported, what replaces it is for a person
        Invalid('import pytorch_lightning as pl\nkw = {}\nif fast:\n    kw["amp_backend"] = "apex"\n'
                'trainer = pl.Trainer(**kw)\n', message="handed to a Lightning Trainer as `**kw`"),
        # both keys in one block: one report, one fix
        Invalid('import pytorch_lightning as pl\nkw = {}\nif fp16:\n    kw["precision"] = 16\n'
                '    kw["amp_level"] = "O2"\n    kw["amp_backend"] = "apex"\ntrainer = pl.Trainer(**kw)\n',
                expected='import pytorch_lightning as pl\nkw = {}\nif fp16:\n    kw["precision"] = "16-mixed"\n'
                         'trainer = pl.Trainer(**kw)\n'),
        # no precision: float32 training, where apex never ran; only the arguments go
        Invalid('import pytorch_lightning as pl\ntrainer = pl.Trainer(gpus=1, amp_backend="apex", amp_level="O2")\n',
                expected='import pytorch_lightning as pl\ntrainer = pl.Trainer(gpus=1)\n',
                message="trains in float32, as it did"),
    ]

    def visit_Call(self, node: ast.Call) -> None:
        argparse_default(self, node, ("amp_backend",), "PyTorch Lightning", LIGHTNING)
        if not self.qnames(node) & LIGHTNING_TRAINER:
            self._setting(node)
            return
        kw = kwargs(node)
        backend, level = kw.get("amp_backend"), kw.get("amp_level")
        apex = backend is not None and is_apex(backend)
        if not apex and level is None:
            return
        if backend is not None and not apex and string_value(backend) is None:
            # chosen at run time (`amp_backend=config.amp_backend`): what it holds is for a person to
            # follow, but Lightning 2.0 takes neither argument, whatever the value
            self.report(backend, f"`amp_backend={self.src.code(backend)}` is chosen at run time, and Lightning 2.0 "
                                 "removed `amp_backend` and `amp_level` (the Trainer no longer takes them): where "
                                 "it picks apex, use native AMP, `precision=\"16-mixed\"`, and drop both")
            return
        drop = [k for k in node.keywords if k.arg in ("amp_level",) or (apex and k.arg == "amp_backend")]
        edits = self.edits.remove_args(node, drop)
        precision = kw.get("precision")
        note = ""
        done = "drop amp_backend/amp_level"
        if isinstance(precision, ast.Constant) and precision.value in (16, "16"):
            edits.append(self.edits.replace(precision, '"16-mixed"'))
            done += "; precision=16 -> \"16-mixed\""
        elif precision is not None and not isinstance(precision, ast.Constant):
            note = (" (`precision` is computed here: give it \"16-mixed\" where it was 16, as Lightning 2 spells "
                    "native AMP)")
        elif precision is None and not has_star(node):
            # no precision: the Trainer trains in float32, and apex never ran (it did only with 16)
            note = " (no `precision` here: the Trainer trains in float32, as it did; apex ran only with precision 16)"
            done += " (float32 stays float32)"
        what = "`amp_backend=\"apex\"`" if apex else "`amp_level`"
        self.report(node, f"{what} picks NVIDIA apex, which Lightning 2.0 removed (the Trainer no longer takes "
                          f"`amp_backend`/`amp_level`); use native AMP: `precision=\"16-mixed\"`{note}",
                    Fix(done, edits))

    def visit_Assign(self, node: ast.Assign) -> None:
        """``train_params["amp_level"] = args.fp16_opt_level`` (or ``["amp_backend"] = "apex"``) in a
        dict the same function hands to a Lightning Trainer as ``**train_params`` (Hugging Face's
        ``lightning_base.py`` and its copies): one report for the block's keys, which go, and
        ``["precision"] = 16`` becomes ``"16-mixed"`` as for the keyword."""
        name = self._apex_key(node)
        if name is None:
            return
        unit = next((a for a in self.ancestors(node) if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                          ast.Module))), None)
        if unit is None or not any(
                isinstance(c, ast.Call) and self._makes_trainer(c) and any(
                    k.arg is None and isinstance(k.value, ast.Name) and k.value.id == name for k in c.keywords)
                for c in ast.walk(unit)):
            return
        parent = self.parent(node)
        siblings = next((b for b in (getattr(parent, f, None) for f in ("body", "orelse", "finalbody"))
                         if isinstance(b, list) and any(x is node for x in b)), [node])
        keyed = [st for st in siblings if self._apex_key(st) == name]
        if keyed[0] is not node:
            return  # reported with the block's first key
        what = ", ".join(f'`{name}["{string_value(st.targets[0].slice)}"]`' for st in keyed)
        one = len(keyed) == 1
        message = (f"{what} {'is' if one else 'are'} handed to a Lightning Trainer as `**{name}` and "
                   f"{'picks' if one else 'pick'} NVIDIA apex, which Lightning 2.0 removed (the Trainer no longer "
                   "takes `amp_backend`/`amp_level`); use native AMP: `precision=\"16-mixed\"`")
        if len(keyed) == len(siblings):
            self.report(node, message)  # the whole block: what replaces it is for a person
            return
        edits = [self.edits.remove_statement(st) for st in keyed]
        done = f"drop {what}"
        for st in siblings:
            if _dict_key(st) == (name, "precision") and isinstance(st.value, ast.Constant) and \
                    st.value.value in (16, "16"):
                edits.append(self.edits.replace(st.value, '"16-mixed"'))
                done += '; precision 16 -> "16-mixed"'
        self.report(node, message, Fix(done, edits))

    @staticmethod
    def _apex_key(st) -> Optional[str]:
        """The dict's name where ``st`` is ``d["amp_level"] = ...`` or ``d["amp_backend"] = "apex"``."""
        name, key = _dict_key(st) or (None, None)
        if key == "amp_level" or (key == "amp_backend" and is_apex(st.value)):
            return name
        return None

    def _makes_trainer(self, call: ast.Call) -> bool:
        """``pl.Trainer(...)`` or ``pl.Trainer.from_argparse_args(args, ...)``."""
        qs = self.qnames(call)
        return bool(qs & LIGHTNING_TRAINER) or any(
            q.endswith(".from_argparse_args") and q.rsplit(".", 1)[0] in LIGHTNING_TRAINER for q in qs)

    def _setting(self, node: ast.Call) -> None:
        """``Config(precision=16, amp_backend="apex")`` in a module that uses Lightning: a setting
        that a Trainer reads later (reported where it picks apex; what reads it is for a person)."""
        for k in node.keywords:
            if k.arg == "amp_backend" and is_apex(k.value) and imports_package(self, LIGHTNING):
                self.report(k.value, "a setting that picks NVIDIA apex for Lightning's `amp_backend`, which "
                                     "Lightning 2.0 removed; choose native AMP (`precision=\"16-mixed\"`) and drop "
                                     "`amp_backend`/`amp_level` where the Trainer is given them")


def _dict_key(st) -> Optional[Tuple[str, Optional[str]]]:
    """(the dict's name, the key) where ``st`` is ``d["key"] = value``."""
    t = st.targets[0] if isinstance(st, ast.Assign) and len(st.targets) == 1 else None
    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
        return t.value.id, string_value(t.slice)
    return None
