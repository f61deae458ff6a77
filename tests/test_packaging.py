"""A wheel built from the repository, installed in a fresh venv, runs and finds its rules."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_wheel_in_fresh_venv(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(REPO)],
                   check=True, capture_output=True)
    wheels = list(dist.glob("ampfix-*.whl"))
    assert len(wheels) == 1
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = venv / "bin" / "pip"
    subprocess.run([str(pip), "install", "-q", str(wheels[0])], check=True, capture_output=True)
    exe = venv / "bin" / "ampfix"
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("ampfix, version")
    f = tmp_path / "t.py"
    f.write_text("import torch\nx = torch.zeros(2).cuda()\n")
    out = subprocess.run([str(exe), "check", str(f)], capture_output=True, text=True)
    assert out.returncode == 1 and "AMP302" in out.stdout
    # a light install: no torch pulled in by the linter
    listed = subprocess.run([str(pip), "list", "--format=freeze"], capture_output=True, text=True).stdout.lower()
    assert "click" in listed and "torch" not in listed and "libcst" not in listed
