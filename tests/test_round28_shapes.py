"""Twenty-eighth round: what the public code of this round showed (the runnable golden is
fixtures/projects/twin_backends; these are the edges).

1. apex imported with importlib (``self.amp = importlib.import_module("apex.amp")``): check did
   not see it at all, so neither did migrate.  The name (or the attribute) it is assigned to now
   refers to apex's module as an import would make it.
2. A forward that already runs under a native autocast of its own, off on the apex path
   (``with torch.cuda.amp.autocast(enabled=self.use_torch_amp):``): a region around it was switched
   off inside, so apex's path lost mixed precision.  apex's condition joins its ``enabled=``; an
   autocast that is always on needs nothing; one deeper in the region is refused.
3. ``amp.master_params`` read by helper methods (a gradient norm, a clip) called between the
   scaled backward and the step of another method: apex had unscaled the gradients there, the
   migrated code read them scaled.  The scaler unscales before the first call; a caller elsewhere
   is refused.
"""
from ampfix.cli import main
from click.testing import CliRunner
from test_round17_shapes import run, write

IMPORTED = '''\
import importlib

import torch

amp = importlib.import_module("apex.amp")


def train(model, optimizer, loader):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
'''


def test_check_sees_apex_imported_with_importlib(tmp_path):
    write(tmp_path, {"train.py": IMPORTED})
    out = CliRunner().invoke(main, ["check", "--select", "AMP1", str(tmp_path)])
    assert "apex.amp.initialize" in out.output and "apex.amp.scale_loss" in out.output, out.output


def test_an_importlib_module_of_another_name_is_not_apex(tmp_path):
    write(tmp_path, {"train.py": IMPORTED.replace('"apex.amp"', '"my_amp"')})
    out = CliRunner().invoke(main, ["check", "--select", "AMP1", str(tmp_path)])
    assert "apex" not in out.output, out.output


def test_a_module_level_importlib_apex_goes_with_the_code_that_read_it(tmp_path):
    """The module-level name is an import: it goes when every read of it is rewritten."""
    write(tmp_path, {"train.py": IMPORTED})
    out = run(tmp_path, "--write", "-q")
    text = (tmp_path / "train.py").read_text()
    assert "import_module" not in text and "apex" not in text, out.output
    assert "scaler.scale(loss).backward()" in text
    compile(text, "train.py", "exec")


def test_a_module_level_importlib_apex_read_elsewhere_stays_with_its_module(tmp_path):
    """`amp` is also handed to a function this run cannot rewrite: the import stays, and so does
    the code that needs it (a reason is given), rather than migrate around a live apex import."""
    src = IMPORTED + "\n\ndef report():\n    return amp.__version__\n"
    write(tmp_path, {"train.py": src})
    out = run(tmp_path, "--write")
    text = (tmp_path / "train.py").read_text()
    assert "importlib.import_module(\"apex.amp\")" in text
    assert "amp.initialize" in text, text
    assert "left for a person" in out.output or "not rewritten" in out.output, out.output


DEEPER = '''\
import torch
from apex import amp


def train(model, optimizer, loader, native):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in loader:
        h = model.body(x)
        with torch.autocast("cuda", enabled=native):
            out = model.head(h)
        loss = torch.nn.functional.mse_loss(out, y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
'''


def test_an_autocast_deeper_in_the_region_that_may_be_off_is_refused(tmp_path):
    write(tmp_path, {"train.py": DEEPER})
    out = run(tmp_path, "--write")
    assert (tmp_path / "train.py").read_text() == DEEPER
    assert "off on some paths" in out.output, out.output


ALWAYS_ON = DEEPER.replace("enabled=native", "dtype=torch.float16").replace(
    "        h = model.body(x)\n        with", "        with").replace(
    "            out = model.head(h)\n        loss", "            out = model(x)\n            loss")


