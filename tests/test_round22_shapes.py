"""Twenty-second round: an ``elif`` that chose apex's scaled backward (its collapse must stay the
``else`` of the ``if`` above it); the AMP switch read from a module global (``cfg.amp`` of ``from
config import cfg``) in a setup function; a setup that initializes apex for inference where the
optimizer handed in is None and for training where it is not (each caller gets the seed its
argument reaches); a loss rescaled with ``loss /= n`` in a function that takes the loss; the scaled
helper called through ``functools.partial`` from a class that keeps the object initializing apex in
an attribute (stylegan2's Trainer and ``self.GAN``)."""
import ast
import subprocess
import sys
import textwrap

from test_round17_shapes import run, write

ELIF = textwrap.dedent('''\
    import sys

    import torch
    from apex import amp


    class Accelerator:
        def backward(self, loss):
            loss.backward()


    def train(fp16, model, opt, loader, accelerator=None):
        if fp16:
            model, opt = amp.initialize(model, opt, opt_level="O1")
        for x in loader:
            loss = model(x).sum()
            if accelerator is not None:
                accelerator.backward(loss)
            elif fp16:
                with amp.scale_loss(loss, opt) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            opt.step()
            opt.zero_grad()


    if __name__ == "__main__":
        model = torch.nn.Linear(4, 2)
        train(False, model, torch.optim.SGD(model.parameters(), lr=0.1), [torch.randn(3, 4)] * 2, Accelerator())
        print("ok")
''')


def test_a_collapsed_elif_stays_the_else_of_the_if_above(tmp_path):
    write(tmp_path, {"train.py": ELIF})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text
    tree = ast.parse(text)
    top = next(n for n in ast.walk(tree) if isinstance(n, ast.If) and "accelerator is not None" in ast.unparse(n.test))
    # the scaled backward is the `else` of the accelerator's `if`, not a statement after it
    assert [ast.unparse(x) for x in top.orelse] == ["scaler.scale(loss).backward()"]
    loop = next(n for n in ast.walk(tree) if isinstance(n, ast.For))
    assert not any("scaler.scale(loss)" in ast.unparse(x) for x in loop.body if x is not top and
                   not isinstance(x, ast.With))
    # the accelerator's path runs one backward per step (a second one would raise)
    r = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    assert "would be rewritten" not in run(tmp_path).output


GLOBAL = {
    "config.py": "from types import SimpleNamespace\n\ncfg = SimpleNamespace(amp=False)\n",
    "train.py": textwrap.dedent('''\
        import torch

        from config import cfg

        if cfg.amp:
            from apex import amp


        def setup(model, optimizer):
            if cfg.amp:
                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            return model, optimizer


        def train_epoch(model, loader, optimizer):
            for x in loader:
                loss = model(x).sum()
                optimizer.zero_grad()
                if cfg.amp:
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                optimizer.step()


        def main():
            model = torch.nn.Linear(4, 2)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model, optimizer = setup(model, optimizer)
            train_epoch(model, [torch.randn(3, 4)], optimizer)


        if __name__ == "__main__":
            main()
    '''),
}


def test_a_switch_read_from_a_module_global_is_said_as_written_in_the_caller(tmp_path):
    write(tmp_path, GLOBAL)
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=bool(cfg.amp))' in text
    r = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_a_global_the_caller_shadows_is_not_said_there(tmp_path):
    src = dict(GLOBAL)
    src["train.py"] = src["train.py"].replace("    model = torch.nn.Linear(4, 2)\n",
                                              "    cfg = None\n    model = torch.nn.Linear(4, 2)\n")
    write(tmp_path, src)
    out = run(tmp_path)
    assert "depends on `cfg`, which its callers cannot see" in out.output


