"""Forty-first round: what the public code of this round showed.

1. With bfloat16, a forward's output squashed before it is handed to numpy (jionie's Google QUEST
   k-fold scripts: ``prediction = torch.sigmoid(prediction)`` then
   ``pred_train = prediction.cpu().detach().numpy()``) was refused: numpy has no bfloat16.  A
   sigmoid, softmax, log_softmax or tanh gives a floating tensor whatever it is given, so where
   such a binding is the last one before the call and lies on every way to it, ``.float()`` goes
   before ``.numpy()`` (float32 where it was bfloat16, a no-op on float32).  A binding on one
   branch only, a later binding that a loop brings round to the call, or an op that keeps an
   integer dtype (``torch.relu``) keeps it refused.
2. apex's private state read in the test of an ``if`` whose two branches are the same statements
   (carbonati's melanoma trainer: ``if self._fp_16 and amp._amp_state.loss_scalers[0]._unskipped
   != 0: self.scheduler.step() else: self.scheduler.step()``) refused the trainer and the script
   that builds it ("private loss scale ... not beside amp.initialize").  Whatever the test says
   the same statements run: the ``if`` gives way to them.  A test that calls something, or
   branches that differ, keep it refused.
3. apex kept on an object by a setup function of another module (lRomul's argus solutions:
   ``def initialize_amp(model, ...): model.nn_module, model.optimizer = amp.initialize(
   model.nn_module, model.optimizer, ...); model.amp = amp``, called as ``model = BirdModel(params);
   if USE_AMP: initialize_amp(model)``; the class sets ``self.amp = None`` in ``__init__`` and
   reads ``if self.amp is not None: with self.amp.scale_loss(...)``) was refused on both sides
   ("never used with amp.scale_loss" / "no home").  The scaler goes on the object: the setup
   function makes ``model.scaler``, the class's ``__init__`` a disabled one in place of
   ``self.amp = None``, and its methods read ``self.scaler``.  Only where every caller hands the
   setup an object of that one class, made right before on every way to the call, and nothing
   else in the project reads or sets ``.amp`` (a subclass, a callback).
4. A name only apex's dropped arguments read, bound twice (carbonati's ``keep_bn_fp32 =
   config.get('keep_batchnorm_fp32', True)`` and ``if opt_level == 'O1': keep_bn_fp32 = None``,
   then ``keep_batchnorm_fp32=keep_bn_fp32``), was left unused after the migration: every binding
   goes, and an ``if`` whose whole body is one of them goes with it.  A binding that computes
   something else (a call other than a mapping's ``.get`` of a key) keeps the name.
5. A scaled branch that binds apex's ``delay_unscale`` first (fast-bert's learners, argus:
   ``if self.is_fp16: # ... apex/advanced.html#gradient-accumulation ...; delay_unscale = ...;
   with amp.scale_loss(..., delay_unscale=delay_unscale) ...: ... else: loss.backward()``) kept
   the ``if`` around ``scaler.scale(loss).backward()``: the binding only apex's call read is no
   reason against folding the plain branch in.  The comment above it that speaks of apex goes
   with it, and the block's blank line after them too (no doubled blank line).
6. An initialize left over beside a training that scales natively (aitoolbox's BERT example:
   ``model, optimizer = amp.initialize(model, optimizer, opt_level="O1")``, then
   ``TrainLoop(model, ..., optimizer, ..., use_amp=True)`` whose loop runs
   ``self.amp_scaler.scale(loss).backward()``; scene_graph_benchmark's ``train_net.py`` and its
   ``do_train``) was refused as "never used with amp.scale_loss".  Where the call that hands the
   optimizer on switches that AMP on wherever apex was on (``use_amp=True``, or the initialize's
   own guard), the initialize goes, with what only its options read; where the training's switch
   is its own (``cfg.SOLVER.USE_AMP``), taking apex's O1 away could train in float32 where it ran
   float16: refused, saying so.  O2/O3 (the model cast) keep it refused.
"""
from test_round17_shapes import run, write