def test_a_region_that_is_an_always_on_autocast_needs_nothing_more(tmp_path):
    write(tmp_path, {"train.py": ALWAYS_ON})
    out = run(tmp_path, "--write", "-q")
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text, out.output
    assert text.count("autocast(") == 1, text
    assert "scaler.scale(loss).backward()" in text


HELPER_OUTSIDE = '''\
import torch
from apex import amp


class Trainer:
    def __init__(self, model, optimizer):
        self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O1")

    def backward(self, loss):
        with amp.scale_loss(loss, self.optimizer) as scaled_loss:
            scaled_loss.backward()

    def step(self):
        self.optimizer.step()

    def grad_norm(self):
        grads = [p.grad.norm() for p in amp.master_params(self.optimizer) if p.grad is not None]
        return torch.stack(grads).norm()


def train(trainer, loader):
    for x, y in loader:
        trainer.backward(torch.nn.functional.mse_loss(trainer.model(x), y))
        print(trainer.grad_norm())
        trainer.step()
'''


def test_a_gradient_helper_called_from_outside_its_class_is_refused(tmp_path):
    write(tmp_path, {"train.py": HELPER_OUTSIDE})
    out = run(tmp_path, "--write")
    assert (tmp_path / "train.py").read_text() == HELPER_OUTSIDE, out.output
    assert "master_params" in out.output and "by hand" in out.output, out.output


ROUND_TRIP = '''\
import torch
from apex import amp

encoder = torch.nn.Linear(4, 8).cuda()
model = torch.nn.Linear(8, 2).cuda()
optimizer = torch.optim.SGD([*encoder.parameters(), *model.parameters()], lr=0.1)
fp16 = True
if fp16:
    models, optimizer = amp.initialize([encoder, model], optimizer, opt_level="O1")
    assert len(models) == 2
    encoder, model = models

for x, y in [(torch.randn(2, 4).cuda(), torch.randn(2, 2).cuda())]:
    loss = torch.nn.functional.mse_loss(model(encoder(x)), y)
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
'''


def test_a_list_of_models_unpacked_back_into_its_names_goes_whole(tmp_path):
    """HGN's `models, optimizer = amp.initialize([encoder, model], ...)`, a check of the list, and
    `encoder, model = models`: once initialize goes, the list is made only to be unpacked into the
    names it was made of; the three lines go (and the `if` they were all of)."""
    write(tmp_path, {"train.py": ROUND_TRIP})
    out = run(tmp_path, "--write", "-q")
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text, out.output
    assert "models" not in text and "if fp16:" not in text, text
    compile(text, "train.py", "exec")


def test_a_list_of_models_read_later_stays(tmp_path):
    src = ROUND_TRIP + "print(len(models))\n"
    write(tmp_path, {"train.py": src})
    out = run(tmp_path, "--write", "-q")
    text = (tmp_path / "train.py").read_text()
    assert "models = [encoder, model]" in text, out.output
    assert "encoder, model = models" in text


def test_a_name_bound_to_a_call_of_itself_does_not_recurse(tmp_path):
    """`import_module = import_module("x")`, `model = model(x)`: reading what such a name refers
    to must not follow the name into itself (a RecursionError took down a whole run)."""
    src = ("from importlib import import_module\nimport_module = import_module('m')\n"
           "model = model(1)\ny = model.x\nfrom apex import amp\namp.init()\n")
    write(tmp_path, {"a.py": src})
    out = CliRunner().invoke(main, ["check", str(tmp_path)])
    assert out.exit_code in (0, 1), out.output
    assert "apex" in out.output


