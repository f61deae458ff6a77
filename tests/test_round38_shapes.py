"""Thirty-eighth round: a step closure handed on as a value, and an evaluator that only returns one.

ignite's ``create_supervised_trainer`` (and the trainers written after it) define the step as a
nested function and hand it to an engine: ``def _update(engine, batch): ... amp.scale_loss ...``,
``return Engine(_update)``.  The closure cannot take the scaler as a parameter (nothing in the
project calls it), and that was refused ("used other than by a call").  It reads the names of the
function that defines it, so the factory takes the scaler from its callers and the closure reads
it, with autocast's switch from the scaler it reads (the seed's condition is not in its scope).
Where a caller of the factory has no scaler to give, it stays refused.

The evaluator made the same way (``return Engine(_inference)``) runs the model later, when the
engine runs: wrapping the call that builds it in autocast covered nothing.  It is left in float32
with a note that says so.
"""
from test_round17_shapes import migrated, run, write

FACTORY = '''\
import torch


class Engine:
    def __init__(self, fn):
        self.fn = fn

    def run(self, data):
        return [self.fn(self, b) for b in data]


def create_trainer(model, optimizer, use_apex=False):
    def _update(engine, batch):
        x, y = batch
        optimizer.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        if use_apex:
            from apex import amp
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()
        return loss.item()

    return Engine(_update)


def create_evaluator(model):
    def _inference(engine, batch):
        model.eval()
        with torch.no_grad():
            return model(batch[0])

    return Engine(_inference)
{extra}'''

MAIN = '''\
import torch
from apex import amp

from engine import create_evaluator, create_trainer


def main(fp16, data):
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    trainer = create_trainer(model, optimizer, use_apex=fp16)
    trainer.run(data)
    evaluator = create_evaluator(model)
    return evaluator.run(data)
'''

# a second caller of the factory with no amp.initialize before it (a script's own main)
OTHER = '''\
import torch

from engine import create_trainer


def finetune(data):
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return create_trainer(model, optimizer).run(data)


if __name__ == "__main__":
    finetune([])
'''

# an evaluation that runs its nested step itself (map): calling it runs the model now
MAPPED = '''

def evaluate(model, data):
    def _one(batch):
        return model(batch[0])

    model.eval()
    with torch.no_grad():
        return list(map(_one, data))
'''


def test_the_factory_takes_the_scaler_and_its_closure_reads_it(tmp_path):
    main = migrated(tmp_path, {"engine.py": FACTORY.format(extra=""), "main.py": MAIN}, "main.py")
    engine = (tmp_path / "engine.py").read_text()
    assert "def create_trainer(model, optimizer, use_apex=False, *, scaler):" in engine
    assert "trainer = create_trainer(model, optimizer, use_apex=fp16, scaler=scaler)" in main
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=bool(fp16))' in main
    closure = engine[engine.index("    def _update"):engine.index("    return Engine(_update)")]
    # the closure reads the factory's parameter, and autocast's switch from it (`fp16` is not there)
    assert 'with torch.autocast("cuda", dtype=torch.float16, enabled=scaler.is_enabled()):' in closure
    assert "scaler.scale(loss).backward()" in closure and "scaler.step(optimizer)" in closure
    assert "scaler.update()" in closure and "amp." not in closure.replace("torch.amp", "")
    assert "def _update(engine, batch):" in closure  # its signature is what the engine calls


def test_the_evaluator_that_returns_its_step_is_not_wrapped(tmp_path):
    write(tmp_path, {"engine.py": FACTORY.format(extra=""), "main.py": MAIN})
    out = run(tmp_path, "--write")
    main = (tmp_path / "main.py").read_text()
    # autocast around `create_evaluator(model)` would cover nothing: the model runs in evaluator.run
    assert "    evaluator = create_evaluator(model)\n" in main
    assert main.count("torch.autocast") == 0
    assert "`create_evaluator` returns a function that runs the model later" in out.output


def test_an_evaluation_that_runs_its_nested_step_itself_is_still_wrapped(tmp_path):
    main = MAIN.replace("    evaluator = create_evaluator(model)\n    return evaluator.run(data)\n",
                        "    return evaluate(model, data)\n").replace(
        "import create_evaluator, create_trainer", "import create_trainer, evaluate")
    main = migrated(tmp_path, {"engine.py": FACTORY.format(extra=MAPPED), "main.py": main}, "main.py")
    assert 'with torch.autocast("cuda", dtype=torch.float16, enabled=bool(fp16)):\n' \
           '        return evaluate(model, data)' in main


def test_a_factory_caller_without_a_scaler_keeps_it_refused(tmp_path):
    files = {"engine.py": FACTORY.format(extra=""), "main.py": MAIN, "other.py": OTHER}
    write(tmp_path, files)
    out = run(tmp_path, "--write")
    assert "create_trainer.<locals>._update` is used other than by a call" in out.output
    assert "nor to `create_trainer`, which defines it: `create_trainer` is also called from `finetune`" in out.output
    # the initialize's reason does not say "never used with amp.scale_loss": it names the one planned apart
    assert "reaches no amp.scale_loss that ampfix follows from here; the one at" in out.output
    assert "never used with amp.scale_loss" not in out.output
    assert {p: (tmp_path / p).read_text() for p in files} == files


def test_with_bfloat16_the_factory_takes_the_switch_and_its_closure_reads_it(tmp_path):
    """No scaler with bfloat16: what the factory takes is autocast's switch, read by the closure."""
    main = migrated(tmp_path, {"engine.py": FACTORY.format(extra=""), "main.py": MAIN}, "main.py", "--dtype",
                    "bfloat16")
    engine = (tmp_path / "engine.py").read_text()
    assert "def create_trainer(model, optimizer, use_apex=False, *, use_amp):" in engine
    assert "create_trainer(model, optimizer, use_apex=fp16, use_amp=use_amp)" in main
    closure = engine[engine.index("    def _update"):engine.index("    return Engine(_update)")]
    assert 'with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp):' in closure
    assert "loss.backward()" in closure and "scaler" not in closure


METHOD_FACTORY = '''\
import torch
from apex import amp


class Engine:
    def __init__(self, fn):
        self.fn = fn

    def run(self, data):
        return [self.fn(self, b) for b in data]


class Trainer:
    def __init__(self, fp16):
        self.model = torch.nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        if fp16:
            self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O1")

    def build_engine(self):
        def _update(engine, batch):
            x, y = batch
            self.optimizer.zero_grad()
            loss = (self.model(x) - y).pow(2).mean()
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
            self.optimizer.step()
            return loss.item()

        return Engine(_update)
'''


def test_a_closure_of_a_method_reads_the_scaler_through_self(tmp_path):
    """The factory is a method of the class that initializes apex: the closure reads `self.scaler`."""
    trainer = migrated(tmp_path, {"trainer.py": METHOD_FACTORY}, "trainer.py")
    assert 'self.scaler = torch.amp.GradScaler("cuda", enabled=bool(fp16))' in trainer
    closure = trainer[trainer.index("        def _update"):trainer.index("        return Engine(_update)")]
    assert "self.scaler.scale(loss).backward()" in closure and "self.scaler.step(self.optimizer)" in closure
    assert "def _update(engine, batch):" in closure and "amp." not in closure.replace("torch.amp", "")
