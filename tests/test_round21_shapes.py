"""Twenty-first round: ``amp.initialize(model, opt, **amp_args)`` with the options built in a dict
right before it; a scaled backward taken for an input's gradient (an adversarial attack) with no
step of its own; apex's amp that is None where apex is not installed (``amp is not None`` asks
whether apex is installed); AMP set up in a base class's method for a grandchild's training step;
a use that only some seeds reach.  The runnable golden is fixtures/projects/attack_trainer."""
import textwrap

from click.testing import CliRunner

from ampfix.cli import main
from test_round17_shapes import run, write

SPREAD = textwrap.dedent('''\
    import torch
    from apex import amp


    def main(args, model, opt, loader):
        amp_args = dict(opt_level=args.opt_level, loss_scale=args.loss_scale, verbosity=False)
        if args.opt_level == "O2":
            amp_args["master_weights"] = args.master_weights
        model, opt = amp.initialize(model, opt, **amp_args)
        for x in loader:
            loss = model(x).sum()
            opt.zero_grad()
            with amp.scale_loss(loss, opt) as scaled_loss:
                scaled_loss.backward()
            opt.step()
''')


def test_initialize_options_from_a_dict_built_right_before(tmp_path):
    write(tmp_path, {"train.py": SPREAD})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    # the dict and its conditional store go with the initialize; the options are read from it
    assert "amp_args" not in text and "apex" not in text
    assert 'enabled=args.opt_level != "O0"' in text
    assert "float(args.loss_scale)" in text
    assert "scaler.scale(loss).backward()" in text and "scaler.step(opt)" in text
    assert "would be rewritten" not in run(tmp_path).output


def test_a_dict_key_that_matters_set_under_a_condition_is_refused(tmp_path):
    src = SPREAD.replace('amp_args["master_weights"] = args.master_weights', 'amp_args["opt_level"] = "O1"')
    write(tmp_path, {"train.py": src})
    out = run(tmp_path)
    assert "takes 'opt_level' from a dict that sets it only under a condition" in out.output
    assert "would be rewritten: apex" not in out.output


def test_a_dict_read_again_is_not_spread(tmp_path):
    src = SPREAD.replace("    for x in loader:", "    print(amp_args)\n    for x in loader:")
    assert src != SPREAD
    write(tmp_path, {"train.py": src})
    out = run(tmp_path)
    assert "has arguments that cannot be read" in out.output


ATTACK = textwrap.dedent('''\
    import torch
    import torch.nn.functional as F
    from apex import amp


    def attack(model, x, y, opt=None):
        delta = torch.zeros_like(x)
        delta.requires_grad = True
        loss = F.cross_entropy(model(x + delta), y)
        if opt is not None:
            with amp.scale_loss(loss, opt) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        return delta.grad.detach().sign()


    def main(model, opt, loader):
        model, opt = amp.initialize(model, opt, opt_level="O1")
        for x, y in loader:
            delta = torch.zeros_like(x)
            delta.requires_grad = True
            loss = F.cross_entropy(model(x + delta), y)
            with amp.scale_loss(loss, opt) as scaled_loss:
                scaled_loss.backward()
            grad = delta.grad.detach()
            x = x + 0.1 * grad.sign()
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            with amp.scale_loss(loss, opt) as scaled_loss:
                scaled_loss.backward()
            opt.step()
        attack(model, x, y, opt)
''')


def test_a_backward_for_an_inputs_gradient_needs_no_step(tmp_path):
    write(tmp_path, {"train.py": ATTACK})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text
    # the attack's backward is scaled, as apex's was (only the gradient's sign is used), and
    # nothing steps in the attack
    attack = text.split("def main")[0]
    assert "scaler.scale(loss).backward()" in attack and "scaler.step" not in attack
    # `opt is not None` says whether there is an optimizer, not whether AMP is on: it stays
    assert "if opt is not None:" in attack and "loss.backward()" in attack
    # no unscale_ after the first backward of the step: the second one's gradients would reach
    # the step scaled (AMP214)
    assert "unscale_" not in text
    assert text.count("scaler.scale(loss).backward()") == 3
    assert "AMP214" not in CliRunner().invoke(main, ["check", str(tmp_path)]).output


def test_a_parameter_gradient_read_between_two_backwards_of_one_step_is_refused(tmp_path):
    src = ATTACK.replace("        grad = delta.grad.detach()\n",
                         "        grad = delta.grad.detach()\n"
                         "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n")
    src = src.replace("        opt.zero_grad()\n", "")
    assert "clip_grad_norm_" in src and "zero_grad" not in src
    write(tmp_path, {"train.py": src})
    out = run(tmp_path)
    assert "gradients are read between the scaled backwards at lines" in out.output
    assert "would be rewritten: apex" not in out.output


