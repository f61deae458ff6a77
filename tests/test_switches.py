"""A scaled backward under its trainer's own switch, no initialize on the way to it, and a setup
that initializes apex and hands the optimizer out: the scaler is made where the switch is set and
the setup's initialize goes (ampfix.migration.switches).  Where it must hold back, the module
stays whole."""
import ast
import textwrap

from ampfix.engine.check import check_source
from ampfix.engine.tidy import tidy
from ampfix.model.settings import Settings
from ampfix.registry import all_rules

TRAINER = """\
    import torch
    from apex import amp


    def setup(model, lr, use_amp=None):
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        if use_amp:
            model, optimizer = amp.initialize(model, optimizer, opt_level=use_amp)
        return model, optimizer


    class Trainer:
        def __init__(self, model, optimizer, use_amp=None):
            self.model = model
            self.optimizer = optimizer
            self.use_amp = use_amp

        def step(self, x):
            loss = self.model(x).sum()
            self.backward(loss)

        def backward(self, loss):
            if {guard}:
                with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
    {extra}

    def build(use_amp):
        return setup(torch.nn.Linear(4, 1), 0.1, use_amp=use_amp)


    def main(use_amp):
        model, optimizer = build(use_amp)
        Trainer(model, optimizer, use_amp=use_amp).step(torch.randn(2, 4))
"""


def migrate(code: str):
    return check_source(textwrap.dedent(code).encode(), "x.py", all_rules(), Settings(), fix="safe")


def trainer(guard="self.use_amp", extra=""):
    return TRAINER.format(guard=guard, extra=textwrap.indent(textwrap.dedent(extra), "        "))


def test_switched_trainer_makes_its_scaler_where_the_switch_is_set():
    res = migrate(trainer())
    out = res.fixed
    assert out is not None and "amp." not in out.replace("torch.amp.", "")
    ast.parse(out)
    lines = out.splitlines()
    at = next(i for i, x in enumerate(lines) if x.strip() == "self.use_amp = use_amp")
    # the switch is apex's opt level too: "O0" ran in float32
    assert lines[at + 1].strip().startswith("self.scaler = torch.amp.GradScaler(")
    assert 'enabled=bool(self.use_amp) and self.use_amp != "O0"' in out.replace("\n", " ").replace("  ", "")
    assert "self.scaler.scale(loss).backward()" in out and "self.scaler.step(self.optimizer)" in out
    # the forward that computes the loss (in the caller) runs under autocast
    assert "enabled=self.scaler.is_enabled()" in out
    # the setup keeps handing out the model and optimizer, without apex
    assert "initialize" not in out and "return model, optimizer" in out
    assert not [d for d in res.diagnostics if d.code == "AMP101"]


def test_switch_with_another_condition_is_not_the_amp_switch():
    """`if self.use_amp and self.accumulate:` scales only in some steps where AMP is on: the
    switch alone does not say when apex ran."""
    res = migrate(trainer(guard="self.use_amp and self.model.training"))
    assert res.fixed in (None, textwrap.dedent(trainer(guard="self.use_amp and self.model.training")))
    assert [d for d in res.diagnostics if d.code == "AMP101"]


def test_switch_set_again_outside_init_is_refused():
    code = trainer(extra="""
        def no_amp(self):
            self.use_amp = None
    """)
    res = migrate(code)
    assert res.fixed in (None, textwrap.dedent(code))
    assert [d for d in res.diagnostics if d.code == "AMP101"]


def test_initialize_that_hands_nothing_out_is_not_paired():
    """An initialize whose optimizer goes nowhere (not returned) is not the trainer's setup."""
    code = trainer().replace("        return model, optimizer\n", "        return model\n").replace(
        "model, optimizer = build(", "model = build(").replace("Trainer(model, optimizer,", "Trainer(model, None,")
    res = migrate(code)
    assert res.fixed in (None, textwrap.dedent(code))
    assert [d for d in res.diagnostics if d.code == "AMP101"]


def test_switched_trainer_without_any_initialize_is_left_whole():
    """The initialize is in files not given: the trainer alone is not migrated."""
    code = textwrap.dedent(trainer())
    code = code[code.index("class Trainer"):code.index("def main")]
    code = "import torch\nfrom apex import amp\n\n\n" + code
    res = migrate(code)
    assert res.fixed in (None, code)
    assert [d for d in res.diagnostics if d.code == "AMP101"]


