"""Forty-second round: what the public code of this round showed.

1. A trainer copied from Hugging Face's of 2020 (VL-T5 and the projects built on it, LM-BFF,
   x-lxmert: ``_use_native_amp = False``; ``if version.parse(torch.__version__) < ...: ...
   _use_apex = True else: _use_native_amp = True``) kept ``_use_native_amp = True`` and every
   ``if self.args.fp16 and _use_native_amp:`` once the apex side went: a flag that can only be
   True, read in tests that no longer choose anything.  Where every read the module keeps is an
   operand of such an ``and`` inside a function, and no other module names the flag, the
   operand leaves the test and the flag's stores go (the version test with them).
2. Two branches that hand apex's scale_loss different optimizers (the CLIP-ViL tasks of
   VL_adapter: ``if args.use_separate_optimizer_for_visual: with amp.scale_loss(loss,
   self.optim.optimizers) ... else: with amp.scale_loss(loss, self.optim) ...``) both became
   ``self.scaler.scale(loss).backward()``: an ``if`` whose branches the fixes made the same text
   gives way to one copy, where its test has no effect of its own.  Branches alike before the
   fixes, a comment in one of them, or a test that calls something keep the ``if``.
"""
from pathlib import Path

from test_round17_shapes import migrated

SEPARATE = '''\
import torch
from apex import amp


def train(model, optim, sgd, loader, args):
    model, [optim, sgd] = amp.initialize(model, [optim, sgd], opt_level="O1")
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        if args.separate:
            with amp.scale_loss(loss, [optim, sgd]) as scaled_loss:
                scaled_loss.backward()
        else:
            with amp.scale_loss(loss, optim) as scaled_loss:
                scaled_loss.backward()
        optim.step()
        sgd.step()
        optim.zero_grad()
        sgd.zero_grad()
'''


def test_branches_the_migration_makes_alike_give_way_to_one_copy(tmp_path: Path):
    out = migrated(tmp_path, {"train.py": SEPARATE}, "train.py")
    assert "apex" not in out and "args.separate" not in out, out
    assert out.count("scaler.scale(loss).backward()") == 1
    body = out[out.index("for x, y in loader:"):]
    assert body.index("scaler.scale(loss).backward()") < body.index("scaler.step(optim)")
    compile(out, "train.py", "exec")


def test_branches_that_stay_different_or_were_alike_keep_their_if(tmp_path: Path):
    # a comment of its own in one branch
    src = SEPARATE.replace("        else:\n", "        else:\n            # the single optimizer\n")
    out = migrated(tmp_path / "a", {"train.py": src}, "train.py")
    assert "if args.separate:" in out and "# the single optimizer" in out
    # a test that calls something: it runs whatever the branches do
    src = SEPARATE.replace("if args.separate:", "if args.flag():")
    out = migrated(tmp_path / "b", {"train.py": src}, "train.py")
    assert "if args.flag():" in out and out.count("scaler.scale(loss).backward()") == 2
    # branches alike in the user's code before any fix: not the fixes' doing
    src = SEPARATE.replace("        optim.step()\n",
                           "        if args.log:\n            print(1)\n        else:\n            print(1)\n"
                           "        optim.step()\n")
    out = migrated(tmp_path / "c", {"train.py": src}, "train.py")
    assert "if args.log:" in out and "args.separate" not in out
