"""Twenty-third round: a runner copied into a part of a repository that never uses apex (its
``checkpoint['amp'] = apex.amp.state_dict()`` and ``apex.amp.load_state_dict(...)`` are all the apex
there, and nothing initializes apex before them): the state goes, as it does where the scaler
lives in a hook; where the same part initializes apex (a registry, not an import, joins them) it
stays refused."""
import ast

from test_round17_shapes import run, write

CHECKPOINT = '''\
try:
    import apex
except ImportError:
    print("apex is not installed")

import torch


def save_checkpoint(model, filename, optimizer=None):
    checkpoint = {"state_dict": model.state_dict()}
    if optimizer is not None:
        checkpoint["optimizer"] = optimizer.state_dict()
    # save amp state dict in the checkpoint
    checkpoint["amp"] = apex.amp.state_dict()
    torch.save(checkpoint, filename)
'''

RUNNER = '''\
try:
    import apex
except ImportError:
    print("apex is not installed")

import torch

from .checkpoint import save_checkpoint

RUNNERS = {}


def register(cls):
    RUNNERS[cls.__name__] = cls
    return cls


@register
class EpochBasedRunnerAmp:
    def __init__(self, model, optimizer, logger):
        self.model, self.optimizer, self.logger = model, optimizer, logger

    def save_checkpoint(self, filename):
        save_checkpoint(self.model, filename, optimizer=self.optimizer)

    def resume(self, filename):
        checkpoint = torch.load(filename)
        self.model.load_state_dict(checkpoint["state_dict"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        if "amp" in checkpoint:
            apex.amp.load_state_dict(checkpoint["amp"])
            self.logger.info("load amp state dict")
        self.logger.info("resumed")
'''

CLASSIFY = '''\
import torch
from apex import amp


def train(model, optimizer, loader):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        optimizer.zero_grad()
'''

# the same part initializes apex and scales the loss in a model a registry builds: the runner's
# saved state is that training's, and cannot go alone
GAN = '''\
import apex
import torch


class GAN(torch.nn.Module):
    def train_step(self, x, optimizer):
        loss = self(x).sum()
        with apex.amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
'''

SETUP = '''\
import apex


def apex_initialize(model, optimizer, **kwargs):
    return apex.amp.initialize(model, optimizer, **kwargs)
'''


def test_state_of_a_runner_no_initialize_reaches_goes(tmp_path):
    write(tmp_path, {
        "segmentation/mmcv_custom/__init__.py": "",
        "segmentation/mmcv_custom/runner/__init__.py": "from .epoch_based_runner import EpochBasedRunnerAmp\n",
        "segmentation/mmcv_custom/runner/checkpoint.py": CHECKPOINT,
        "segmentation/mmcv_custom/runner/epoch_based_runner.py": RUNNER,
        "classification/train.py": CLASSIFY,
    })
    out = run(tmp_path, "--write")
    assert out.exit_code == 0, out.output
    ckpt = (tmp_path / "segmentation/mmcv_custom/runner/checkpoint.py").read_text()
    runner = (tmp_path / "segmentation/mmcv_custom/runner/epoch_based_runner.py").read_text()
    for text in (ckpt, runner):
        assert "apex" not in text, text
        ast.parse(text)
    # the comment that described the saved state goes with it; the rest of the function stays
    assert "save amp state dict" not in ckpt and 'checkpoint["optimizer"] = optimizer.state_dict()' in ckpt
    # the whole `if "amp" in checkpoint:` block goes (its log line said what no longer happens)
    assert '"amp" in checkpoint' not in runner and 'self.logger.info("resumed")' in runner
    assert "its saved state goes" in out.output and "an old checkpoint's 'amp' entry is ignored" in out.output
    # the other part migrates as before
    assert "scaler.scale(loss).backward()" in (tmp_path / "classification/train.py").read_text()


def test_state_of_a_runner_stays_where_its_part_uses_apex(tmp_path):
    files = {
        "gen/runners/__init__.py": "",
        "gen/runners/checkpoint.py": CHECKPOINT,
        "gen/runners/runner.py": RUNNER,
        "gen/runners/apex_utils.py": SETUP,
        "gen/models/gan.py": GAN,
    }
    write(tmp_path, files)
    out = run(tmp_path)
    assert "its saved state goes" not in out.output, out.output
    assert (tmp_path / "gen/runners/checkpoint.py").read_text() == CHECKPOINT
    assert "gen/runners/checkpoint.py: not rewritten" in out.output.replace("\\", "/"), out.output


# lucidrains' trainers: `assert not fp16 or fp16 and APEX_AVAILABLE, 'Apex must be installed ...'`
ASSERTED = '''\
import torch

try:
    from apex import amp
    APEX_AVAILABLE = True
except ImportError:
    APEX_AVAILABLE = False


def train(model, opt, loader, fp16=False):
    assert not fp16 or fp16 and APEX_AVAILABLE, "Apex must be installed for mixed precision"
    if fp16:
        model, opt = amp.initialize(model, opt, opt_level="O1")
    for x in loader:
        loss = model(x).sum()
        if fp16:
            with amp.scale_loss(loss, opt) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        opt.step()
'''


def test_an_assert_that_always_holds_once_apex_is_gone_goes_with_its_flag(tmp_path):
    write(tmp_path, {"train.py": ASSERTED})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    # the assert held whatever fp16 was: it goes, and the flag that only it read goes too
    assert "APEX_AVAILABLE" not in text and "Apex must be installed" not in text, text
    assert "apex" not in text and "scaler.scale(loss).backward()" in text, text


def test_always_holds_tries_every_truth_of_its_operands():
    from ampfix.engine.tidy import _always_holds

    def holds(src):
        return _always_holds(ast.parse(src, mode="eval").body, {"OK"})

    assert holds("not fp16 or fp16 and OK")
    assert holds("not a.b or OK")
    assert not holds("not fp16 or a and OK")
    assert not holds("fp16 and OK")
    assert not holds("not f() or f()")  # a call may give another value the second time
