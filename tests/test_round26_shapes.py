"""Twenty-sixth round: shapes of the twenty-sixth batch and of the refusals they share with the
corpus (measured before these fixes).

1. A subclass of Hugging Face's `Trainer` that overrides `train()` (a copy of the framework's loop)
   reads `self.use_apex`, which the framework's `__init__` sets: `if self.use_apex:
   amp.initialize(...)`, `amp.master_params(opt) if self.use_apex else model.parameters()`.  The
   scaled backward is the framework's own (`training_step`), so "the optimizer is never used with
   amp.scale_loss" refused it.  The framework sets `use_apex` only for the apex backend and raises
   when apex is missing: the apex path is dead code once apex is gone, and the native path
   (`self.use_amp`, `self.scaler`) is the framework's.
2. apex set up inside a `try:` whose handler only reports, with a log line or some arithmetic
   before `amp.initialize` (`logging.info(...)`, `t_total = int(len(loader) * epochs)`): refused
   as "runs inside a `try` statement".  Those statements do not fail where apex's import could;
   the scaler is made where the `try` was, and a log line that spoke of apex goes with it.
"""
from test_round17_shapes import run, write

HF_SUBCLASS = '''\
import torch
from transformers import Trainer
from transformers.file_utils import is_apex_available

if is_apex_available():
    from apex import amp


class ContrastiveTrainer(Trainer):
    def train(self, model_path=None):
        model = self.model
        # Mixed precision training with apex (torch < 1.6)
        if self.use_apex:
            model, self.optimizer = amp.initialize(model, self.optimizer, opt_level=self.args.fp16_opt_level)
        for inputs in self.get_train_dataloader():
            loss = self.training_step(model, inputs)
            if self.use_amp:
                self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(
                amp.master_params(self.optimizer) if self.use_apex else model.parameters(),
                self.args.max_grad_norm,
            )
            if self.use_amp:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
        return loss
'''


def test_a_subclass_of_the_framework_trainer_drops_its_apex_path(tmp_path):
    write(tmp_path, {"trainers.py": HF_SUBCLASS})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "trainers.py").read_text()
    assert "amp." not in text and "apex" not in text.lower().replace("# mixed precision training with apex", "")
    assert "use_apex" not in text
    assert "torch.nn.utils.clip_grad_norm_(\n                model.parameters(),\n" in text
    # the framework's native path is untouched
    assert text.count("self.scaler.") == 3 and "self.use_amp" in text
    compile(text, "trainers.py", "exec")
    assert "Would rewrite 0 files" in run(tmp_path).output


def test_a_subclass_that_sets_use_apex_itself_is_not_settled_by_the_framework(tmp_path):
    own = HF_SUBCLASS.replace("        model = self.model\n",
                              "        model = self.model\n        self.use_apex = self.args.fp16\n")
    write(tmp_path, {"trainers.py": own})
    out = run(tmp_path, "--write")
    assert out.exit_code == 1, out.output  # problems are left for a person
    # the class decides `use_apex` itself: the framework's fact does not hold, the apex path is not
    # dropped (it is refused, with the reason, as before)
    assert (tmp_path / "trainers.py").read_text() == own
    assert "never used with amp.scale_loss" in out.output


TRY_SETUP = '''\
import logging
import sys

import torch


def train(model, optimizer, data, apex_enable):
    for x, y in data:
        loss = torch.nn.functional.mse_loss(model(x), y)
        if apex_enable:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(4)]
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    apex_enable = False
    try:
        from apex import amp

        logging.info("Enable apex successful")
        t_total = int(len(data) * epochs)
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        apex_enable = True
    except Exception as e:
        logging.error(e)
        logging.error("import apex failed")
    train(model, optimizer, data, apex_enable)
'''


def test_a_try_with_a_log_line_and_arithmetic_before_initialize(tmp_path):
    write(tmp_path, {"train.py": TRY_SETUP})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "apex." not in text and "amp.scale_loss" not in text and "from apex" not in text
    # the scaler exists wherever the step runs: made before the try, not inside it
    assert text.index("scaler = torch.amp.GradScaler(") < text.index("    try:\n")
    # the try keeps what may still fail and its handler; it does not start with a blank line, and
    # apex's success message went with apex
    assert "    try:\n        t_total = int(len(data) * epochs)\n" in text
    assert "Enable apex successful" not in text and 'logging.error("import apex failed")' in text
    assert "scaler.scale(loss).backward()" in text
    compile(text, "train.py", "exec")
    assert "Would rewrite 0 files" in run(tmp_path).output


