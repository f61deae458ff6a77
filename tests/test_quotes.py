"""What the migration writes follows the module's own quotes: a file of 'single' quoted strings
gets GradScaler('cuda'), not GradScaler("cuda"); literals it keeps are not touched."""
import textwrap

from ampfix.engine.check import check_source
from ampfix.model.edits import house_quote, requote
from ampfix.model.settings import Settings
from ampfix.registry import all_rules

SCRIPT = """\
    import torch
    from apex import amp

    model = torch.nn.Linear(4, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level={q}O1{q})
    for x, y in loader:
        loss = ((model(x) - y) ** 2).mean()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        print({q}step{q}, "it's")
"""


def migrate(q: str) -> str:
    res = check_source(textwrap.dedent(SCRIPT.format(q=q)).encode(), "x.py", all_rules(), Settings(), fix="safe")
    assert res.fixed is not None
    return res.fixed


def test_single_quoted_module_gets_single_quotes():
    out = migrate("'")
    assert "GradScaler('cuda')" in out and "torch.autocast('cuda'" in out, out
    assert '"cuda"' not in out
    assert "print('step', \"it's\")" in out  # the user's own literals stay as written


def test_double_quoted_module_keeps_double_quotes():
    out = migrate('"')
    assert 'GradScaler("cuda")' in out and 'torch.autocast("cuda"' in out, out


def test_requote_leaves_what_it_cannot_convert():
    assert requote('f"{a}" + "it\'s" + "a\\\\n" + """doc"""', "'") == 'f"{a}" + "it\'s" + "a\\\\n" + """doc"""'
    assert requote('x = "a"', '"') == 'x = "a"'
    assert requote('x = ("a"', "'") == 'x = ("a"'  # not tokenizable: as it is
    assert house_quote("a = 'x'\nb = 'y'\nc = \"z\"\n") == "'" and house_quote("a = 'x'\nb = \"y\"\n") == '"'