SQUASH = '''\
import numpy as np
import torch
from apex import amp


def main(model, optimizer, loader, criterion):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    preds = []
    for x, y in loader:
        prediction = model(x)
        loss = criterion(prediction, y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        SQUASH
        preds.append(prediction.cpu().detach().numpy())
    return np.concatenate(preds)
'''


def test_bfloat16_gives_a_squashed_output_a_float_before_numpy(tmp_path):
    for squash in ("prediction = torch.sigmoid(prediction)", "prediction = prediction.softmax(1)",
                   "prediction = torch.nn.functional.log_softmax(prediction, dim=1)"):
        # `criterion(prediction, y)` would prove it floating on its own: a loss of its own instead
        src = SQUASH.replace("criterion(prediction, y)", "(prediction - y).abs().mean()").replace("SQUASH", squash)
        write(tmp_path, {"train.py": src})
        run(tmp_path, "--write", "-q", "--dtype", "bfloat16")
        text = (tmp_path / "train.py").read_text()
        assert "apex" not in text and "dtype=torch.bfloat16" in text, text
        assert "preds.append(prediction.cpu().detach().float().numpy())" in text, text
        before = text
        run(tmp_path, "--write", "-q", "--dtype", "bfloat16")
        assert (tmp_path / "train.py").read_text() == before


def test_bfloat16_refuses_a_squash_that_does_not_reach_every_way(tmp_path):
    base = SQUASH.replace("criterion(prediction, y)", "(prediction - y).abs().mean()")
    for squash in (
            # on one branch only
            "if x is not None:\n            prediction = torch.sigmoid(prediction)",
            # an op that keeps the dtype (an integer tensor stays one)
            "prediction = torch.relu(prediction)",
            # another binding after it
            "prediction = torch.sigmoid(prediction)\n        prediction = prediction * 2"):
        write(tmp_path, {"train.py": base.replace("SQUASH", squash)})
        out = run(tmp_path, "--dtype", "bfloat16")
        assert "hands the forward's output to numpy" in out.output, (squash, out.output)


def test_bfloat16_refuses_a_squash_a_loop_goes_round(tmp_path):
    """The sigmoid is before the inner loop; the loop binds the output again after the call, and
    its next turn hands that to numpy."""
    src = SQUASH.replace("criterion(prediction, y)", "(prediction - y).abs().mean()").replace(
        "        SQUASH\n        preds.append(prediction.cpu().detach().numpy())\n",
        "        prediction = torch.sigmoid(prediction)\n"
        "        for k in range(2):\n"
        "            preds.append(prediction.cpu().detach().numpy())\n"
        "            prediction = model(x)\n")
    write(tmp_path, {"train.py": src})
    out = run(tmp_path, "--dtype", "bfloat16")
    assert "hands the forward's output to numpy" in out.output, out.output


def test_float16_leaves_the_squashed_numpy_as_it_is(tmp_path):
    write(tmp_path, {"train.py": SQUASH.replace("SQUASH", "prediction = torch.sigmoid(prediction)")})
    run(tmp_path, "--write", "-q")
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text and "preds.append(prediction.cpu().detach().numpy())" in text, text


PRIVATE = '''\
import torch
from apex import amp


class Trainer:
    def __init__(self, model, optim, scheduler, fp_16=False):
        self.model, self.optim, self.scheduler, self._fp_16 = model, optim, scheduler, fp_16

    def train_on_batch(self, x, y):
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.optim.zero_grad()
        if self._fp_16:
            with amp.scale_loss(loss, self.optim) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        self.optim.step()
        if self._fp_16 and amp._amp_state.loss_scalers[0]._unskipped != 0:
            self.scheduler.step()
        else:
            self.scheduler.step()
        return loss.item()


def main(model, optim, scheduler, loader, fp_16):
    if fp_16:
        model, optim = amp.initialize(model, optim, opt_level="O1")
    trainer = Trainer(model, optim, scheduler, fp_16=fp_16)
    for x, y in loader:
        trainer.train_on_batch(x, y)
'''


