"""Shapes met on the tenth round's repositories (songlab-cal/tape, allenai/longformer,
studio-ousia/luke, microsoft/LoRA), as small inline scripts; the trainer that picks its backend
by an option is the project fixture backend_trainer (tests/test_projects.py)."""
import textwrap

from ampfix.engine.check import check_source
from ampfix.engine.tidy import checks_for_apex, removal_of_unused
from ampfix.model.semantic import Model
from ampfix.model.settings import Settings
from ampfix.model.source import Source
from ampfix.model.edits import apply_edits
from ampfix.registry import all_rules
from ampfix.rule import ImportSpec

import ast
import shutil
from pathlib import Path

import torch


def run(src):
    return check_source(textwrap.dedent(src).encode(), "x.py", all_rules(), Settings(), fix="safe")


# luke's legacy trainer: the optimizer is copied from self, initialized under its local name, and
# stepped through self
LOCAL_COPY = """\
    import torch


    class Trainer:
        def __init__(self, args, model, loader):
            self.args = args
            self.model = model
            self.loader = loader
            self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def train(self):
            model = self.model
            optimizer = self.optimizer
            if self.args.fp16:
                from apex import amp

                model, optimizer = amp.initialize(model, optimizer, opt_level=self.args.fp16_opt_level)
            for x, y in self.loader:
                loss = torch.nn.functional.mse_loss(model(x), y)
                if self.args.fp16:
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                self.optimizer.step()
                model.zero_grad()
"""


def test_a_step_through_self_of_the_initialized_local_copy_is_the_scalers():
    out = run(LOCAL_COPY).fixed
    assert "amp.initialize" not in out and "apex" not in out
    assert "self.scaler.step(self.optimizer)" in out and "self.scaler.update()" in out
    # only train() makes and reads the scaler: no disabled one in __init__ as well
    assert out.count("GradScaler(") == 1
    compile(out, "x.py", "exec")


def test_a_copy_rebound_otherwise_is_not_followed():
    src = LOCAL_COPY.replace("            for x, y in self.loader:",
                             "            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                             "            for x, y in self.loader:")
    res = run(src)
    assert "amp.initialize" in res.fixed  # refused: the step of the copy is not the scaled optimizer's


# LoRA's NLG script: the helper that scales the backward gets `loss / accumulation`
EXPRESSION = """\
    import torch
    from apex import amp


    def optimizer_step(loss, optimizer, model, args, is_update=True):
        if args.fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        if is_update:
            optimizer.step()
            optimizer.zero_grad()


    def train(model, optimizer, loader, args):
        for i, (x, y) in enumerate(loader):
            out = model(x)
            loss = torch.nn.functional.mse_loss(out, y)
            optimizer_step(loss / args.grad_acc, optimizer, model, args, is_update=(i + 1) % args.grad_acc == 0)


    def main(args, model, loader):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if args.fp16:
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        train(model, optimizer, loader, args)
"""


def test_a_loss_handed_over_as_arithmetic_gets_its_forward_under_autocast():
    out = run(EXPRESSION).fixed
    assert "amp.scale_loss" not in out and "amp.initialize" not in out
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if "torch.autocast(" in line)
    assert "out = model(x)" in lines[head + 1]
    assert "loss / args.grad_acc," in out and "scaler.step(optimizer)" in out and "scaler=scaler" in out
    compile(out, "x.py", "exec")


def test_a_loss_computed_in_the_call_is_still_refused():
    src = EXPRESSION.replace("optimizer_step(loss / args.grad_acc", "optimizer_step(torch.nn.functional.mse_loss(out, y)")
    assert "amp.initialize" in run(src).fixed


def _tidy(text, specs):
    src = Source(text.encode(), "x.py", text=text)
    src.parse()
    return apply_edits(text, removal_of_unused(src, Model(src.tree), specs))


def test_an_alias_a_line_import_keeps_its_layout():
    text = ("from transformers import (\n    Trainer,\n    is_apex_available,\n)\n\n"
            "if is_apex_available():\n    from apex import amp\n\nTrainer()\n")
    out = _tidy(text, [ImportSpec("apex", "amp", None), ImportSpec("transformers", "is_apex_available", None)])
    assert out == "from transformers import (\n    Trainer,\n)\n\nTrainer()\n"


