"""Forty-seventh round: what the public code of this round's new batch showed.

1. A module that builds a mixed-precision optimizer of its own on apex's FP16_Optimizer parts
   (``from apex.fp16_utils import DynamicLossScaler, LossScaler, model_grads_to_master_grads``, a
   port of Megatron's ``fp16.py``) without making an FP16_Optimizer: nothing planned it, so its
   diagnostics were left with no reason at all.  It is refused now, saying why.
2. A program with both paths whose apex wrapper class lives in a helper module beside a native
   twin of another name (``ApexScaler`` / ``NativeScalerWithGradNormCount``, the MAE-style
   ``util/misc.py``): the apex branch of ``main`` went, and the class it alone used was left with
   apex's guarded import, its module refused ("not called in the project on the way here").  The
   class goes with the branch now, where every module that names it reads it only in code that
   goes.
3. ``if True:  # args.distributed`` in such a program: the author's own switch was folded away with
   the apex branches (and its comment lost).  A test of literals alone is left as written.
4. In Hugging Face's Trainer of 2020 (and its copies), beside the torch-version test that picks apex
   or native AMP, another picks DDP's ``no_sync`` (``if version.parse(torch.__version__) <
   version.parse("1.2"): _use_ddp_no_sync = False``): it was folded too (and, nothing reading the
   flag, deleted).  A version test whose statement says nothing of mixed precision stays.  And the
   one that chose native AMP, once its ``else: _use_native_amp = True`` is all that is left of it
   and nothing reads the flag, goes whole (the store was left behind, a module global nothing read).
5. Apex used only on a torch older than native AMP (``if use_fp16 and LooseVersion(torch.__version__)
   < LooseVersion('1.6.0'): from apex import amp; model, optimizer = amp.initialize(...)``, EasyCV's
   ``train_model``; its hooks use native AMP from 1.6 on) in a module with no native AMP of its own:
   refused before ("never used with amp.scale_loss in the files given"); the branch never runs on the
   torch native AMP needs, and goes.
6. An evaluation copy of a training script (``validate.py`` made from ``main.py``, training stubbed
   out): ``model, optimizer = amp.initialize(model, optimizer, ...)`` and the optimizer then handed
   only to functions that read it (``build_scheduler(config, optimizer, n)``, ``load_checkpoint(...,
   optimizer, ...)``, a ``train_one_epoch`` that is ``pass``).  Refused before ("never used with
   amp.scale_loss ... its backward is unscaled": there is no backward); an inference seed now (the
   forward under autocast, no GradScaler), the checkpoint loader's scaler optional.  Handed to a
   function that steps it, stores it or is not the project's, it stays a training seed; so it does
   in a function nothing in the project calls (its callers would be asked for a scaler).
"""
import textwrap

from test_round17_shapes import run, write

PARTS = textwrap.dedent('''\
    import torch
    from apex.fp16_utils import DynamicLossScaler, LossScaler
    from apex.fp16_utils import model_grads_to_master_grads


    class FP16_Optimizer(object):
        def __init__(self, init_optimizer, static_loss_scale=1.0, dynamic_loss_scale=False):
            self.optimizer = init_optimizer
            if dynamic_loss_scale:
                self.loss_scaler = DynamicLossScaler()
            else:
                self.loss_scaler = LossScaler(static_loss_scale)

        def update_master_grads(self, fp16_groups, fp32_groups):
            for a, b in zip(fp16_groups, fp32_groups):
                model_grads_to_master_grads(a, b)
''')


def test_a_module_built_on_apex_fp16_parts_is_refused_with_a_reason(tmp_path):
    write(tmp_path, {"fp16.py": PARTS})
    out = run(tmp_path)
    assert out.exit_code == 1, out.output
    assert "fp16.py: not rewritten" in out.output
    assert ("(not rewritten: `apex.fp16_utils.DynamicLossScaler` at line 10 is a part of apex's FP16_Optimizer, "
            "used here to build a mixed-precision optimizer of the module's own") in out.output
    assert (tmp_path / "fp16.py").read_text() == PARTS


