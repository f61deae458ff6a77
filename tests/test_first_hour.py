"""What a newcomer meets in the first hour (issue: first impressions): each case a user hit."""
import json
import subprocess
import sys
import textwrap

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def ampfix(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "ampfix", *args], capture_output=True, text=True, cwd=cwd,
                          env=env)


def test_amp107_reads_pyproject_as_data(tmp_path):
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent('''\
        [project]
        name = "helpers"
        description = "Helpers for migrating away from apex"
        keywords = ["apex", "amp"]
        dependencies = ["torch>=2.4"]

        [project.optional-dependencies]
        legacy = [
            "apex @ git+https://github.com/NVIDIA/apex",
        ]
        '''))
    (tmp_path / "train.py").write_text("import torch\n")
    r = ampfix("check", "--no-cache", "--select", "AMP107", "--output-format", "json", ".", cwd=tmp_path)
    lines = [d["location"]["line"] for d in json.loads(r.stdout)["diagnostics"]]
    assert lines == [9], r.stdout


def test_ampfix_checks_its_own_pyproject_clean():
    r = ampfix("check", "--no-cache", "--select", "AMP107", "--output-format", "json", "pyproject.toml", cwd=ROOT)
    assert json.loads(r.stdout)["diagnostics"] == []


def test_a_file_above_the_folder_asked_for_is_not_reported(tmp_path):
    (tmp_path / "requirements.txt").write_text("torch\napex\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("import torch\n")
    r = ampfix("check", "--no-cache", "src", cwd=tmp_path)
    assert r.returncode == 0 and "requirements.txt" not in r.stdout, r.stdout
    r = ampfix("check", "--no-cache", ".", cwd=tmp_path)
    assert r.returncode == 1 and "requirements.txt:2:1: AMP107" in r.stdout


APEX = '''\
import torch
from apex import amp

model = torch.nn.Linear(4, 4).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = amp.initialize(model, opt, opt_level="O1")  # noqa: AMP101
for x in range(3):
    loss = model(x).sum()
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    opt.step()
'''


def test_noqa_on_a_line_of_a_migration_leaves_the_migration_alone(tmp_path):
    f = tmp_path / "train.py"
    f.write_text(APEX)
    r = ampfix("migrate", "--write", str(f))
    assert f.read_text() == APEX
    assert "line 6 of" in r.stderr and "noqa: AMP101" in r.stderr, r.stderr
    f.write_text(APEX.replace("  # noqa: AMP101", ""))
    ampfix("migrate", "--write", str(f))
    assert "GradScaler" in f.read_text()


def _without_torch(tmp_path):
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "torch.py").write_text("raise ImportError('No module named torch')\n")
    import os

    return {**os.environ, "PYTHONPATH": f"{blocker}{os.pathsep}{ROOT}"}


def test_convert_checkpoint_without_torch_is_one_line(tmp_path):
    r = ampfix("convert-checkpoint", "a.pt", "b.pt", cwd=tmp_path, env=_without_torch(tmp_path))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "needs torch" in r.stderr, r.stderr


def test_convert_checkpoint_into_a_missing_folder_is_one_line(tmp_path):
    r = ampfix("convert-checkpoint", "a.pt", str(tmp_path / "nope" / "b.pt"), cwd=tmp_path)
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr, r.stderr


LOOP = ("import torch\nfor b in data:\n    loss = model(b)\n    loss.backward()\n    opt.step()\n"
        "    print(loss.item())\n    opt.zero_grad(set_to_none=False)\n")


def _codes(r):
    return sorted({(d["path"].replace("\\", "/"), d["code"]) for d in json.loads(r.stdout)["diagnostics"]})


def test_the_nearest_configuration_applies_to_each_file(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.ampfix]\nselect = ["AMP3"]\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "pyproject.toml").write_text('[tool.ampfix]\nextend = "../pyproject.toml"\nignore = ["AMP303"]\n')
    for d in (tmp_path, tmp_path / "sub"):
        (d / "t.py").write_text(LOOP)
    r = ampfix("check", "--no-cache", "--output-format", "json", ".", cwd=tmp_path)
    assert _codes(r) == [("sub/t.py", "AMP301"), ("t.py", "AMP301"), ("t.py", "AMP303")], r.stdout


def test_the_more_specific_selector_wins(tmp_path):
    (tmp_path / "t.py").write_text(LOOP)
    r = ampfix("check", "--no-cache", "--output-format", "json", "--select", "AMP301", "--ignore", "AMP3", "t.py",
               cwd=tmp_path)
    assert _codes(r) == [("t.py", "AMP301")]
    r = ampfix("check", "--no-cache", "--output-format", "json", "--select", "AMP3", "--ignore", "AMP301", "t.py",
               cwd=tmp_path)
    assert _codes(r) == [("t.py", "AMP303")]