def test_a_torch_version_test_goes_with_the_import_it_guarded():
    text = ("import torch\nfrom packaging import version\n\n"
            "if version.parse(torch.__version__) >= version.parse(\"1.6\"):\n"
            "    from torch.cuda.amp import autocast\n\ntorch.zeros(1)\n")
    out = _tidy(text, [ImportSpec("torch.cuda.amp", "autocast", None)])
    assert out == "import torch\n\ntorch.zeros(1)\n"
    # still read elsewhere: the import of `version` stays, and so does nothing else
    kept = _tidy(text + "print(version.parse('1'))\n", [ImportSpec("torch.cuda.amp", "autocast", None)])
    assert "from packaging import version" in kept and "autocast" not in kept


def test_checks_for_apex():
    assert checks_for_apex(ast.parse('importlib.util.find_spec("apex") is not None').body[0].value)
    assert checks_for_apex(ast.parse("is_apex_available()").body[0].value)
    assert not checks_for_apex(ast.parse("torch.cuda.is_available()").body[0].value)


# SegmentationBLWX/sssegmentation (round 11): the back end is a configuration's "type", compared
# with `in [...]`; the native path unpacks keyword groups of the same configuration
CONFIG_TYPE = """\
    import copy

    import torch


    def train(cfg, model, optimizer, loader):
        fp16_cfg = copy.deepcopy(cfg.get('fp16_cfg', {'type': None}))
        fp16_type, grad_scaler = fp16_cfg.pop('type'), None
        assert fp16_type in [None, 'apex', 'pytorch']
        if fp16_type in ['apex']:
            import apex
            model, optimizer = apex.amp.initialize(model, optimizer, **fp16_cfg['initialize'])
        elif fp16_type in ['pytorch']:
            from torch.cuda.amp import GradScaler, autocast
            grad_scaler = GradScaler(**fp16_cfg['grad_scaler'])
        for x, y in loader:
            optimizer.zero_grad()
            if fp16_type in ['pytorch']:
                with autocast(**fp16_cfg['autocast']):
                    loss = torch.nn.functional.mse_loss(model(x), y)
            else:
                loss = torch.nn.functional.mse_loss(model(x), y)
            if fp16_type in ['apex']:
                with apex.amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            elif fp16_type in ['pytorch']:
                grad_scaler.scale(loss).backward()
            else:
                loss.backward()
            if fp16_type in ['pytorch']:
                grad_scaler.step(optimizer)
                grad_scaler.update()
            else:
                optimizer.step()
"""


def _module(code):
    ns = {}
    exec(compile(code, "x.py", "exec"), ns)
    return ns


def test_an_apex_type_read_from_a_configuration_is_routed_to_the_native_path():
    out = run(CONFIG_TYPE).fixed
    assert "apex.amp.initialize" not in out and "apex.amp.scale_loss" not in out and "import apex" not in out
    assert "fp16_cfg.setdefault('grad_scaler', {})" in out and "fp16_cfg.setdefault('autocast', {})" in out
    assert out.index("if fp16_type == 'apex':") < out.index("assert fp16_type in")
    # it runs with the configuration written for apex, and with none
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.randn(3, 4), torch.randn(3, 2))]
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _module(textwrap.dedent(out))["train"]({"fp16_cfg": {"type": "apex", "initialize": {"opt_level": "O1"}}},
                                               model, opt, data)
        _module(textwrap.dedent(out))["train"]({}, model, opt, data)


def test_a_plain_read_of_the_configuration_on_the_native_path_refuses():
    src = CONFIG_TYPE.replace("GradScaler(**fp16_cfg['grad_scaler'])", "GradScaler(init_scale=fp16_cfg['scale'])")
    res = run(src)
    assert res.fixed is not None and "apex.amp.initialize" in res.fixed  # left: the AMP101 says why


# round 12: the Swin lineage's registry hook inside a subfolder of a repository whose classifier
# at the root keeps an apex loss-scaler class of its own (NVlabs/FAN), and a sibling project's
# copy of the runner that saves apex's state with no apex setup of its own (Sense-X/UniFormer)
REGISTRY = Path(__file__).resolve().parents[1] / "fixtures" / "projects" / "registry_hook" / "before"

