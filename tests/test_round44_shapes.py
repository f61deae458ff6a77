"""Forty-fourth round: what the public code of this round showed.

1. A trainer class that initializes ``self.model`` in ``__init__`` (a depth-completion
   ``Trainer(args, model, ...)`` whose ``__init__`` calls ``amp.initialize(self.model,
   self.optimizer, opt_level=self.opt_level)``; the LXMERT task classes) evaluates it in its other
   methods: ``evaluate_one_epoch`` under ``torch.no_grad()`` through ``self.eval_step(data)``,
   ``predict`` with ``self.model(...)`` directly.  apex ran those in half precision (O1 patched
   torch, O2 cast the model); the migration left them in float32, because the evaluation pass
   only looked at calls that hand the model to a function.  Now each such forward (or call of a
   method of the class that runs the model and trains nothing) runs under autocast with the
   scaler the object keeps, where the object always holds one.
2. AMP206's fix (``scaler.unscale_(optimizer)`` before a clip of scaled gradients) is unsafe: it
   changes what the clip does (the threshold then limits the true gradients), as the migration
   already said of apex code that clipped inside ``amp.scale_loss``.  The two now agree: a change
   of training needs ``--unsafe-fixes``.
"""
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from ampfix.cli import main
from test_round17_shapes import migrated

TRAINER = textwrap.dedent('''\
    import torch
    from apex import amp


    class Trainer:
        def __init__(self, model, optimizer, opt_level="O1"):
            self.model = model
            self.optimizer = optimizer
            self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level=opt_level)

        def train_step(self, data):
            x, y = data
            pred = self.model(x)
            return pred, torch.nn.functional.mse_loss(pred, y)

        def eval_step(self, data):
            return self.train_step(data)

        def train_one_epoch(self, loader):
            self.model.train()
            for data in loader:
                pred, loss = self.train_step(data)
                with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                    scaled_loss.backward()
                self.optimizer.step()
                self.optimizer.zero_grad()

        def evaluate(self, loader):
            self.model.eval()
            total = []
            with torch.no_grad():
                for data in loader:
                    pred, loss = self.eval_step(data)
                    total.append(loss)
            return torch.stack(total).mean()

        def predict(self, x):
            self.model.eval()
            with torch.no_grad():
                out = self.model(x)
                best = out.argmax(1)
            return best
''')

REGION = 'with torch.autocast("cuda", dtype=torch.float16, enabled=self.scaler.is_enabled()):'


def test_the_classs_evaluations_run_under_autocast(tmp_path: Path):
    out = migrated(tmp_path, {"trainer.py": TRAINER}, "trainer.py")
    assert "apex" not in out and "amp.scale_loss" not in out, out
    # through the helper method that runs the model (eval_step -> train_step)
    assert f"            for data in loader:\n                {REGION}\n" \
           "                    pred, loss = self.eval_step(data)\n" in out, out
    # directly
    assert f"        with torch.no_grad():\n            {REGION}\n" \
           "                out = self.model(x)\n" in out, out
    # training: one region around the forward, none added inside the helpers themselves
    assert out.count("torch.autocast(") == 3, out
    assert "    def train_step(self, data):\n        x, y = data\n        pred = self.model(x)\n" in out


def test_the_migrated_trainer_runs_and_evaluates(tmp_path: Path):
    torch = pytest.importorskip("torch")
    out = migrated(tmp_path, {"trainer.py": TRAINER}, "trainer.py")
    ns = {}
    exec(compile(out, "trainer.py", "exec"), ns)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    t = ns["Trainer"](model, torch.optim.SGD(model.parameters(), lr=0.1))
    data = [(torch.randn(8, 4), torch.randn(8, 2)) for _ in range(4)]
    before = t.evaluate(data)
    t.train_one_epoch(data)
    assert t.evaluate(data) < before
    assert t.predict(torch.randn(3, 4)).shape == (3,)


def test_no_region_where_the_object_may_not_hold_a_scaler(tmp_path: Path):
    # set up in `fit`, which is the only method that reads the scaler: `predict` may run
    # before it (no scaler on the object then), so it is left in float32
    init = "        self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level=opt_level)\n"
    assert init in TRAINER
    src = TRAINER.replace(init, "        self.opt_level = opt_level\n").replace(
        "    def train_one_epoch(self, loader):\n",
        "    def train_one_epoch(self, loader):\n" + init.replace("opt_level=opt_level", "opt_level=self.opt_level"))
    out = migrated(tmp_path, {"trainer.py": src}, "trainer.py")
    assert "apex" not in out, out
    assert "out = self.model(x)" in out
    assert "enabled=False" not in out and out.count("torch.autocast(") == 1, out