def test_a_standalone_helper_beside_the_parts_is_still_rewritten(tmp_path):
    src = PARTS.replace("from apex.fp16_utils import model_grads_to_master_grads",
                        "from apex.fp16_utils import model_grads_to_master_grads, to_python_float")
    src += "\n\ndef report(loss):\n    return to_python_float(loss)\n"
    write(tmp_path, {"fp16.py": src})
    out = run(tmp_path)
    assert "+    return loss.item()" in out.output
    assert "is a part of apex's FP16_Optimizer" in out.output


MISC = textwrap.dedent('''\
    import torch


    class NativeScalerWithGradNormCount:
        state_dict_key = "amp_scaler"

        def __init__(self):
            self._scaler = torch.cuda.amp.GradScaler()

        def __call__(self, loss, optimizer):
            self._scaler.scale(loss).backward()
            self._scaler.step(optimizer)
            self._scaler.update()


    try:
        from apex import amp
        has_apex = True
    except ImportError:
        has_apex = False

    class ApexScaler:
        state_dict_key = "amp"

        def __call__(self, loss, optimizer):
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()


    def world_size():
        return 1
''')

MAIN = textwrap.dedent('''\
    import argparse
    import torch
    from util.misc import NativeScalerWithGradNormCount as NativeScaler
    try:
        from apex import amp
        has_apex = True
    except ImportError:
        has_apex = False
    from util.misc import ApexScaler


    def main():
        p = argparse.ArgumentParser()
        p.add_argument('--apex_amp', action='store_true')
        args = p.parse_args()
        model = torch.nn.Linear(4, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if True:  # args.distributed
            print("one process")
        if args.apex_amp and has_apex:
            model, optimizer = amp.initialize(model, optimizer, opt_level='O1')
            loss_scaler = ApexScaler()
        else:
            loss_scaler = NativeScaler()
        for _ in range(3):
            with torch.cuda.amp.autocast():
                loss = model(torch.ones(2, 4, device="cuda")).sum()
            optimizer.zero_grad()
            loss_scaler(loss, optimizer)
''')


def test_an_apex_wrapper_class_only_the_apex_branch_used_goes_with_it(tmp_path):
    write(tmp_path, {"util/__init__.py": "", "util/misc.py": MISC, "main.py": MAIN})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    misc = (tmp_path / "util/misc.py").read_text()
    main = (tmp_path / "main.py").read_text()
    assert "ApexScaler" not in misc and "apex" not in misc and "has_apex" not in misc
    assert "class NativeScalerWithGradNormCount:" in misc and "def world_size():" in misc
    assert "amp.initialize" not in main and "has_apex" not in main and "ApexScaler" not in main
    assert "    loss_scaler = NativeScaler()\n" in main
    compile(misc, "misc.py", "exec")
    compile(main, "main.py", "exec")
    again = run(tmp_path)
    assert again.exit_code == 0 and "Would rewrite 0 files" in again.output


def test_a_literal_test_is_the_authors_switch_and_stays(tmp_path):
    write(tmp_path, {"util/__init__.py": "", "util/misc.py": MISC, "main.py": MAIN})
    assert run(tmp_path, "--write", "-q").exit_code == 0
    assert "    if True:  # args.distributed\n        print(\"one process\")\n" in (
        tmp_path / "main.py").read_text()


def test_the_class_stays_where_code_that_stays_uses_it(tmp_path):
    other = "from util.misc import ApexScaler\n\n\ndef make():\n    return ApexScaler()\n"
    write(tmp_path, {"util/__init__.py": "", "util/misc.py": MISC, "main.py": MAIN, "other.py": other})
    out = run(tmp_path)
    assert "-class ApexScaler:" not in out.output
    assert "util/misc.py:26:14: AMP101 `apex.amp.scale_loss` is NVIDIA apex" in out.output