BASE = textwrap.dedent('''\
    import torch

    try:
        from apex import amp
    except ImportError:
        amp = None


    class Base(object):
        def __init__(self, fp16=False):
            self.fp16 = fp16
            self.network = torch.nn.Linear(4, 2)
            self.optimizer = torch.optim.SGD(self.network.parameters(), lr=0.1)

        def setup(self):
            if self.fp16:
                if amp is not None:
                    self.network, self.optimizer = amp.initialize(self.network, self.optimizer, opt_level="O1")
                else:
                    raise RuntimeError("install apex")

        def step(self, x):
            self.optimizer.zero_grad()
            loss = self.network(x).sum()
            if not self.fp16 or amp is None:
                loss.backward()
            else:
                with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                    scaled_loss.backward()
            self.optimizer.step()
''')

CHILD = textwrap.dedent('''\
    import torch

    try:
        from apex import amp
        from apex.parallel import DistributedDataParallel as DDP
    except ImportError:
        amp = None
        DDP = None

    from base import Base


    class Middle(Base):
        pass


    class Child(Middle):
        def step(self, x):
            self.optimizer.zero_grad()
            loss = self.network(x).mean()
            if not self.fp16 or amp is None:
                loss.backward()
            else:
                with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                    scaled_loss.backward()
            self.optimizer.step()


    def wrap(model):
        return DDP
''')


def test_installed_or_none_amp_folds_and_a_grandchild_steps_with_the_base_scaler(tmp_path):
    write(tmp_path, {"base.py": BASE, "child.py": CHILD})
    out = run(tmp_path, "--write", "-q")
    # exit 1: apex's DDP class handed out as a value (`return DDP`) is left for a person
    assert out.exit_code == 1, out.output
    assert "AMP101" not in run(tmp_path).output
    base = (tmp_path / "base.py").read_text()
    child = (tmp_path / "child.py").read_text()
    assert "apex" not in base and "amp is" not in base and "install apex" not in base
    assert 'self.scaler = torch.amp.GradScaler("cuda", enabled=False)' in base
    assert 'self.scaler = torch.amp.GradScaler("cuda", enabled=bool(self.fp16))' in base
    # the grandchild's own step uses the scaler its ancestor keeps on self
    assert "self.scaler.scale(loss).backward()" in child and "self.scaler.step(self.optimizer)" in child
    # apex.parallel's import stays (it is still read); the `amp = None` beside it goes
    assert "amp = None" not in child and "DDP = None" in child
    assert "from apex.parallel import DistributedDataParallel as DDP" in child
    assert "would be rewritten: apex.amp" not in run(tmp_path).output


def _attack_project(tmp_path, evaluate_passes_opt):
    helper = textwrap.dedent('''\
        import torch
        from apex import amp


        def attack(model, x, opt=None):
            delta = torch.zeros_like(x)
            delta.requires_grad = True
            loss = model(x + delta).sum()
            if opt is not None:
                with amp.scale_loss(loss, opt) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            return delta.grad.sign()
    ''')
    train = textwrap.dedent('''\
        import torch
        from apex import amp

        from helper import attack


        def train(model, opt, xs):
            model, opt = amp.initialize(model, opt, opt_level="O1")
            for x in xs:
                x = x + attack(model, x, opt)
                opt.zero_grad()
                loss = model(x).sum()
                with amp.scale_loss(loss, opt) as scaled_loss:
                    scaled_loss.backward()
                opt.step()


        def evaluate(model, xs, opt):
            return [attack(model, x, OPT) for x in xs]


        if __name__ == "__main__":
            evaluate(torch.nn.Linear(4, 4), [torch.randn(2, 4)], None)
    ''').replace("OPT", "opt" if evaluate_passes_opt else "None")
    write(tmp_path, {"helper.py": helper, "train.py": train})


def test_callers_without_a_scaler_that_never_reach_the_scaled_backward(tmp_path):
    """`attack` is called with the optimizer by a trainer that initialized apex, and with none by
    an evaluation that nothing initializes: the scaled backward runs only under `opt is not None`,
    so the evaluation never reaches it; the scaler is an optional parameter, off where absent."""
    _attack_project(tmp_path, evaluate_passes_opt=False)
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    helper = (tmp_path / "helper.py").read_text()
    train = (tmp_path / "train.py").read_text()
    assert "def attack(model, x, opt=None, *, scaler=None):" in helper
    # a caller that passes no scaler gets a disabled one: float32, and no presence test anywhere
    assert 'if scaler is None:\n        scaler = torch.amp.GradScaler("cuda", enabled=False)' in helper
    assert "enabled=scaler.is_enabled()" in helper and "scaler is not None" not in helper
    assert "    if opt is not None:\n        scaler.scale(loss).backward()" in helper
    assert "attack(model, x, opt, scaler=scaler)" in train and "attack(model, x, None)" in train
    assert "apex" not in helper + train