SETUP = {
    "setup_utils.py": textwrap.dedent('''\
        import torch


        def get_optimizer(model, lr):
            optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
            return optimizer


        def setup_for_distributed_mode(model, optimizer, device, fp16=False, fp16_opt_level="O1"):
            model.to(device)
            if fp16:
                from apex import amp

                if optimizer is None:
                    model = amp.initialize(model, optimizer, opt_level=fp16_opt_level)
                else:
                    model, optimizer = amp.initialize(model, optimizer, opt_level=fp16_opt_level)
            return model, optimizer
    '''),
    "train.py": textwrap.dedent('''\
        import sys

        import torch

        from setup_utils import get_optimizer, setup_for_distributed_mode

        fp16 = "--fp16" in sys.argv
        model = torch.nn.Linear(4, 2)
        optimizer = get_optimizer(model, 0.1)
        model, optimizer = setup_for_distributed_mode(model, optimizer, "cpu", fp16)
        for step in range(3):
            loss = model(torch.randn(3, 4)).sum()
            if fp16:
                from apex import amp

                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    '''),
    "evaluate.py": textwrap.dedent('''\
        import sys

        import torch

        from setup_utils import setup_for_distributed_mode

        fp16 = "--fp16" in sys.argv
        model = torch.nn.Linear(4, 2)
        model, _ = setup_for_distributed_mode(model, None, "cpu", fp16)
        model.eval()
        with torch.no_grad():
            print(model(torch.randn(3, 4)).sum().item())
    '''),
}


