"""Eighteenth round: an FP16_Optimizer made at a script's module level (or under its
``if __name__ == "__main__":``) and handed to a function or a trainer class; the fp32 path's own
schedule object; a call that hands the optimizer on before the FP16_Optimizer exists.  The runnable
golden is fixtures/projects/fp16_script_trainer."""
import ast
import textwrap

from click.testing import CliRunner

from ampfix.cli import main
from test_round17_shapes import TRAINER, run, write

SCRIPT = textwrap.dedent('''\
    import argparse

    import torch

    from trainer import Trainer

    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--fp16", action="store_true")
        parser.add_argument("--lr", type=float, default=0.1)
        args = parser.parse_args()
        model = torch.nn.Linear(4, 4).cuda()
        if args.fp16:
            model.half()
        if args.fp16:
            from apex.optimizers import FP16_Optimizer, FusedAdam

            optimizer = FusedAdam(model.parameters(), lr=args.lr)
            optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)
        else:
            optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        trainer = Trainer(model, optimizer, args)
        trainer.fit([(torch.randn(8, 4, device="cuda"), torch.randn(8, 4, device="cuda"))])
''')

ENGINE = textwrap.dedent('''\
    import torch


    def train(args, model, optimizer, loader):
        for x, y in loader:
            if args.fp16:
                x = x.half()
            loss = torch.nn.functional.mse_loss(model(x), y)
            if args.fp16:
                optimizer.backward(loss)
            else:
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
''')

FLAT = textwrap.dedent('''\
    import argparse

    import torch

    from engine import train

    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true")
    args = parser.parse_args()
    model = torch.nn.Linear(4, 4).cuda()
    if args.fp16:
        model.half()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.fp16:
        from apex.fp16_utils import FP16_Optimizer

        optimizer = FP16_Optimizer(optimizer, static_loss_scale=128.0)
    for epoch in range(3):
        train(args, model, optimizer, [(torch.randn(8, 4, device="cuda"), torch.randn(8, 4, device="cuda"))])
''')


def test_a_script_under_the_main_guard_hands_it_to_a_trainer_class(tmp_path):
    write(tmp_path, {"trainer.py": TRAINER, "main.py": SCRIPT})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    script = (tmp_path / "main.py").read_text()
    trainer = (tmp_path / "trainer.py").read_text()
    head, _, body = script.partition('if __name__ == "__main__":\n')
    # made inside the block, after the flag is parsed, before the class is handed it
    assert "GradScaler" not in head
    assert body.index("args = parser.parse_args()") < body.index("scaler = torch.amp.GradScaler(") < \
        body.index("Trainer(model, optimizer, args, scaler=scaler)")
    assert "apex" not in script and ".half()" not in script
    assert "def __init__(self, model, optimizer, args, *, scaler):" in trainer
    assert "self.scaler.scale(loss).backward()" in trainer and "x.half()" not in trainer
    compile(script, "main.py", "exec")
    assert "Would rewrite 0 files" in run(tmp_path).output


def test_module_level_code_hands_it_to_a_function_of_another_module(tmp_path):
    write(tmp_path, {"engine.py": ENGINE, "train.py": FLAT})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    script = (tmp_path / "train.py").read_text()
    engine = (tmp_path / "engine.py").read_text()
    assert "def train(args, model, optimizer, loader, *, scaler):" in engine
    assert "scaler.scale(loss).backward()" in engine and "x.half()" not in engine
    assert "growth_interval=2**31 - 1" in script and "enabled=bool(args.fp16)" in script
    assert script.index("scaler = torch.amp.GradScaler(") < script.index("for epoch in range(3):")
    # the call grew past the file's width: one argument a line
    assert "        scaler=scaler,\n    )\n" in script
    assert "apex" not in script + engine and "model.half()" not in script


def test_two_scripts_sharing_one_trainer_refuse(tmp_path):
    # each script's plan would edit the shared class alone; the other's call would lack the scaler
    write(tmp_path, {"trainer.py": TRAINER, "a.py": SCRIPT, "b.py": SCRIPT})
    before = (tmp_path / "trainer.py").read_text()
    out = run(tmp_path, "--write")
    assert (tmp_path / "trainer.py").read_text() == before
    assert "FP16_Optimizer(optimizer" in (tmp_path / "a.py").read_text()
    assert "b.py line 22) without this FP16_Optimizer" in out.output, out.output


