"""Nineteenth round: a setup whose training path returns the model and the optimizers apex
initialized and whose other path returns the model alone; a loss helper that gets the loss terms
as a parameter (its forward pass is in the callers); a helper reached only through a module's
``forward`` (no call can pass it a scaler).  The runnable golden is fixtures/projects/maker_returns."""
import ast
import textwrap

from ampfix.migration.rewriter import quoted_as, returned_after, returns_after
from test_round17_shapes import run, write

MODELS = textwrap.dedent('''\
    import torch


    def create_model(opt):
        model = torch.nn.Linear(4, 4).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if opt.train:
            if opt.amp != "O0":
                from apex import amp
                model, optimizer = amp.initialize(model, optimizer, opt_level=opt.amp)
            return model, optimizer
        return model
''')

BACKWARD = textwrap.dedent('''\
    import torch


    def loss_backward(opt, losses, optimizer):
        loss = sum(torch.mean(x) for x in losses)
        optimizer.zero_grad()
        if opt.amp != "O0":
            from apex import amp
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()
''')

TRAIN = textwrap.dedent('''\
    import torch

    from backward import loss_backward
    from models import create_model


    def train(opt):
        model, optimizer = create_model(opt)
        for x in [torch.randn(2, 4, device="cuda")]:
            losses = [model(x)]
            loss_backward(opt, losses, optimizer)
''')

INFER = textwrap.dedent('''\
    import torch

    from models import create_model


    def infer(opt):
        model = create_model(opt)
        return model(torch.randn(2, 4, device="cuda"))
''')


def test_setup_with_a_training_return_hands_the_scaler_to_the_caller_that_unpacks_it(tmp_path):
    write(tmp_path, {"models.py": MODELS, "backward.py": BACKWARD, "train.py": TRAIN, "infer.py": INFER})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    train = (tmp_path / "train.py").read_text()
    # `if opt.train:` held wherever the caller got two values back: enabled= says only the level
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=opt.amp != "O0")' in train
    assert 'with torch.autocast("cuda", dtype=torch.float16, enabled=opt.amp != "O0"):\n' \
           '            losses = [model(x)]' in train
    assert "loss_backward(opt, losses, optimizer, scaler=scaler)" in train
    backward = (tmp_path / "backward.py").read_text()
    # the loss is only the mean of what came in: no region in the helper
    assert "autocast" not in backward
    assert "scaler.scale(loss).backward()" in backward and "scaler.step(optimizer)" in backward
    # the inference script unpacks one value: the model, never the optimizer
    assert (tmp_path / "infer.py").read_text() == INFER
    assert "apex" not in (tmp_path / "models.py").read_text()
    assert "would be rewritten" not in run(tmp_path).output


def test_a_caller_that_unpacks_neither_return_refuses(tmp_path):
    write(tmp_path, {"models.py": MODELS, "backward.py": BACKWARD, "train.py": TRAIN,
                     "odd.py": "from models import create_model\n\n\ndef f(opt):\n    a, b, c = create_model(opt)\n"})
    out = run(tmp_path, "--write")
    assert "unpacks 3 values of 2" in out.output
    assert (tmp_path / "models.py").read_text() == MODELS


MODULE_LOSS = textwrap.dedent('''\
    import torch

    from backward import loss_backward


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.opt = torch.optim.SGD(self.parameters(), lr=0.1)

        def forward(self, x):
            self.finetune(x)
            return self.fc(x)

        def finetune(self, x):
            losses = [self.fc(x)]
            loss_backward(self.opt_args, losses, self.opt)


    if __name__ == "__main__":
        Net()(torch.randn(2, 4))
''')


def test_a_helper_reached_through_forward_refuses_instead_of_a_required_parameter(tmp_path):
    """nn.Module.__call__ runs forward: no call in the project names it, and giving it a
    keyword-only `scaler` would break every `model(x)`."""
    write(tmp_path, {"models.py": MODELS, "backward.py": BACKWARD, "train.py": TRAIN, "net.py": MODULE_LOSS})
    out = run(tmp_path, "--write")
    assert "`Net.forward` runs when the object is called" in out.output or \
           "`loss_backward` is also called from `Net.finetune`" in out.output, out.output
    assert (tmp_path / "net.py").read_text() == MODULE_LOSS
    assert "def forward(self, x):" in (tmp_path / "net.py").read_text()


