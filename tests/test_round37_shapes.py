"""Thirty-seventh round: helpers reached through ``from <package> import *``, and a setup called
twice in one block.

atppo's trainers (``RLMR/ppo/ppo_trainer.py``, ``USDP/dp_trainer.py``) call ``step(loss, ...)``, the
scaled backward of ``util/ppo_util.py``, through ``from util import *``, where ``util/__init__.py``
only imports it (``from .ppo_util import step``): the star import bound the package's own defs, not
what it passes on, so the call was not followed and the initialize was refused ("never used with
amp.scale_loss").  A star import binds those names now, read from the package without adding it to
the run.  The actor and the critic each come from ``self.init_trainable(...)``: the GradScaler made
after each call was one too many (the second threw the first away); one serves both, as apex's
one loss scaler did, and where a step accumulates (runs on fewer iterations than its backward)
that is refused with the reason: the other optimizer's ``update()`` would change the scale between
its micro-batches.
"""
from pathlib import Path

from test_round17_shapes import migrated, run, write

STEPS = '''\
import torch
try:
    from apex import amp
except ImportError:
    amp = None


def backward_step(loss, optimizer, global_step, accum, fp16):
    if fp16:
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
    else:
        loss.backward()
{step}'''

INIT = '''\
from .steps import backward_step
'''

TRAINER = '''\
import torch
from torch import nn

from helpers import *
from apex import amp


class Pair:
    def __init__(self, args):
        self.a, self.opt_a = self.setup(args)
        {between}self.b, self.opt_b = self.setup(args)
        self.args = args
        self.n = 0

    def setup(self, args):
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if args.fp16:
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        return model, optimizer

    def train_step(self, x, y):
        self.n += 1
        loss_a = (self.a(x) - y).pow(2).mean()
        backward_step(loss_a, self.opt_a, self.n, {accum}, self.args.fp16)
        loss_b = (self.b(x) - y).pow(2).mean()
        backward_step(loss_b, self.opt_b, self.n, {accum}, self.args.fp16)
'''


EVERY = """\
    optimizer.step()
    optimizer.zero_grad()
"""
ACCUMULATING = """\
    if global_step % accum == 0:
        optimizer.step()
        optimizer.zero_grad()
"""


def files(accum="1", between=""):
    step = EVERY if accum == "1" else ACCUMULATING
    return {"helpers/__init__.py": INIT, "helpers/steps.py": STEPS.format(step=step),
            "trainers/pair.py": TRAINER.format(accum=accum, between=between)}


def test_a_call_through_a_star_import_of_a_package_is_followed(tmp_path):
    pair = migrated(tmp_path, files(), "trainers/pair.py")
    steps = (tmp_path / "helpers/steps.py").read_text()
    assert "def backward_step(loss, optimizer, global_step, accum, fp16, *, scaler):" in steps
    assert "scaler.scale(loss).backward()" in steps and "amp" not in steps.replace("torch.amp", "")
    assert "backward_step(loss_a, self.opt_a, self.n, 1, self.args.fp16, scaler=self.scaler)" in pair
    assert "backward_step(loss_b, self.opt_b, self.n, 1, self.args.fp16, scaler=self.scaler)" in pair
    # the package that passes the helper on is read, never edited
    assert (tmp_path / "helpers/__init__.py").read_text() == INIT


def test_a_setup_called_twice_in_one_block_makes_one_scaler(tmp_path):
    pair = migrated(tmp_path, files(), "trainers/pair.py")
    assert pair.count("GradScaler(") == 1
    made = pair.index("self.scaler = torch.amp.GradScaler(")
    assert pair.index("self.a, self.opt_a = self.setup(args)") < made < pair.index("self.b, self.opt_b = self.setup(args)")


def test_the_second_scaler_stays_where_what_it_reads_is_rebound_between(tmp_path):
    """``args`` rebound between the two calls: the second call's scaler reads another ``args``;
    both stay, as before (the second is the one the steps see)."""
    pair = migrated(tmp_path, files(between="args = args.other\n        "), "trainers/pair.py")
    assert pair.count("GradScaler(") == 2


def test_one_scaler_for_two_optimizers_that_accumulate_is_refused(tmp_path):
    """Steps every second micro-batch: optimizer a's update() would change the scale between b's
    two backwards, so b's accumulated gradients would mix two scales."""
    write(tmp_path, files(accum="2"))
    before = {p: (tmp_path / p).read_text() for p in files()}
    out = run(tmp_path, "--write")
    assert "one GradScaler serves the optimizers of `Pair.setup`'s calls at lines 10 and 11" in out.output
    assert "runs on fewer iterations than the scaled backward (accumulation)" in out.output
    assert {p: (tmp_path / p).read_text() for p in files()} == before


def test_a_star_import_does_not_read_the_package_into_the_run(tmp_path):
    """What ``from helpers import *`` binds is read from the package's file, which is not added to
    the project (that would change which modules other names resolve to)."""
    from ampfix.model.settings import Settings
    from ampfix.model.source import Source
    from ampfix.project.graph import Project

    write(tmp_path, files())
    paths = [str(tmp_path / "trainers/pair.py")]
    p = Project({x: Source(Path(x).read_bytes(), x) for x in paths}, Settings(), root=tmp_path, given=paths)
    m = p.modules[paths[0]]
    assert "backward_step" in p._star_names(m, "helpers")
    assert list(p.modules) == paths