LOOP_HELPERS = '''\
import torch
from apex import amp


class Trainer:
    def __init__(self, model, criterion):
        self.model = model
        self.criterion = criterion

    def _parse_data(self, inputs):
        imgs, targets = inputs
        return imgs.cuda(), targets.cuda()

    def _forward(self, x):
        return self.model(x)

    def train(self, loader, optimizer, fp16):
        for batch in loader:
            inputs, targets = self._parse_data(batch)
            n = torch.cuda.device_count()
            inputs = torch.cat((inputs, inputs), 0)
            out = self._forward(inputs)

            def halves(t):
                return t.view(2, -1, t.size(-1))

            first = halves(out)[0]
            loss = self.criterion(first, targets)
            optimizer.zero_grad()
            if fp16:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()


def main(model, loader, fp16):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    Trainer(model, torch.nn.functional.cross_entropy).train(loader, optimizer, fp16)
'''


def test_the_region_starts_at_the_forward_past_a_helper_defined_in_the_loop(tmp_path):
    """MMT's trainers: the inputs parsed by a method that only moves them, arranged with
    `torch.cat`; the forward through a method; a helper `def` in the loop between the forward and
    the loss.  The def no longer cuts the region off from the forward (the forward ran in float32),
    and the parsing before it stays outside."""
    write(tmp_path, {"train.py": LOOP_HELPERS})
    out = run(tmp_path, "--write", "-q")
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text, out.output
    at = text.index("torch.autocast(")
    assert text.index("self._parse_data(batch)") < text.index("torch.cat((inputs") < at, text
    assert at < text.index("self._forward(inputs)") < text.index("def halves") < text.index("self.criterion("), text
    assert "                out = self._forward(inputs)\n" in text, text
    compile(text, "train.py", "exec")


def test_bfloat16_refuses_where_the_native_path_autocasts_in_float16(tmp_path):
    """apex's path cannot join a float16 autocast when the migration is to bfloat16: refused."""
    import shutil
    from pathlib import Path

    before = Path(__file__).resolve().parent.parent / "fixtures" / "projects" / "twin_backends" / "before"
    shutil.copytree(before, tmp_path / "p")
    out = run(tmp_path / "p", "--write", "--dtype", "bfloat16")
    assert "another dtype" in out.output, out.output
    assert (tmp_path / "p" / "train.py").read_text() != ""
    assert "apex.amp" in (tmp_path / "p" / "train.py").read_text()


OTHER_BRANCH = '''\
import torch
from apex import amp


def train(model, optimizer, loader, with_apex, mixed_precision):
    scaler = torch.amp.GradScaler("cuda", enabled=mixed_precision and not with_apex)
    if with_apex:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O2" if mixed_precision else "O0")
    for x, y in loader:
        optimizer.zero_grad()
        if with_apex:
            out = model(x)
        else:
            with torch.autocast("cuda", enabled=mixed_precision):
                out = model(x)
        loss = torch.nn.functional.mse_loss(out, y)
        if with_apex:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
'''


def test_an_autocast_in_the_branch_apex_does_not_take_is_not_in_the_way(tmp_path):
    """NVIDIA's retinanet: `if with_apex: <forward> else: with autocast(enabled=...): <forward>`
    in the region: the inner autocast never runs on apex's path, so the region may hold it."""
    write(tmp_path, {"train.py": OTHER_BRANCH})
    out = run(tmp_path, "--write")
    text = (tmp_path / "train.py").read_text()
    assert "from apex" not in text and "amp.initialize" not in text, out.output
    assert 'with torch.autocast("cuda", enabled=mixed_precision):' in text
    compile(text, "train.py", "exec")


BRANCH_STEPS = '''\
import torch
from apex import amp


class Trainer:
    def __init__(self, model, optimizer, opt_level, clip, log_every):
        self.model, self.optimizer = model, optimizer
        self.opt_level, self.clip, self.log_every = opt_level, clip, log_every
        if opt_level is not None:
            self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level=opt_level)

    def rescale_gradients(self):
        if self.opt_level is not None:
            params = [p for p in amp.master_params(self.optimizer) if p.grad is not None]
        else:
            params = [p for p in self.model.parameters() if p.grad is not None]
        return torch.nn.utils.clip_grad_norm_(params, self.clip)

    def train_epoch(self, groups):
        for step, group in enumerate(groups):
            self.optimizer.zero_grad()
            for x, y in group:
                loss = torch.nn.functional.mse_loss(self.model(x), y) / len(group)
                if self.opt_level is not None:
                    with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
            norm = self.rescale_gradients()
            if step % self.log_every == 0:
                before = [p.detach().clone() for p in self.model.parameters()]
                self.optimizer.step()
                print(norm, sum((a - b.detach()).norm() for a, b in zip(before, self.model.parameters())))
            else:
                self.optimizer.step()
'''