def test_a_test_of_private_state_between_identical_branches_gives_way(tmp_path):
    write(tmp_path, {"train.py": PRIVATE})
    run(tmp_path, "--write", "-q")
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text and "amp._amp_state" not in text and "_unskipped" not in text, text
    assert "        self.scaler.step(self.optim)\n        self.scaler.update()\n        self.scheduler.step()\n" in text, text
    compile(text, "train.py", "exec")
    before = text
    run(tmp_path, "--write", "-q")
    assert (tmp_path / "train.py").read_text() == before


def test_a_test_of_private_state_that_decides_something_stays_refused(tmp_path):
    for src in (PRIVATE.replace("        else:\n            self.scheduler.step()\n", "        else:\n            pass\n"),
                PRIVATE.replace("._unskipped != 0:", "._unskipped != len(y):")):
        write(tmp_path, {"train.py": src})
        out = run(tmp_path)
        assert "apex's private state is used at line 18: migrate it by hand" in out.output, out.output


SETUP = {
    "src/__init__.py": "",
    "src/utils.py": '''\
def initialize_amp(model, opt_level="O1", loss_scale="dynamic"):
    from apex import amp
    model.nn_module, model.optimizer = amp.initialize(
        model.nn_module, model.optimizer, opt_level=opt_level, loss_scale=loss_scale)
    model.amp = amp
''',
    "src/models.py": '''\
import torch

from argus import Model


class BirdModel(Model):
    def __init__(self, params):
        super().__init__(params)
        self.amp = None
        self.iter_size = params.get("iter_size", 1)

    def train_step(self, batch, state):
        self.train()
        self.optimizer.zero_grad()
        for i, (input, target) in enumerate(batch):
            prediction = self.nn_module(input)
            loss = self.loss(prediction, target)
            if self.amp is not None:
                delay_unscale = i != (self.iter_size - 1)
                with self.amp.scale_loss(loss, self.optimizer, delay_unscale=delay_unscale) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
        self.optimizer.step()
        return loss.item()
''',
    "train.py": '''\
from src.models import BirdModel
from src.utils import initialize_amp

USE_AMP = True


def train_fold(params, loader):
    model = BirdModel(params)
    if USE_AMP:
        initialize_amp(model)
    model.fit(loader, num_epochs=3)
    model = None
    return model
''',
}


def test_a_setup_function_keeps_the_scaler_on_the_object_it_is_handed(tmp_path):
    write(tmp_path, SETUP)
    run(tmp_path, "--write", "-q")
    utils = (tmp_path / "src/utils.py").read_text()
    models = (tmp_path / "src/models.py").read_text()
    assert "apex" not in utils + models and ".amp" not in utils.replace("torch.amp", "") + models.replace(
        "torch.amp", ""), utils + models
    assert "    model.scaler = torch.amp.GradScaler(" in utils and "amp.initialize" not in utils, utils
    assert "        self.scaler = torch.amp.GradScaler('cuda', enabled=False)\n" in models.replace('"', "'"), models
    assert "enabled=self.scaler.is_enabled()" in models, models
    assert "            self.scaler.scale(loss).backward()\n        self.scaler.step(self.optimizer)\n" \
        "        self.scaler.update()\n" in models, models
    # the plain branch folded into the scaled one, and apex's delay_unscale went with it
    assert "loss.backward()" not in models and "delay_unscale" not in models, models
    assert (tmp_path / "train.py").read_text() == SETUP["train.py"]
    for text in (utils, models):
        compile(text, "m.py", "exec")
    before = utils + models
    run(tmp_path, "--write", "-q")
    assert (tmp_path / "src/utils.py").read_text() + (tmp_path / "src/models.py").read_text() == before


