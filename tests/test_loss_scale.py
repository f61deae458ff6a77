"""apex's ``loss_scale`` as the GradScaler's options: a literal, a name read at run time, and a
choice between "dynamic" and a value (``"dynamic" if args.loss_scale == 0 else args.loss_scale``,
NVIDIA's BERT fine-tuning scripts), which used to be refused."""
import textwrap

import pytest

from ampfix.engine.check import check_source
from ampfix.model.settings import Settings
from ampfix.registry import all_rules

SCRIPT = """\
    import argparse
    import torch
    from apex import amp

    parser = argparse.ArgumentParser()
    parser.add_argument("--loss_scale", type=float, default=0)
    parser.add_argument("--fp16", action="store_true")
    args = parser.parse_args()
    model = torch.nn.Linear(4, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O2", loss_scale={ls})
    for x in loader:
        loss = model(x).sum()
        if args.fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""


def migrate(ls: str):
    res = check_source(textwrap.dedent(SCRIPT.format(ls=ls)).encode(), "x.py", all_rules(), Settings(), fix="safe")
    return res


def scaler_options(out: str) -> str:
    start = out.index("GradScaler(")
    depth, i = 0, start + len("GradScaler")
    for i in range(start + len("GradScaler"), len(out)):
        depth += {"(": 1, ")": -1}.get(out[i], 0)
        if depth == 0:
            break
    return " ".join(out[start:i + 1].split())


@pytest.mark.parametrize("ls, expected", [
    ('"dynamic"', 'GradScaler("cuda", enabled=bool(args.fp16))'),
    ("128.0", "init_scale=128.0, growth_interval=2**31 - 1"),
    ("args.loss_scale", 'init_scale=2.0**16 if args.loss_scale in (None, 0, "dynamic") else float(args.loss_scale)'),
    # the test restates what the name's own dynamic values are: it folds away
    ('"dynamic" if args.loss_scale == 0 else args.loss_scale',
     'init_scale=2.0**16 if args.loss_scale in (None, 0, "dynamic") else float(args.loss_scale), '
     'growth_interval=2000 if args.loss_scale in (None, 0, "dynamic") else 2**31 - 1'),
    ('args.loss_scale if args.loss_scale else "dynamic"',
     'init_scale=2.0**16 if args.loss_scale in (None, 0, "dynamic") else float(args.loss_scale)'),
    # a test of its own: dynamic when it holds, the number otherwise
    ("None if args.dynamic else 128", "init_scale=2.0**16 if args.dynamic else 128, "
                                      "growth_interval=2000 if args.dynamic else 2**31 - 1"),
    ('128 if args.static else "dynamic"', "init_scale=2.0**16 if not args.static else 128"),
])
def test_loss_scale_options(ls, expected):
    res = migrate(ls)
    assert res.fixed is not None and "apex" not in res.fixed, res.fixed
    opts = scaler_options(res.fixed)
    assert expected in opts.replace("( ", "(").replace(", )", ")"), opts
    compile(res.fixed, "x.py", "exec")


@pytest.mark.parametrize("ls", ["args.a if args.b else args.c", "get_scale()", '"dynamic" if a else (1 if b else 2)'])
def test_other_expressions_are_refused_with_the_reason(ls):
    res = migrate(ls)
    assert res.fixed is None or "amp.initialize" in res.fixed
    reasons = [d.message for d in res.diagnostics if "not rewritten" in d.message]
    assert any("loss_scale is neither 'dynamic', a number, a name nor a choice between them" in r for r in reasons), \
        [d.message for d in res.diagnostics]
