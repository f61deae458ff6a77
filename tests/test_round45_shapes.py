"""Forty-fifth round: what the public code of this round showed.

1. A loader for sampling (``getModel(path, fp16)`` in a generation service) that sets apex up
   with an optimizer made only for it (``optimizer = AdamW(model.parameters(), lr=0.1)``; nothing
   trains) and returns the model with its settings, not the optimizer: the seed moves to the
   callers, as for a setup that returns both, and the caller's forward passes run under autocast;
   the optimizer goes with the initialize.  The opt level set as a local constant just before
   (``fp16_opt_level = 'O1'``) is that literal, in the callers' terms too.
2. A setup whose inference path initializes a teacher beside the model
   (``if optimizer is None: if teacher is None: ... else: model, teacher =
   amp.initialize([model, teacher], optimizer)``) where no caller takes that branch: the
   training callers pass an optimizer, the evaluation callers pass none and no teacher (the
   parameter's default, None).  That initialize goes with the others; before, it stopped the
   whole project ("nothing uses the model after amp.initialize").
3. An evaluation whose forward is the whole body of a ``with torch.no_grad():`` and whose loss is
   computed right after that block (``loss = self.criterion(output, target)``, an architecture
   search trainer): autocast joined the ``with`` and left the loss outside, in float16 on the
   half-precision output, where apex O1 ran it in float32.  The region takes the loss too.
4. A worker that picks its training function by name (``globals().get("train_" +
   args.target)(args, gpu_id, rank, loader, model, optimizer, scheduler)``, the pre-training
   trainer of UER-py's older releases and the projects built on it), each ``train_*`` scaling the
   loss through ``args.amp``: that call is a call of each module-level function it may pick (the
   name's prefix or suffix, and parameters that take its arguments: ``train_and_validate(args)``
   is not one), so the scaler goes to all of them, passed once; where one of them does not train
   with the optimizer, the migration refuses with the line of the call.
5. A loader that initializes apex for inference only on CUDA (``if fp16 and 'cuda' in device:``,
   ``device`` a local the loader picks): moved to the callers, that test of the device, which
   they cannot see, says nothing to ``autocast("cuda")`` (it leaves the CPU's operations alone)
   and goes; the caller's region is enabled by ``fp16`` alone.
6. apex's op lists edited at import (``amp.lists.functional_overrides.FP32_FUNCS.remove('softmax')``,
   ``...FP16_FUNCS.append('softmax')``: NVIDIA's Tacotron 2 training and inference scripts and their
   copies): softmax in float16 is ``register_half_function(torch.nn.functional, 'softmax')``, the
   module-level patch with the ``_half_function`` helper, after it; a function autocast already
   runs in that dtype needs nothing; a removal alone refuses.  The lists act with the module's
   ``amp.initialize``: refused with it, unsafe with it.
"""
import textwrap

from test_round17_shapes import migrated, run, write

LOADER = textwrap.dedent('''\
    import torch


    def load(path, fp16=False):
        config = {"length": 4}
        model = torch.nn.Linear(4, 4)
        model.load_state_dict(torch.load(path))
        model.cuda()
        model.eval()
        if fp16:
            optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
            from apex import amp
            fp16_opt_level = 'O1'
            model, optimizer = amp.initialize(model, optimizer, opt_level=fp16_opt_level)
        return model, config
''')

SAMPLE = textwrap.dedent('''\
    import torch

    from loader import load


    def main(path, fp16):
        model, config = load(path, fp16=fp16)
        for _ in range(config["length"]):
            print(model(torch.ones(1, 4, device="cuda")))
''')


def test_loader_with_an_optimizer_for_apex_alone_moves_to_its_caller(tmp_path):
    loader = migrated(tmp_path, {"loader.py": LOADER, "sample.py": SAMPLE}, "loader.py")
    sample = (tmp_path / "sample.py").read_text()
    # the optimizer, the import, the constant and the initialize all go: nothing of apex is left
    assert "if fp16:" not in loader and "optimizer" not in loader and "apex" not in loader
    assert "    model.eval()\n    return model, config\n" in loader
    # the level was a literal: no `'O1' != 'O0'` in the caller
    assert 'with torch.autocast("cuda", dtype=torch.float16, enabled=bool(fp16)):\n' \
           "            print(model(" in sample
    compile(sample, "sample.py", "exec")
    again = run(tmp_path)
    assert again.exit_code == 0 and "Would rewrite 0 files" in again.output


def test_loader_whose_optimizer_is_read_afterwards_is_not_moved(tmp_path):
    # the optimizer is handed on (printed): it was not made for apex alone; the seed stays refused
    src = LOADER.replace("    return model,", "    print(optimizer)\n    return model,")
    write(tmp_path, {"loader.py": src, "sample.py": SAMPLE})
    out = run(tmp_path)
    assert "loader.py: not rewritten" in out.output
    assert "is never used with amp.scale_loss" in out.output


