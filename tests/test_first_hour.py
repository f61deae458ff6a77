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
