"""Thirty-fifth round: an mmcv optimizer hook whose loss the runner computed.

OpenSelfSup's (and DenseCL's) ``DistOptimizerHook.after_train_iter(runner)`` scales
``runner.outputs["loss"]``; the forward pass that made it ran in mmcv's runner, between the hooks'
``before_train_iter`` and ``after_train_iter`` (``batch_processor(model, data)``), and no call in
the project computes it, so the migration was refused ("the loss reaches ... whose callers cannot
all be followed").  The hook holds the autocast region now: a ``before_train_iter`` it gains enters
it, ``after_train_iter`` leaves it first thing, before the backward.  Only for a class deriving
from mmcv's hooks, and not where the class, its project bases or a project subclass have
iteration hooks of their own (refused with the reason).
"""
from test_round17_shapes import migrated, run, write

HOOK = '''\
from mmcv.runner import OptimizerHook
try:
    import apex
except:
    print('apex is not installed')

class DistOptimizerHook(OptimizerHook):
    """Optimizer hook for distributed training."""

    def __init__(self, update_interval=1, grad_clip=None, use_fp16=False):
        self.grad_clip = grad_clip
        self.update_interval = update_interval
        self.use_fp16 = use_fp16

    def before_run(self, runner):
        runner.optimizer.zero_grad()
{extra}
    def after_train_iter(self, runner):
        runner.outputs['loss'] /= self.update_interval
        if self.use_fp16:
            with apex.amp.scale_loss(runner.outputs['loss'], runner.optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            runner.outputs['loss'].backward()
        if self.every_n_iters(runner, self.update_interval):
            runner.optimizer.step()
            runner.optimizer.zero_grad()
'''

TRAIN = '''\
import torch
from mmcv.runner import Runner

from hooks import DistOptimizerHook
try:
    import apex
except:
    print('apex is not installed')


def batch_processor(model, data, train_mode):
    losses = model(**data)
    return dict(loss=losses['loss'], num_samples=len(data['img']))


def dist_train(model, data_loaders, cfg):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if 'use_fp16' in cfg and cfg.use_fp16:
        model, optimizer = apex.amp.initialize(model.cuda(), optimizer, opt_level="O1")
    runner = Runner(model, batch_processor, optimizer, cfg.work_dir)
    runner.register_training_hooks(cfg.lr_config, DistOptimizerHook(**cfg.optimizer_config))
    runner.run(data_loaders, cfg.workflow, cfg.total_epochs)
'''


def files(extra=""):
    return {"hooks.py": HOOK.replace("{extra}", extra), "train.py": TRAIN}


def test_the_hook_holds_the_autocast_region(tmp_path):
    hook = migrated(tmp_path, files(), "hooks.py")
    train = (tmp_path / "train.py").read_text()
    assert "    def before_train_iter(self, runner):\n" \
           "        self.autocast = torch.autocast(\n" \
           "            'cuda', dtype=torch.float16, enabled=self.scaler.is_enabled()\n" \
           "        )\n" \
           "        self.autocast.__enter__()\n\n" \
           "    def after_train_iter(self, runner):\n" \
           "        self.autocast.__exit__(None, None, None)\n" \
           "        runner.outputs['loss'] /= self.update_interval\n" \
           "        self.scaler.scale(runner.outputs['loss']).backward()\n" in hook
    assert "            self.scaler.step(runner.optimizer)\n            self.scaler.update()\n" in hook
    assert "apex" not in hook.replace("apex scales", "")
    # the scaler is made where apex was initialized and handed to the hook
    assert "scaler = torch.amp.GradScaler('cuda', enabled=bool('use_fp16' in cfg and cfg.use_fp16))" in train
    assert "DistOptimizerHook(**cfg.optimizer_config, scaler=scaler)\n" in train
    assert "apex" not in train
    # the runner's batch_processor is left as it was: the hook covers its forward
    assert "    losses = model(**data)\n" in train
    assert run(tmp_path).output.strip().endswith("Would rewrite 0 files; 0 problems left for a person.")


def test_bfloat16_enters_bfloat16_autocast_without_a_scaler(tmp_path):
    hook = migrated(tmp_path, files(), "hooks.py", "--dtype", "bfloat16")
    assert "torch.autocast('cuda', dtype=torch.bfloat16" in hook
    assert "self.autocast.__exit__(None, None, None)\n" in hook
    assert "GradScaler" not in hook + (tmp_path / "train.py").read_text()
    assert "        runner.outputs['loss'].backward()\n" in hook


