"""The Python API returns what the JSON output says; the flake8 plugin reports the same problems."""
import json
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

import ampfix
from ampfix.cli import main

CODE = "import torch\nx = torch.zeros(3).cuda()\nopt.zero_grad(set_to_none=False)\n"


def test_check_is_the_json_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text(CODE)
    cli = json.loads(CliRunner().invoke(main, ["check", "--no-cache", "--output-format", "json", "t.py"]).stdout)
    assert ampfix.check(["t.py"]) == cli
    assert [d["code"] for d in ampfix.check(["t.py"], select=["AMP302"])["diagnostics"]] == ["AMP302"]


def test_code_in_code_out():
    diags = ampfix.check_code(CODE, "train.py")
    assert [(d["code"], d["location"]["line"]) for d in diags] == [("AMP302", 2), ("AMP301", 3)]
    fixed = ampfix.fix_code(CODE, "train.py")
    # AMP301's fix changes training (None gradients skip steps): only with unsafe=True
    assert 'torch.zeros(3, device="cuda")' in fixed and "opt.zero_grad(set_to_none=False)" in fixed
    assert ampfix.fix_code(fixed, "train.py") == fixed
    assert "opt.zero_grad()" in ampfix.fix_code(CODE, "train.py", unsafe=True)


def test_migrate_shows_then_writes(tmp_path):
    f = tmp_path / "t.py"
    f.write_text(CODE)
    dry = ampfix.migrate([str(f)])
    assert dry["files"][0]["changed"] and "+x = torch.zeros(3, device=" in dry["files"][0]["diff"]
    assert f.read_text() == CODE
    ampfix.migrate([str(f)], write=True)
    assert "device=" in f.read_text()


def test_bad_settings_raise():
    with pytest.raises(ampfix.api.ConfigError):
        ampfix.check(["."], select=["NOPE"])


@pytest.mark.skipif(shutil.which("flake8") is None and subprocess.run(
    [sys.executable, "-m", "flake8", "--version"], capture_output=True).returncode != 0, reason="flake8 not installed")
def test_flake8_plugin(tmp_path):
    f = tmp_path / "t.py"
    f.write_text(CODE)
    out = subprocess.run([sys.executable, "-m", "flake8", "--select", "AMP", str(f)], capture_output=True, text=True)
    assert f"{f}:2:5: AMP302 [*]" in out.stdout and f"{f}:3:1: AMP301 `zero_grad" in out.stdout, out.stdout + out.stderr
