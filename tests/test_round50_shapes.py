"""Fiftieth round.

1. An import that takes the place of imports that went keeps the file's own spacing before the
   code after it: a file written with one blank line between its imports and its first class keeps
   one (the fix has no reason to touch that line); one with two keeps two; a file that had no
   imports and starts with a function gets two under the added import (PEP 8, E302).
"""
import textwrap

from test_round17_shapes import migrated

CLASS = textwrap.dedent('''\
    import torch.cuda.amp as amp
    {gap}class F(torch.autograd.Function):
        @staticmethod
        @amp.custom_fwd
        def forward(ctx, x):
            return x
''')


def test_replaced_import_keeps_the_files_spacing(tmp_path):
    for blanks in (0, 1, 2):
        root = tmp_path / str(blanks)
        out = migrated(root, {"f.py": CLASS.format(gap="\n" * blanks)}, "f.py", "--select", "AMP202")
        head = out.split("class F")[0]
        # none (not PEP 8 at all) is not kept: the added import gets PEP 8's two
        assert head == "import torch\n" + "\n" * (blanks or 2), (blanks, out)
        assert '@torch.amp.custom_fwd(device_type="cuda")' in out


def test_added_import_above_a_function_gets_two_blank_lines(tmp_path):
    src = textwrap.dedent('''\
        def train(model, optimizer, loader):
            from apex import amp
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for x in loader:
                loss = model(x)
                optimizer.zero_grad()
                with amp.scale_loss(loss, optimizer) as scaled:
                    scaled.backward()
                optimizer.step()
    ''')
    out = migrated(tmp_path, {"m.py": src}, "m.py")
    assert out.startswith("import torch\n\n\ndef train("), out
    assert "scaler.scale(loss).backward()" in out
