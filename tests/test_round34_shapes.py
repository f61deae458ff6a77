"""Thirty-fourth round: a trainer whose apex and fp32 branches assign the same once initialize
goes, read as a reviewer reads the diff.

``if opt_level: logging.info("using apex.amp ..."); self.model, self.optimizer =
amp.initialize(model, optimizer, ...) / else: self.model, self.optimizer = model, optimizer``
(an allennlp callback trainer): the migrated ``if`` kept two identical branches and a log line
that still said apex.  The ``if`` becomes the one assignment now.  ``self._use_apex = opt_level
is not None``, read only by the ``if self._use_apex: with amp.scale_loss(...)`` that went, is
dead code the migration made: it goes, unless another module (or a ``getattr`` string) still
reads it.  The GradScaler made before a statement goes above the comment lines that describe
that statement, not between them.  A first import that goes takes the blank line after it (no
file starts with a blank line), and a long line a fix wrote under a comment line is fitted like
any other.

``optimizer.backward(loss)`` of FP16_Optimizer, then ``clip_grad_norm_(model.parameters(), c)``,
then ``optimizer.step()`` (NER-BERT's train loop): the clip changed the float16 copies FP16_Optimizer's
step never read; migrated, it would clip scaled gradients (refused by the self-check before).
``scaler.unscale_`` goes before it now, as an unsafe fix that says why (the float16 path clips
from now on, as the float32 path did), and a dry run keeps saying "needs --unsafe-fixes (why)"
when a safe fix elsewhere in the file changed it first.

``sys.path.append("./apex")`` in the ``try`` of apex's import (sthalles/SimCLR, ConVIRT) stayed
behind once the guard unwrapped; it goes with the import now (a path that names something else stays).

A clip of the model's own parameters inside ``with amp.scale_loss(...)`` (the README's unsafe fix)
was refused by the self-check: only a clip of ``amp.master_params`` got its ``unscale_``.  Where the
optimizer steps right after the block every time, ``scaler.unscale_`` goes before the clip now; on
micro-batches (one ``unscale_`` a step) it stays refused.
"""
from test_round17_shapes import migrated, run, write

TRAINER = '''\
import logging

import torch
from apex import amp


class Trainer:
    def __init__(self, model, optimizer, opt_level=None):
        # the model must be on the GPU already,
        # or the optimizer would be wrong
        if opt_level:
            logging.info(f"using apex.amp with opt_level {opt_level}")
            self.model, self.optimizer = amp.initialize(model, optimizer, opt_level=opt_level)
        else:
            self.model, self.optimizer = model, optimizer
        self._use_apex = opt_level is not None
        self.steps = 0

    def step(self, batch):
        loss = self.model(batch).sum()
        if self._use_apex:
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.steps += 1


def main():
    model = torch.nn.Linear(4, 4).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    t = Trainer(model, opt, opt_level="O1")
    for _ in range(3):
        t.step(torch.randn(2, 4, device="cuda"))


if __name__ == "__main__":
    main()
'''

REPORT = '''\
from trainer import Trainer


def describe(t: Trainer) -> str:
    return "apex" if t._use_apex else "fp32"
'''


def test_identical_branches_become_one_assignment(tmp_path):
    text = migrated(tmp_path, {"trainer.py": TRAINER}, "trainer.py")
    assert "if opt_level" not in text and "else:" not in text.split("def step")[0], text
    assert text.count("self.model, self.optimizer = model, optimizer") == 1, text
    # the log line said apex: it went with the branch; logging is no longer imported
    assert "apex" not in text.lower() and "logging" not in text, text


def test_flag_attribute_only_the_apex_code_read_goes(tmp_path):
    text = migrated(tmp_path, {"trainer.py": TRAINER}, "trainer.py")
    assert "_use_apex" not in text, text
    assert "        self.model, self.optimizer = model, optimizer\n        self.steps = 0\n" in text, text


def test_flag_attribute_another_module_reads_stays(tmp_path):
    text = migrated(tmp_path, {"trainer.py": TRAINER, "report.py": REPORT}, "trainer.py")
    assert "        self._use_apex = opt_level is not None\n" in text, text
    # the rest of the migration is the same
    assert "if self._use_apex" not in text and "self.scaler.scale(loss).backward()" in text, text


