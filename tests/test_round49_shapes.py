"""Forty-ninth round: what the full corpus run with last round's checks showed, and the gaps
behind last round's refusals.

1. A function of another module that the plan edits without an apex use of its own (a
   learning-rate setter that took the scaler beside the optimizer) had its part dropped: no rule
   reported there, so the caller passed ``scaler=`` to a function that did not take it.  A file a
   migration edits always reports the edit now (at its first change, where no planner named a
   place).
   Its clip of ``clip_master_grads`` named the maker's ``model``, undefined there: the optimizer's
   groups are the parameters in a function it is handed to.
2. ``set_lr(optimizer, step, ...)`` that only sets ``optimizer.param_groups[...]['lr']``: it takes
   the plain optimizer as it took the FP16_Optimizer and needs no scaler (a parameter it never
   reads is dead code a reviewer would strike).
3. A reason that quotes a call over several lines is said on one line.
4. A helper of another module that halves the model under the flag (DialoGPT's ``load_model(model,
   checkpoint, args)``: ``if args.fp16: logger.info('model.half() activated'); model.half()``),
   called only by the maker with the flag's object: the cast goes with the FP16_Optimizer (and the
   log line that said it); another caller keeps it, and the plan is refused, naming the call.
5. An evaluation the FP16_Optimizer's model is handed to (``eval_model_loss(model, loader, args)``,
   integer inputs, so no cast told it): it ran the float16 model, so its call runs under autocast.
"""
import textwrap

from test_round17_shapes import migrated, run, write

SET_LR = textwrap.dedent('''\
    def set_lr(optimizer, step, lr):
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, step / 100)
''')

TRAIN = textwrap.dedent('''\
    import argparse

    import torch
    from apex.fp16_utils import FP16_Optimizer

    from utils import set_lr

    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true")
    args = parser.parse_args()

    model = torch.nn.Linear(4, 2).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.fp16:
        model.half()
        optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)

    for step in range(10):
        x = torch.randn(8, 4, device="cuda")
        if args.fp16:
            x = x.half()
        loss = model(x).float().pow(2).mean()
        if args.fp16:
            optimizer.backward(loss)
        else:
            loss.backward()
        set_lr(optimizer, step, 0.1)
        optimizer.step()
        optimizer.zero_grad()
''')


def test_a_learning_rate_setter_takes_the_plain_optimizer_and_no_scaler(tmp_path):
    files = {"train.py": TRAIN, "utils.py": SET_LR}
    out = migrated(tmp_path, files, "train.py")
    assert "FP16_Optimizer" not in out and "GradScaler" in out
    assert "set_lr(optimizer, step, 0.1)\n" in out
    assert (tmp_path / "utils.py").read_text() == SET_LR
    compile(out, "train.py", "exec")


CLIP = textwrap.dedent('''\
    def clip(optimizer, norm):
        optimizer.clip_master_grads(norm)
''')


def test_a_helper_in_a_file_without_apex_that_takes_the_scaler_is_rewritten_too(tmp_path):
    train = TRAIN.replace("from utils import set_lr", "from utils import clip").replace(
        "    set_lr(optimizer, step, 0.1)\n", "    clip(optimizer, 1.0)\n")
    write(tmp_path, {"train.py": train, "utils.py": CLIP})
    out = run(tmp_path)
    assert out.exit_code == 1, out.output  # 1: files would change
    # before, no rule reported in utils.py and its part was dropped: `clip(..., scaler=scaler)`
    # called a function without that parameter
    assert "utils.py: would be rewritten" in out.output, out.output
    assert run(tmp_path, "--write", "-q").exit_code == 0
    utils = (tmp_path / "utils.py").read_text()
    train = (tmp_path / "train.py").read_text()
    assert utils.startswith("import torch\n\n\ndef clip(optimizer, norm, *, scaler):\n")
    # the maker's `model` is not a name here: the optimizer's own groups are the parameters
    assert "model" not in utils and 'optimizer.param_groups for p in group["params"]' in utils
    compile(utils, "utils.py", "exec")
    assert "clip(optimizer, 1.0, scaler=scaler)" in train


LOAD = textwrap.dedent('''\
    def load_model(model, checkpoint,
                   args):
        if args.fp16:
            model.half()
        return model
''')