def test_a_use_only_some_seeds_reach_refuses_them_with_it(tmp_path):
    """The evaluation hands `attack` an optimizer too, with no initialize before it: its group and
    the trainer's are refused together (migrating the trainer alone left `amp.scale_loss` in the
    attack with nothing to initialize apex)."""
    _attack_project(tmp_path, evaluate_passes_opt=True)
    out = run(tmp_path)
    assert "is also called from `evaluate`" in out.output, out.output
    assert "would be rewritten: apex" not in out.output
    run(tmp_path, "--write", "-q")
    assert "amp.initialize" in (tmp_path / "train.py").read_text()
    assert "amp.scale_loss" in (tmp_path / "helper.py").read_text()


def test_bfloat16_folds_the_installed_test_and_the_attack_backward(tmp_path):
    """With bfloat16 the `amp is not None` tests fold as with float16, and `if opt is not None:
    <scaled> else: loss.backward()` becomes one plain backward (both branches are the same)."""
    _attack_project(tmp_path, evaluate_passes_opt=False)
    write(tmp_path, {"base.py": BASE, "child.py": CHILD})
    out = run(tmp_path, "--write", "-q", "--dtype", "bfloat16")
    assert out.exit_code in (0, 1), out.output
    helper = (tmp_path / "helper.py").read_text()
    base = (tmp_path / "base.py").read_text()
    assert "if opt is not None" not in helper and helper.count("loss.backward()") == 1
    assert "GradScaler" not in helper + base and "apex" not in base and "amp is" not in base
    assert "dtype=torch.bfloat16" in base


def test_names_that_two_modules_re_export_from_each_other_do_not_recurse(tmp_path):
    """`from b import prep` in a, `from a import prep` in b (each re-exporting the other's): the
    resolution of a call of it in a forward region stops (it had recursed without end:
    facebookresearch/multihop_dense_retrieval, a RecursionError reported as a planner bug)."""
    a = "from b import prep\n"
    b = "from a import prep\n"
    train = textwrap.dedent('''\
        import torch
        from apex import amp

        from a import prep


        def main(model, opt, loader):
            model, opt = amp.initialize(model, opt, opt_level="O1")
            for x in loader:
                x = prep(x)
                loss = model(x).sum()
                opt.zero_grad()
                with amp.scale_loss(loss, opt) as scaled_loss:
                    scaled_loss.backward()
                opt.step()
    ''')
    write(tmp_path, {"a.py": a, "b.py": b, "train.py": train})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    assert "scaler.scale(loss).backward()" in (tmp_path / "train.py").read_text()


def test_a_subclass_overriding_the_setup_inherits_the_base_default(tmp_path):
    """nnUNet's `nnUNetTrainerV2_Mish` overrides `_maybe_init_amp` (O2) and has no __init__: its
    seed goes with the base's, and the base's __init__ makes the one disabled default (a class
    attribute beside it would be a second GradScaler nothing reads)."""
    o2 = textwrap.dedent('''\
        try:
            from apex import amp
        except ImportError:
            amp = None

        from base import Base


        class O2(Base):
            def setup(self):
                if self.fp16:
                    if amp is not None:
                        self.network, self.optimizer = amp.initialize(self.network, self.optimizer, opt_level="O2")
    ''')
    write(tmp_path, {"base.py": BASE, "o2.py": o2})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    base = (tmp_path / "base.py").read_text()
    sub = (tmp_path / "o2.py").read_text()
    assert base.count("GradScaler(") == 2 and 'GradScaler("cuda", enabled=False)' in base
    assert sub.count("GradScaler(") == 1 and "enabled=False" not in sub and "apex" not in sub


LOADER = textwrap.dedent('''\
    import torch

    try:
        from apex import amp
    except ImportError:
        amp = None


    class Model(torch.nn.Module):
        @classmethod
        def load(cls, path, opt_level=None):
            model = cls()
            if opt_level is not None:
                if amp is None:
                    print("apex is not installed: full precision")
                if amp is not None:
                    model = amp.initialize(model, opt_level=opt_level)
            RETURN
''')


def test_an_inference_model_that_is_returned_refuses_and_no_scaler_parameter_appears(tmp_path):
    """allennlp's `Model._load`: `model = amp.initialize(model, opt_level=...)` for inference, then
    `return model`: apex's casting reached the forward passes in the callers, which a region here
    would not; refused with the reason. (It had also got a required `scaler=` that no caller
    passes, for the `amp is None` test: a TypeError. Installed tests take no scaler.)"""
    write(tmp_path, {"model.py": LOADER.replace("RETURN", "model.extend_vocab()\n        return model")})
    out = run(tmp_path)
    assert "for inference is returned: its forward passes run in the callers" in out.output, out.output
    assert "would be rewritten: apex" not in out.output


def test_an_installed_test_takes_no_scaler(tmp_path):
    src = LOADER.replace("RETURN", "print(model(torch.zeros(1)))")
    write(tmp_path, {"model.py": src})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "model.py").read_text()
    assert "scaler" not in text and "amp is" not in text and "apex" not in text
    assert "with torch.autocast(" in text and "print(model(torch.zeros(1)))" in text