def test_constant_level_before_a_local_seed_is_read_as_the_literal(tmp_path):
    src = textwrap.dedent('''\
        import torch
        from apex import amp


        def main(fp16):
            model = torch.nn.Linear(4, 4).cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            if fp16:
                level = "O2"
                model, opt = amp.initialize(model, opt, opt_level=level)
            for _ in range(3):
                loss = model(torch.ones(2, 4, device="cuda")).sum()
                if fp16:
                    with amp.scale_loss(loss, opt) as scaled:
                        scaled.backward()
                else:
                    loss.backward()
                opt.step()
                opt.zero_grad()
    ''')
    out = migrated(tmp_path, {"t.py": src}, "t.py")
    assert 'scaler = torch.amp.GradScaler("cuda")\n' in out and "level" not in out
    assert "scaler.scale(loss).backward()" in out


def test_constant_level_reassigned_or_a_parameter_is_not_a_literal(tmp_path):
    # bound twice (a default, then under a condition): not a constant; the scaler reads the name
    src = textwrap.dedent('''\
        import torch
        from apex import amp


        def main(fp16, fast):
            model = torch.nn.Linear(4, 4).cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            level = "O1"
            if fast:
                level = "O0"
            model, opt = amp.initialize(model, opt, opt_level=level)
            loss = model(torch.ones(2, 4, device="cuda")).sum()
            with amp.scale_loss(loss, opt) as scaled:
                scaled.backward()
            opt.step()
    ''')
    out = migrated(tmp_path, {"t.py": src}, "t.py")
    assert 'enabled=level != "O0"' in out


SETUP = textwrap.dedent('''\
    import torch
    from apex import amp


    def setup(model, optimizer, fp16=False, level="O1", teacher=None):
        model.cuda()
        if fp16:
            if optimizer is None:
                if teacher is None:
                    model = amp.initialize(model, optimizer, opt_level=level)
                else:
                    model, teacher = amp.initialize([model, teacher], optimizer, opt_level=level)
            else:
                model, optimizer = amp.initialize(model, optimizer, opt_level=level)
        return model, optimizer
''')

TRAIN = textwrap.dedent('''\
    import torch

    from setup import setup


    def main(fp16):
        model = torch.nn.Linear(4, 2)
        teacher = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = setup(model, optimizer, fp16, teacher=teacher)
        for _ in range(3):
            x = torch.ones(8, 4, device="cuda")
            with torch.no_grad():
                target = teacher(x)
            loss = torch.nn.functional.mse_loss(model(x), target)
            if fp16:
                from apex import amp
                with amp.scale_loss(loss, optimizer) as scaled:
                    scaled.backward()
            else:
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
''')

EVALUATE = textwrap.dedent('''\
    import torch

    from setup import setup


    def main(fp16):
        model = torch.nn.Linear(4, 2)
        model, _ = setup(model, None, fp16)
        print(model(torch.ones(8, 4, device="cuda")).dtype)
''')


def test_teacher_branch_no_caller_takes_goes_with_the_setup(tmp_path):
    setup = migrated(tmp_path, {"setup.py": SETUP, "train.py": TRAIN, "evaluate.py": EVALUATE}, "setup.py")
    train = (tmp_path / "train.py").read_text()
    evaluate = (tmp_path / "evaluate.py").read_text()
    assert "amp" not in setup and "return model, optimizer" in setup
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=bool(fp16))' in train
    assert "scaler.scale(loss).backward()" in train
    assert 'with torch.autocast("cuda", dtype=torch.float16, enabled=bool(fp16)):\n        print(model(' in evaluate


def test_teacher_branch_a_caller_takes_stays_refused(tmp_path):
    # an evaluation that hands a teacher in takes the branch: the teacher's initialize is not
    # returned to it, so that setup stays as it is, with its reason
    ev = EVALUATE.replace("setup(model, None, fp16)", "setup(model, None, fp16, teacher=torch.nn.Linear(4, 2))")
    write(tmp_path, {"setup.py": SETUP, "train.py": TRAIN, "evaluate.py": ev})
    out = run(tmp_path)
    assert "setup.py: not rewritten" in out.output and "train.py: not rewritten" in out.output


EVALUATION = textwrap.dedent('''\
    import torch
    import torch.nn.functional as F
    from apex import amp


    def main(loader, val):
        model = torch.nn.Linear(4, 3).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt = amp.initialize(model, opt, opt_level="O1")
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            with amp.scale_loss(loss, opt) as scaled:
                scaled.backward()
            opt.step()
            opt.zero_grad()
        model.eval()
        total = 0.0
        for x, y in val:
            with torch.no_grad():
                out = model(x)
            loss = F.cross_entropy(out, y)
            total += loss.item()
        return total
''')