def test_bfloat16_leaves_an_evaluation_that_goes_to_numpy(tmp_path: Path):
    line = "                total.append(loss)\n"
    assert line in TRAINER
    src = TRAINER.replace(line, line + "                print(pred.cpu().numpy())\n")
    out = migrated(tmp_path, {"trainer.py": src}, "trainer.py", "--dtype", "bfloat16")
    assert "        with torch.no_grad():\n" \
           "            for data in loader:\n                pred, loss = self.eval_step(data)\n" in out, out
    assert "out = self.model(x)" in out and out.count("torch.autocast(") == 2, out


CLIP = textwrap.dedent('''\
    import torch


    def step(model, opt, scaler, loss):
        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
''')


def test_amp206_fix_needs_unsafe_fixes(tmp_path: Path):
    (tmp_path / "train.py").write_text(CLIP)
    out = CliRunner().invoke(main, ["check", "--fix", "--select", "AMP206", str(tmp_path)])
    assert "unscale_" not in (tmp_path / "train.py").read_text()
    assert "AMP206" in out.output
    out = CliRunner().invoke(main, ["check", "--fix", "--unsafe-fixes", "--select", "AMP206", str(tmp_path)])
    assert "    scaler.unscale_(opt)\n    torch.nn.utils.clip_grad_norm_" in (tmp_path / "train.py").read_text()


def test_migrate_does_not_apply_amp206_as_a_safe_fix(tmp_path: Path):
    (tmp_path / "train.py").write_text(CLIP)
    out = CliRunner().invoke(main, ["migrate", "--write", str(tmp_path)])
    assert out.exit_code == 1, out.output  # a problem is left for a person
    assert (tmp_path / "train.py").read_text() == CLIP
    assert "AMP206" in out.output and "needs --unsafe-fixes" in out.output, out.output


def test_a_model_chosen_by_a_test_goes_under_autocast_whole(tmp_path: Path):
    # an EMA copy or the model, picked by an `if` in the evaluation: apex's casting reached both
    old = "                pred, loss = self.eval_step(data)\n"
    assert old in TRAINER
    src = TRAINER.replace(
        "        self.model = model\n", "        self.model = model\n        self.ema = None\n").replace(
        old, "                if self.ema is not None:\n                    pred = self.ema(data[0])\n"
             "                else:\n                    pred = self.model(data[0])\n"
             "                loss = torch.nn.functional.mse_loss(pred, data[1])\n")
    out = migrated(tmp_path, {"trainer.py": src}, "trainer.py")
    assert f"            for data in loader:\n                {REGION}\n" \
           "                    if self.ema is not None:\n                        pred = self.ema(data[0])\n" \
           "                    else:\n                        pred = self.model(data[0])\n" \
           "                    loss = torch.nn.functional.mse_loss(pred, data[1])\n" \
           "                total.append(loss)\n" in out, out


def test_two_forwards_a_line_apart_share_one_region(tmp_path: Path):
    # the forward, a plain statement that reads its output, and a loss method of the model:
    # one region, not two a line apart
    old = "            out = self.model(x)\n            best = out.argmax(1)\n"
    assert old in TRAINER
    src = TRAINER.replace(old, "            out = self.model(x)\n            prob = torch.sigmoid(out).cpu()\n"
                               "            loss = self.model.loss(out)\n            best = out.argmax(1)\n")
    out = migrated(tmp_path, {"trainer.py": src}, "trainer.py")
    assert f"        with torch.no_grad():\n            {REGION}\n                out = self.model(x)\n" \
           "                prob = torch.sigmoid(out).cpu()\n                loss = self.model.loss(out)\n" \
           "            best = out.argmax(1)\n" in out, out
    # bfloat16: only regions that touch join
    (tmp_path / "trainer.py").unlink()
    out = migrated(tmp_path, {"trainer.py": src}, "trainer.py", "--dtype", "bfloat16")
    assert "                out = self.model(x)\n            prob = torch.sigmoid(out).cpu()\n" in out, out


def test_a_statement_that_only_calls_keeps_two_regions_apart(tmp_path: Path):
    # `torch.save(...)` between two evaluations: the file is written outside autocast
    old = "            out = self.model(x)\n            best = out.argmax(1)\n"
    src = TRAINER.replace(old, "            out = self.model(x)\n            torch.save(out, 'out.pt')\n"
                               "            again = self.model(x)\n            best = out.argmax(1)\n")
    out = migrated(tmp_path, {"trainer.py": src}, "trainer.py")
    assert "                out = self.model(x)\n            torch.save(out, 'out.pt')\n" in out, out
    assert out.count("torch.autocast(") == 4, out