def test_flag_attribute_named_in_a_string_stays(tmp_path):
    report = 'from trainer import Trainer\n\n\ndef describe(t: Trainer):\n    return getattr(t, "_use_apex", False)\n'
    text = migrated(tmp_path, {"trainer.py": TRAINER, "report.py": report}, "trainer.py")
    assert "self._use_apex = opt_level is not None" in text, text


def test_flag_attribute_a_module_that_does_not_import_it_reads_stays(tmp_path):
    # a callback handed the trainer: it never imports the trainer's module
    callback = 'def on_step(trainer):\n    return "apex" if trainer._use_apex else "fp32"\n'
    text = migrated(tmp_path, {"trainer.py": TRAINER, "callback.py": callback}, "trainer.py")
    assert "self._use_apex = opt_level is not None" in text, text


def test_scaler_goes_above_the_comment_of_the_statement_under_it(tmp_path):
    text = migrated(tmp_path, {"trainer.py": TRAINER}, "trainer.py")
    init = text.split("    def __init__(self, model, optimizer, opt_level=None):\n")[1].split("\n\n")[0]
    assert init.index("self.scaler = torch.amp.GradScaler(") < init.index("# the model must be on the GPU"), init
    assert ("        # or the optimizer would be wrong\n"
            "        self.model, self.optimizer = model, optimizer\n") in init, init


def test_a_comment_on_mixed_precision_keeps_the_scaler_under_it(tmp_path):
    src = TRAINER.replace("        # the model must be on the GPU already,\n        # or the optimizer would be wrong\n",
                          "        # mixed precision\n")
    text = migrated(tmp_path, {"trainer.py": src}, "trainer.py")
    assert "        # mixed precision\n        self.scaler = torch.amp.GradScaler(" in text, text


def test_first_import_that_goes_leaves_no_blank_first_line(tmp_path):
    text = migrated(tmp_path, {"trainer.py": TRAINER}, "trainer.py")
    assert text.startswith("import torch\n\n\nclass Trainer:"), text[:80]


def test_branches_that_differ_stay(tmp_path):
    src = TRAINER.replace("            self.model, self.optimizer = model, optimizer\n",
                          "            self.model, self.optimizer = model.float(), optimizer\n")
    text = migrated(tmp_path, {"trainer.py": src}, "trainer.py")
    assert "        if opt_level:\n" in text and "model.float(), optimizer" in text, text
    # a log line that does not speak of apex keeps its branch too
    src = TRAINER.replace('f"using apex.amp with opt_level {opt_level}"', 'f"mixed precision {opt_level}"')
    text = migrated(tmp_path / "b", {"trainer.py": src}, "trainer.py")
    assert '            logging.info(f"mixed precision {opt_level}")\n' in text, text


def test_a_long_line_a_fix_wrote_under_a_comment_is_fitted():
    from ampfix.engine.fit import fit_lines

    before = "def f(a):\n    # a comment\n    x = 1\n"
    long = "    y = some_function(first_argument_name=1, second_argument_name=2, third_argument_name=3)\n"
    after = "def f(a):\n    # a comment\n" + long
    fitted = fit_lines(before, after)
    assert all(len(line) <= 88 for line in fitted.splitlines()), fitted
    assert "# a comment" in fitted and "third_argument_name=3" in fitted, fitted


FP16_CLIP = '''\
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--fp16", action="store_true")
args = parser.parse_args()


def train(model, data, optimizer):
    model.train()
    for x, y in data:
        loss = nn.functional.cross_entropy(model(x), y)
        model.zero_grad()
        if args.fp16:
            optimizer.backward(loss)
        else:
            loss.backward()
        nn.utils.clip_grad_norm_(parameters=model.parameters(), max_norm=1.0)
        optimizer.step()


def main():
    model = nn.Linear(4, 4).cuda()
    if args.fp16:
        model.half()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if args.fp16:
        from apex.fp16_utils import FP16_Optimizer
        optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)
    data = [(torch.randn(2, 4, device="cuda"), torch.tensor([0, 1]).cuda())]
    train(model, data, optimizer)
'''


