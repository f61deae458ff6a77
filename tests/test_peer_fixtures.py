"""ampfix against the peers' own fixtures (tests/data/peer_fixtures.json): the same findings as
TorchFix on its deprecated-AMP checker file, and the same rewrite as its codemod (up to the
spelling of one object: ampfix writes ``torch.autocast``, TorchFix ``torch.amp.autocast``, the
same class).  Their files are read from git at the pinned commit: ``AMPFIX_MIRRORS`` (a folder of
``owner+name/repo`` git mirrors) or a clone of the public URL; without either the test skips."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DATA = json.loads((Path(__file__).resolve().parent / "data" / "peer_fixtures.json").read_text())


def _git_dir(repo, commit, tmp_path):
    mirrors = os.environ.get("AMPFIX_MIRRORS")
    if mirrors:
        d = Path(mirrors) / repo.replace("/", "+") / "repo"
        d = d / ".git" if (d / ".git").is_dir() else d
        if d.is_dir():
            return d
    gd = tmp_path / "clone.git"
    try:
        subprocess.run(["git", "clone", "--bare", "--filter=blob:none", "--quiet", f"https://github.com/{repo}",
                        str(gd)], check=True, timeout=60, capture_output=True)
        subprocess.run(["git", "--git-dir", str(gd), "fetch", "--quiet", "origin", commit], timeout=60,
                       capture_output=True)
    except (subprocess.SubprocessError, OSError):
        return None
    return gd


def _show(gd, commit, path):
    return subprocess.run(["git", "--git-dir", str(gd), "show", f"{commit}:{path}"], capture_output=True,
                          check=True).stdout


@pytest.mark.parametrize("peer", DATA["peers"], ids=lambda p: p["repo"])
def test_peer_fixtures(peer, tmp_path):
    gd = _git_dir(peer["repo"], peer["commit"], tmp_path)
    if gd is None:
        pytest.skip(f"{peer['repo']} cannot be read here (no AMPFIX_MIRRORS, no network)")
    for c in peer["checks"]:
        f = tmp_path / Path(c["path"]).name
        f.write_bytes(_show(gd, peer["commit"], c["path"]))
        out = subprocess.run([sys.executable, "-m", "ampfix", "check", "--no-cache", "--output-format", "json",
                              "--select", c["select"], str(f)], capture_output=True, text=True)
        got = sorted([d["location"]["line"], d["location"]["column"]] for d in json.loads(out.stdout)["diagnostics"])
        assert got == sorted(c["findings"]), (c["path"], got)
    for m in peer["codemods"]:
        f = tmp_path / "before.py"
        f.write_bytes(_show(gd, peer["commit"], m["before"]))
        subprocess.run([sys.executable, "-m", "ampfix", "migrate", "--write", "--select", m["select"], str(f)],
                       capture_output=True)
        theirs = _show(gd, peer["commit"], m["after"]).decode()
        for a, b in m["same_objects"].items():
            theirs = theirs.replace(a, b)
        assert f.read_text() == theirs