def test_the_optimizer_handed_on_before_the_fp16_optimizer_exists_refuses(tmp_path):
    early = FLAT.replace("if args.fp16:\n    from apex",
                         "train(args, model, optimizer, [])\nif args.fp16:\n    from apex")
    assert early != FLAT
    write(tmp_path, {"engine.py": ENGINE, "train.py": early})
    out = run(tmp_path, "--write")
    assert "FP16_Optimizer(optimizer" in (tmp_path / "train.py").read_text()
    assert "`train` is called at line 14, before the FP16_Optimizer at line 18 is made" in out.output, out.output


SCHEDULED = SCRIPT.replace(
    "    else:\n        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)\n",
    "    else:\n        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)\n"
    "        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, s / 10))\n")


def test_the_fp32_paths_schedule_object_takes_the_fp16_warmup_away(tmp_path):
    # the fp16 path now runs the fp32 path's optimizer and its LambdaLR: its own warm-up would
    # set the learning rate on top of the schedule's
    assert SCHEDULED != SCRIPT
    write(tmp_path, {"trainer.py": TRAINER, "main.py": SCHEDULED})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    trainer = (tmp_path / "trainer.py").read_text()
    script = (tmp_path / "main.py").read_text()
    assert "param_groups" not in trainer and "warmup_linear" not in trainer
    assert "    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer" in script


def test_a_schedule_under_a_condition_of_its_own_refuses(tmp_path):
    nested = SCHEDULED.replace("        scheduler = torch.optim",
                               "        if args.lr > 0:\n            scheduler = torch.optim")
    assert nested != SCHEDULED
    write(tmp_path, {"trainer.py": TRAINER, "main.py": nested})
    out = run(tmp_path, "--write")
    assert "FP16_Optimizer(optimizer" in (tmp_path / "main.py").read_text()
    assert "builds a schedule for `optimizer` at line 23 under a condition of its own" in out.output, out.output


CLIP_LOOP = textwrap.dedent('''\
    import torch


    def train(args, model, opt, data, scaler=None):
        for x in data:
            loss = model(x)
            if {test}:
                loss.backward()
            elif scaler is not None:
                scaler.scale(loss).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
''')


def test_unscale_before_a_clip_runs_only_where_the_scaled_backward_did(tmp_path):
    # `scaler` is None on the other path: an unguarded unscale_ raised AttributeError there
    # (hirofumi0810/neural_sp after its apex path went: a holdout module the corpus had counted right)
    write(tmp_path, {"train.py": CLIP_LOOP.format(test="args.fp32")})
    out = CliRunner().invoke(main, ["check", "--fix", "--unsafe-fixes", "--select", "AMP206", str(tmp_path)])
    text = (tmp_path / "train.py").read_text()
    assert "        if not args.fp32 and scaler is not None:\n            scaler.unscale_(opt)\n" \
           "        torch.nn.utils.clip_grad_norm_" in text, out.output
    compile(text, "train.py", "exec")


def test_a_test_that_calls_is_not_evaluated_again(tmp_path):
    write(tmp_path, {"train.py": CLIP_LOOP.format(test="plain_step(args)")})
    out = CliRunner().invoke(main, ["check", "--fix", "--unsafe-fixes", "--select", "AMP206", str(tmp_path)])
    assert "unscale_" not in (tmp_path / "train.py").read_text()
    assert "AMP206" in out.output and "clipping scaled gradients" in out.output


INFER = textwrap.dedent('''\
    import torch
    from apex import amp


    def infer(model, loader, with_apex=False, mixed_precision=True):
        if with_apex:
            model = amp.initialize(model, None,
                                   opt_level='O2' if mixed_precision else 'O0',
                                   keep_batchnorm_fp32=True,
                                   verbosity=0)
        model.eval()
        out = []
        with torch.no_grad():
            for x in loader:
                out.append(model(x))
        return out
''')


def test_initialize_with_optimizers_none_returns_the_model_alone(tmp_path):
    # NVIDIA/retinanet-examples `odtk/infer.py` (holdout, counted right before this round): the
    # rewrite said `model = model, None` (a tuple: the next `model.eval()` raised), and its
    # `enabled=` read `'O2' if mp else 'O0' != 'O0'`, which is `'O2' if mp else False`
    write(tmp_path, {"infer.py": INFER})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "infer.py").read_text()
    assert "model, None" not in text and "amp" not in text.replace("torch.autocast", "")
    call = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call) and "autocast" in ast.unparse(n.func))
    enabled = ast.unparse(next(k.value for k in call.keywords if k.arg == "enabled"))
    # the conditional opt level folds to its test (nineteenth round)
    assert enabled == "bool(with_apex) and bool(mixed_precision)", text
    for with_apex in (False, True):
        for mp in (False, True):
            got = eval(enabled, {"with_apex": with_apex, "mixed_precision": mp})
            assert got is (with_apex and mp)


