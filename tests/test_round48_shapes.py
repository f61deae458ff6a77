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


LAYERNORM = textwrap.dedent('''\
    import logging

    import torch
    from torch import nn

    logger = logging.getLogger(__name__)

    try:
        from apex.normalization.fused_layer_norm import FusedLayerNorm as BertLayerNorm
    except (ImportError, AttributeError):
        logger.info("Better speed can be achieved with apex installed.")

        class BertLayerNorm(nn.Module):
            def __init__(self, hidden_size, eps=1e-12):
                super(BertLayerNorm, self).__init__()
                self.weight = nn.Parameter(torch.ones(hidden_size))
                self.variance_epsilon = eps

            def forward(self, x):
                return x * self.weight


    class Embeddings(nn.Module):
        def __init__(self, h):
            super().__init__()
            self.LayerNorm = BertLayerNorm(h, eps=1e-12)
''')


def test_a_fallback_class_naming_itself_is_not_apex(tmp_path):
    # 4. `super(BertLayerNorm, self)` inside the fallback class is the class itself: it was
    # rewritten to `super(torch.nn.LayerNorm, self)` where the fallback stayed
    write(tmp_path, {"modeling.py": LAYERNORM})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "modeling.py").read_text()
    assert "super(torch.nn.LayerNorm" not in text
    # nothing else reads the name: the import and its fallback go, the use is torch's
    assert "apex" not in text and "class BertLayerNorm" not in text
    assert "self.LayerNorm = torch.nn.LayerNorm(h, eps=1e-12)" in text


def test_an_apex_binding_another_module_imports_stays(tmp_path):
    # 5. `from .modeling import BertLayerNorm as LayerNorm` in a sibling: the binding (and its
    # fallback) stay, where before they went and the sibling's import failed
    write(tmp_path, {"pkg/__init__.py": "", "pkg/modeling.py": LAYERNORM,
                     "pkg/gpt.py": "from .modeling import BertLayerNorm as LayerNorm\n\nln = LayerNorm(8)\n"})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "pkg" / "modeling.py").read_text()
    assert "    from apex.normalization.fused_layer_norm import FusedLayerNorm as BertLayerNorm\n" in text
    assert "            super(BertLayerNorm, self).__init__()\n" in text
    assert "self.LayerNorm = torch.nn.LayerNorm(h, eps=1e-12)" in text
    assert (tmp_path / "pkg" / "gpt.py").read_text().startswith("from .modeling import BertLayerNorm as LayerNorm")
    compile(text, "modeling.py", "exec")


def test_a_class_named_like_its_apex_base_still_reads_apex(tmp_path):
    # the bases of `class FusedLayerNorm(FusedLayerNorm)` run before the class exists: apex's
    from ampfix.model.semantic import Model, names_own_class
    import ast

    tree = ast.parse("from apex.normalization import FusedLayerNorm\n"
                     "class FusedLayerNorm(FusedLayerNorm):\n"
                     "    def f(self):\n"
                     "        return super(FusedLayerNorm, self)\n")
    Model(tree)
    names = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "FusedLayerNorm"]
    assert [names_own_class(n) for n in names] == [False, True]


SCHEDULED_FP16 = textwrap.dedent('''\
    import torch
    from apex.optimizers import FP16_Optimizer, FusedAdam

    from optimization import WarmupLinearSchedule


    def main(args, model, loader):
        model.half()
        optimizer = FusedAdam(model.parameters(), lr=1e-3)
        optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)
        scheduler = WarmupLinearSchedule(optimizer, warmup_steps=10, t_total=100)
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x.half()), y)
            optimizer.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
''')

SCHEDULE = textwrap.dedent('''\
    from torch.optim.lr_scheduler import LambdaLR


    class WarmupLinearSchedule(LambdaLR):
        def __init__(self, optimizer, warmup_steps, t_total, last_epoch=-1):
            self.warmup_steps = warmup_steps
            self.t_total = t_total
            super(WarmupLinearSchedule, self).__init__(optimizer, self.lr_lambda, last_epoch=last_epoch)

        def lr_lambda(self, step):
            return min(1.0, step / max(1, self.warmup_steps))
''')


def test_a_project_schedule_handed_the_fp16_optimizer_takes_the_plain_one(tmp_path):
    # 6. transformers' WarmupLinearSchedule vendored in the project: its __init__ was taken for a
    # function the scaler must reach ("used other than by a call": `super(WarmupLinearSchedule, ...)`)
    write(tmp_path, {"train.py": SCHEDULED_FP16, "optimization.py": SCHEDULE})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "scheduler = WarmupLinearSchedule(optimizer, warmup_steps=10, t_total=100)" in text
    assert "scaler.scale(loss).backward()" in text and "FP16_Optimizer" not in text
    assert (tmp_path / "optimization.py").read_text() == SCHEDULE


def test_a_schedule_that_steps_the_optimizer_is_not_trusted(tmp_path):
    stepping = SCHEDULE.replace("    def lr_lambda(self, step):\n",
                                "    def advance(self):\n        self.optimizer.step()\n\n"
                                "    def lr_lambda(self, step):\n")
    assert stepping != SCHEDULE
    write(tmp_path, {"train.py": SCHEDULED_FP16, "optimization.py": stepping})
    out = run(tmp_path)
    assert "FP16_Optimizer` is NVIDIA apex" in out.output and "(not rewritten: `WarmupLinearSchedule.__init__`" in out.output
    assert "+            scaler.scale(loss)" not in out.output


