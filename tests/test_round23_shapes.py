"""Twenty-third round: a runner copied into a part of a repository that never uses apex (its
``checkpoint['amp'] = apex.amp.state_dict()`` and ``apex.amp.load_state_dict(...)`` are all the apex
there, and nothing initializes apex before them): the state goes, as it does where the scaler
lives in a hook; where the same part initializes apex (a registry, not an import, joins them) it
stays refused."""
import ast
import subprocess
import sys

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


# torchdistill's training box: an nn.Module that initializes apex in its setup, computes the loss
# in its own forward and scales it in update_params(loss); the scripts get the box from a factory
BOX = '''\
import torch
from torch import nn

try:
    from apex import amp
except ImportError:
    amp = None


class TrainingBox(nn.Module):
    def setup(self, config):
        self.apex = False
        if config.get("apex"):
            self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O1")
            self.apex = True

    def __init__(self, model, config):
        super().__init__()
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        self.setup(config)

    def forward(self, x, y):
        """The loss of one batch."""
        out = self.model(x)
        return nn.functional.mse_loss(out, y)

    def update_params(self, loss):
        if self.apex:
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        target = amp.master_params(self.optimizer) if self.apex \\
            else [p for group in self.optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(target, 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad()


def get_box(model, config):
    return TrainingBox(model, config)
'''

BOX_MAIN = '''\
import torch

from box import get_box


def main(config):
    model = torch.nn.Linear(4, 2)
    box = get_box(model, config) if config.get("student") else None
    for _ in range(2):
        loss = box(torch.randn(3, 4), torch.randn(3, 2))
        box.update_params(loss)
    print("ok")


if __name__ == "__main__":
    main({"student": True})
'''


def test_a_box_that_computes_its_loss_in_its_forward_gets_autocast_there(tmp_path):
    write(tmp_path, {"box.py": BOX, "main.py": BOX_MAIN})
    out = run(tmp_path, "--write")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "box.py").read_text()
    assert "import amp" not in text and "amp." not in text.replace("torch.amp.", ""), text
    tree = ast.parse(text)
    fwd = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "forward")
    # the docstring stays first; the rest of the body is the autocast region
    assert isinstance(fwd.body[0], ast.Expr) and isinstance(fwd.body[1], ast.With), text
    assert "self.scaler.is_enabled()" in ast.unparse(fwd.body[1].items[0].context_expr)
    # the clip's two branches are one now, by the words of the fp32 one
    assert 'target = [p for group in self.optimizer.param_groups for p in group["params"]]' in text, text
    assert "self.scaler.unscale_(self.optimizer)" in text
    assert "autocast covers `TrainingBox.forward`" in out.output
    assert (tmp_path / "main.py").read_text() == BOX_MAIN
    res = subprocess.run([sys.executable, "main.py"], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr


def test_a_box_whose_subclass_has_its_own_forward_stays_refused(tmp_path):
    sub = BOX + '''

class OtherBox(TrainingBox):
    def forward(self, x, y):
        return self.model(x).sum()
'''
    write(tmp_path, {"box.py": sub, "main.py": BOX_MAIN})
    out = run(tmp_path)
    assert "callers cannot all be followed" in out.output, out.output
    assert (tmp_path / "box.py").read_text() == sub


# a trainer of the Hugging Face 2020 kind: `if backend == "amp": <native> else: if not
# apex_available(): msg = (...); raise ImportError(msg); self.use_apex = True`
CHOICE = '''\
import torch
from torch.cuda.amp import GradScaler, autocast

try:
    from apex import amp
    HAS_APEX = True
except ImportError:
    HAS_APEX = False


class Trainer:
    def __init__(self, model, backend, fp16):
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        self.use_apex = False
        self.use_amp = False
        if fp16:
            if backend == "amp":
                self.use_amp = True
                self.scaler = GradScaler()
            else:
                if not HAS_APEX:
                    msg = ("apex is not installed, "
                           "see https://github.com/nvidia/apex")
                    raise ImportError(msg)
                self.use_apex = True
        if self.use_apex:
            self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O1")

    def step(self, x):
        if self.use_amp:
            with autocast():
                loss = self.model(x).sum()
        else:
            loss = self.model(x).sum()
        if self.use_amp:
            self.scaler.scale(loss).backward()
        elif self.use_apex:
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        if self.use_amp:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
'''


def test_an_apex_choice_that_builds_its_message_before_raising_routes_to_native(tmp_path):
    write(tmp_path, {"trainer.py": CHOICE})
    out = run(tmp_path, "--write")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "trainer.py").read_text()
    assert "apex" not in text.lower(), text
    assert "every apex choice now takes the native AMP path" in out.output
    tree = ast.parse(text)
    init = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    # the fp16 setup is the native one whatever the backend says
    assert "self.use_amp = True" in ast.unparse(init) and "backend ==" not in ast.unparse(init), ast.unparse(init)


