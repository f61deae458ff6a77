"""Thirtieth round: what the public code of this round's holdout batch showed, read as a reviewer
reads a diff (each migrated right by the corpus's counts, each left something a reviewer would
not merge):

1. ``if comm.get_world_size() > 1: model, optimizer = amp.initialize(...)`` in a trainer's
   ``__init__``: the GradScaler made right before the ``if`` evaluates its test now
   (``enabled=comm.get_world_size() > 1 and ...``), yet the emptied ``if`` stayed as ``if ...:
   pass``, because its test calls a function.  It goes: the call still runs once, in the scaler.
2. Comments that could no longer be uncommented: ``# print(keep_batchnorm_fp32)`` above the
   initialize whose only argument read that name (the assignment went), and the commented-out
   debugging right below a clip of ``amp.master_params`` (``# norm_b = ...master_params...``,
   ``# print(name, norm_a, norm_b)``).
3. ``# https://nvidia.github.io/apex/amp.html#checkpointing`` above the checkpoint line that now
   saves the GradScaler's state points to apex's docs: it goes (``# save amp state`` alone stays:
   it still says what the line does).
"""
from test_round17_shapes import run, write

TRAINER = '''\
import torch
from apex import amp

import comm


class ApexTrainer:
    def __init__(self, model, data_loader, optimizer, apex_opt_level="O1"):
        if comm.get_world_size() > 1:
            model, optimizer = amp.initialize(model, optimizer, opt_level=apex_opt_level)
        self.model = model
        self.optimizer = optimizer
        self.data = iter(data_loader)

    def run_step(self):
        losses = self.model(next(self.data))
        self.optimizer.zero_grad()
        with amp.scale_loss(losses, self.optimizer) as scaled_loss:
            scaled_loss.backward()
        self.optimizer.step()

    def state_dict(self):
        ret = {"optimizer": self.optimizer.state_dict()}
        # save amp state according to
        # https://nvidia.github.io/apex/amp.html#checkpointing
        ret["amp"] = amp.state_dict()
        # save amp state
        ret["amp2"] = amp.state_dict()
        return ret
'''

COMMENTED = '''\
import torch
from apex import amp
from torch.nn.utils import clip_grad_norm_


def train(model, optimizer, loader, opt_level, max_norm):
    keep_batchnorm_fp32 = True if opt_level in ("O2", "O3") else None
    # print(keep_batchnorm_fp32)
    # keep batch norm in float32 where the level casts the model
    model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level,
                                      keep_batchnorm_fp32=keep_batchnorm_fp32)
    for x, y in loader:
        loss = model(x, y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        # norm_a = sum(p.grad.norm() for p in amp.master_params(optimizer))
        clip_grad_norm_(amp.master_params(optimizer), max_norm)
        # norm_b = sum(p.grad.norm() for p in amp.master_params(optimizer))
        # print(norm_a, norm_b)
        optimizer.step()
        # print(loss.item())
'''


def _migrated(tmp_path, name, text, *extra):
    write(tmp_path, {name: text, "comm.py": "def get_world_size():\n    return 1\n"})
    out = run(tmp_path, "--write", "-q", *extra)
    assert out.exit_code == 0, out.output
    return (tmp_path / name).read_text()


def test_a_guard_whose_test_the_scaler_evaluates_goes_when_emptied(tmp_path):
    text = _migrated(tmp_path, "trainer.py", TRAINER)
    compile(text, "trainer.py", "exec")
    assert "pass" not in text, text
    assert text.count("comm.get_world_size()") == 1, text
    assert 'enabled=comm.get_world_size() > 1 and apex_opt_level != "O0"' in text, text
    assert "amp.initialize" not in text and "from apex" not in text, text


def test_a_pointer_to_apex_docs_above_a_checkpoint_line_goes(tmp_path):
    text = _migrated(tmp_path, "trainer.py", TRAINER)
    assert "nvidia.github.io/apex" not in text and "according to" not in text, text
    # a comment that still says what the line does stays
    assert '        # save amp state\n        ret["amp2"] = self.scaler.state_dict()' in text, text
    assert 'ret["amp"] = self.scaler.state_dict()' in text, text