HALF_HELPERS = textwrap.dedent('''\
    import torch.nn as nn


    class tofp16(nn.Module):
        def forward(self, x):
            return x.half()


    def network_to_half(network):
        return nn.Sequential(tofp16(), network.half())
''')

FP16_SCRIPT = textwrap.dedent('''\
    import torch
    from apex.fp16_utils import FP16_Optimizer

    from models import network_to_half

    model = torch.nn.Linear(8, 8)
    model = network_to_half(model)
    model = model.cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    optimizer = FP16_Optimizer(optimizer, static_loss_scale=128.0, verbose=False)
    for x, y in [(torch.randn(4, 8), torch.randn(4, 8))]:
        optimizer.zero_grad()
        loss = torch.nn.functional.l1_loss(model(x.cuda().half()).float(), y.cuda())
        optimizer.backward(loss)
        optimizer.step()
''')


def test_a_model_made_half_by_a_project_helper_is_refused(tmp_path):
    # 7. the project's own copy of apex's network_to_half: the FP16_Optimizer went and the model
    # stayed float16, where GradScaler cannot unscale its gradients (it was counted right)
    write(tmp_path, {"train.py": FP16_SCRIPT, "models.py": HALF_HELPERS})
    out = run(tmp_path)
    assert out.exit_code == 1, out.output
    assert "`network_to_half(model)` at line 7 makes the model float16 (" in out.output
    assert ("models.py line 9, `network_to_half`): GradScaler cannot unscale float16 gradients; keep the model "
            "float32 by hand") in out.output
    assert "scaler.scale(loss)" not in out.output.split("left for a person")[0]


def test_a_half_helper_that_cannot_be_followed_is_refused_by_its_name(tmp_path):
    # `from utils import *` passing on `from models import *`: not followed; the name says enough
    script = FP16_SCRIPT.replace("from models import network_to_half", "from utils import *")
    write(tmp_path, {"train.py": script, "utils.py": "from models import *\n", "models.py": HALF_HELPERS})
    out = run(tmp_path)
    assert out.exit_code == 1, out.output
    assert "`network_to_half(model)` at line 7 may make the model float16 (`network_to_half` cannot be followed)" \
        in out.output


def test_a_copy_of_the_modeling_file_elsewhere_does_not_keep_the_binding(tmp_path):
    # two packages, each with its own modeling.py; a sibling imports the name from the other copy:
    # this copy's binding is nobody's, and goes with its fallback as before
    write(tmp_path, {"a/__init__.py": "", "a/modeling.py": LAYERNORM,
                     "b/__init__.py": "", "b/modeling.py": LAYERNORM,
                     "b/gpt.py": "from .modeling import BertLayerNorm as LayerNorm\n\nln = LayerNorm(8)\n"})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    assert "apex" not in (tmp_path / "a" / "modeling.py").read_text()
    assert "from apex.normalization" in (tmp_path / "b" / "modeling.py").read_text()


def test_a_binding_imported_by_absolute_name_stays_and_a_namesake_import_does_not_keep_it(tmp_path):
    # `from models.normalization import SynchronizedBatchNorm2d` (few-shot-vid2vid): the apex binding
    # stays; `from torch.nn.parallel import DistributedDataParallel` elsewhere is not an import of it
    norm = ("import torch\nfrom apex.parallel import SyncBatchNorm as SynchronizedBatchNorm2d\n\n\n"
            "def make(n):\n    return SynchronizedBatchNorm2d(n)\n")
    write(tmp_path, {"models/__init__.py": "", "models/normalization.py": norm,
                     "models/architecture.py": "from models.normalization import SynchronizedBatchNorm2d\n\n"
                                               "bn = SynchronizedBatchNorm2d(8)\n"})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    assert "from apex.parallel import SyncBatchNorm as SynchronizedBatchNorm2d" in \
        (tmp_path / "models" / "normalization.py").read_text()
    ddp = ("import torch\nfrom apex.parallel import DistributedDataParallel\n\n\n"
           "def wrap(model):\n    return DistributedDataParallel(model)\n")
    write(tmp_path, {"engine.py": ddp,
                     "other.py": "from torch.nn.parallel import DistributedDataParallel\n\n"
                                 "wrap = DistributedDataParallel\n"})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    assert "apex" not in (tmp_path / "engine.py").read_text()


HALF_THEN_INIT = textwrap.dedent('''\
    import torch
    from apex import amp


    def main(args, loader):
        model = torch.nn.Linear(8, 8)
        if args.fp16:
            model.half()
        model.to("cuda")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        if args.fp16:
            model, optimizer = amp.initialize(model, optimizer, opt_level=args.fp16_opt_level)
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            if args.fp16:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
''')


def test_a_model_made_half_before_amp_initialize_is_refused(tmp_path):
    # 8. `if args.fp16: model.half()` then apex's initialize (lonePatient/train-bert-pytorch): the
    # migration kept the half model beside a GradScaler, which cannot unscale its gradients
    write(tmp_path, {"train.py": HALF_THEN_INIT})
    out = run(tmp_path)
    assert out.exit_code == 1, out.output
    assert ("not rewritten: line 8 makes the model float16 (`model.half()`) before amp.initialize at line 12: "
            "native AMP keeps the model float32") in out.output
    assert (tmp_path / "train.py").read_text() == HALF_THEN_INIT
