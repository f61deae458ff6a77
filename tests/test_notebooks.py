"""Jupyter notebooks: code cells checked as one module in order, IPython lines kept, diagnostics
by cell, --write touching only the changed cells' source (outputs, metadata, layout kept)."""
import json

from click.testing import CliRunner

from ampfix.cli import main


def notebook(cells, **meta):
    nb = {"cells": cells, "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                                      "name": "python3"}, **meta},
          "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def code(*lines, outputs=(), count=1, tags=()):
    return {"cell_type": "code", "execution_count": count, "id": f"c{count}", "metadata": {"tags": list(tags)},
            "outputs": list(outputs), "source": list(lines)}


OUT = {"name": "stdout", "output_type": "stream", "text": ["loss 0.69 — é\n"]}
IMG = {"data": {"image/png": "iVBORw0KGgo=\n", "text/plain": ["<Figure>"]}, "metadata": {}, "output_type": "display_data"}
CELLS = [
    {"cell_type": "markdown", "id": "m", "metadata": {}, "source": ["# Training\n"]},
    code("%matplotlib inline\n", "import torch\n", "!nvidia-smi\n", "x = torch.zeros(3).cuda()", outputs=[OUT]),
    code("%%time\n", "opt = torch.optim.SGD([x], lr=0.1)\n", "for i in range(3):\n",
         "    opt.zero_grad(set_to_none=False)\n", "    files = !ls\n", count=2, outputs=[IMG], tags=["train"]),
    code("%%bash\n", "echo this is not python (\n", count=3),
    code("print(x)\n", count=4),
]


def run(*args):
    return CliRunner().invoke(main, [*map(str, args)], catch_exceptions=False)


def test_diagnostics_name_the_cell_and_line(tmp_path):
    f = tmp_path / "train.ipynb"
    f.write_text(notebook(CELLS))
    r = run("check", "--no-cache", f)
    assert r.exit_code == 1
    assert f"{f}:cell 2:4:5: AMP302" in r.output and f"{f}:cell 3:4:5: AMP301" in r.output
    assert "AMP000" not in r.output  # the magics and the bash cell are not Python errors
    js = json.loads(run("check", "--no-cache", "--output-format", "json", f).stdout)
    assert sorted((d["cell"], d["location"]["line"]) for d in js["diagnostics"]) == [(2, 4), (3, 4)]


def test_write_changes_only_the_code_of_the_changed_cells(tmp_path):
    f = tmp_path / "train.ipynb"
    before = notebook(CELLS)
    f.write_text(before)
    r = run("migrate", "--write", "--unsafe-fixes", f)
    assert r.exit_code == 0, r.output
    after = f.read_text()
    old, new = json.loads(before), json.loads(after)
    assert new["cells"][1]["source"] == ["%matplotlib inline\n", "import torch\n", "!nvidia-smi\n",
                                         'x = torch.zeros(3, device="cuda")']
    assert new["cells"][2]["source"][3] == "    opt.zero_grad()\n"
    assert new["cells"][2]["source"][4] == "    files = !ls\n"  # the IPython line, as it was
    for i in (0, 3, 4):
        assert new["cells"][i] == old["cells"][i]
    for i in (1, 2):  # outputs, metadata, counts: untouched
        assert {k: v for k, v in new["cells"][i].items() if k != "source"} == \
               {k: v for k, v in old["cells"][i].items() if k != "source"}
    # the layout is Jupyter's own: only the two changed source lines differ in the text
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b]
    assert len(before.splitlines()) == len(after.splitlines()) and len(changed) == 2
    assert run("check", "--no-cache", f).exit_code == 0
    assert run("migrate", "--write", "--unsafe-fixes", f).exit_code == 0 and f.read_text() == after  # idempotent


def test_dry_run_diff_shows_the_ipython_lines(tmp_path):
    f = tmp_path / "train.ipynb"
    f.write_text(notebook(CELLS))
    r = run("migrate", f)
    assert "-x = torch.zeros(3).cuda()" in r.stdout and " !nvidia-smi" in r.stdout and "ampfix: ipython" not in r.stdout


def test_an_apex_notebook_is_migrated_across_cells(tmp_path):
    f = tmp_path / "apex.ipynb"
    f.write_text(notebook([
        code("import torch\n", "from apex import amp\n"),
        code("model = torch.nn.Linear(4, 4).cuda()\n", "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
             "model, opt = amp.initialize(model, opt, opt_level='O1')\n", count=2),
        code("for step in range(3):\n", "    loss = model(torch.randn(2, 4, device='cuda')).sum()\n",
             "    opt.zero_grad()\n", "    with amp.scale_loss(loss, opt) as scaled:\n", "        scaled.backward()\n",
             "    opt.step()\n", count=3),
    ]))
    r = run("migrate", "--write", "--unsafe-fixes", f)
    assert r.exit_code == 0, r.output
    cells = ["".join(c["source"]) for c in json.loads(f.read_text())["cells"]]
    assert "apex" not in "".join(cells)
    assert "GradScaler" in cells[1] and "scaler.scale(loss).backward()" in cells[2] and "torch.autocast" in cells[2]