def test_commented_out_code_that_reads_what_went_goes(tmp_path):
    text = _migrated(tmp_path, "train.py", COMMENTED)
    compile(text, "train.py", "exec")
    assert "keep_batchnorm_fp32" not in text, text
    # prose stays; commented-out code that reads no removed name stays
    assert "# keep batch norm in float32 where the level casts the model" in text, text
    assert "        # print(loss.item())" in text, text
    # the debugging around the clip of apex's master params goes, above and below
    assert "norm_a" not in text and "norm_b" not in text, text
    assert "scaler.unscale_(optimizer)" in text, text


def test_the_cleanup_is_idempotent(tmp_path):
    once = _migrated(tmp_path, "train.py", COMMENTED)
    twice = _migrated(tmp_path, "train.py", once)
    assert twice == once
    once = _migrated(tmp_path, "trainer.py", TRAINER)
    assert _migrated(tmp_path, "trainer.py", once) == once


LABELS = '''\
import torch
from apex import amp


def train(model, optimizer, loader, fp16):
    # apex: amp fp16 mixed-precision training
    if fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in loader:
        loss = model(x, y)
        optimizer.zero_grad()
        # add apex for loss.backward()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()


def train2(model, optimizer, loader):
    #  Apex
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in loader:
        loss = model(x, y)
        optimizer.zero_grad()
        # Mixed precision training https://github.com/NVIDIA/apex
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
'''


def test_apex_as_a_comment_label_goes_from_the_lines_above_what_the_migration_writes(tmp_path):
    text = _migrated(tmp_path, "train.py", LABELS)
    compile(text, "train.py", "exec")
    # the label and the link go, what the comment says stays
    assert "    # amp fp16 mixed-precision training\n    scaler = torch.amp.GradScaler(" in text, text
    assert "Apex" not in text and "github.com/NVIDIA" not in text, text
    assert "        # Mixed precision training\n        scaler.scale(loss).backward()" in text, text
    # apex as part of what a comment says: the comment stays as written
    assert "# add apex for loss.backward()" in text, text
    assert _migrated(tmp_path, "train.py", text) == text


DUAL = '''\
import argparse
from contextlib import suppress
from functools import partial

import torch

try:
    from apex import amp
    has_apex = True
except ImportError:
    has_apex = False

has_native_amp = hasattr(torch.cuda.amp, "autocast")


def main(model, optimizer, loader, criterion):
    parser = argparse.ArgumentParser()
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--apex-amp", action="store_true")
    parser.add_argument("--native-amp", action="store_true")
    args = parser.parse_args()
    use_amp = None
    if args.amp:
        # for backwards compat, `--amp` tries apex before native amp
        if has_apex:
            args.apex_amp = True
        elif has_native_amp:
            args.native_amp = True
    if args.apex_amp and has_apex:
        use_amp = "apex"
    elif args.native_amp and has_native_amp:
        use_amp = "native"

    amp_autocast = suppress
    scaler = None
    if use_amp == "apex":
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    elif use_amp == "native":
        amp_autocast = partial(torch.autocast, "cuda")
        scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        with amp_autocast():
            loss = criterion(model(x), y)
        optimizer.zero_grad()
        if use_amp == "apex":
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
        elif scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
'''


def test_a_comment_about_the_apex_branch_that_went_goes_with_it(tmp_path):
    text = _migrated(tmp_path, "train.py", DUAL)
    compile(text, "train.py", "exec")
    assert "has_apex" not in text and "amp.initialize" not in text, text
    # the `if has_apex:` try went, and the comment that said `--amp` tries apex first with it
    assert "tries apex" not in text, text
    assert "    if args.amp:\n        if has_native_amp:\n            args.native_amp = True" in text, text
    assert _migrated(tmp_path, "train.py", text) == text
