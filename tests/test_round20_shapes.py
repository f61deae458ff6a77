"""Twentieth round: apex's amp kept on an object that functions hand around (``args.amp = amp``,
read as ``args.amp.scale_loss``), a training step shared through ``from common import *``, a
trainer picked from a dict of classes by name, and a second backward before the step.  The
runnable golden is fixtures/projects/args_amp."""
import textwrap

from test_round17_shapes import run, write

COMMON = textwrap.dedent('''\
    import torch


    def train_model(args, model, optimizer, x):
        optimizer.zero_grad()
        loss = model(x).sum()
        if args.fp16:
            with args.amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()
        return loss
''')

SCRIPT = textwrap.dedent('''\
    import torch

    from common import *


    def main(args):
        model = torch.nn.Linear(4, 4).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if args.fp16:
            from apex import amp
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            args.amp = amp
        for x in [torch.randn(2, 4, device="cuda")]:
            train_model(args, model, optimizer, x)
''')


def test_amp_kept_on_args_and_read_by_a_step_a_star_import_shares(tmp_path):
    write(tmp_path, {"common.py": COMMON, "script.py": SCRIPT})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    common = (tmp_path / "common.py").read_text()
    script = (tmp_path / "script.py").read_text()
    assert "def train_model(args, model, optimizer, x, *, scaler):" in common
    assert "scaler.scale(loss).backward()" in common and "scaler.step(optimizer)" in common
    assert "args.amp" not in common and "args.amp" not in script and "apex" not in script
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=bool(args.fp16))' in script
    assert "train_model(args, model, optimizer, x, scaler=scaler)" in script
    assert "would be rewritten" not in run(tmp_path).output


def test_an_args_attribute_that_is_a_flag_is_not_apex(tmp_path):
    """`args.amp` read as a flag (`if args.amp:`) is a command-line option, not apex's amp: the
    module's `args.amp.scale_loss` stays unrecognised and the project is not half migrated."""
    common = COMMON.replace("if args.fp16:", "if args.amp and args.fp16:")
    write(tmp_path, {"common.py": common, "script.py": SCRIPT})
    run(tmp_path, "--write")
    assert (tmp_path / "common.py").read_text() == common
    assert (tmp_path / "script.py").read_text() == SCRIPT


def test_a_def_of_its_own_shadows_the_star_imported_one(tmp_path):
    own = SCRIPT.replace("def main(args):", textwrap.dedent('''\
        def train_model(args, model, optimizer, x):
            return common_step(args, model, optimizer, x)


        def main(args):''').rstrip("\n").replace("\n", "\n"), 1)
    own = own.replace("from common import *", "from common import *\nfrom common import train_model as common_step")
    write(tmp_path, {"common.py": COMMON, "script.py": own})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    script = (tmp_path / "script.py").read_text()
    # the script's own train_model hands the scaler on to the shared one
    assert "def train_model(args, model, optimizer, x, *, scaler):" in script
    assert "common_step(args, model, optimizer, x, scaler=scaler)" in script
    assert "train_model(args, model, optimizer, x, scaler=scaler)" in script


TRAINERS = textwrap.dedent('''\
    import torch


    class Trainer:
        def train(self, args, model, optimizer, x):
            loss = self.forward(model, x)
            if args.fp16:
                with args.amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()


    class A(Trainer):
        def forward(self, model, x):
            return model(x).sum()


    class B(Trainer):
        def forward(self, model, x):
            return model(x).mean()


    TABLE = {"a": A, "b": B}


    def worker(args, kind):
        model = torch.nn.Linear(4, 4).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if args.fp16:
            from apex import amp
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            args.amp = amp
        trainer = TABLE[kind]()
        trainer.train(args, model, optimizer, torch.randn(2, 4, device="cuda"))
''')


def test_a_trainer_picked_from_a_dict_gets_the_scaler_through_the_shared_method(tmp_path):
    write(tmp_path, {"trainers.py": TRAINERS})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "trainers.py").read_text()
    assert "def train(self, args, model, optimizer, x, *, scaler):" in text
    assert 'trainer.train( args, model, optimizer, torch.randn(2, 4, device="cuda"), scaler=scaler )' in \
        " ".join(text.split())
    assert "apex" not in text


def test_a_dict_of_trainers_that_differ_in_the_method_is_not_followed(tmp_path):
    text = TRAINERS.replace("    def forward(self, model, x):\n        return model(x).mean()\n",
                            "    def forward(self, model, x):\n        return model(x).mean()\n\n"
                            "    def train(self, args, model, optimizer, x):\n        optimizer.step()\n")
    write(tmp_path, {"trainers.py": text})
    run(tmp_path, "--write")
    assert "trainer.train(args, model, optimizer, torch.randn(2, 4, device=\"cuda\"))" in \
        (tmp_path / "trainers.py").read_text()


