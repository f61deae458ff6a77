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
