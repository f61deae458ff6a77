"""Forty-first round: what the public code of this round showed.

1. With bfloat16, a forward's output squashed before it is handed to numpy (jionie's Google QUEST
   k-fold scripts: ``prediction = torch.sigmoid(prediction)`` then
   ``pred_train = prediction.cpu().detach().numpy()``) was refused: numpy has no bfloat16.  A
   sigmoid, softmax, log_softmax or tanh gives a floating tensor whatever it is given, so where
   such a binding is the last one before the call and lies on every way to it, ``.float()`` goes
   before ``.numpy()`` (float32 where it was bfloat16, a no-op on float32).  A binding on one
   branch only, a later binding that a loop brings round to the call, or an op that keeps an
   integer dtype (``torch.relu``) keeps it refused.
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
