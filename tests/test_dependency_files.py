"""AMP107: apex in dependency and environment files, reported by `check` in every format and
removed by `migrate --write` once no file of the project imports apex any more."""
import json
import shutil
import tomllib
from pathlib import Path

from click.testing import CliRunner

from ampfix.cli import main

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "apex" / "before"


def project(tmp_path, script="checkpoint_resume.py"):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "demo"\ndependencies = [\n    "torch>=2.4",\n    "apex @ git+https://github.com/NVIDIA/apex",\n]\n')
    (tmp_path / "requirements.txt").write_text("torch>=2.4\napex\nnumpy  # arrays\n")
    (tmp_path / "environment.yml").write_text(
        "name: demo\ndependencies:\n  - python=3.11\n  - pip:\n    - git+https://github.com/NVIDIA/apex\n")
    (tmp_path / "setup.py").write_text(
        'from setuptools import setup\nsetup(name="demo", install_requires=[\n    "torch",\n    "apex",\n])\n')
    (tmp_path / "Dockerfile").write_text(
        "FROM pytorch/pytorch\nRUN git clone https://github.com/NVIDIA/apex && cd apex && pip install -v .\n")
    shutil.copy(FIX / script, tmp_path / "train.py")
    return tmp_path


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_check_reports_every_file_and_line(tmp_path):
    p = project(tmp_path)
    out = run("check", "--select", "AMP107", str(p))
    lines = [x for x in out.output.splitlines() if "AMP107" in x]
    where = {(Path(x.split(":")[0]).name, int(x.split(":")[1])) for x in lines}
    assert where == {("pyproject.toml", 5), ("requirements.txt", 2), ("environment.yml", 5), ("setup.py", 4),
                     ("Dockerfile", 2)}, out.output
    req = next(x for x in lines if "requirements.txt" in x)
    assert "unrelated project" in req and "May 2025" in req
    js = json.loads(run("check", "--select", "AMP107", "--output-format", "json", str(p)).output)
    assert len(js["diagnostics"]) == 5 and all(d["code"] == "AMP107" for d in js["diagnostics"])
    gh = run("check", "--select", "AMP107", "--output-format", "github", str(p)).output
    assert gh.count("::") >= 5 and "requirements.txt,line=2" in gh


def test_migrate_removes_entries_once_apex_is_gone(tmp_path):
    p = project(tmp_path)
    out = run("migrate", "--write", str(p))
    assert "from apex" not in (p / "train.py").read_text()
    assert (p / "requirements.txt").read_text() == "torch>=2.4\nnumpy  # arrays\n"
    data = tomllib.loads((p / "pyproject.toml").read_text())
    assert data["project"]["dependencies"] == ["torch>=2.4"]
    assert "apex" not in (p / "setup.py").read_text() and "torch" in (p / "setup.py").read_text()
    assert "NVIDIA/apex" not in (p / "environment.yml").read_text()
    # the Dockerfile is named for a person, not edited
    assert "NVIDIA/apex" in (p / "Dockerfile").read_text()
    assert "Dockerfile:2:1: AMP107" in out.output and "remove it by hand" in out.output
    again = run("migrate", str(p))
    assert "would be rewritten" not in again.output


def test_entries_stay_while_apex_is_imported(tmp_path):
    p = project(tmp_path)
    (p / "fused.py").write_text("from apex.contrib.sparsity import ASP\nASP.prune_trained_model(model, opt)\n")
    out = run("migrate", "--write", str(p))
    assert "apex" in (p / "requirements.txt").read_text()
    assert "still imported by" in out.output and "fused.py" in out.output


def test_entries_stay_when_only_part_of_the_project_is_given(tmp_path):
    p = project(tmp_path)
    (p / ".git").mkdir()
    (p / "src").mkdir()
    shutil.move(str(p / "train.py"), str(p / "src" / "train.py"))
    (p / "scripts").mkdir()
    (p / "scripts" / "old.py").write_text("from apex import amp\n")
    out = run("migrate", "--write", str(p / "src"))
    # a file above the folder asked for is neither read nor written (ruff's habit)
    assert "apex" in (p / "requirements.txt").read_text()
    assert "requirements.txt" not in out.output, out.output


def test_requirement_with_an_unrelated_similar_name_is_not_reported(tmp_path):
    (tmp_path / "requirements.txt").write_text("apex-utils==1.0\napexpy\n")
    (tmp_path / "t.py").write_text("import torch\n")
    out = run("check", "--select", "AMP107", str(tmp_path))
    assert "AMP107" not in out.output
