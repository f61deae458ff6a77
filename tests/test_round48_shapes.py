"""Forty-eighth round: what the public code of this round's new holdout batch showed.

1. An object built first and initialized after (``fitter = Fitter(model, ...)``, then
   ``fitter.model, fitter.optimizer = amp.initialize(fitter.model, fitter.optimizer, ...)``): the
   class scales the loss in a method, so ``Fitter(...)`` was handed ``scaler=scaler`` -- on a line
   before the one that made the scaler (where the initialize was, its options read from
   ``fitter.config``).  Broken code (an undefined name).  A call handed the scaler of its own
   function must come after the scaler is made; where it does not, the module is refused, saying
   which call.
2. ``if amp is None: <warn, turn AMP off> else: <initialize>`` (the apex check of a MoCo
   reimplementation): the test of whether apex is installed folds to its ``else``, and the
   initialize there went, so the edits crossed ("the rewrite does not fit together").  The ``if``
   goes whole now: its body only ran where apex was missing.
3. A clip after the step (``with amp.scale_loss(...): ...backward(); optimizer.step();
   clip_grad_norm_(...)``): AMP206 read the migrated clip as clipping scaled gradients and the
   migration refused its own output.  ``scaler.step`` unscales the gradients in place, so past it
   they are the true ones.
"""
import textwrap

from test_round17_shapes import run, write

FITTER = textwrap.dedent('''\
    import torch
    from apex import amp


    class Fitter:
        def __init__(self, model, optimizer, config):
            self.model = model
            self.optimizer = optimizer
            self.config = config

        def train_one_epoch(self, loader):
            for x, y in loader:
                self.optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(self.model(x), y)
                with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                    scaled_loss.backward()
                self.optimizer.step()
''')

FIT_MAIN = textwrap.dedent('''\
    import argparse

    import torch
    from apex import amp

    from fitter import Fitter


    class Config:
        opt_level = "O1"


    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--fp16", action="store_true")
        args = parser.parse_args()
        model = torch.nn.Linear(4, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        fitter = Fitter(model, optimizer, Config)
        if args.fp16:
            fitter.model, fitter.optimizer = amp.initialize(fitter.model, fitter.optimizer,
                                                            opt_level=fitter.config.opt_level)
        fitter.train_one_epoch([(torch.randn(8, 4, device="cuda"), torch.randint(0, 2, (8,), device="cuda"))])
''')


def test_a_call_handed_the_scaler_before_it_is_made_is_refused(tmp_path):
    write(tmp_path, {"fitter.py": FITTER, "main.py": FIT_MAIN})
    out = run(tmp_path)
    assert out.exit_code == 1, out.output
    assert ("main.py line 19, before the scaler is made (line 20, for amp.initialize at line 21): it would be "
            "handed a name not yet set") in out.output
    assert "`Fitter.__init__` is called at " in out.output
    assert "scaler=scaler" not in out.output
    assert (tmp_path / "main.py").read_text() == FIT_MAIN


def test_the_same_call_after_the_initialize_is_handed_the_scaler(tmp_path):
    # built after the initialize, the object gets the scaler made there
    main = FIT_MAIN.replace(
        '''    fitter = Fitter(model, optimizer, Config)
    if args.fp16:
        fitter.model, fitter.optimizer = amp.initialize(fitter.model, fitter.optimizer,
                                                        opt_level=fitter.config.opt_level)
''', '''    if args.fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level=Config.opt_level)
    fitter = Fitter(model, optimizer, Config)
''')
    assert main != FIT_MAIN
    write(tmp_path, {"fitter.py": FITTER, "main.py": main})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "main.py").read_text()
    made = text.index("scaler = torch.amp.GradScaler(")
    assert made < text.index("fitter = Fitter(model, optimizer, Config, scaler=scaler)")
    assert "apex" not in text + (tmp_path / "fitter.py").read_text()


INSTALLED_ELSE = textwrap.dedent('''\
    import argparse
    import logging

    import torch

    try:
        from apex import amp
    except ImportError:
        amp = None

    logger = logging.getLogger(__name__)


    def train(loader, model, model_ema, optimizer, args):
        model.train()
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            with torch.no_grad():
                model_ema(x.cuda())
            optimizer.zero_grad()
            if args.amp_opt_level != "O0":
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()


    def main(args):
        model = torch.nn.Linear(4, 2).cuda()
        model_ema = torch.nn.Linear(4, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if args.amp_opt_level != "O0":
            if amp is None:
                logger.warning("apex is not installed, ignoring amp_opt_level")
                args.amp_opt_level = "O0"
            else:
                model, optimizer = amp.initialize(model, optimizer, opt_level=args.amp_opt_level)
                model_ema = amp.initialize(model_ema, opt_level=args.amp_opt_level)
        loader = [(torch.randn(8, 4), torch.randint(0, 2, (8,)))]
        train(loader, model, model_ema, optimizer, args)


    if __name__ == "__main__":
        p = argparse.ArgumentParser()
        p.add_argument("--amp-opt-level", default="O0")
        main(p.parse_args())
''')


def test_an_installed_check_whose_else_initialized_goes_whole(tmp_path):
    write(tmp_path, {"train.py": INSTALLED_ELSE})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "does not fit together" not in out.output
    assert "apex" not in text and "amp is None" not in text and "logger.warning" not in text
    assert ('    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n'
            '    scaler = torch.amp.GradScaler("cuda", enabled=args.amp_opt_level != "O0")\n'
            '    loader = ') in text
    assert "train(loader, model, model_ema, optimizer, args, scaler=scaler)" in text
    compile(text, "train.py", "exec")


def test_an_installed_check_whose_else_keeps_code_keeps_it(tmp_path):
    # something else in the `else` stays: the `if` folds to it (the warning goes)
    src = INSTALLED_ELSE.replace(
        "            model_ema = amp.initialize(model_ema, opt_level=args.amp_opt_level)\n",
        "            model_ema = amp.initialize(model_ema, opt_level=args.amp_opt_level)\n"
        "            args.ema_ready = True\n")
    assert src != INSTALLED_ELSE
    write(tmp_path, {"train.py": src})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "amp is None" not in text and "logger.warning" not in text
    assert '    if args.amp_opt_level != "O0":\n        args.ema_ready = True\n' in text


CLIP_AFTER_STEP = textwrap.dedent('''\
    import torch
    from apex import amp


    def train(loader, net, optimizer):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(net(x.cuda()), y.cuda())
            optimizer.zero_grad()
            with amp.scale_loss(loss, optimizer) as scale_loss:
                scale_loss.backward()
            optimizer.step()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)


    def main():
        net = torch.nn.Linear(4, 2).cuda()
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        net, optimizer = amp.initialize(net, optimizer, opt_level="O1")
        train([(torch.randn(8, 4), torch.randint(0, 2, (8,)))], net, optimizer)
''')


def test_a_clip_after_the_step_migrates_as_it_was(tmp_path):
    write(tmp_path, {"train.py": CLIP_AFTER_STEP})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert ("        scaler.step(optimizer)\n        scaler.update()\n"
            "        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)\n") in text
    assert "unscale_" not in text and "apex" not in text


def test_a_clip_between_the_backward_and_the_step_is_still_reported(tmp_path):
    from click.testing import CliRunner

    from ampfix.cli import main

    (tmp_path / "t.py").write_text(textwrap.dedent('''\
        import torch
        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    '''))
    out = CliRunner().invoke(main, ["check", "--select", "AMP206", str(tmp_path / "t.py")])
    assert out.output.count("AMP206") == 1, out.output
    assert "t.py:3:1: AMP206" in out.output