SECOND = textwrap.dedent('''\
    import torch
    from apex import amp


    def main():
        model = torch.nn.Linear(4, 4).cuda()
        critic = torch.nn.Linear(4, 1).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt = amp.initialize(model, opt, opt_level="O1")
        for x in [torch.randn(2, 4, device="cuda")]:
            loss = model(x).sum()
            with amp.scale_loss(loss, opt) as scaled:
                scaled.backward()
            adv = OTHER.sum()
            adv.backward()
            opt.step()
''')


def test_a_second_backward_of_the_same_model_before_the_step_is_scaled_too(tmp_path):
    """apex unscaled the first backward's gradients when its block exited; GradScaler unscales
    every gradient at the step: the second backward's loss is scaled too."""
    write(tmp_path, {"train.py": SECOND.replace("OTHER", "model(x * 2)")})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "scaler.scale(loss).backward()" in text and "scaler.scale(adv).backward()" in text
    assert "scaler.step(opt)" in text
    # its forward ran in float16 under apex's O1 too: it gets autocast
    assert 'with torch.autocast("cuda", dtype=torch.float16):\n            adv = model(x * 2).sum()' in text


def test_a_second_backward_of_another_model_before_the_step_refuses(tmp_path):
    src = SECOND.replace("OTHER", "critic(x)")
    write(tmp_path, {"train.py": src})
    out = run(tmp_path, "--write")
    assert "`adv.backward()` at line 15 is another backward before the step" in out.output, out.output
    assert (tmp_path / "train.py").read_text() == src


def test_with_bfloat16_the_amp_kept_on_args_goes_and_the_switch_is_carried(tmp_path):
    write(tmp_path, {"common.py": COMMON, "script.py": SCRIPT})
    out = run(tmp_path, "--write", "-q", "--dtype", "bfloat16")
    assert out.exit_code == 0, out.output
    common = (tmp_path / "common.py").read_text()
    script = (tmp_path / "script.py").read_text()
    assert "def train_model(args, model, optimizer, x, *, use_amp):" in common
    assert 'with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp):' in common
    assert "loss.backward()" in common and "optimizer.step()" in common and "args.amp" not in common
    assert "use_amp = bool(args.fp16)" in script and "args.amp" not in script


def test_with_bfloat16_a_loss_helper_whose_forward_is_in_the_callers_takes_no_switch(tmp_path):
    """The helper gets the loss terms; the callers run the forward under autocast: nothing in the
    helper reads the switch, so it keeps its signature (no unused `use_amp=`), and the callers'
    autocast says the setup's condition (no flag made for nothing)."""
    from test_round19_shapes import BACKWARD, INFER, MODELS, TRAIN

    write(tmp_path, {"models.py": MODELS, "backward.py": BACKWARD, "train.py": TRAIN, "infer.py": INFER})
    out = run(tmp_path, "--write", "-q", "--dtype", "bfloat16")
    assert out.exit_code == 0, out.output
    backward = (tmp_path / "backward.py").read_text()
    train = (tmp_path / "train.py").read_text()
    assert "def loss_backward(opt, losses, optimizer):" in backward
    assert "loss.backward()" in backward and "autocast" not in backward and "use_amp" not in backward
    assert 'with torch.autocast("cuda", dtype=torch.bfloat16, enabled=opt.amp != "O0"):' in train
    assert "loss_backward(opt, losses, optimizer)" in train and "use_amp" not in train


def test_an_amp_named_attribute_read_only_for_its_state_is_not_apex(tmp_path):
    """`trainer.amp_scaler.state_dict()` in a module that never sets it could be a GradScaler:
    only a `scale_loss` read (no GradScaler has one) makes such an attribute apex's amp."""
    from ampfix.cli import main
    from click.testing import CliRunner

    src = "def save(trainer, ckpt):\n    ckpt['scaler'] = trainer.amp_scaler.state_dict()\n    return ckpt\n"
    write(tmp_path, {"ckpt.py": src, "other.py": "import apex\n"})
    out = CliRunner().invoke(main, ["check", "--select", "AMP1", str(tmp_path / "ckpt.py")])
    assert "AMP101" not in out.output, out.output
    write(tmp_path, {"step.py": "def step(args, loss, opt):\n    with args.amp.scale_loss(loss, opt) as s:\n"
                                "        s.backward()\n"})
    out = CliRunner().invoke(main, ["check", "--select", "AMP1", str(tmp_path / "step.py")])
    assert "AMP101" in out.output and "apex.amp.scale_loss" in out.output, out.output