def _func(src):
    from types import SimpleNamespace

    tree = ast.parse(textwrap.dedent(src))
    for n in ast.walk(tree):
        for c in ast.iter_child_nodes(n):
            c._p = n
    f = tree.body[0]
    seed = next(n for n in ast.walk(f) if isinstance(n, ast.Assign) and getattr(n.value, "func", None) is not None
                and getattr(n.value.func, "id", "") == "seed")
    return SimpleNamespace(node=f), seed


def test_returns_after_follows_only_the_paths_through_the_statement():
    f, seed = _func('''
        def make(opt):
            if opt.train:
                m, o = seed()
                return m, o
            return m
    ''')
    assert returned_after(f, seed) == ["m", "o"]
    f, seed = _func('''
        def make(opt):
            if opt.train:
                m, o = seed()
            return m, o
    ''')
    assert returned_after(f, seed) == ["m", "o"]
    f, seed = _func('''
        def make(opt):
            for i in range(3):
                if i:
                    return i
                m, o = seed()
            return m, o
    ''')
    assert returned_after(f, seed) == []  # the loop comes round to `return i`
    f, seed = _func('''
        def make(opt):
            try:
                m, o = seed()
                return m, o
            except ValueError:
                return None
    ''')
    assert len(returns_after(f, seed)) == 2 and returned_after(f, seed) == []
    f, seed = _func('''
        def make(opt):
            m, o = seed()
            def inner():
                return 1
            return m, o
    ''')
    assert returned_after(f, seed) == ["m", "o"]  # a nested def's return is not the function's


def test_unparsed_conditions_keep_the_files_quotes():
    assert quoted_as('opt.amp != "O0"', "bool(x) and opt.amp != 'O0'") == 'bool(x) and opt.amp != "O0"'
    assert quoted_as("opt.amp != 'O0'", "bool(x) and opt.amp != 'O0'") == "bool(x) and opt.amp != 'O0'"
    assert quoted_as('a != "x"', "a != 'it\\'s'") == "a != 'it\\'s'"


def test_a_conditional_opt_level_folds_to_its_test(tmp_path):
    """`opt_level='O0' if args.fp32 else 'O1'` says when AMP is on: `not args.fp32`, not
    `('O0' if args.fp32 else 'O1') != "O0"`."""
    script = textwrap.dedent('''\
        import torch
        from apex import amp


        def train(args, model, loader):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model, optimizer = amp.initialize(model, optimizer, opt_level='O0' if args.fp32 else 'O1')
            for x, y in loader:
                loss = torch.nn.functional.mse_loss(model(x), y)
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
    ''')
    write(tmp_path, {"train.py": script})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "scaler = torch.amp.GradScaler('cuda', enabled=not args.fp32)" in text, text
    assert "'O0'" not in text


FP16_SCRIPT = textwrap.dedent('''\
    import argparse

    import torch
    from apex.fp16_utils import FP16_Optimizer

    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--clip", type=float, default=0.25)
    parser.add_argument("--dynamic-loss-scale", action="store_true")
    args = parser.parse_args()
    model = torch.nn.Linear(4, 4).cuda()
    if args.fp16:
        model = model.half()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.fp16:
        # If args.dynamic_loss_scale is False, static_loss_scale will be used.
        optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=args.dynamic_loss_scale)


    def train(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        if args.fp16:
            optimizer.backward(loss)
        else:
            loss.backward()
        if args.fp16:
            optimizer.clip_master_grads(args.clip)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
''')


def test_fp16_optimizer_clip_reuses_the_fp32_paths_parameters_and_its_comment_goes(tmp_path):
    """kimiyoung/transformer-xl's shape (tuned corpus): the clip of both paths becomes the fp32
    path's `clip_grad_norm_(model.parameters(), ...)`, not a generator over param_groups, and the
    comment on the loss-scale options of the FP16_Optimizer that went does not stay behind."""
    for dtype in ("float16", "bfloat16"):
        write(tmp_path / dtype, {"train.py": FP16_SCRIPT})
        out = run(tmp_path / dtype, "--write", "-q", "--dtype", dtype)
        assert out.exit_code == 0, out.output
        text = (tmp_path / dtype / "train.py").read_text()
        assert "torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)" in text, text
        assert "param_groups" not in text and "clip_master_grads" not in text
        assert "static_loss_scale" not in text, text