def test_a_broken_notebook_is_one_clear_line(tmp_path):
    f = tmp_path / "broken.ipynb"
    f.write_text('{"cells": [')
    r = run("check", "--no-cache", f)
    assert r.exit_code == 1 and f"{f}:1:1: AMP000 cannot read the notebook: not valid JSON" in r.output
    assert "Traceback" not in r.output


def test_folders_are_walked_for_notebooks(tmp_path):
    (tmp_path / "nbs").mkdir()
    (tmp_path / "nbs" / "a.ipynb").write_text(notebook([code("import torch\n", "x = torch.ones(2).cuda()\n")]))
    r = run("check", "--no-cache", tmp_path)
    assert "a.ipynb:cell 1:2:5: AMP302" in r.output


def test_a_layout_ampfix_cannot_reproduce_is_not_written(tmp_path):
    f = tmp_path / "odd.ipynb"
    text = notebook([code("import torch\n", "x = torch.ones(2).cuda()\n")]).replace('\n "metadata"', '\n\n "metadata"')
    f.write_text(text)
    r = run("migrate", "--write", "--unsafe-fixes", f)
    assert r.exit_code == 2 and "layout" in r.output and f.read_text() == text


def test_add_noqa_leaves_notebooks_and_says_so(tmp_path):
    f = tmp_path / "train.ipynb"
    text = notebook(CELLS)
    f.write_text(text)
    r = run("check", "--add-noqa", f)
    assert r.exit_code == 0 and f.read_text() == text and "notebooks are not edited by --add-noqa" in r.stderr


def test_old_and_odd_notebooks_are_one_clear_line_each(tmp_path):
    v3 = tmp_path / "v3.ipynb"
    v3.write_text(json.dumps({"metadata": {}, "nbformat": 3, "nbformat_minor": 0,
                              "worksheets": [{"cells": [{"cell_type": "code", "input": ["x = 1\n"]}]}]}))
    empty = tmp_path / "empty.ipynb"
    empty.write_text(notebook([]))
    syntax = tmp_path / "syntax.ipynb"
    syntax.write_text(notebook([code("import torch\n"), code("def f(:\n", "    pass\n", count=2)]))
    r = run("check", "--no-cache", v3, empty, syntax)
    assert f"{v3}:1:1: AMP000 cannot read the notebook: nbformat 3 (before Jupyter 4): convert it first" in r.output
    assert f"{syntax}:cell 2:1:7: AMP000" in r.output and "empty.ipynb" not in r.output


def test_unchanged_module_writes_back_the_same_bytes():
    """Reading a notebook and writing back its module unchanged gives the file byte for byte,
    whatever the cells hold (magics, shell lines, blank lines, no final newline, source as a
    string or a list, other languages' cells, non-ASCII)."""
    from hypothesis import given, settings, strategies as st

    from ampfix.io import notebook as nbm

    line = st.sampled_from(["import torch", "x = 1", "    y = x", "%matplotlib inline", "!pip install -q x",
                            "files = !ls", "", "# é comment", "for i in range(2):", "    pass", "%%time",
                            "print('ü')", "y = (1", "    % 2)", "s = '" + "''", "!text in a string", "''" + "'"])
    cell = st.tuples(st.lists(line, max_size=6), st.booleans(), st.booleans(), st.sampled_from(["code", "markdown"]))

    @settings(max_examples=200, deadline=None)
    @given(st.lists(cell, max_size=5), st.booleans())
    def check(cells, ascii_):
        out = []
        for i, (lines, as_list, final_nl, kind) in enumerate(cells):
            text = "\n".join(lines) + ("\n" if final_nl and lines else "")
            src = text.splitlines(keepends=True) if as_list else text
            c = {"cell_type": kind, "metadata": {}, "source": src}
            if kind == "code":
                c.update(execution_count=i, outputs=[])
            out.append(c)
        raw = json.dumps({"cells": out, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, sort_keys=True,
                         indent=1, ensure_ascii=ascii_) + "\n"
        book = nbm.read(raw.encode("utf-8"), "t.ipynb")
        assert nbm.write_back(book, book.module) == raw.encode("utf-8")

    check()


def test_percent_and_bang_inside_an_expression_are_python(tmp_path):
    """`%` starting a continuation line is the modulo operator, and a `!ls` inside a string is
    text: only a statement's start is an IPython line."""
    f = tmp_path / "mod.ipynb"
    f.write_text(notebook([code("import torch\n", "y = (10\n", "     % 3)\n", "doc = '''\n", "!not a shell line\n",
                                "'''\n", "z = 7 \\\n", "    % 2\n", "x = torch.zeros(3).cuda()\n")]))
    r = run("check", "--no-cache", f)
    assert "AMP000" not in r.output and f"{f}:cell 1:9:5: AMP302" in r.output
    assert run("migrate", "--write", "--unsafe-fixes", f).exit_code == 0
    assert "     % 3)\n" in json.loads(f.read_text())["cells"][0]["source"]
