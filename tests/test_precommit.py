"""The pre-commit hooks, for real: `pre-commit try-repo` against this repository."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("pre-commit") is None or not (REPO / ".git").exists(),
                                reason="needs pre-commit and a git checkout of ampfix")


def git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})


def try_repo(cwd, hook, home):
    env = {**os.environ, "PRE_COMMIT_HOME": str(home)}
    return subprocess.run(["pre-commit", "try-repo", str(REPO), hook, "--all-files"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_hooks_fail_then_pass(tmp_path):
    work = tmp_path / "proj"
    work.mkdir()
    git(work, "init", "-q")
    bad = work / "train.py"
    bad.write_text("import torch\nopt.zero_grad(set_to_none=False)\nx = torch.zeros(3).cuda()\n")
    git(work, "add", ".")
    home = tmp_path / "pc-home"

    check = try_repo(work, "ampfix", home)
    assert check.returncode == 1, check.stdout + check.stderr
    assert "AMP301" in check.stdout and "AMP302" in check.stdout

    migrate = try_repo(work, "ampfix-migrate", home)
    assert migrate.returncode == 1, migrate.stdout + migrate.stderr  # it changed the file
    assert "files were modified by this hook" in migrate.stdout
    # AMP301's fix is unsafe: the hook applies the safe ones only
    assert bad.read_text() == 'import torch\nopt.zero_grad(set_to_none=False)\nx = torch.zeros(3, device="cuda")\n'
    git(work, "add", ".")

    assert try_repo(work, "ampfix-migrate", home).returncode == 0
    bad.write_text(bad.read_text().replace("set_to_none=False", ""))  # the unsafe one, by a person
    git(work, "add", ".")
    again = try_repo(work, "ampfix", home)
    assert again.returncode == 0, again.stdout + again.stderr