def test_a_reason_quoting_a_call_over_lines_is_one_line(tmp_path):
    train = TRAIN.replace("from utils import set_lr", "from utils import load_model, set_lr").replace(
        "model = torch.nn.Linear(4, 2).cuda()\n",
        "model = load_model(torch.nn.Linear(4, 2).cuda(), None,\n                   args)\n").replace(
        "        model.half()\n", "")
    # another caller keeps the helper's cast: refused, naming the call over two lines
    infer = "import argparse\nfrom utils import load_model\nmodel = load_model(None, 'm.pt', argparse.Namespace())\n"
    write(tmp_path, {"train.py": train, "utils.py": SET_LR + "\n\n" + LOAD, "infer.py": infer})
    out = run(tmp_path)
    assert out.exit_code == 1, out.output  # a problem is left for a person
    line = next(x for x in out.output.splitlines() if "not rewritten:" in x)
    assert "`load_model(torch.nn.Linear(4, 2).cuda(), None, args)` at line" in line
    assert "makes the model float16" in line


HALVER = textwrap.dedent('''\
    import logging

    import torch

    logger = logging.getLogger(__name__)


    def load_model(model, checkpoint, args):
        if checkpoint:
            model.load_state_dict(torch.load(checkpoint))
        if args.fp16:
            logger.info("in fp16, model.half() activated")
            model.half()
        return model


    def evaluate(model, loader, args):
        model.eval()
        total = 0.0
        with torch.no_grad():
            for ids in loader:
                total += model(ids.to(args.device)).float().mean()
        return total
''')


def _halver_train():
    return TRAIN.replace("from utils import set_lr", "from utils import evaluate, load_model, set_lr").replace(
        "model = torch.nn.Linear(4, 2).cuda()\n", "model = load_model(torch.nn.Linear(4, 2).cuda(), None, args)\n").replace(
        "        model.half()\n", "") + "    val = evaluate(model, [], args)\n"


def test_a_helper_that_halves_under_the_flag_loses_the_cast_with_the_optimizer(tmp_path):
    write(tmp_path, {"train.py": _halver_train(), "utils.py": SET_LR + "\n\n" + HALVER})
    assert run(tmp_path, "--write", "-q").exit_code == 0
    utils = (tmp_path / "utils.py").read_text()
    train = (tmp_path / "train.py").read_text()
    assert ".half()" not in utils and "activated" not in utils and "if args.fp16" not in utils
    assert "return model" in utils and "load_state_dict" in utils
    assert "FP16_Optimizer" not in train and "scaler.scale(loss).backward()" in train
    # the evaluation ran the float16 model: it runs under autocast, with the flag
    assert ('    with torch.autocast("cuda", dtype=torch.float16, enabled=bool(args.fp16)):\n'
            '        val = evaluate(model, [], args)\n') in train
    compile(train, "train.py", "exec")
    compile(utils, "utils.py", "exec")


def test_a_helper_that_halves_for_another_caller_too_is_refused(tmp_path):
    infer = "import argparse\nfrom utils import load_model\nimport torch\n" \
            "args = argparse.Namespace(fp16=True)\nmodel = load_model(torch.nn.Linear(4, 2), 'm.pt', args)\n"
    write(tmp_path, {"train.py": _halver_train(), "utils.py": SET_LR + "\n\n" + HALVER, "infer.py": infer})
    out = run(tmp_path)
    assert out.exit_code == 1, out.output
    assert "makes the model float16" in out.output and "`load_model`" in out.output
    assert "would be rewritten" not in out.output


def test_a_migration_is_never_applied_in_part_when_a_rule_is_not_selected(tmp_path):
    # `--select AMP101` selects the rule that says the helper's part (utils.py) and not the one
    # that carries train.py's (AMP102): before, utils.py was rewritten alone and train.py called
    # `clip(optimizer, 1.0)` without the scaler the helper now requires
    train = TRAIN.replace("from utils import set_lr", "from utils import clip").replace(
        "    set_lr(optimizer, step, 0.1)\n", "    clip(optimizer, 1.0)\n")
    part = tmp_path / "part"
    write(part, {"train.py": train, "utils.py": CLIP})
    out = run(part, "--select", "AMP101", "--write")
    assert (part / "utils.py").read_text() == CLIP, out.output
    assert (part / "train.py").read_text() == train, out.output
    # the rule of FP16_Optimizer carries the whole of its migration (the helper's part too), as
    # the full run does (round 50: the planner's report in utils.py is AMP102's now)
    whole = tmp_path / "whole"
    write(whole, {"train.py": train, "utils.py": CLIP})
    assert run(whole, "--write", "-q").exit_code == 0
    assert "scaler=scaler" in (whole / "train.py").read_text()
    assert "*, scaler" in (whole / "utils.py").read_text()
    assert run(part, "--select", "AMP102", "--write", "-q").exit_code == 0
    for name in ("train.py", "utils.py"):
        assert (part / name).read_text() == (whole / name).read_text(), name
