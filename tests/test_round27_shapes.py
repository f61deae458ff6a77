"""Twenty-seventh round: what a reviewer saw in the migrated code of the twenty-seventh batch
(measured before these fixes: 14/15 right, 0 broken).

1. A comment right above `amp.initialize` that describes it (`# fp16`, `# apex mixed precision`)
   stayed behind when the initialize went and the scaler was made elsewhere (before the function's
   callers, or before an `if`): a stale comment above the next statement.  It goes with the line
   it described; a comment that does not speak of half precision stays.
2. Two evaluation calls in a row, each run under autocast because apex had run the model in half
   precision there, got one `with torch.autocast(...)` each: one region holds both.  Regions that
   may hold an optimizer step are not joined (autocast's cache of cast weights lasts until its
   region ends).
"""
from test_round17_shapes import run, write

DESCRIBED = '''\
import torch
from apex import amp


def build(model, lr):
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    # fp16
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")

    # one process per GPU
    model = torch.nn.parallel.DistributedDataParallel(model)
    return model, optimizer


def train(model, optimizer, loader):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()


def main(loader):
    model = torch.nn.Linear(4, 4).cuda()
    model, optimizer = build(model, 0.1)
    train(model, optimizer, loader)
'''


def test_a_comment_that_described_the_initialize_goes_with_it(tmp_path):
    write(tmp_path, {"train.py": DESCRIBED})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "amp.initialize" not in text and "apex" not in text
    assert "# fp16" not in text
    # the comment above the next statement speaks of that statement: it stays, where it was
    assert "    # one process per GPU\n    model = torch.nn.parallel.DistributedDataParallel(model)" in text
    assert "GradScaler" in text
    compile(text, "train.py", "exec")


UNDESCRIBED = DESCRIBED.replace("    # fp16\n", "    # the optimizer state is restored by the caller\n")


def test_a_comment_that_speaks_of_something_else_stays(tmp_path):
    write(tmp_path, {"train.py": UNDESCRIBED})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "amp.initialize" not in text
    assert "# the optimizer state is restored by the caller" in text


EVALUATIONS = '''\
import torch
from apex import amp


def evaluate(model, loader, threshold=None):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            total += float((model(x) - y).abs().sum())
    return total, threshold


def train_step(model, optimizer, loader, fp16):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        if fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()


def main(args, train_loader, valid_loader, test_loader):
    model = torch.nn.Linear(4, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
    for epoch in range(args.epochs):
        model.train()
        train_step(model, optimizer, train_loader, args.fp16)
        dev, th = evaluate(model, valid_loader)
        test, _ = evaluate(model, test_loader, threshold=th)
        print(epoch, dev, test)
'''


def test_evaluations_in_a_row_share_one_autocast_region(tmp_path):
    write(tmp_path, {"train.py": EVALUATIONS})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "amp." not in text.replace("torch.amp.", "") and "apex" not in text
    region = ('        with torch.autocast("cuda", dtype=torch.float16, enabled=bool(args.fp16)):\n'
              "            dev, th = evaluate(model, valid_loader)\n"
              "            test, _ = evaluate(model, test_loader, threshold=th)\n"
              "        print(epoch, dev, test)\n")
    assert region in text, text
    # the training step keeps its own region, apart from the evaluations
    assert text.count("with torch.autocast(") == 2
    compile(text, "train.py", "exec")


SCALAR_LAST = '''\
import torch
from apex import amp


def train(model, optimizer, loader, warmup):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    step = 0
    for x, y in loader:
        recon, kl = model(x, y)
        weight = min(1, step / warmup)
        with amp.scale_loss(recon + weight * kl, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        step += 1
'''


def test_arithmetic_on_numbers_after_the_forward_stays_out_of_the_region(tmp_path):
    """The region ends with the forward pass: `weight = min(1, step / warmup)` reads nothing it
    computed and does no tensor operation, so autocast changes nothing there."""
    write(tmp_path, {"train.py": SCALAR_LAST})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert ('        with torch.autocast("cuda", dtype=torch.float16):\n'
            "            recon, kl = model(x, y)\n"
            "        weight = min(1, step / warmup)\n") in text, text
    assert "scaler.scale(recon + weight * kl).backward()" in text
    compile(text, "train.py", "exec")


SCALAR_ON_OUTPUT = SCALAR_LAST.replace("weight = min(1, step / warmup)", "weight = min(1, kl / warmup)")