VERSIONED = textwrap.dedent('''\
    import torch
    from packaging import version

    _use_native_amp = False
    _use_apex = False

    if version.parse(torch.__version__) < version.parse("1.6"):
        from apex import amp
        _use_apex = True
    else:
        _use_native_amp = True

    if version.parse(torch.__version__) < version.parse("1.2"):
        _use_ddp_no_sync = False
    else:
        _use_ddp_no_sync = True


    def train(model, optimizer, loss, fp16, scaler):
        if fp16 and _use_native_amp:
            scaler.scale(loss).backward()
        elif fp16:
            with amp.scale_loss(loss, optimizer) as s:
                s.backward()
        else:
            loss.backward()
        if _use_ddp_no_sync:
            print("no_sync")
        else:
            print("sync")
''')


def test_a_version_test_of_other_things_stays(tmp_path):
    write(tmp_path, {"trainer.py": VERSIONED})
    assert run(tmp_path, "--write", "-q").exit_code == 0
    out = (tmp_path / "trainer.py").read_text()
    # the flag of the version test that chose native AMP: nothing reads it any more, it goes whole
    assert "amp" not in out and "import torch\nfrom packaging import version\n\nif version" in out
    assert ('if version.parse(torch.__version__) < version.parse("1.2"):\n    _use_ddp_no_sync = False\nelse:\n'
            '    _use_ddp_no_sync = True\n') in out
    assert 'if _use_ddp_no_sync:\n        print("no_sync")\n    else:\n        print("sync")\n' in out


OLD_TORCH_ONLY = textwrap.dedent('''\
    from distutils.version import LooseVersion

    import torch


    def train_model(model, optimizer, loader, use_fp16=False):
        model = model.cuda()

        # apex needs the model before DDP wraps it; from torch 1.6 the hooks use native AMP
        if use_fp16 and LooseVersion(torch.__version__) < LooseVersion('1.6.0'):
            from apex import amp
            model, optimizer = amp.initialize(model, optimizer, opt_level='O1')

        model = torch.nn.parallel.DistributedDataParallel(model)
        for batch in loader:
            loss = model(batch).sum()
            loss.backward()
            optimizer.step()
''')


def test_apex_only_on_an_old_torch_goes(tmp_path):
    write(tmp_path, {"train.py": OLD_TORCH_ONLY})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text and "LooseVersion" not in text and "amp" not in text
    assert "    model = model.cuda()\n\n    model = torch.nn.parallel.DistributedDataParallel(model)\n" in text
    assert "GradScaler" not in text and "autocast" not in text  # nothing of it ran on torch >= 1.6


def test_an_old_torch_test_beside_a_choice_of_apex_is_read_before_the_choices_are(tmp_path):
    # the old-torch test is read before the module's selectors are (`args.amp_impl == "apex"`
    # reads them): it must not fail there, and the branch goes as before
    src = OLD_TORCH_ONLY.replace("if use_fp16 and LooseVersion", "if amp_impl == 'apex' and LooseVersion").replace(
        "use_fp16=False", "amp_impl='native'")
    write(tmp_path, {"train.py": src})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    assert "please report" not in out.output
    assert "apex" not in (tmp_path / "train.py").read_text().replace("amp_impl == 'apex'", "")


UTILS = textwrap.dedent('''\
    import torch
    try:
        from apex import amp
    except ImportError:
        amp = None


    def load_checkpoint(path, model, optimizer, scheduler):
        ck = torch.load(path)
        model.load_state_dict(ck['model'])
        optimizer.load_state_dict(ck['optimizer'])
        scheduler.load_state_dict(ck['scheduler'])
        if 'amp' in ck:
            amp.load_state_dict(ck['amp'])
''')

SCHED = textwrap.dedent('''\
    import torch


    class WarmupLR(torch.optim.lr_scheduler.LambdaLR):
        def __init__(self, optimizer, steps):
            super().__init__(optimizer, lambda s: min(1.0, (s + 1) / steps))


    def build_scheduler(optimizer, steps):
        return WarmupLR(optimizer, steps)
''')

TRAIN = textwrap.dedent('''\
    import torch
    from apex import amp
    from sched import build_scheduler
    from utils import load_checkpoint


    def train_one_epoch(model, optimizer, loader):
        for x in loader:
            loss = model(x).sum()
            optimizer.zero_grad()
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()


    def main(args):
        model = torch.nn.Linear(4, 4).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = amp.initialize(model, optimizer, opt_level='O1')
        scheduler = build_scheduler(optimizer, 10)
        if args.resume:
            load_checkpoint(args.resume, model, optimizer, scheduler)
        train_one_epoch(model, optimizer, [torch.ones(2, 4, device='cuda')])
''')