def test_fp16_optimizer_then_a_clip_of_the_model_is_an_unsafe_fix(tmp_path):
    # FP16_Optimizer's backward copied the scaled float16 gradients to its master copies and
    # unscaled those: the clip of model.parameters() changed nothing its step read.  Migrated, the
    # clip would see scaled gradients (refused before); with unscale_ first it clips what the
    # step uses, as the float32 path did: the numbers change, so it needs --unsafe-fixes
    write(tmp_path, {"train.py": FP16_CLIP})
    out = run(tmp_path)
    assert "AMP102 needs --unsafe-fixes (the clip at line 20 clipped the float16 model's gradients" in out.output, \
        out.output
    # a safe fix elsewhere in the file (the tensor made on the device) does not hide why
    assert 'torch.tensor([0, 1], device="cuda")' in out.output, out.output
    text = migrated(tmp_path, {"train.py": FP16_CLIP}, "train.py", "--unsafe-fixes")
    assert ("        scaler.scale(loss).backward()\n"
            "        scaler.unscale_(optimizer)\n"
            "        nn.utils.clip_grad_norm_(parameters=model.parameters(), max_norm=1.0)\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n") in text, text
    assert "FP16_Optimizer" not in text and "model.half()" not in text, text


def test_fp16_optimizer_without_a_model_clip_stays_safe(tmp_path):
    src = FP16_CLIP.replace("        nn.utils.clip_grad_norm_(parameters=model.parameters(), max_norm=1.0)\n", "")
    text = migrated(tmp_path, {"train.py": src}, "train.py")
    assert "scaler.unscale_" not in text and "FP16_Optimizer" not in text, text


SYS_PATH = '''\
import sys

import torch

apex_support = False
try:
    sys.path.append("./apex")
    from apex import amp

    apex_support = True
except ImportError:
    print("Please install apex for mixed precision training")
    apex_support = False


def train(model, optimizer, fp16):
    if apex_support and fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
    for _ in range(3):
        loss = model(torch.randn(2, 4, device="cuda")).sum()
        optimizer.zero_grad()
        if apex_support and fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()
'''


def test_a_path_added_for_apex_goes_with_its_import(tmp_path):
    text = migrated(tmp_path, {"train.py": SYS_PATH}, "train.py")
    assert "sys.path" not in text and "import sys" not in text and "apex" not in text.lower(), text
    assert text.startswith("import torch\n\n\ndef train("), text
    # a path that does not name apex stays (it may serve other imports)
    other = SYS_PATH.replace('sys.path.append("./apex")', 'sys.path.append("./third_party")')
    text = migrated(tmp_path / "b", {"train.py": other}, "train.py")
    assert 'sys.path.append("./third_party")' in text and "import sys" in text, text


CLIP_IN_BLOCK = '''\
import torch
from apex import amp


def main():
    model = torch.nn.Linear(4, 4).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1")
    for _ in range(3):
        loss = model(torch.randn(2, 4, device="cuda")).sum()
        with amp.scale_loss(loss, opt) as scaled_loss:
            scaled_loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
'''


def test_a_clip_of_the_model_inside_scale_loss_unscales_first_as_an_unsafe_fix(tmp_path):
    # the README's row: a clip inside the block is an unsafe fix; with the model's own parameters
    # (not amp.master_params) nothing unscaled before it, so the self-check refused the module
    write(tmp_path, {"t.py": CLIP_IN_BLOCK})
    out = run(tmp_path)
    assert "AMP101 needs --unsafe-fixes (the clip at line 13 ran inside apex's scale_loss block" in out.output, \
        out.output
    text = migrated(tmp_path / "u", {"t.py": CLIP_IN_BLOCK}, "t.py", "--unsafe-fixes")
    assert ("        scaler.scale(loss).backward()\n"
            "        scaler.unscale_(opt)\n"
            "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
            "        scaler.step(opt)\n"
            "        scaler.update()\n") in text, text


def test_a_clip_inside_scale_loss_on_micro_batches_stays_refused(tmp_path):
    # the step runs every second batch: one unscale_ a step cannot go before each clip
    src = CLIP_IN_BLOCK.replace("    for _ in range(3):\n", "    for i in range(4):\n").replace(
        "        opt.step()\n", "        if i % 2 == 1:\n            opt.step()\n")
    write(tmp_path, {"t.py": src})
    out = run(tmp_path, "--unsafe-fixes")
    assert "not rewritten: its output would be wrong: AMP206" in out.output, out.output