def test_a_gradient_helper_before_a_step_in_each_branch_gets_the_unscale(tmp_path):
    """allennlp's trainer: `rescale_gradients()` (apex's master params clipped) after the
    accumulation loop, then the step in both branches of an `if`: the scaler unscales right before
    the call, once a step (the migrated code had clipped the scaled gradients)."""
    write(tmp_path, {"train.py": BRANCH_STEPS})
    out = run(tmp_path, "--write", "-q")
    text = (tmp_path / "train.py").read_text()
    assert "amp.initialize" not in text, out.output
    assert text.count(".unscale_(") == 1, text
    assert "            self.scaler.unscale_(self.optimizer)\n            norm = self.rescale_gradients()" in text, text
    compile(text, "train.py", "exec")


def test_a_gradient_helper_called_on_every_micro_batch_is_refused(tmp_path):
    src = BRANCH_STEPS.replace("                    loss.backward()\n            norm = self.rescale_gradients()",
                               "                    loss.backward()\n                norm = self.rescale_gradients()")
    assert src != BRANCH_STEPS
    write(tmp_path, {"train.py": src})
    out = run(tmp_path, "--write")
    assert (tmp_path / "train.py").read_text() == src, out.output
    assert "rescale_gradients" in out.output, out.output


COLLECTED = '''\
import torch
from apex import amp


def train(model, optimizer, loader, clips):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in loader:
        logits = []
        for k in range(clips):
            out = model(x[:, k])
            logits.append(out)

        logits = torch.stack(logits).mean(0)
        loss = torch.nn.functional.cross_entropy(logits, y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
'''


def test_a_forward_in_a_loop_that_collects_its_outputs_is_in_the_region(tmp_path):
    """ClipBERT's multi-clip step: the model runs in a loop whose outputs are appended to a list,
    the loss comes from the list after it.  The region started after the loop (the forward ran in
    float32); an append is a value put in the list the loss reads (a key set on a dict of
    inputs is not: that would pull their preparation in)."""
    write(tmp_path, {"train.py": COLLECTED})
    out = run(tmp_path, "--write", "-q")
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text, out.output
    assert text.index("torch.autocast(") < text.index("for k in range(clips):") < text.index("cross_entropy"), text
    compile(text, "train.py", "exec")


IN_THE_BATCH = '''\
import torch
from apex import amp


def train(encoder, model, optimizer, loader, threshold):
    [encoder, model], optimizer = amp.initialize([encoder, model], optimizer, opt_level="O1")
    for batch in loader:
        inputs = {"x": batch["x"]}
        inputs["threshold"] = threshold
        batch["encoding"] = encoder(**inputs)[0]
        batch["mask"] = batch["mask"].float()
        loss = model(batch)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
'''


def test_an_encoder_output_put_in_the_batch_is_in_the_region(tmp_path):
    """HGN: `batch["encoding"] = encoder(**inputs)[0]`, then `model(batch)`: the encoder's forward
    feeds the loss through the batch and runs under autocast; keys set to inputs only being
    prepared (`inputs["threshold"] = t`) stay out."""
    write(tmp_path, {"train.py": IN_THE_BATCH})
    out = run(tmp_path, "--write", "-q")
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text, out.output
    assert text.index('inputs["threshold"] = threshold') < text.index("torch.autocast(") \
        < text.index('batch["encoding"] = encoder'), text