def test_a_setup_function_with_bfloat16_sets_the_switch(tmp_path):
    write(tmp_path, SETUP)
    run(tmp_path, "--write", "-q", "--dtype", "bfloat16")
    utils = (tmp_path / "src/utils.py").read_text()
    models = (tmp_path / "src/models.py").read_text()
    assert "model.use_amp = opt_level != 'O0'" in utils.replace('"', "'"), utils
    assert "self.use_amp = False" in models and "enabled=self.use_amp" in models, models
    assert "apex" not in models and "GradScaler" not in models + utils, models


def test_a_setup_function_stays_refused_where_the_object_cannot_be_followed(tmp_path):
    cases = {
        # a callback reads `.amp` on the object: it would be gone
        "callback": {**SETUP, "callbacks.py": "def on_epoch(state):\n    return state.model.amp is not None\n"},
        # the caller hands it something made elsewhere
        "made elsewhere": {**SETUP, "train.py": SETUP["train.py"].replace("model = BirdModel(params)",
                                                                          "model = load_model(params)")},
        # bound on one branch only
        "one branch": {**SETUP, "train.py": SETUP["train.py"].replace(
            "    model = BirdModel(params)\n", "    model = params\n    if params:\n        model = BirdModel(params)\n")},
        # a subclass reads self.amp itself
        "subclass": {**SETUP, "src/more.py": "from src.models import BirdModel\n\n\nclass Big(BirdModel):\n"
                                            "    def log(self):\n        return self.amp is None\n"},
    }
    for why, files in cases.items():
        tmp = tmp_path / why.replace(" ", "_")
        write(tmp, files)
        out = run(tmp)
        assert "src/utils.py: not rewritten" in out.output, (why, out.output)
        assert "src/models.py: not rewritten" in out.output, (why, out.output)


OPTIONS = '''\
import torch
from apex import amp


def main(model, optim, loader, config):
    if config.get("fp_16"):
        opt_level = config.get("opt_level", "O2")
        keep_bn_fp32 = config.get("keep_batchnorm_fp32", True)
        if opt_level == "O1":
            keep_bn_fp32 = None
        model, optim = amp.initialize(model, optim, opt_level=opt_level, keep_batchnorm_fp32=keep_bn_fp32)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        with amp.scale_loss(loss, optim) as scaled_loss:
            scaled_loss.backward()
        optim.step()
'''


def test_a_name_only_apex_read_goes_with_every_binding(tmp_path):
    write(tmp_path, {"train.py": OPTIONS})
    run(tmp_path, "--write", "-q")
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text and "keep_bn_fp32" not in text and 'if opt_level == "O1"' not in text, text
    assert 'opt_level = config.get("opt_level", "O2")' in text, text
    compile(text, "train.py", "exec")


def test_a_binding_that_computes_something_keeps_the_name(tmp_path):
    write(tmp_path, {"train.py": OPTIONS.replace('keep_bn_fp32 = None', 'keep_bn_fp32 = decide(opt_level)')})
    run(tmp_path, "--write", "-q")
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text and "keep_bn_fp32 = decide(opt_level)" in text, text


DELAY = '''\
import torch
from apex import amp


class Learner:
    def __init__(self, model, optimizer, is_fp16, steps):
        self.model, self.optimizer, self.is_fp16, self.steps = model, optimizer, is_fp16, steps
        if is_fp16:
            self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O1")

    def step(self, batches):
        for i, (x, y) in enumerate(batches):
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            loss /= self.steps

            if self.is_fp16:
                # see https://nvidia.github.io/apex/advanced.html#gradient-accumulation-across-iterations
                delay_unscale = ((i + 1) % self.steps) != 0

                with amp.scale_loss(loss, self.optimizer, delay_unscale=delay_unscale) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()

        self.optimizer.step()
'''