def test_arithmetic_on_what_the_forward_computed_stays_in_the_region(tmp_path):
    write(tmp_path, {"train.py": SCALAR_ON_OUTPUT})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert ("            recon, kl = model(x, y)\n"
            "            weight = min(1, kl / warmup)\n") in text, text


VENDORED_TRAINER = '''\
import torch

try:
    from apex import amp
    _apex = True
except ImportError:
    _apex = False


class Trainer:
    def __init__(self, model, optimizer, fp16=False, backend="auto"):
        self.model, self.optimizer = model, optimizer
        self.use_apex = False
        self.use_amp = False
        if fp16:
            if backend == "amp":
                self.use_amp = True
                self.scaler = torch.cuda.amp.GradScaler()
            else:
                if not _apex:
                    raise ImportError("install apex")
                self.use_apex = True

    def _wrap_model(self, model, training=True):
        if self.use_apex and training:
            model, self.optimizer = amp.initialize(model, self.optimizer, opt_level="O1")
        return model

    def train(self, batches):
        self.model = self._wrap_model(self.model)
        for x, y in batches:
            self.training_step(x, y)
            self.optimizer.step()
            self.optimizer.zero_grad()

    def training_step(self, x, y):
        if self.use_amp:
            with torch.cuda.amp.autocast():
                loss = torch.nn.functional.mse_loss(self.model(x), y)
        else:
            loss = torch.nn.functional.mse_loss(self.model(x), y)
        if self.use_amp:
            self.scaler.scale(loss).backward()
        elif self.use_apex:
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        return loss.detach()
'''


def test_copies_of_one_trainer_in_two_folders_each_lose_their_apex_path(tmp_path):
    """A vendored trainer copied into two folders of one repository: each copy's `self.use_apex
    = True` stores on its own objects only (the classes extend nothing, nothing extends them), so
    the other copy's store does not keep this one's apex path alive."""
    write(tmp_path, {"ranker/__init__.py": "", "ranker/trainer.py": VENDORED_TRAINER,
                     "generator/__init__.py": "", "generator/trainer.py": VENDORED_TRAINER,
                     "run.py": "from ranker.trainer import Trainer as Ranker\nfrom generator.trainer import Trainer\n"})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    for d in ("ranker", "generator"):
        text = (tmp_path / d / "trainer.py").read_text()
        assert "from apex" not in text and "amp." not in text.replace("torch.amp.", "") and "not _apex" not in text, text
        assert "self.use_apex = True" not in text and "elif self.use_apex" not in text, text
        assert "self.scaler.scale(loss).backward()" in text
        compile(text, "trainer.py", "exec")


MIXIN = '''\
from ranker.trainer import Trainer


class ApexMixin:
    def force_apex(self):
        self.use_apex = True


class ForcedTrainer(Trainer, ApexMixin):
    pass
'''


def test_a_mixin_that_stores_the_flag_on_the_trainers_objects_keeps_it(tmp_path):
    """`class ForcedTrainer(Trainer, ApexMixin)`: the mixin's `self.use_apex = True` lands on
    trainers' objects, so the flag is not settled and the apex path stays."""
    write(tmp_path, {"ranker/__init__.py": "", "ranker/trainer.py": VENDORED_TRAINER, "forced.py": MIXIN})
    run(tmp_path, "--write", "-q")
    text = (tmp_path / "ranker" / "trainer.py").read_text()
    assert "elif self.use_apex:" in text or "amp.scale_loss" in text


def test_a_bug_in_the_dual_path_planner_leaves_the_module_whole_with_its_reason(tmp_path, monkeypatch):
    """A dual-path planner that failed on a module left nothing of its own, silently, and the other
    planners took the program's apex path for its only one: now the module's apex code is left whole,
    with the bug's reason (found when a planner iterated the project's modules while it grew)."""
    from ampfix.migration import dual

    def boom(self):
        raise RuntimeError("boom")

    monkeypatch.setattr(dual.DualModule, "applies", boom)
    write(tmp_path, {"trainer.py": VENDORED_TRAINER})
    out = run(tmp_path, "--write")
    assert "could not plan this migration (RuntimeError: boom)" in out.output, out.output
    text = (tmp_path / "trainer.py").read_text()
    assert "amp.initialize" in text and "amp.scale_loss" in text and "self.use_apex = True" in text
