"""Shapes met on the eighth round's repositories, as small inline scripts: an optimizer made only
to hand apex a second model (HobbitLong/CMC's momentum encoder), and how the enabled= of one
scaler reads when two initialize calls share it."""
import textwrap

from ampfix.engine.check import check_source
from ampfix.migration.spell import conj, disj
from ampfix.model.settings import Settings
from ampfix.registry import all_rules

CMC = """\
    import torch
    from apex import amp


    def main(args, model, model_ema, loader):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if args.amp:
            model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)
            if args.moco:
                optimizer_ema = torch.optim.SGD(model_ema.parameters(), lr=0, momentum=0, weight_decay=0)
                model_ema, optimizer_ema = amp.initialize(model_ema, optimizer_ema, opt_level=args.opt_level)
        for x in loader:
            with torch.no_grad():
                k = model_ema(x)
            loss = (model(x) - k).pow(2).mean()
            optimizer.zero_grad()
            if args.amp:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()
"""


def run(src):
    return check_source(textwrap.dedent(src).encode(), "x.py", all_rules(), Settings(), fix="safe")


def test_an_optimizer_made_only_for_a_second_initialize_goes_with_it():
    out = run(CMC).fixed
    assert "optimizer_ema" not in out and "amp.initialize" not in out
    assert "if args.moco" not in out and "if args.amp" not in out  # emptied, they go
    assert out.count("GradScaler(") == 1
    assert 'enabled=bool(args.amp) and args.opt_level != "O0")' in out  # not `x or (x and y)`


def test_an_optimizer_read_elsewhere_stays():
    src = CMC.replace("            optimizer.step()\n", "            optimizer.step()\n            print(optimizer_ema)\n")
    out = run(src).fixed
    assert "optimizer_ema = torch.optim.SGD(" in out


def test_enabled_expressions_simplify_as_a_reviewer_would():
    assert disj("n > 1 and x", "n <= 1 and x") == "x"
    assert disj("a and b", "a") == "a" and disj("a", "a and b") == "a"
    assert disj("a", "b") == "(a) or (b)"
    assert conj("x != 'O0'", "x != \"O0\"") == "x != 'O0'"
    assert conj("a", "b and a") == "a and b"