# fast-reid's DefaultTrainer picks `(AMPTrainer if cfg.SOLVER.FP16_ENABLED else SimpleTrainer)(...)`;
# AMPTrainer scales the loss in run_step and inherits SimpleTrainer's __init__

LOOP = '''\
import torch
from apex import amp


class SimpleTrainer:
    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer

    def run_step(self, x, y):
        loss = (self.model(x) - y).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()


class AMPTrainer(SimpleTrainer):
{own_init}
    def run_step(self, x, y):
        loss = (self.model(x) - y).pow(2).mean()
        self.optimizer.zero_grad()
        with amp.scale_loss(loss, self.optimizer) as scaled_loss:
            scaled_loss.backward()
        self.optimizer.step()
'''

DEFAULTS = '''\
import torch
from apex import amp

from loop import AMPTrainer, SimpleTrainer


def build(fp16):
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    return {build}
'''

CHOSEN = "(AMPTrainer if fp16 else SimpleTrainer)(model, optimizer)"
OWN_INIT = '''\
    def __init__(self, model, optimizer):
        super().__init__(model, optimizer)
        self.steps = 0
'''


def test_a_class_picked_by_a_conditional_expression_gets_the_scaler_through_the_inherited_init(tmp_path):
    defaults = migrated(tmp_path, {"loop.py": LOOP.format(own_init=""), "defaults.py": DEFAULTS.format(build=CHOSEN)},
                        "defaults.py")
    loop = (tmp_path / "loop.py").read_text()
    assert "return (AMPTrainer if fp16 else SimpleTrainer)(model, optimizer, scaler=scaler)" in defaults
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=bool(fp16))' in defaults
    # the base's __init__ takes it; the subclass without one of its own is built through it
    assert "def __init__(self, model, optimizer, *, scaler):" in loop
    assert "self.scaler.scale(loss).backward()" in loop and "amp." not in loop.replace("torch.amp.", "")


def test_a_subclass_built_by_its_own_name_is_a_call_of_the_inherited_init(tmp_path):
    defaults = migrated(tmp_path, {"loop.py": LOOP.format(own_init=""),
                                   "defaults.py": DEFAULTS.format(build="AMPTrainer(model, optimizer)")}, "defaults.py")
    assert "return AMPTrainer(model, optimizer, scaler=scaler)" in defaults
    assert "def __init__(self, model, optimizer, *, scaler):" in (tmp_path / "loop.py").read_text()


def test_a_choice_of_classes_built_by_different_inits_is_refused(tmp_path):
    """AMPTrainer has an ``__init__`` of its own: a scaler argument added to the conditional call
    would reach SimpleTrainer's too, which takes none.  Refused, nothing written."""
    files = {"loop.py": LOOP.format(own_init=OWN_INIT), "defaults.py": DEFAULTS.format(build=CHOSEN)}
    write(tmp_path, files)
    out = run(tmp_path, "--write")
    assert "defaults.py: not rewritten" in out.output and "loop.py: not rewritten" in out.output
    assert {p: (tmp_path / p).read_text() for p in files} == files


# apex's imagenet example (and its many copies) explains apex's DDP above `if args.distributed:`

DDP_SCRIPT = '''\
import torch
from apex.parallel import DistributedDataParallel as DDP


def wrap(model, args):
    # For distributed training, wrap the model with apex.parallel.DistributedDataParallel.
    # This must be done AFTER the call to amp.initialize.
    if args.distributed:
        # delay_allreduce delays all communication to the end of the backward pass.
        model = DDP(model, delay_allreduce=True)
    # the model is ready
    if args.other:
        model = model.cuda()
    return model
'''


def test_the_comment_on_apex_ddp_above_the_if_that_wraps_goes_with_it(tmp_path):
    out = migrated(tmp_path, {"wrap.py": DDP_SCRIPT}, "wrap.py")
    assert "apex" not in out and "amp.initialize" not in out and "delay_allreduce" not in out
    assert "    if args.distributed:\n        model = torch.nn.parallel.DistributedDataParallel(model)\n" in out
    # a comment that does not speak of apex's DDP stays
    assert "    # the model is ready\n" in out


def test_a_comment_at_the_end_of_a_rewritten_apex_line_that_names_apex_goes(tmp_path):
    script = ("import torch\nimport apex\n\n\ndef prepare(model):\n"
              "    model = apex.parallel.convert_syncbn_model(model).cuda()  # use apex's SyncBatchNorm\n"
              "    model = apex.parallel.convert_syncbn_model(model)  # sync the statistics '#1'\n"
              "    return model\n")
    out = migrated(tmp_path, {"prep.py": script}, "prep.py")
    assert "    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model).cuda()\n" in out
    # one that does not speak of apex stays, whole
    assert "    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)  # sync the statistics '#1'\n" in out