UNSWITCHED_SCALER = """\
from apex import amp


class SamScaler:
    def __call__(self, loss, optimizer):
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
"""


def _migrate(root):
    from click.testing import CliRunner

    from ampfix.cli import main

    return CliRunner().invoke(main, ["migrate", "--write", "--torch-version", "2.4", str(root)])


CLASSIFIER = """\
import torch
from apex import amp

from utils.scaler import SamScaler


def main(model, loader):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
"""


def test_a_registry_hook_in_a_subfolder_migrates_beside_an_unswitched_scaler_elsewhere(tmp_path):
    shutil.copytree(REGISTRY, tmp_path / "detection")
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "__init__.py").write_text("")
    (tmp_path / "utils" / "scaler.py").write_text(UNSWITCHED_SCALER)
    (tmp_path / "main.py").write_text(CLASSIFIER)
    out = _migrate(tmp_path)
    assert out.exit_code in (0, 1), out.output
    for p in (tmp_path / "detection").rglob("*.py"):
        assert p.read_text() == (REGISTRY.parent / "after" / p.relative_to(tmp_path / "detection")).read_text(), p
    # the scaler class nothing initializes apex for stays, with its reason
    assert (tmp_path / "utils" / "scaler.py").read_text() == UNSWITCHED_SCALER
    assert "utils/scaler.py" in out.output and "not rewritten" in out.output


def test_a_sibling_copy_of_the_runner_without_a_setup_stays(tmp_path):
    shutil.copytree(REGISTRY, tmp_path / "detection")
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "__init__.py").write_text("")
    (tmp_path / "utils" / "scaler.py").write_text(UNSWITCHED_SCALER)
    (tmp_path / "main.py").write_text(CLASSIFIER)
    (tmp_path / "segmentation" / "custom").mkdir(parents=True)
    for name in ("checkpoint.py", "runner.py"):
        shutil.copy(REGISTRY / "custom" / name, tmp_path / "segmentation" / "custom" / name)
    (tmp_path / "segmentation" / "custom" / "__init__.py").write_text("")
    shutil.copytree(REGISTRY / "tinymm", tmp_path / "segmentation" / "tinymm")
    out = _migrate(tmp_path)
    assert out.exit_code in (0, 1), out.output
    for p in (tmp_path / "detection").rglob("*.py"):
        assert p.read_text() == (REGISTRY.parent / "after" / p.relative_to(tmp_path / "detection")).read_text(), p
    # the copy whose project never initializes apex is not tied to the detector's hook: its
    # saved state goes on its own (nothing in its part initializes apex), the rest of it stays
    for name in ("checkpoint.py", "runner.py"):
        before = (REGISTRY / "custom" / name).read_text()
        after = (tmp_path / "segmentation" / "custom" / name).read_text()
        assert "apex.amp" in before and "apex.amp" not in after and "import apex" not in after, after
        compile(after, name, "exec")
        kept = [x for x in before.splitlines() if "apex" not in x and "amp" not in x]
        assert all(x in after.splitlines() for x in kept if x.strip().startswith(("def ", "class "))), after
    assert "its saved state goes (nothing here initializes apex)" in out.output


def test_a_reason_survives_when_other_fixes_rewrite_the_file(tmp_path):
    """The passes after the first run with no plan: what is left keeps the planner's reason."""
    from click.testing import CliRunner

    from ampfix.cli import main

    src = textwrap.dedent(CONFIG_TYPE.replace("GradScaler(**fp16_cfg['grad_scaler'])",
                                              "GradScaler(init_scale=fp16_cfg['scale'])"))
    (tmp_path / "x.py").write_text(src)
    out = CliRunner().invoke(main, ["migrate", "--torch-version", "2.4", str(tmp_path / "x.py")]).output
    assert "would be rewritten: torch.cuda.amp.GradScaler" in out  # the deprecated names are fixed
    left = [line for line in out.splitlines() if "left for a person" in line and "apex.amp.initialize" in line]
    assert len(left) == 1 and "(not rewritten: " in left[0], out