def test_a_comment_above_the_hook_stays_with_it(tmp_path):
    hook = migrated(tmp_path, files("\n    # backward, then a step every update_interval iterations"), "hooks.py")
    assert "        runner.optimizer.zero_grad()\n\n    def before_train_iter(self, runner):\n" in hook
    assert "        self.autocast.__enter__()\n\n" \
           "    # backward, then a step every update_interval iterations\n" \
           "    def after_train_iter(self, runner):\n" in hook


def test_a_hook_with_its_own_before_train_iter_is_refused(tmp_path):
    write(tmp_path, files("\n    def before_train_iter(self, runner):\n        self.t = 0\n"))
    out = run(tmp_path, "--write")
    assert "`DistOptimizerHook` has a `before_train_iter` of its own" in out.output
    assert "import apex" in (tmp_path / "hooks.py").read_text()


def test_a_subclass_with_iteration_hooks_is_refused(tmp_path):
    write(tmp_path, {**files(), "more.py": "from hooks import DistOptimizerHook\n\n\n"
                                          "class TimedHook(DistOptimizerHook):\n"
                                          "    def after_train_iter(self, runner):\n"
                                          "        super().after_train_iter(runner)\n"})
    out = run(tmp_path, "--write")
    assert "more.py line 4) extends `DistOptimizerHook` with iteration hooks of its own" in out.output
    assert "import apex" in (tmp_path / "hooks.py").read_text()


def test_a_hook_of_another_framework_stays_refused(tmp_path):
    other = files()
    other["hooks.py"] = other["hooks.py"].replace("from mmcv.runner import OptimizerHook",
                                                  "from myframework import OptimizerHook")
    write(tmp_path, other)
    out = run(tmp_path, "--write")
    assert "whose callers cannot all be followed" in out.output
    assert "def before_train_iter" not in (tmp_path / "hooks.py").read_text()


# -- a project module that forwards to apex's amp (caffeinism/StyleGAN-pytorch, delira) ----------

SHIM = '''\
import contextlib

try:
    from apex import amp
except ImportError:
    amp = None


@contextlib.contextmanager
def scale_loss(loss, optimizers, loss_id=0, model=None, delay_unscale=False, **kwargs):
    """apex's loss scaling where apex is installed, none otherwise."""
    if amp is None:
        yield loss
    else:
        with amp.scale_loss(loss=loss, optimizers=optimizers, loss_id=loss_id, model=model,
                            delay_unscale=delay_unscale) as _loss:
            yield _loss


def count_parameters(model):
    return sum(p.numel() for p in model.parameters())
'''

USER = '''\
import torch
from apex import amp

from utils import count_parameters, scale_loss


def train(model, loader, fp16):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    print(count_parameters(model))
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        with scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
'''


def test_a_forwarding_context_manager_goes_with_its_calls(tmp_path):
    train = migrated(tmp_path, {"utils.py": SHIM, "train.py": USER}, "train.py")
    utils = (tmp_path / "utils.py").read_text()
    assert "from utils import count_parameters\n" in train
    assert "        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n" in train
    assert '    scaler = torch.amp.GradScaler("cuda", enabled=bool(fp16))\n' in train
    assert "apex" not in train
    # the forwarder and the imports only it read go; the rest of the module stays
    assert utils == "def count_parameters(model):\n    return sum(p.numel() for p in model.parameters())\n"
    assert run(tmp_path).output.strip().endswith("Would rewrite 0 files; 0 problems left for a person.")


def test_a_forwarder_used_as_a_value_is_left(tmp_path):
    user = USER.replace("def train(", "BACKWARD = scale_loss\n\n\ndef train(")
    write(tmp_path, {"utils.py": SHIM, "train.py": user})
    out = run(tmp_path, "--write")
    assert "with scale_loss(loss, optimizer) as scaled_loss:" in (tmp_path / "train.py").read_text()
    assert "from apex import amp" in (tmp_path / "utils.py").read_text()
    assert "not rewritten" in out.output