EVAL = textwrap.dedent('''\
    import torch
    from apex import amp
    from sched import build_scheduler
    from utils import load_checkpoint


    def train_one_epoch(model, optimizer, loader):
        pass


    @torch.no_grad()
    def validate(model, loader):
        return sum(model(x).sum().item() for x in loader)


    def main(args):
        model = torch.nn.Linear(4, 4).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = amp.initialize(model, optimizer, opt_level='O1')
        scheduler = build_scheduler(optimizer, 10)
        load_checkpoint(args.resume, model, optimizer, scheduler)
        print(validate(model, [torch.ones(2, 4, device='cuda')]))


    if __name__ == "__main__":
        import argparse
        p = argparse.ArgumentParser()
        p.add_argument("--resume")
        main(p.parse_args())
''')


def test_an_evaluation_copy_of_the_training_script_is_an_inference_seed(tmp_path):
    write(tmp_path, {"utils.py": UTILS, "sched.py": SCHED, "main.py": TRAIN, "validate.py": EVAL})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    ev = (tmp_path / "validate.py").read_text()
    assert "amp" not in ev.replace("torch.autocast", "") and "GradScaler" not in ev
    assert 'with torch.autocast("cuda", dtype=torch.float16):\n        print(validate(' in ev
    utils = (tmp_path / "utils.py").read_text()
    assert "def load_checkpoint(path, model, optimizer, scheduler, *, scaler=None):" in utils
    assert "    if scaler is not None and 'amp' in ck:\n        scaler.load_state_dict(" in utils
    assert "from apex" not in utils and "amp = None" not in utils
    assert "def main(args):" in ev and "    load_checkpoint(args.resume, model, optimizer, scheduler)\n" in ev
    main = (tmp_path / "main.py").read_text()
    assert "load_checkpoint(args.resume, model, optimizer, scheduler, scaler=scaler)" in main
    for name, text in (("validate.py", ev), ("utils.py", utils), ("main.py", main)):
        compile(text, name, "exec")


def test_an_optimizer_handed_to_a_function_that_steps_it_still_trains(tmp_path):
    ev = EVAL.replace("def train_one_epoch(model, optimizer, loader):\n    pass\n",
                      "def train_one_epoch(model, optimizer, loader):\n    optimizer.step()\n").replace(
        "    print(validate(", "    train_one_epoch(model, optimizer, [])\n    print(validate(")
    write(tmp_path, {"utils.py": UTILS, "sched.py": SCHED, "main.py": TRAIN, "validate.py": ev})
    out = run(tmp_path)
    assert "never used with amp.scale_loss" in out.output


def test_an_evaluation_function_nothing_calls_is_left_as_before(tmp_path):
    ev = EVAL[:EVAL.index("\n\nif __name__")] + "\n"
    write(tmp_path, {"utils.py": UTILS, "sched.py": SCHED, "main.py": TRAIN, "validate.py": ev})
    out = run(tmp_path)
    assert "never used with amp.scale_loss" in out.output
    assert "def main(args, *, scaler)" not in out.output


def test_an_optimizer_kept_by_an_object_still_trains(tmp_path):
    # `WarmupTrainer(optimizer)` keeps it: a method may step it; only a schedule's constructor is trusted
    trainer = "class WarmupTrainer:\n    def __init__(self, optimizer):\n        self.optimizer = optimizer\n"
    ev = EVAL.replace("from utils import load_checkpoint\n", "from utils import load_checkpoint\nfrom trainer import WarmupTrainer\n")
    ev = ev.replace("    print(validate(", "    WarmupTrainer(optimizer)\n    print(validate(")
    write(tmp_path, {"utils.py": UTILS, "sched.py": SCHED, "main.py": TRAIN, "validate.py": ev, "trainer.py": trainer})
    out = run(tmp_path)
    assert "never used with amp.scale_loss" in out.output