def test_availability_flag_tests_fold_once_the_guard_goes():
    src = textwrap.dedent("""\
        import logging
        try:
            from apex import amp
            HAS_AMP = True
        except ImportError:
            HAS_AMP = False


        def f(use_amp, log):
            if use_amp and not HAS_AMP:
                raise ImportError("needs apex")
            if HAS_AMP:
                a = 1
            else:
                a = 2
            if use_amp and HAS_AMP:
                a += 1
            if log() and not HAS_AMP:
                a = 0
            return a
    """)
    from ampfix.rule import ImportSpec

    out = tidy(src, "x.py", [], [ImportSpec("apex", "amp", None)])
    assert "raise ImportError" not in out
    assert "    a = 1\n" in out and "a = 2" not in out
    assert "    if use_amp:\n        a += 1" in out
    # a call before the decisive operand is kept, with its test
    assert "if log() and not HAS_AMP:" in out
    assert "HAS_AMP = True" in out  # other modules may import it
    ast.parse(out)


PARAM_SWITCH = """\
    import torch
    from apex import amp


    def setup(model, use_amp):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if use_amp:
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        return model, optimizer


    def backpropagate(loss, optimizer, fp16):
        if fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        return loss


    class Runner:
        def __init__(self, model, optimizer, params):
            self.model = model
            self.optimizer = optimizer
            self.params = params

        def backward(self, loss):
            return backpropagate(loss, self.optimizer, fp16=self.params.fp16)

        def train_step(self, x):
            loss = self.model(x).sum()
            self.backward(loss)
            self.optimizer.step()
            self.optimizer.zero_grad()


    def build(params):
        return setup(torch.nn.Linear(4, 1), params.fp16)


    def main(params):
        model, optimizer = build(params)
        Runner(model, optimizer, params).train_step(torch.randn(2, 4))
"""


def test_switch_passed_down_from_the_object_that_sets_it():
    """`backpropagate(loss, opt, fp16=self.params.fp16)` through a wrapper method: the switch is
    the runner's; its scaler is passed down, the forward in the caller of the wrapper gets
    autocast, the step after the wrapper's call goes through the scaler."""
    res = migrate(PARAM_SWITCH)
    out = res.fixed
    assert out is not None, [d.message for d in res.diagnostics if d.code == "AMP101"]
    ast.parse(out)
    assert "amp." not in out.replace("torch.amp.", "") and "initialize" not in out
    assert "self.scaler = torch.amp.GradScaler(\"cuda\", enabled=bool(self.params.fp16))" in out
    assert "scaler.scale(loss).backward()" in out
    assert "self.scaler.step(self.optimizer)" in out and "self.scaler.update()" in out
    body = out[out.index("def train_step"):]
    assert body.index("with torch.autocast(") < body.index("loss = self.model(x).sum()") < body.index("self.backward(")


def test_switched_trainer_in_bfloat16_keeps_one_clip_and_a_flag():
    """--dtype bfloat16: no scaler; the switch's flag is kept on the trainer for autocast, and the
    fp16 clip and its fp32 twin become one statement (no scaler to unscale)."""
    clip = textwrap.indent(textwrap.dedent("""\
        if self.use_amp:
            torch.nn.utils.clip_grad_norm_(amp.master_params(self.optimizer), 1.0)
        else:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
    """), " " * 12)
    code = trainer().replace("            self.optimizer.step()\n", clip)
    res = check_source(textwrap.dedent(code).encode(), "x.py", all_rules(), Settings(dtype="bfloat16"), fix="safe")
    out = res.fixed
    assert out is not None and "GradScaler" not in out and "amp." not in out.replace("torch.amp.", "")
    ast.parse(out)
    assert 'self.amp_enabled = bool(self.use_amp) and self.use_amp != "O0"' in out
    assert "dtype=torch.bfloat16, enabled=self.amp_enabled" in out
    assert out.count("clip_grad_norm_(") == 1 and "        if self.use_amp:" not in out


def test_initialize_whose_optimizer_only_reaches_a_scheduler_is_not_paired():
    """Handing the optimizer to code outside the project pairs only when the model goes to the
    same object (a runner): a scheduler that gets the optimizer alone says nothing of where the
    trainer's optimizer comes from."""
    code = trainer().replace(
        "        return model, optimizer\n",
        "        scheduler = get_scheduler(optimizer)\n        return model\n", 1)
    res = migrate(code)
    assert res.fixed is None or "amp.scale_loss" in res.fixed
    assert [d for d in res.diagnostics if d.code == "AMP101"]