def test_show_settings_names_the_torch_version_and_its_source(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["torch>=1.13"]\n'
                                             '[project.optional-dependencies]\nverify = ["torch>=2.0"]\n')
    (tmp_path / "t.py").write_text("import torch\n")
    r = ampfix("check", "--show-settings", "t.py", cwd=tmp_path)
    assert "1.13" in r.stdout and "pyproject.toml:3" in r.stdout and "torch.cuda.amp" in r.stdout, r.stdout
    r = ampfix("check", "--show-files", ".", cwd=tmp_path)
    assert r.stdout.split() == ["t.py"]


def test_an_optional_extra_does_not_set_the_torch_version(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["click"]\n'
                                             '[project.optional-dependencies]\nverify = ["torch>=2.0"]\n')
    (tmp_path / "t.py").write_text("import torch\ns = torch.cuda.amp.GradScaler()\n")
    r = ampfix("migrate", "t.py", cwd=tmp_path)
    assert 'torch.amp.GradScaler("cuda")' in r.stdout, r.stdout


def test_output_file_statistics_json_and_exit_non_zero_on_fix(tmp_path):
    (tmp_path / "t.py").write_text(LOOP)
    r = ampfix("check", "--no-cache", "-o", "report.json", "--output-format", "json", "t.py", cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == "" and json.loads((tmp_path / "report.json").read_text())["diagnostics"]
    r = ampfix("check", "--no-cache", "--statistics", "--output-format", "json", "t.py", cwd=tmp_path)
    assert {row["code"]: row["count"] for row in json.loads(r.stdout)} == {"AMP301": 1, "AMP303": 1}
    (tmp_path / "u.py").write_text("import torch\nx = torch.zeros(3).cuda()\n")
    assert ampfix("migrate", "--write", "u.py", cwd=tmp_path).returncode == 0
    (tmp_path / "u.py").write_text("import torch\nx = torch.zeros(3).cuda()\n")
    assert ampfix("migrate", "--write", "--exit-non-zero-on-fix", "u.py", cwd=tmp_path).returncode == 1


def test_engine_codes_are_explained_and_selectable(tmp_path):
    r = ampfix("explain", "AMP000")
    assert r.returncode == 0 and "syntax-error" in r.stdout
    (tmp_path / "bad.py").write_text("x = (\n")
    r = ampfix("check", "--no-cache", "--select", "AMP000", "bad.py", cwd=tmp_path)
    assert r.returncode == 1 and "AMP000" in r.stdout
    r = ampfix("check", "--no-cache", "--ignore", "AMP000", "bad.py", cwd=tmp_path)
    assert r.returncode == 2 and "always on" in r.stderr


def test_an_unknown_code_in_noqa_is_reported(tmp_path):
    (tmp_path / "t.py").write_text("import torch\nx = 1  # noqa: AMP999, E501\ny = 2  # noqa: AMP301\n")
    r = ampfix("check", "--no-cache", "t.py", cwd=tmp_path)
    assert "t.py:2:1: AMP003" in r.stdout and "AMP999" in r.stdout and ":3:" not in r.stdout, r.stdout


def test_rules_json_has_booleans():
    rows = json.loads(ampfix("rules", "--output-format", "json").stdout)
    assert all(isinstance(r["default"], bool) for r in rows)
    assert {r["fix"] for r in rows} <= {None, "safe", "unsafe", "sometimes"}


def test_a_dry_run_names_the_column_in_the_file_as_it_is(tmp_path):
    (tmp_path / "t.py").write_text("import torch\nfor b in data:\n    loss = model(b)\n    loss.backward()\n"
                                   "    opt.step()\n    z = torch.zeros(3).cuda(); print(loss.item())\n")
    check = ampfix("check", "--no-cache", "t.py", cwd=tmp_path).stdout
    dry = ampfix("migrate", "t.py", cwd=tmp_path).stderr
    at = next(line.split(": AMP303")[0] for line in check.splitlines() if "AMP303" in line)
    assert f"left for a person: {at}: AMP303" in dry, (at, dry)


def test_a_notebooks_dry_run_names_the_cell_line_and_column_as_they_are(tmp_path):
    cells = [["import torch\n"],
             ["for b in data:\n", "    loss = model(b)\n", "    loss.backward()\n", "    opt.step()\n",
              "    z = torch.zeros(3).cuda(); print(loss.item())\n"]]
    nb = {"cells": [{"cell_type": "code", "metadata": {}, "source": c, "outputs": [], "execution_count": None}
                    for c in cells], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "t.ipynb").write_text(json.dumps(nb, indent=1))
    check = ampfix("check", "--no-cache", "t.ipynb", cwd=tmp_path).stdout
    dry = ampfix("migrate", "t.ipynb", cwd=tmp_path).stderr
    at = next(line.split(": AMP303")[0] for line in check.splitlines() if "AMP303" in line)
    assert at == "t.ipynb:cell 2:5:38" and f"left for a person: {at}: AMP303" in dry, (at, dry)