def test_a_scaled_branch_that_binds_delay_unscale_folds(tmp_path):
    write(tmp_path, {"learner.py": DELAY})
    run(tmp_path, "--write", "-q")
    text = (tmp_path / "learner.py").read_text()
    assert "apex" not in text and "delay_unscale" not in text and "loss.backward()" not in text, text
    assert "            loss /= self.steps\n\n            self.scaler.scale(loss).backward()\n" in text, text
    assert "\n\n\n" not in text.split("class Learner")[1], text
    compile(text, "learner.py", "exec")


def test_with_bfloat16_the_loss_scale_only_apex_read_goes_too(tmp_path):
    src = OPTIONS.replace('        model, optim = amp.initialize(model, optim, opt_level=opt_level, ',
                          '        loss_scale = config.get("loss_scale", "dynamic")\n'
                          '        model, optim = amp.initialize(model, optim, opt_level=opt_level, loss_scale=loss_scale, ')
    write(tmp_path, {"train.py": src})
    run(tmp_path, "--write", "-q", "--dtype", "bfloat16")
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text and "loss_scale" not in text and "keep_bn_fp32" not in text, text
    write(tmp_path, {"train.py": src})
    run(tmp_path, "--write", "-q")
    text = (tmp_path / "train.py").read_text()
    assert 'loss_scale = config.get("loss_scale", "dynamic")' in text and "init_scale=" in text, text


LEFTOVER = {
    "trainer.py": '''\
import torch


def do_train(model, optimizer, loader, use_amp=False):
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
    for x, y in loader:
        with torch.autocast("cuda", enabled=use_amp):
            loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
''',
    "train.py": '''\
import torch
from apex import amp

from trainer import do_train


def main(model, loader, args):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # mixed precision
    level = "O1" if args.fp16 else "O0"
    model, optimizer = amp.initialize(model, optimizer, opt_level=level)
    do_train(model, optimizer, loader, use_amp=True)
''',
}


def test_an_initialize_left_over_beside_native_scaling_goes(tmp_path):
    write(tmp_path, LEFTOVER)
    run(tmp_path, "--write", "-q")
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text and "amp.initialize" not in text and "level" not in text, text
    assert "# mixed precision" not in text and "do_train(model, optimizer, loader, use_amp=True)" in text, text
    assert (tmp_path / "trainer.py").read_text() == LEFTOVER["trainer.py"]
    compile(text, "train.py", "exec")


def test_an_initialize_left_over_under_its_guard_goes_where_the_call_follows_it(tmp_path):
    src = LEFTOVER["train.py"].replace(
        '    level = "O1" if args.fp16 else "O0"\n    model, optimizer = amp.initialize(model, optimizer, opt_level=level)\n',
        '    if args.fp16:\n        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n').replace(
        "use_amp=True", "use_amp=args.fp16")
    write(tmp_path, {**LEFTOVER, "train.py": src})
    run(tmp_path, "--write", "-q")
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text and "if args.fp16" not in text and "use_amp=args.fp16" in text, text


def test_a_left_over_initialize_stays_where_it_may_still_matter(tmp_path):
    cases = {
        # the training's AMP has a switch of its own
        "own switch": (LEFTOVER["train.py"].replace("use_amp=True", "use_amp=args.amp"), "looks left over"),
        # O2 casts the model: the native scaler never ran beside it
        "o2": (LEFTOVER["train.py"].replace('"O1" if', '"O2" if'), "never used with amp.scale_loss"),
    }
    for why, (src, said) in cases.items():
        tmp = tmp_path / why.replace(" ", "_")
        write(tmp, {**LEFTOVER, "train.py": src})
        out = run(tmp)
        assert "train.py: not rewritten" in out.output and said in out.output, (why, out.output)
    # a training that does not scale natively: as before
    tmp = tmp_path / "plain"
    write(tmp, {**LEFTOVER, "trainer.py": LEFTOVER["trainer.py"].replace("scaler.scale(loss).backward()",
                                                                          "loss.backward()")})
    out = run(tmp)
    assert "never used with amp.scale_loss" in out.output, out.output