def test_a_forwarder_whose_caller_is_refused_says_why(tmp_path):
    user = USER.replace('amp.initialize(model, optimizer, opt_level="O1")', "amp.initialize(model, optimizer, **options)")
    user = user.replace("def train(model, loader, fp16):", "def train(model, loader, fp16, options):")
    write(tmp_path, {"utils.py": SHIM, "train.py": user})
    out = run(tmp_path, "--write")
    assert (tmp_path / "utils.py").read_text() == SHIM
    assert "`scale_loss` forwards to apex's amp.scale_loss; its call at" in out.output
    assert "`scale_loss` forwards to apex's `apex.amp.scale_loss`" in out.output


def test_a_function_that_does_more_than_forward_is_not_a_forwarder(tmp_path):
    shim = SHIM.replace('    if amp is None:\n        yield loss',
                        '    if amp is None:\n        print("no apex")\n        yield loss\n'
                        '    elif loss_id:\n        yield loss * 2')
    write(tmp_path, {"utils.py": shim, "train.py": USER})
    run(tmp_path, "--write")
    assert "with scale_loss(loss, optimizer) as scaled_loss:" in (tmp_path / "train.py").read_text()


def test_a_re_exported_forwarder_stays_while_its_calls_are_rewritten(tmp_path):
    api = "from utils import scale_loss\n\n__all__ = ['scale_loss']\n"
    write(tmp_path, {"utils.py": SHIM, "train.py": USER, "api.py": api})
    out = run(tmp_path, "--write")
    train = (tmp_path / "train.py").read_text()
    assert "another module takes `scale_loss` from" in out.output
    assert "scaler.scale(loss).backward()" in train and "apex" not in train
    utils = (tmp_path / "utils.py").read_text()
    assert "def scale_loss(loss, optimizers" in utils and "from apex import amp" in utils
    assert (tmp_path / "api.py").read_text() == api


def test_the_first_import_and_the_guard_below_it_go_together():
    """``import contextlib``, a blank line, then apex's import guard, both unused: the first
    removal took the blank line after it and the second the blank line above it, the same line
    (the rewrite failed with "edits overlap"); they are one removal now, and what is left does not
    start with a blank line."""
    from ampfix.engine.tidy import tidy
    from ampfix.rule import ImportSpec

    text = "import contextlib\n\ntry:\n    from apex import amp\nexcept ImportError:\n    amp = None\n\n\n" \
           "def count(model):\n    return 1\n"
    specs = [ImportSpec("apex", "amp"), ImportSpec("contextlib")]
    assert tidy(text, "u.py", [], specs) == "def count(model):\n    return 1\n"
    assert tidy(text.replace("contextlib\n\n", "contextlib\n"), "u.py", [], specs) == "def count(model):\n    return 1\n"
    assert tidy('"""doc"""\nimport apex\n\nx = 1\n', "u.py", [], [ImportSpec("apex")]) == '"""doc"""\n\nx = 1\n'


# -- apex set up in one block inside the loop (dvl-tum/intra_batch, holdout round35b) ----------

SETUP_BLOCK = '''\
import torch


class Trainer:
    def __init__(self, config):
        self.config = config

    def train(self, model, loader):
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(2):
            self.model = model

            # Do training in mixed precision
            if self.config["is_apex"]:
                global amp
                from apex import amp
                self.model, self.opt = amp.initialize(self.model, self.opt, opt_level="O1")
            if i > 0:
                self.model.train()
            self.execute(loader)

    def execute(self, loader):
        for x in loader:
            loss = self.model(x).sum()
            if self.config["is_apex"]:
                with amp.scale_loss(loss, self.opt) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            self.opt.step()
'''


def test_a_block_of_apex_setup_goes_with_the_comment_that_describes_it(tmp_path):
    """``# Do training in mixed precision`` above ``if is_apex: global amp; from apex import amp;
    <initialize>``: the initialize went first and the import and ``global`` later, by the tidy, so
    the emptied ``if`` went without its comment, which then sat above the next statement."""
    out = migrated(tmp_path, {"trainer.py": SETUP_BLOCK}, "trainer.py")
    assert "mixed precision" not in out and "global amp" not in out and "from apex" not in out
    assert "            self.model = model\n\n            if i > 0:\n" in out
    assert "self.scaler.scale(loss).backward()" in out


def test_a_block_with_more_than_apex_setup_keeps_its_comment(tmp_path):
    src = SETUP_BLOCK.replace("                global amp\n", "                global amp\n                self.half = True\n")
    out = migrated(tmp_path, {"trainer.py": src}, "trainer.py")
    assert "            # Do training in mixed precision\n            if self.config[\"is_apex\"]:\n" \
           "                self.half = True\n" in out