def test_and_parenthesizes_what_binds_looser():
    from ampfix.migration.spell import conj

    assert conj("bool(a)", "x if c else y") == "bool(a) and (x if c else y)"
    assert conj("a or b", "c") == "(a or b) and c"
    assert conj("a and b", "c") == "a and b and c"


ADV = textwrap.dedent('''\
    import torch
    from apex import amp


    def train(opts, model, optimizer, loader, tasks):
        task2scaler = {t: i for i, t in enumerate(tasks)}
        model, optimizer = amp.initialize(model, optimizer, num_losses=len(task2scaler),
                                          enabled=opts.fp16, opt_level="O2")
        for name, (x, delta) in zip(tasks, loader):
            loss = model(x + delta).sum()
            with amp.scale_loss(loss, optimizer, loss_id=task2scaler[name]) as scaled_loss:
                scaled_loss.backward(retain_graph=True)
            amp_scale = scaled_loss.item() // loss.item()
            delta_grad = delta.grad.float() / amp_scale
            optimizer.step()
            optimizer.zero_grad()
        return delta_grad
''')


def test_the_scaled_loss_read_after_its_block_stays_bound(tmp_path):
    # VILLA's adversarial training reads `scaled_loss` after the block to unscale its own
    # gradients: the rewrite had dropped the name (NameError); UNITER's `task2scaler`, read only by
    # num_losses= and loss_id=, stayed behind unread
    write(tmp_path, {"train.py": ADV})
    out = run(tmp_path, "--write")
    # left for a person: the two `.item()` host syncs the script makes itself (AMP303)
    assert "not rewritten" not in out.output and "Rewrote 1 file" in out.output, out.output
    text = (tmp_path / "train.py").read_text()
    assert "scaled_loss = scaler.scale(loss)\n        scaled_loss.backward(retain_graph=True)\n" in text
    assert "amp_scale = scaled_loss.item() // loss.item()" in text
    assert "task2scaler" not in text and "apex" not in text
    compile(text, "train.py", "exec")


GUARDED = textwrap.dedent('''\
    import os
    import warnings

    import torch
    from helpers import log_lr, warmup_linear
    try:
        from apex import amp
    except ModuleNotFoundError:
        warnings.warn("APEX AMP is unavailable")


    def train(args, model, optimizer, loader):
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        for step, (x, y) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(x), y)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
            log_lr(optimizer)
''')


def test_imports_only_removed_code_read_go_with_it(tmp_path):
    # NVIDIA DeepLearningExamples Transformer-XL: `import warnings`, read only by the except of the
    # apex import, stayed behind unread; an import the original left unread (`os`) is not ours
    # to remove, nor one whose module may have effects of its own (`helpers`: not in the project)
    write(tmp_path, {"train.py": GUARDED})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "import warnings" not in text and "import os\n" in text
    assert "from helpers import log_lr, warmup_linear\n" in text


WARMUP = textwrap.dedent('''\
    import torch
    from helpers import BertAdam, warmup_linear


    def train(args, model, loader):
        if args.fp16:
            from apex.optimizers import FP16_Optimizer, FusedAdam

            optimizer = FusedAdam(model.parameters(), lr=args.lr)
            optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)
        else:
            optimizer = BertAdam(model.parameters(), lr=args.lr, warmup=0.1, t_total=100)
        for step, (x, y) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(x), y)
            if args.fp16:
                optimizer.backward(loss)
            else:
                loss.backward()
            if args.fp16:
                lr_this_step = args.lr * warmup_linear(step / 100, 0.1)
                for group in optimizer.param_groups:
                    group["lr"] = lr_this_step
            optimizer.step()
            optimizer.zero_grad()
''')


def test_one_name_of_several_goes_when_only_removed_code_read_it(tmp_path):
    # NVIDIA's BERT run_swag.py: the fp16 path's own warm-up goes (BertAdam schedules itself), and
    # `warmup_linear`, imported beside BertAdam for it alone, stayed behind unread
    write(tmp_path, {"train.py": WARMUP})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "param_groups" not in text and "from helpers import BertAdam\n" in text