def test_loss_after_a_no_grad_evaluation_joins_its_region(tmp_path):
    out = migrated(tmp_path, {"t.py": EVALUATION}, "t.py")
    assert textwrap.indent(textwrap.dedent('''\
        with torch.autocast("cuda", dtype=torch.float16):
            with torch.no_grad():
                out = model(x)
            loss = F.cross_entropy(out, y)
        total += loss.item()
    '''), "        ") in out


def test_no_grad_evaluation_without_a_loss_after_it_joins_the_with(tmp_path):
    src = EVALUATION.replace("        loss = F.cross_entropy(out, y)\n        total += loss.item()\n",
                             "        total += out.sum().item()\n")
    out = migrated(tmp_path, {"t.py": src}, "t.py")
    assert 'with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):\n            out = model(x)\n' in out


def test_loader_that_also_evaluates_keeps_its_regions_in_place(tmp_path):
    # the function runs the model after the seed (an evaluation) and returns it with its results:
    # the seed stays where it is, with the evaluation under autocast there (a level the callers
    # cannot see does not matter then)
    src = textwrap.dedent('''\
        import torch
        from apex import amp


        def run(model, loader):
            return [model(x) for x in loader]


        def execute_test(cfg, loader):
            model = torch.nn.Linear(4, 4).cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            level = "O1" if cfg.fp16 else "O0"
            model, optimizer = amp.initialize(model, optimizer, opt_level=level)
            results = run(model, loader)
            return model, results


        def main(cfg, loader):
            _, results = execute_test(cfg, loader)
            print(len(results))
    ''')
    out = migrated(tmp_path, {"t.py": src}, "t.py")
    assert 'with torch.autocast("cuda", dtype=torch.float16, enabled=level != "O0"):\n' \
           "        results = run(model, loader)\n" in out
    assert "def main(cfg, loader):\n    _, results = execute_test(cfg, loader)\n" in out


DISPATCH = textwrap.dedent('''\
    import torch


    def train_and_validate(args):
        model = torch.nn.Linear(4, 4).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if args.fp16:
            from apex import amp
            model, optimizer = amp.initialize(model, optimizer, opt_level=args.fp16_opt_level)
            args.amp = amp
        globals().get("train_" + args.target)(args, model, optimizer)


    def train_mlm(args, model, optimizer):
        for _ in range(3):
            loss = model(torch.ones(2, 4, device="cuda")).sum()
            if args.fp16:
                with args.amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()


    def train_cls(args, model, optimizer):
        for _ in range(3):
            loss = model(torch.ones(2, 4, device="cuda")).mean()
            if args.fp16:
                with args.amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
''')


def test_training_function_picked_by_name_from_globals_gets_the_scaler(tmp_path):
    out = migrated(tmp_path, {"trainer.py": DISPATCH}, "trainer.py")
    assert out.count("scaler=scaler") == 1
    assert 'globals().get("train_" + args.target)(args, model, optimizer, scaler=scaler)' in out
    assert "def train_mlm(args, model, optimizer, *, scaler):" in out
    assert "def train_cls(args, model, optimizer, *, scaler):" in out
    assert "def train_and_validate(args):" in out and out.count("scaler.scale(loss).backward()") == 2
    assert "apex" not in out and "args.amp" not in out
    compile(out, "trainer.py", "exec")


def test_function_picked_by_name_that_does_not_train_refuses(tmp_path):
    src = DISPATCH + textwrap.dedent('''\


        def train_probe(args, model, optimizer):
            print(model(torch.ones(2, 4, device="cuda")))
    ''')
    write(tmp_path, {"trainer.py": src})
    out = run(tmp_path)
    assert "trainer.py: not rewritten" in out.output
    assert "picks its function by name from globals(): `train_probe`" in out.output


def test_function_picked_from_globals_by_an_f_string_suffix(tmp_path):
    src = DISPATCH.replace('globals().get("train_" + args.target)', 'globals()[f"{args.target}_train"]')
    src = src.replace("def train_mlm(", "def mlm_train(").replace("def train_cls(", "def cls_train(")
    out = migrated(tmp_path, {"trainer.py": src}, "trainer.py")
    assert 'globals()[f"{args.target}_train"](args, model, optimizer, scaler=scaler)' in out
    assert "def mlm_train(args, model, optimizer, *, scaler):" in out


DEVICE_LOADER = textwrap.dedent('''\
    import torch
    from apex import amp


    def load_model(path, use_gpu, fp16=True):
        if use_gpu:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        else:
            device = "cpu"
        model = torch.nn.Linear(4, 2).to(device)
        model.load_state_dict(torch.load(path))
        if fp16 and "cuda" in device:
            model = amp.initialize(model, opt_level="O2")
        return model


    def main(args):
        model = load_model(args.path, args.use_gpu, args.fp16)
        print(model(torch.ones(3, 4)).argmax(1))
''')


