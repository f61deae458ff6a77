"""Seventeenth round: an FP16_Optimizer handed to a class that keeps it on self (a trainer:
``Trainer(model, optimizer, args)``, ``self.optimizer.backward(loss)`` in its methods).  The
runnable golden is fixtures/projects/fp16_trainer_class; these are the edges."""
import textwrap
from pathlib import Path

from click.testing import CliRunner

from ampfix.cli import main

TRAINER = textwrap.dedent('''\
    import torch


    def warmup_linear(x, warmup=0.1):
        return x / warmup if x < warmup else 1.0


    class Trainer:
        def __init__(self, model, optimizer, args):
            self.model = model
            self.optimizer = optimizer
            self.args = args
            self.steps = 0

        def fit(self, loader):
            for x, y in loader:
                if self.args.fp16:
                    x = x.half()
                loss = torch.nn.functional.mse_loss(self.model(x), y)
                if self.args.fp16:
                    self.optimizer.backward(loss)
                else:
                    loss.backward()
                if self.args.fp16:
                    lr = self.args.lr * warmup_linear(self.steps / 100)
                    for group in self.optimizer.param_groups:
                        group["lr"] = lr
                self.optimizer.step()
                self.optimizer.zero_grad()
                self.steps += 1
''')

MAIN = textwrap.dedent('''\
    import torch

    from trainer import Trainer


    def main(args, model, loader):
        if args.fp16:
            model.half()
        if args.fp16:
            from apex.optimizers import FP16_Optimizer, FusedAdam

            optimizer = FusedAdam(model.parameters(), lr=args.lr)
            optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)
        else:
            optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        trainer = Trainer(model, optimizer, args)
        trainer.fit(loader)
''')


def write(root: Path, files: dict) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def run(root: Path, *extra):
    return CliRunner().invoke(main, ["migrate", *extra, "--torch-version", "2.4", str(root)])


def migrated(root: Path, files: dict, read: str, *extra) -> str:
    """``files`` written under ``root``, migrated with ``--write`` (and ``extra``): the text of ``read``."""
    write(root, files)
    out = run(root, "--write", "-q", *extra)
    assert out.exit_code == 0, out.output
    return (root / read).read_text()


def test_trainer_class_takes_and_keeps_the_scaler(tmp_path):
    write(tmp_path, {"trainer.py": TRAINER, "main.py": MAIN})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    trainer = (tmp_path / "trainer.py").read_text()
    main_py = (tmp_path / "main.py").read_text()
    assert "def __init__(self, model, optimizer, args, *, scaler):" in trainer
    assert "        self.optimizer = optimizer\n        self.scaler = scaler\n" in trainer
    assert "self.scaler.scale(loss).backward()" in trainer
    assert "self.scaler.step(self.optimizer)\n            self.scaler.update()" in trainer
    assert 'enabled=self.scaler.is_enabled()' in trainer and "x.half()" not in trainer
    # AdamW does not schedule: the fp16 path's own warm-up still drives it, under the same flag
    assert "if self.args.fp16:\n                lr = " in trainer
    assert "Trainer(model, optimizer, args, scaler=scaler)" in main_py and "apex" not in main_py + trainer
    compile(trainer, "trainer.py", "exec")
    again = run(tmp_path)
    assert again.exit_code == 0 and "Would rewrite 0 files" in again.output


def test_warmup_in_the_class_goes_when_the_kept_optimizer_schedules(tmp_path):
    scheduled = MAIN.replace("torch.optim.AdamW(model.parameters(), lr=args.lr)",
                             "BertAdam(model.parameters(), lr=args.lr, warmup=0.1, t_total=100)")
    scheduled = scheduled.replace("from trainer import Trainer\n",
                                  "from trainer import Trainer\nfrom sched import BertAdam\n")
    write(tmp_path, {"trainer.py": TRAINER, "main.py": scheduled})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    trainer = (tmp_path / "trainer.py").read_text()
    # kept, it would apply the warm-up twice; the helper only it called goes too
    assert "param_groups" not in trainer and "warmup_linear" not in trainer