# pytorch-pretrained-BERT's examples: the fp16 path's own warm-up, with a guard on the rate and
# a log of it, beside an fp32 optimizer that schedules itself
WARMUP = '''\
import torch
from pytorch_pretrained_bert.optimization import BertAdam


def warmup_linear(x, warmup=0.002):
    return x / warmup if x < warmup else 1.0 - x


def train(model, loader, fp16, lr, total, log):
    if fp16:
        from apex.optimizers import FP16_Optimizer, FusedAdam
        optimizer = FP16_Optimizer(FusedAdam(model.parameters(), lr=lr), dynamic_loss_scale=True)
    else:
        optimizer = BertAdam(model.parameters(), lr=lr, warmup=0.1, t_total=total)
    step = 0
    for x in loader:
        loss = model(x).sum()
        if fp16:
            optimizer.backward(loss)
        else:
            loss.backward()
        step += 1
        if fp16:
            # modify learning rate with special warm up BERT uses
            lr_this_step = lr * warmup_linear(step / total)
            if lr_this_step < 0:
                # save guard for possible miscalculation of train steps
                lr_this_step = 1e-8
            for param_group in optimizer.param_groups:
                param_group["lr"] = lr_this_step
            log.add_scalar("lr", lr_this_step, step)
        optimizer.step()
        optimizer.zero_grad()
'''


def test_the_fp16_warmup_goes_with_its_guard_and_its_log(tmp_path):
    write(tmp_path, {"train.py": WARMUP})
    out = run(tmp_path, "--write")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text and "FP16_Optimizer" not in text, text
    assert "lr_this_step" not in text and "save guard" not in text and 'add_scalar("lr"' not in text, text
    assert "warmup_linear" not in text and "scaler.step(optimizer)" in text
    assert "the warm-up the fp16 path wrote into param_groups goes" in out.output


# mt-dnn: `from apex import amp` then `global amp` in __init__ (the declaration holds for the whole
# function: the module's amp is bound), `amp.scale_loss` in another method
GLOBAL_AFTER = '''\
import torch


class Model:
    def __init__(self, net, fp16):
        self.net = net
        self.optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        self.fp16 = fp16
        if fp16:
            try:
                from apex import amp
                global amp
            except ImportError:
                raise ImportError("install apex")
            net, optimizer = amp.initialize(self.net, self.optimizer, opt_level="O1")
            self.net = net
            self.optimizer = optimizer

    def update(self, x):
        loss = self.net(x).sum()
        if self.fp16:
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        self.optimizer.step()
'''


def test_a_global_declared_after_the_import_binds_the_module_name(tmp_path):
    from ampfix.model.semantic import Model

    tree = ast.parse(GLOBAL_AFTER)
    sem = Model(tree)
    read = next(n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "scale_loss")
    # bound at module level by the import (not the guess for a name nothing binds)
    assert [b.kind for b in sem.bindings_of(read.value)] == ["import"]
    write(tmp_path, {"model.py": GLOBAL_AFTER})
    out = run(tmp_path, "--write")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "model.py").read_text()
    assert "raised NameError" not in out.output  # it did not: the global made it the module's
    assert "global amp" not in text and "apex" not in text, text
    assert "self.scaler.scale(loss).backward()" in text
    compile(text, "model.py", "exec")
