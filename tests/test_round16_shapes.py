"""Sixteenth round: an optimizer that a project class wraps (a learning-rate schedule that owns
it), apex handed the inner one and the step run by the wrapper's method; and an inference
initialize whose options are worked out under its own guard.  The runnable goldens are
fixtures/projects/optim_wrapper and fixtures/apex/*/inference_level_under_guard.py."""
import textwrap
from pathlib import Path

from click.testing import CliRunner

from ampfix.cli import main

WRAPPER = textwrap.dedent('''\
    import torch


    class Warmup:
        def __init__(self, optimizer, steps):
            self.optim = optimizer
            self.steps = steps
            self.n = 0

        def step(self):
            self.n += 1
            for group in self.optim.param_groups:
                group["lr"] = min(1.0, self.n / self.steps) * 0.1
            self.optim.step()
''')

TRAIN = textwrap.dedent('''\
    import torch
    from apex import amp

    from wrap import Warmup


    def main(model, loader, fp16):
        opt = Warmup(torch.optim.SGD(model.parameters(), lr=0.1), 100)
        sched = torch.optim.lr_scheduler.StepLR(opt.optim, 10)
        if fp16:
            model, opt.optim = amp.initialize(model, opt.optim, opt_level="O1")
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            with amp.scale_loss(loss, opt.optim) as scaled_loss:
                scaled_loss.backward()
            opt.step()
            opt.optim.zero_grad()
            sched.step()
''')


def write(root: Path, files: dict) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def run(root: Path, *extra):
    return CliRunner().invoke(main, ["migrate", *extra, "--torch-version", "2.4", str(root)])


def test_the_wrappers_step_method_takes_the_scaler_and_steps_through_it(tmp_path):
    write(tmp_path, {"wrap.py": WRAPPER, "train.py": TRAIN})
    out = run(tmp_path, "--write")
    assert out.exit_code in (0, 1), out.output
    wrap = (tmp_path / "wrap.py").read_text()
    train = (tmp_path / "train.py").read_text()
    assert "def step(self, *, scaler):" in wrap, wrap
    assert "        scaler.step(self.optim)\n        scaler.update()\n" in wrap, wrap
    # no clip in the wrapper: no unscale_
    assert "unscale_" not in wrap, wrap
    assert "opt.step(scaler=scaler)" in train and "apex" not in train, train
    # the torch scheduler's `step()` is another method by that name: it is left alone
    assert "sched.step()" in train, train
    assert "would be rewritten" not in run(tmp_path).output


def test_a_wrapper_method_called_elsewhere_is_refused_with_the_reason(tmp_path):
    other = TRAIN + textwrap.dedent('''\


        def warm(opt, n):
            for _ in range(n):
                opt.step()
    ''')
    write(tmp_path, {"wrap.py": WRAPPER, "train.py": other})
    out = run(tmp_path, "--write")
    assert "may call it too" in out.output, out.output
    assert "from apex import amp" in (tmp_path / "train.py").read_text()
    assert (tmp_path / "wrap.py").read_text() == WRAPPER


def test_a_wrapper_stepped_twice_after_the_backward_is_refused(tmp_path):
    twice = TRAIN.replace("        opt.step()\n", "        opt.step()\n        opt.step()\n")
    assert twice != TRAIN
    write(tmp_path, {"wrap.py": WRAPPER, "train.py": twice})
    out = run(tmp_path, "--write")
    assert "called more than once after the scaled backward" in out.output, out.output
    assert (tmp_path / "wrap.py").read_text() == WRAPPER


def test_a_read_of_the_gradients_at_the_call_and_in_the_wrapper_is_refused(tmp_path):
    clipping = WRAPPER.replace("        self.optim.step()\n",
                               "        torch.nn.utils.clip_grad_norm_(self.optim.param_groups[0]['params'], 1.0)\n"
                               "        self.optim.step()\n")
    train = TRAIN.replace("        opt.step()\n",
                          "        torch.nn.utils.clip_grad_norm_(amp.master_params(opt.optim), 5.0)\n"
                          "        opt.step()\n")
    assert clipping != WRAPPER and train != TRAIN
    write(tmp_path, {"wrap.py": clipping, "train.py": train})
    out = run(tmp_path, "--write")
    assert "the gradients are read both at line" in out.output, out.output
    assert (tmp_path / "wrap.py").read_text() == clipping


def test_bfloat16_leaves_the_wrapper_alone(tmp_path):
    write(tmp_path, {"wrap.py": WRAPPER, "train.py": TRAIN})
    out = run(tmp_path, "--write", "--dtype", "bfloat16")
    assert out.exit_code in (0, 1), out.output
    assert (tmp_path / "wrap.py").read_text() == WRAPPER
    train = (tmp_path / "train.py").read_text()
    assert "apex" not in train and "dtype=torch.bfloat16" in train and "opt.step()" in train, train


INFER = textwrap.dedent('''\
    import torch
    from apex import amp


    def run(model, batches, args):
        if args.amp:
            level = "O2" if args.half else "O1"
            model = amp.initialize(model, opt_level=level)
        with torch.no_grad():
            return [model(x) for x in batches]
''')


def test_inference_options_set_under_the_guard_are_read_after_it_behind_the_guards_test(tmp_path):
    write(tmp_path, {"infer.py": INFER})
    out = run(tmp_path, "--write")
    assert out.exit_code == 0, out.output
    after = (tmp_path / "infer.py").read_text()
    assert 'enabled=bool(args.amp) and level != "O0"' in after, after
    assert "apex" not in after and 'level = "O2" if args.half else "O1"' in after, after


def test_inference_option_bound_again_later_stays_refused(tmp_path):
    again = INFER.replace("    with torch.no_grad():", "    level = None\n    with torch.no_grad():")
    assert again != INFER
    write(tmp_path, {"infer.py": again})
    out = run(tmp_path, "--write")
    assert "is set inside the `if`" in out.output, out.output
    assert (tmp_path / "infer.py").read_text() == again


def test_inference_option_set_again_under_the_guard_after_initialize_stays_refused(tmp_path):
    later = INFER.replace("        model = amp.initialize(model, opt_level=level)\n",
                          "        model = amp.initialize(model, opt_level=level)\n        level = None\n")
    assert later != INFER
    write(tmp_path, {"infer.py": later})
    out = run(tmp_path, "--write")
    assert "is set inside the `if`" in out.output, out.output
    assert (tmp_path / "infer.py").read_text() == later