def test_bfloat16_keeps_the_switch_on_self(tmp_path):
    write(tmp_path, {"trainer.py": TRAINER, "main.py": MAIN})
    out = run(tmp_path, "--write", "-q", "--dtype", "bfloat16")
    assert out.exit_code == 0, out.output
    trainer = (tmp_path / "trainer.py").read_text()
    assert "self.use_amp = use_amp" in trainer and "enabled=self.use_amp" in trainer
    assert "scaler" not in trainer and "loss.backward()" in trainer


def refused(tmp_path, files, *needles):
    """The FP16_Optimizer stays, with the reason; the trainer is left as it was (apex's FusedAdam
    may still become torch's fused AdamW: a fix of its own)."""
    write(tmp_path, files)
    before = (tmp_path / "trainer.py").read_text()
    out = run(tmp_path, "--write")
    assert (tmp_path / "trainer.py").read_text() == before
    assert "FP16_Optimizer(optimizer" in (tmp_path / "main.py").read_text()
    for n in needles:
        assert n in out.output, out.output


def test_a_subclass_refuses(tmp_path):
    sub = "from trainer import Trainer\n\n\nclass Fancy(Trainer):\n    def fit(self, loader):\n" \
          "        self.optimizer.backward(loader)\n"
    refused(tmp_path, {"trainer.py": TRAINER, "main.py": MAIN, "fancy.py": sub},
            "`Fancy` (", "subclasses `Trainer`, which keeps the optimizer: pass the scaler there by hand")


def test_the_optimizer_read_around_the_class_refuses(tmp_path):
    around = MAIN.replace("    trainer.fit(loader)\n", "    trainer.fit(loader)\n    trainer.optimizer.step()\n")
    assert around != MAIN
    refused(tmp_path, {"trainer.py": TRAINER, "main.py": around}, "reads the optimizer around `Trainer`")


def test_the_attribute_set_again_refuses(tmp_path):
    again = TRAINER.replace("        self.steps = 0\n", "        self.steps = 0\n\n    def reset(self, o):\n"
                            "        self.optimizer = o\n")
    assert again != TRAINER
    refused(tmp_path, {"trainer.py": again, "main.py": MAIN}, "`self.optimizer` is set again")


def test_a_class_made_elsewhere_without_the_optimizer_refuses(tmp_path):
    other = "import torch\n\nfrom trainer import Trainer\n\n\ndef plain(model, args):\n" \
            "    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), args)\n"
    refused(tmp_path, {"trainer.py": TRAINER, "main.py": MAIN, "other.py": other},
            "is also called from `plain`")


def test_a_step_in_another_method_refuses(tmp_path):
    # the plain optimizer would step on the scaled gradients FP16_Optimizer used to unscale
    split = TRAINER.replace("            self.optimizer.step()\n            self.optimizer.zero_grad()\n",
                            "            self.update()\n") + \
        "\n    def update(self):\n        self.optimizer.step()\n        self.optimizer.zero_grad()\n"
    assert split != TRAINER + "\n"
    refused(tmp_path, {"trainer.py": split, "main.py": MAIN}, "does not follow the scaled backward")


def test_fp16_optimizer_under_the_main_guard_makes_the_scaler_inside_it(tmp_path):
    # the flag is parsed inside `if __name__ == "__main__":`: a scaler made before that block read
    # `args` before it existed (NameError at start-up); the golden is
    # fixtures/apex/*/fp16_optimizer_main_guard.py
    src = (Path(__file__).parent.parent / "fixtures/apex/before/fp16_optimizer_main_guard.py").read_text()
    write(tmp_path, {"train.py": src})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    head, _, body = text.partition('if __name__ == "__main__":\n')
    assert "GradScaler" not in head and '    scaler = torch.amp.GradScaler("cuda", enabled=bool(args.fp16))\n' in body
    assert "__name__ ==" not in body and ".half()" not in text and "inputs = x\n" in body