def test_a_scripts_own_folder_comes_first_for_its_imports(tmp_path):
    """`from model import Net` beside a `model.py` is that file, even where a `model` package of
    the project is the only `model` read so far (the DDP planner joined a script with an unrelated
    apex subclass that way, and a second run then rewrote what the first had kept)."""
    from ampfix.model.settings import Settings
    from ampfix.model.source import Source
    from ampfix.project.graph import Project

    write(tmp_path, {"tools/run.py": "from model import Net\n", "tools/model.py": "class Net: pass\n",
                     "pkg/model/__init__.py": "import apex\n"})
    files = [tmp_path / "tools" / "run.py", tmp_path / "pkg" / "model" / "__init__.py"]
    project = Project({str(f): Source(f.read_bytes(), str(f)) for f in files}, Settings(), root=tmp_path,
                      given=[str(f) for f in files])
    run_py = project.modules[str(files[0])]
    assert project.loaded_named("model") is project.modules[str(files[1])]
    beside, found = project.module_beside(run_py, "model")
    assert beside and found is None  # tools/model.py: not read, and not the package
    assert project.module_beside(run_py, "nothing_here") == (False, None)


def test_initialize_targets_the_function_never_reads_again_are_not_reassigned(tmp_path):
    """YOLOX: `model, optimizer = amp.initialize(model, self.optimizer)` where the local
    `optimizer` is never read (apex patched self.optimizer in place): nothing is left of it."""
    src = textwrap.dedent('''\
        import torch
        from apex import amp


        class Trainer:
            def setup(self, model, fp16):
                self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                if fp16:
                    model, optimizer = amp.initialize(model, self.optimizer, opt_level="O1")
                self.model = model

            def step(self, x):
                loss = self.model(x).sum()
                with amp.scale_loss(loss, self.optimizer) as scaled:
                    scaled.backward()
                self.optimizer.step()
    ''')
    write(tmp_path, {"trainer.py": src})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "trainer.py").read_text()
    assert "optimizer = self.optimizer" not in text and "if fp16:" not in text
    assert "self.scaler = torch.amp.GradScaler(\"cuda\", enabled=bool(fp16))" in text


OBJECTIVES = textwrap.dedent('''\
    import torch


    def fit(models, optimizers, loader, fp16):
        if fp16:
            from apex import amp

            for i in range(len(models)):
                model, optimizer = amp.initialize(models[i], optimizers[i], opt_level="O1")
                models[i] = model
                optimizers[i] = optimizer
        for x in loader:
            for i in range(len(models)):
                model, optimizer = models[i], optimizers[i]
                loss = model(x).sum()
                if fp16:
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                optimizer.step()
''')


def test_a_loop_that_only_initialized_apex_per_objective_goes(tmp_path):
    """sentence-transformers: once initialize goes, `models[i] = model` only writes back what was
    read: the write-backs go, the loop that is left doing nothing goes, and the `if` with it."""
    write(tmp_path, {"fit.py": OBJECTIVES})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "fit.py").read_text()
    assert "models[i] = model" not in text and "optimizers[i] = optimizer" not in text
    assert text.count("for i in range(len(models)):") == 1 and "pass" not in text
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=bool(fp16))' in text
    assert "scaler.scale(loss).backward()" in text and "scaler.step(optimizer)" in text


def test_a_loop_whose_variable_is_read_after_it_stays(tmp_path):
    src = OBJECTIVES.replace("    for x in loader:", "    print(i)\n    for x in loader:", 1)
    assert src != OBJECTIVES
    write(tmp_path, {"fit.py": src})
    run(tmp_path, "--write", "-q")
    text = (tmp_path / "fit.py").read_text()
    # `i` keeps the loop's last value for the print: the loop stays (with nothing but `pass`)
    assert text.count("for i in range(len(models)):") == 2


def test_with_bfloat16_a_closure_reads_the_setups_condition_and_no_flag_is_made(tmp_path):
    """ignite's benchmark: the step is a closure of the function that initialized apex; its
    autocast says the setup's condition, so no `use_amp = ...` is made for nothing."""
    src = textwrap.dedent('''\
        import torch
        from apex import amp


        def run(model, optimizer, loader, opt):
            model, optimizer = amp.initialize(model, optimizer, opt_level=opt)

            def train_step(batch):
                loss = model(batch).sum()
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()

            for batch in loader:
                train_step(batch)
    ''')
    write(tmp_path, {"bench.py": src})
    out = run(tmp_path, "--write", "-q", "--dtype", "bfloat16")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "bench.py").read_text()
    assert "use_amp" not in text
    assert 'with torch.autocast("cuda", dtype=torch.bfloat16, enabled=opt != "O0"):' in text