def test_a_name_another_module_takes_from_this_one_stays(tmp_path):
    other = "from train import warmup_linear\n\nprint(warmup_linear(0.5, 0.1))\n"
    write(tmp_path, {"train.py": WARMUP, "report.py": other})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "param_groups" not in text and "from helpers import BertAdam, warmup_linear\n" in text


PREPARE = textwrap.dedent('''\
    import torch


    def prepare(args, model, ckpt, amp):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if ckpt:
            optimizer.load_state_dict(ckpt["optimizer"])
            if amp:
                optimizer.state = {}
        if amp:
            model, optimizer = amp.initialize(model, optimizer, opt_level=args.fp16_opt_level)
            if ckpt:
                amp.load_state_dict(ckpt["amp"])
        return model, optimizer


    def train(args, model, loader, ckpt=None):
        if args.fp16:
            from apex import amp
        else:
            amp = None
        model, optimizer = prepare(args, model, ckpt, amp=amp)
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            if args.fp16:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()
''')


def test_amp_handed_to_a_setup_that_restores_its_state_migrates(tmp_path):
    # the caller makes the scaler before the call: the setup's early `if amp:` reads a parameter
    write(tmp_path, {"train.py": PREPARE})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "def prepare(args, model, ckpt, scaler):" in text and "if scaler.is_enabled():\n            optimizer.state" in text
    assert text.index("scaler = torch.amp.GradScaler(") < text.index("prepare(args, model, ckpt, scaler=scaler)")


def test_amp_tested_before_the_initialize_that_makes_the_scaler_refuses(tmp_path):
    # microsoft/unilm s2s-ft: a dummy scaled step inside the setup keeps the scaler there, made
    # where initialize was; `if amp: optimizer.state = {}` above it had become
    # `if scaler.is_enabled():` three lines before the scaler existed (UnboundLocalError); the
    # corpus saw it once pyflakes joined its checks
    dummy = PREPARE.replace('''            amp.load_state_dict(ckpt["amp"])
''', '''            amp.load_state_dict(ckpt["amp"])
            loss = model(torch.ones(2, 2)).sum()
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
''')
    assert dummy != PREPARE
    write(tmp_path, {"train.py": dummy})
    out = run(tmp_path, "--write")
    text = (tmp_path / "train.py").read_text()
    assert "amp.initialize(" in text and "scaler" not in text, text
    assert "`amp` is tested at line 8, before the scaler is made where amp.initialize was (line 11)" in out.output, \
        out.output


GLOBAL_OPT = textwrap.dedent('''\
    import torch

    model = torch.nn.Linear(4, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.fp16:
        from apex.fp16_utils import FP16_Optimizer
        optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)


    def train(loader):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            if args.fp16:
                optimizer.backward(loss)
            else:
                loss.backward()
            optimizer.step()
''')

SELF_OPT = textwrap.dedent('''\
    import torch


    class Wrapper:
        def __init__(self, args, model):
            self.args, self.model = args, model
            self.init_optimizer(args)

        def init_optimizer(self, args):
            optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
            if args.fp16:
                from apex.optimizers import FP16_Optimizer
                self.optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)
            else:
                self.optimizer = optimizer

        def step(self, x, y):
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            if self.args.fp16:
                self.optimizer.backward(loss)
            else:
                loss.backward()
            self.optimizer.step()
''')


def test_bfloat16_flags_are_bound_where_they_are_read(tmp_path):
    # kimiyoung/transformer-xl (a module-level FP16_Optimizer, its optimizer read as a global) and
    # uclanlp/visualbert (self.optimizer made in a method, stepped in another): autocast read
    # `use_amp`, which nothing bound
    write(tmp_path, {"flat.py": GLOBAL_OPT, "wrap.py": SELF_OPT})
    out = run(tmp_path, "--write", "-q", "--dtype", "bfloat16")
    assert out.exit_code == 0, out.output
    flat = (tmp_path / "flat.py").read_text()
    wrap = (tmp_path / "wrap.py").read_text()
    assert "use_amp = bool(args.fp16)\n" in flat and "enabled=use_amp" in flat
    assert "self.use_amp = bool(args.fp16)" in wrap and "enabled=self.use_amp" in wrap