def test_device_test_the_callers_cannot_see_goes_from_the_moved_condition(tmp_path):
    out = migrated(tmp_path, {"m.py": DEVICE_LOADER}, "m.py")
    assert 'if fp16 and "cuda" in device:' not in out and "amp" not in out.replace("torch.amp", "")
    assert 'with torch.autocast("cuda", dtype=torch.float16, enabled=bool(args.fp16)):\n' \
           "        print(model(" in out


def test_device_test_under_or_still_refuses(tmp_path):
    # `fp16 or "cuda" in device` is not a conjunct: nothing can drop it
    src = DEVICE_LOADER.replace('if fp16 and "cuda" in device:', 'if fp16 or "cuda" in device:')
    write(tmp_path, {"m.py": src})
    out = run(tmp_path)
    assert "depends on `device`, which its callers cannot see" in out.output


LISTS = textwrap.dedent('''\
    import torch
    from apex import amp
    amp.lists.functional_overrides.FP32_FUNCS.remove('softmax')
    amp.lists.functional_overrides.FP16_FUNCS.append('softmax')


    def main(loader):
        model = torch.nn.Linear(4, 3).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt = amp.initialize(model, opt, opt_level="O1")
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(torch.nn.functional.softmax(model(x), -1), y)
            with amp.scale_loss(loss, opt) as scaled:
                scaled.backward()
            opt.step()
            opt.zero_grad()
''')


def test_op_lists_edited_at_import_become_the_patch_apex_made(tmp_path):
    out = migrated(tmp_path, {"t.py": LISTS}, "t.py")
    assert "amp.lists" not in out and "from apex" not in out
    helper = out.index("def _half_function(fn):")
    patch = out.index("torch.nn.functional.softmax = _half_function(torch.nn.functional.softmax)\n")
    assert helper < patch < out.index("def main(loader):")
    assert "scaler.scale(loss).backward()" in out
    compile(out, "t.py", "exec")


def test_op_list_autocast_already_keeps_needs_nothing(tmp_path):
    src = LISTS.replace("amp.lists.functional_overrides.FP32_FUNCS.remove('softmax')\n", "").replace(
        "FP16_FUNCS.append('softmax')", "FP16_FUNCS.append('linear')")
    out = migrated(tmp_path, {"t.py": src}, "t.py")
    assert "amp.lists" not in out and "_half_function" not in out and "functools" not in out


def test_op_list_removal_alone_refuses(tmp_path):
    src = LISTS.replace("amp.lists.functional_overrides.FP16_FUNCS.append('softmax')\n", "")
    write(tmp_path, {"t.py": src})
    out = run(tmp_path)
    assert "`softmax` is only removed from apex's list" in out.output
    assert "t.py: not rewritten" in out.output


def test_op_lists_follow_the_modules_initialize(tmp_path):
    # the initialize is refused (an opt level apex never had): the lists stay with it
    src = LISTS.replace('opt_level="O1")', 'opt_level="O4")')
    write(tmp_path, {"t.py": src})
    out = run(tmp_path)
    assert "apex's op lists act with the module's amp.initialize, which is not rewritten" in out.output
    assert "t.py: not rewritten" in out.output


def test_half_function_with_bfloat16_casts_to_bfloat16(tmp_path):
    # apex's "half" is the reduced precision; with --dtype bfloat16 that is bfloat16, not float16
    out = migrated(tmp_path, {"t.py": LISTS}, "t.py", "--dtype", "bfloat16")
    assert "on bfloat16 inputs" in out and "v.bfloat16()" in out and "v.half()" not in out
    assert "torch.nn.functional.softmax = _half_function(torch.nn.functional.softmax)" in out


def test_a_package_import_read_only_by_the_optimizer_that_went(tmp_path):
    # `import optimlib` read only by the optimizer made for apex goes where the module imports the
    # package again (`from optimlib import Net`): importing it once more did nothing; alone, it stays
    # (importing a third-party package may do something)
    src = LOADER.replace("import torch\n", "import torch\nimport optimlib\nfrom optimlib import Net\n", 1).replace(
        "torch.optim.AdamW(", "optimlib.AdamW(").replace("torch.nn.Linear(4, 4)", "Net()")
    out = migrated(tmp_path, {"loader.py": src, "sample.py": SAMPLE}, "loader.py")
    assert "import optimlib\n" not in out and "from optimlib import Net\n" in out
    alone = src.replace("from optimlib import Net\n", "").replace("Net()", "torch.nn.Linear(4, 4)")
    out = migrated(tmp_path / "alone", {"loader.py": alone, "sample.py": SAMPLE}, "loader.py")
    assert "import optimlib\n" in out and "AdamW" not in out