def test_a_try_whose_body_may_fail_before_initialize_stays_refused(tmp_path):
    """`model.load_state_dict(torch.load(path))` before `amp.initialize` may fail, and the handler
    goes on without AMP: a scaler made inside would not exist at the step."""
    risky = TRY_SETUP.replace('        t_total = int(len(data) * epochs)\n',
                              '        model.load_state_dict(torch.load("init.pt"))\n')
    write(tmp_path, {"train.py": risky})
    out = run(tmp_path, "--write")
    text = (tmp_path / "train.py").read_text()
    assert "amp.initialize" in text and "GradScaler" not in text
    assert "runs inside a `try` statement" in out.output


def test_apex_log_line_stays_where_apex_is_still_set_up(tmp_path):
    """The try keeps `from apex import amp` (its initialize is refused) while the import of apex's
    DDP goes: the log line that says apex is enabled still tells the truth and stays."""
    kept = TRY_SETUP.replace("        from apex import amp\n",
                             "        from apex import amp\n        from apex.parallel import DistributedDataParallel\n")
    kept = kept.replace('        t_total = int(len(data) * epochs)\n',
                        '        model.load_state_dict(torch.load("init.pt"))\n')
    kept = kept.replace("        apex_enable = True\n",
                        "        model = DistributedDataParallel(model)\n        apex_enable = True\n")
    write(tmp_path, {"train.py": kept})
    run(tmp_path, "--write")
    text = (tmp_path / "train.py").read_text()
    assert "from apex import amp" in text and "apex.parallel" not in text
    assert 'logging.info("Enable apex successful")' in text


def test_a_run_of_statements_that_opens_a_block_goes_in_one_edit():
    """Three apex imports at the head of a `try:` body, a blank line, then the flag: removing the
    three leaves the block starting with the flag (no blank line), in edits that do not overlap
    (one edit for the run: a first version gave each import its own edit inside the run's)."""
    from ampfix.engine.tidy import Remover
    from ampfix.model.edits import apply_edits
    from ampfix.model.semantic import Model
    from ampfix.model.source import Source

    text = ("try:\n    from apex import amp\n    from apex.parallel import DistributedDataParallel as DDP\n"
            "    from apex.parallel import convert_syncbn_model\n\n    has_apex = True\n"
            "except ImportError:\n    has_apex = False\n")
    src = Source(text.encode(), "m.py", text=text)
    src.parse()
    model = Model(src.tree)
    edits = Remover(src, model).remove(src.tree.body[0].body[:3])
    assert apply_edits(text, edits) == "try:\n    has_apex = True\nexcept ImportError:\n    has_apex = False\n"


INIT_SCALE = '''\
import argparse

import torch
from apex import amp


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--loss_scale", type=float, default=0)
    parser.add_argument("--init_loss_scale", type=float, default=2 ** 20)
    args = parser.parse_args()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.fp16:
        if args.loss_scale == 0:
            model, optimizer = amp.initialize(model, optimizer, opt_level="O2", loss_scale="dynamic")
        else:
            model, optimizer = amp.initialize(model, optimizer, opt_level="O2", loss_scale=args.loss_scale)
        amp._amp_state.loss_scalers[0]._loss_scale = args.init_loss_scale
    for _ in range(3):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        if args.fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
'''


def test_apex_private_first_loss_scale_read_from_the_arguments(tmp_path):
    """NVIDIA's BERT pre-training sets apex's first loss scale through its private state from an
    argument, after one initialize per branch: the scaler's init_scale reads the same argument,
    and the private line goes once (it served both branches)."""
    write(tmp_path, {"train.py": INIT_SCALE})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "_amp_state" not in text and "apex" not in text
    assert text.count("GradScaler(") == 1 and "init_scale=args.init_loss_scale" in text
    compile(text, "train.py", "exec")
    assert "Would rewrite 0 files" in run(tmp_path).output


def test_a_first_loss_scale_that_reads_a_name_bound_after_initialize_is_refused(tmp_path):
    rebound = INIT_SCALE.replace("        amp._amp_state.loss_scalers[0]._loss_scale = args.init_loss_scale\n",
                                 "        first = args.init_loss_scale * 2\n"
                                 "        amp._amp_state.loss_scalers[0]._loss_scale = first\n")
    write(tmp_path, {"train.py": rebound})
    out = run(tmp_path, "--write")
    assert (tmp_path / "train.py").read_text() == rebound
    assert "reads a name bound after amp.initialize" in out.output
