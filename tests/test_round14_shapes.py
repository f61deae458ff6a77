"""Shapes met reading the fourteenth round's side-by-side diffs of modules the corpus counted
right: a vendored Hugging Face trainer whose apex path goes (its `self.use_apex = False` and its
relative `is_apex_available` import stayed as dead code), and a comment on half precision above
an apex setup block that went.  apex DDP's own methods are AMP103's examples (rules/apex_parallel.py)."""
import textwrap
from pathlib import Path

from click.testing import CliRunner

from ampfix.cli import main

FILE_UTILS = '''\
import importlib.util


def is_apex_available():
    return importlib.util.find_spec("apex") is not None
'''

TRAINER = '''\
import torch

from .file_utils import is_apex_available, logger_name

if is_apex_available():
    from apex import amp


class Trainer:
    def __init__(self, model, optimizer, args):
        self.model = model
        self.optimizer = optimizer
        self.args = args
        self.use_amp = False
        self.use_apex = False
        if args.fp16:
            if args.fp16_backend == "amp":
                self.use_amp = True
                self.scaler = torch.cuda.amp.GradScaler()
            else:
                if not is_apex_available():
                    raise ImportError("Using FP16 with APEX but APEX is not installed.")
                self.use_apex = True

    def wrap_model(self, model):
        # Mixed precision training with apex (torch < 1.6)
        if self.use_apex:
            model, self.optimizer = amp.initialize(model, self.optimizer, opt_level=self.args.fp16_opt_level)
        return model

    def training_step(self, model, x):
        if self.use_amp:
            with torch.cuda.amp.autocast():
                loss = model(x).mean()
        else:
            loss = model(x).mean()
        if self.use_amp:
            self.scaler.scale(loss).backward()
        elif self.use_apex:
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        return loss.detach()

    def step(self, model):
        torch.nn.utils.clip_grad_norm_(
            amp.master_params(self.optimizer) if self.use_apex else model.parameters(), 1.0)
        if self.use_amp:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
'''


def write(root: Path, files: dict) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def migrate(root: Path):
    return CliRunner().invoke(main, ["migrate", "--write", "--torch-version", "2.4", str(root)])


def test_vendored_trainer_loses_its_dead_apex_flag_and_relative_import(tmp_path):
    write(tmp_path, {"pkg/__init__.py": "", "pkg/file_utils.py": FILE_UTILS + "\nlogger_name = 'x'\n",
                     "pkg/trainer.py": TRAINER})
    out = migrate(tmp_path)
    assert out.exit_code == 0, out.output
    after = (tmp_path / "pkg" / "trainer.py").read_text()
    assert "apex" not in after.lower(), after
    assert "use_apex" not in after and "is_apex_available" not in after, after
    # what the module still reads from the relative import stays
    assert "from .file_utils import logger_name" in after, after
    compile(after, "trainer.py", "exec")


def test_a_flag_read_in_another_module_is_kept(tmp_path):
    write(tmp_path, {"pkg/__init__.py": "", "pkg/file_utils.py": FILE_UTILS + "\nlogger_name = 'x'\n",
                     "pkg/trainer.py": TRAINER,
                     "pkg/report.py": "def report(trainer):\n    return {'apex': trainer.use_apex}\n"})
    out = migrate(tmp_path)
    assert out.exit_code == 0, out.output
    after = (tmp_path / "pkg" / "trainer.py").read_text()
    assert "self.use_apex = False" in after, after


EINSUM = textwrap.dedent('''\
    import torch


    def main(args, model):
        model.train()

        # We want fp16 execution of torch.einsum if args.fp16 is set.
        if args.fp16:
            try:
                import apex

                apex.amp.register_half_function(torch, "einsum")
            except ImportError:
                raise ImportError("Please install apex to use fp16 training.")

        # Training
        return model
''')


def test_a_comment_on_half_precision_goes_with_the_setup_block_under_it(tmp_path):
    write(tmp_path, {"run.py": EINSUM})
    out = migrate(tmp_path)
    assert out.exit_code == 0, out.output
    after = (tmp_path / "run.py").read_text()
    assert "einsum" not in after and "apex" not in after, after
    assert "# Training" in after and "model.train()" in after, after


# thunlp/OpenMatch's DANCE driver (and its kind): the batch comes from a `try: next(it)` whose
# `except StopIteration:` evaluates the model before starting the data again; the model read
# there computes nothing the loss needs, so the region is the forward pass alone
STREAMING = textwrap.dedent('''\
    import torch
    from apex import amp


    def evaluate(model, data):
        model.eval()
        with torch.no_grad():
            out = sum(model(x).sum() for x in data)
        model.train()
        return out


    def train(args, model, optimizer, data):
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        it = iter(data)
        step = 0
        while step < args.steps:
            if step % 10 == 0:
                data = [x * 1.0 for x in data]
                it = iter(data)
            try:
                batch = next(it)
            except StopIteration:
                print(evaluate(model, data))
                it = iter(data)
                batch = next(it)
            step += 1
            loss = model(batch).pow(2).mean()
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
            optimizer.zero_grad()
''')