def test_each_caller_gets_the_seed_its_optimizer_argument_reaches(tmp_path):
    write(tmp_path, SETUP)
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    setup = (tmp_path / "setup_utils.py").read_text()
    train = (tmp_path / "train.py").read_text()
    evaluate = (tmp_path / "evaluate.py").read_text()
    assert "apex" not in setup + train + evaluate
    # the training caller hands a torch optimizer: the inference seed is not its, and the test of
    # `optimizer is None` it settles says nothing more
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=bool(fp16))' in train
    assert "scaler.scale(loss).backward()" in train and "scaler.step(optimizer)" in train
    # the evaluation caller hands None: autocast around its forward, no scaler
    assert "GradScaler" not in evaluate
    assert 'torch.autocast("cuda", dtype=torch.float16, enabled=bool(fp16))' in evaluate
    # apex's `model = amp.initialize(model, None)` returned the model alone: nothing rebinds it
    assert "model = model" not in setup
    for script in ("train.py", "evaluate.py"):
        r = subprocess.run([sys.executable, script], cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    assert "would be rewritten" not in run(tmp_path).output


def test_an_optimizer_the_caller_may_leave_none_keeps_both_seeds(tmp_path):
    src = dict(SETUP)
    src["train.py"] = src["train.py"].replace("optimizer = get_optimizer(model, 0.1)",
                                              "optimizer = get_optimizer(model, 0.1) if len(sys.argv) > 2 else None")
    write(tmp_path, src)
    out = run(tmp_path)
    # not known to be an optimizer: both seeds reach the call, and it is refused with its reason
    assert "would be rewritten: apex" not in out.output
    assert "not rewritten" in out.output


RESCALE = textwrap.dedent('''\
    from apex import amp


    class Box:
        def __init__(self, model, optimizer, fp16, accum):
            self.model, self.optimizer = model, optimizer
            self.fp16, self.accum = fp16, accum
            if fp16:
                self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O1")

        def update_params(self, loss):
            if self.accum > 1:
                loss /= self.accum
            if self.fp16:
                with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            self.optimizer.step()
''')


def test_a_loss_rescaled_in_place_is_not_a_forward_pass(tmp_path):
    # `loss /= n` on the parameter: the forward passes are in the callers, which nothing here
    # follows; autocast around the division would cover nothing
    write(tmp_path, {"box.py": RESCALE})
    out = run(tmp_path)
    assert "autocast" not in "".join(ln for ln in out.output.splitlines(True) if ln.startswith("+"))
    assert "as the parameter `loss` of `Box.update_params`" in out.output


def test_a_partial_of_the_scaled_helper_and_an_object_holding_the_setup(tmp_path):
    # stylegan2's shape: the Trainer keeps the GAN in `self.GAN` (which initializes apex in its
    # __init__) and calls the scaled helper through `backwards = partial(loss_backwards, self.fp16)`
    write(tmp_path, {"gan.py": GAN})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "gan.py").read_text()
    assert "apex" not in text
    assert 'self.scaler = torch.amp.GradScaler("cuda", enabled=bool(fp16))' in text
    assert "backwards = partial(loss_backwards, self.fp16)" in text
    assert text.count("scaler=self.GAN.scaler)") == 2
    assert "self.GAN.scaler.step(self.GAN.D_opt)" in text and "self.GAN.scaler.step(self.GAN.G_opt)" in text
    assert "def loss_backwards(fp16, loss, optimizer, *, scaler, **kwargs):" in text
    r = subprocess.run([sys.executable, "gan.py"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    assert "would be rewritten" not in run(tmp_path).output


def test_a_partial_handed_on_is_a_value(tmp_path):
    src = GAN.replace("        for _ in range(2):", "        self.hook = backwards\n        for _ in range(2):")
    write(tmp_path, {"gan.py": src})
    out = run(tmp_path)
    assert "is used other than by a call" in out.output
    assert "would be rewritten: apex" not in out.output


GAN = textwrap.dedent('''\
    from functools import partial

    import torch
    from apex import amp


    def loss_backwards(fp16, loss, optimizer, **kwargs):
        if fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward(**kwargs)
        else:
            loss.backward(**kwargs)


    class GAN(torch.nn.Module):
        def __init__(self, fp16=False):
            super().__init__()
            self.G = torch.nn.Linear(4, 4)
            self.D = torch.nn.Linear(4, 1)
            self.G_opt = torch.optim.Adam(self.G.parameters(), lr=1e-3)
            self.D_opt = torch.optim.Adam(self.D.parameters(), lr=1e-3)
            self.fp16 = fp16
            if fp16:
                (self.G, self.D), (self.G_opt, self.D_opt) = amp.initialize(
                    [self.G, self.D], [self.G_opt, self.D_opt], opt_level="O1")


    class Trainer:
        def __init__(self, fp16=False):
            self.fp16 = fp16
            self.GAN = None

        def init_GAN(self):
            self.GAN = GAN(fp16=self.fp16)

        def train(self):
            if self.GAN is None:
                self.init_GAN()
            backwards = partial(loss_backwards, self.fp16)
            for _ in range(2):
                z = torch.randn(3, 4)
                self.GAN.D_opt.zero_grad()
                disc_loss = self.GAN.D(self.GAN.G(z)).mean()
                backwards(disc_loss, self.GAN.D_opt)
                self.GAN.D_opt.step()
                self.GAN.G_opt.zero_grad()
                gen_loss = -self.GAN.D(self.GAN.G(z)).mean()
                backwards(gen_loss, self.GAN.G_opt)
                self.GAN.G_opt.step()


    if __name__ == "__main__":
        Trainer().train()
        print("ok")
''')


EVAL_IN_TRAIN = textwrap.dedent('''\
    import torch
    from apex import amp


    def test(model, data):
        model.eval()
        with torch.no_grad():
            return sum(model(x).sum().item() for x in data)


    def train(args, model, ema_model, optimizer, data):
        for epoch in range(2):
            model.train()
            for x in data:
                loss = model(x).sum()
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            if args.use_ema:
                test_model = ema_model
            else:
                test_model = model
            print(test(test_model, data))


    def main(args):
        model = torch.nn.Linear(4, 2)
        ema_model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        train(args, model, ema_model, optimizer, [torch.randn(3, 4)])
''')


def test_evaluation_inside_the_training_function_runs_under_autocast(tmp_path):
    # apex patched torch for the whole process: `test(...)` inside `train` ran in half precision
    write(tmp_path, {"train.py": EVAL_IN_TRAIN})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text
    assert ("        with torch.autocast(\"cuda\", dtype=torch.float16, enabled=scaler.is_enabled()):\n"
            "            print(test(test_model, data))\n") in text
    # the function that only evaluates is not edited
    assert "def test(model, data):\n    model.eval()" in text


def test_a_dispatcher_of_evaluations_gets_autocast_at_its_call_not_a_scaler_it_lacks(tmp_path):
    # UNITER's `validate(model, loaders)` hands the model to one `validate_<task>` per task: it
    # only evaluates, through them; it has no scaler, so nothing inside it may read one
    src = EVAL_IN_TRAIN.replace("        print(test(test_model, data))",
                                '        print(validate(test_model, {"a": data}))')
    src = src.replace("def train(args", "def validate(model, loaders):\n    out = {}\n"
                      "    for name, data in loaders.items():\n"
                      "        out[name] = test(model, data)\n    return out\n\n\ndef train(args")
    write(tmp_path, {"train.py": src})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    body = text.split("def validate(model, loaders):")[1].split("def train(")[0]
    assert "scaler" not in body and "autocast" not in body
    assert ('        with torch.autocast("cuda", dtype=torch.float16, enabled=scaler.is_enabled()):\n'
            '            print(validate(test_model, {"a": data}))\n') in text