def test_the_region_leaves_out_a_data_fetch_that_only_evaluates_the_model_on_the_side():
    from ampfix.engine.check import check_source
    from ampfix.model.settings import Settings
    from ampfix.registry import all_rules

    fixed = check_source(STREAMING.encode(), "x.py", all_rules(), Settings(), fix="safe").fixed
    assert fixed is not None and "apex" not in fixed, fixed
    lines = fixed.splitlines()
    region = next(i for i, x in enumerate(lines) if "with torch.autocast(" in x and "loss =" in lines[i + 1])
    # the forward and the loss only: the data fetch stays outside (the evaluation on the side
    # gets a region of its own: apex ran it in half precision too)
    assert lines[region + 1].strip() == "loss = model(batch).pow(2).mean()", fixed
    assert lines[region - 1].strip() == "step += 1", fixed
    fetch = next(i for i, x in enumerate(lines) if x.strip() == "try:")
    assert "autocast" not in lines[fetch - 1] and lines[fetch].startswith("        try:"), fixed
    compile(fixed, "x.py", "exec")


# apex's DDP made in one module and tested by type in another (a checkpoint helper's
# `model.module if isinstance(model, DDP) else model`): the test changes with the call, or the
# helper would hand out the wrapper once the wrapper is torch's
DDP_TRAIN = '''\
import torch
from apex.parallel import DistributedDataParallel as DDP

from utils import unwrap


def setup(model):
    model = DDP(model, delay_allreduce=True)
    return unwrap(model)
'''
DDP_UTILS = '''\
from apex.parallel import DistributedDataParallel as DDP


def unwrap(model):
    return model.module if isinstance(model, DDP) else model
'''
DDP_ACCUM = '''\
from apex.parallel import DistributedDataParallel


def backward(model, loss, boundary):
    assert isinstance(model, DistributedDataParallel)
    model.disable_allreduce()
    if boundary:
        model.enable_allreduce()
    loss.backward()
'''


def test_a_type_test_in_another_module_changes_with_the_ddp_it_tests(tmp_path):
    write(tmp_path, {"train.py": DDP_TRAIN, "utils.py": DDP_UTILS})
    out = migrate(tmp_path)
    assert out.exit_code == 0, out.output
    train, utils = (tmp_path / "train.py").read_text(), (tmp_path / "utils.py").read_text()
    assert "torch.nn.parallel.DistributedDataParallel(model)" in train, train
    assert "isinstance( model, torch.nn.parallel.DistributedDataParallel )" in " ".join(utils.split()), utils
    assert "apex" not in train + utils and "DDP" not in utils and "import torch" in utils, utils


def test_an_apex_only_method_anywhere_keeps_every_ddp_of_the_project(tmp_path):
    train = DDP_TRAIN.replace("from utils import unwrap\n", "from accum import backward\nfrom utils import unwrap\n")
    write(tmp_path, {"train.py": train, "utils.py": DDP_UTILS, "accum.py": DDP_ACCUM})
    out = migrate(tmp_path)
    assert "Rewrote 0 files" in out.output, out.output
    for name, text in (("train.py", train), ("utils.py", DDP_UTILS), ("accum.py", DDP_ACCUM)):
        assert (tmp_path / name).read_text() == text, name
    check = CliRunner().invoke(main, ["check", "--select", "AMP103", str(tmp_path)])
    said = [x for x in check.output.splitlines() if "AMP103" in x]
    assert len(said) == 3 and all("accum.py line 6 is apex's DistributedDataParallel's own" in x for x in said), \
        check.output


def test_a_type_test_checked_alone_is_left_for_a_person():
    from ampfix.engine.check import check_source
    from ampfix.model.settings import Settings
    from ampfix.registry import all_rules

    res = check_source(DDP_UTILS.encode(), "utils.py", all_rules(), Settings(), fix="safe")
    assert res.fixed == DDP_UTILS
    assert any("a reference, not a call" in d.message for d in res.diagnostics), res.diagnostics


def test_an_evaluation_inside_a_print_runs_under_autocast_but_not_one_beside_other_project_code():
    from ampfix.engine.check import check_source
    from ampfix.model.settings import Settings
    from ampfix.registry import all_rules

    code = STREAMING.replace("print(evaluate(model, data))", "print(f'acc {evaluate(model, data)}')")
    fixed = check_source(code.encode(), "x.py", all_rules(), Settings(), fix="safe").fixed
    lines = fixed.splitlines()
    at = next(i for i, x in enumerate(lines) if "evaluate(model, data)" in x and "print" in x)
    assert "with torch.autocast(" in lines[at - 1], fixed
    # beside another function of the project, the statement is not the evaluation's alone
    code = STREAMING.replace("print(evaluate(model, data))", "print(evaluate(model, data), step_log(step))") + \
        "\n\ndef step_log(step):\n    return step\n"
    fixed = check_source(code.encode(), "x.py", all_rules(), Settings(), fix="safe").fixed
    lines = fixed.splitlines()
    at = next(i for i, x in enumerate(lines) if "step_log(step))" in x)
    assert "autocast" not in lines[at - 1], fixed
