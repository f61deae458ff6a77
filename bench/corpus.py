"""The corpus of public training code that ampfix is measured on.

``bench/corpus/manifest.json`` names, for each public repository, a commit and the Python files
read there.  Nothing of theirs is kept in this repository: this script copies the files out of
git, either cloned from the public URL (``https://github.com/OWNER/NAME``, the default) or from
mirrors fetched beforehand (``--mirrors DIR``: one folder per repository, ``owner+name/repo``,
holding a git directory).

    python bench/corpus.py materialize --out /tmp/corpus                  # clones from GitHub
    python bench/corpus.py materialize --mirrors DIR --out /tmp/corpus    # from local mirrors
    python bench/corpus.py materialize --out /tmp/holdout --only holdout  # the holdout alone
    python bench/corpus.py list
    python bench/corpus.py add --mirrors DIR OWNER/NAME [--holdout] [--commit REV] [--batch LABEL]

Entries with ``"holdout": true`` are the holdout: repositories measured before any fix and never
looked at while fixing (``bench/results/corpus`` reports them apart).  ``--only holdout`` /
``--only tuned`` materialize one side.  A repository whose mirror or clone is missing is
reported and skipped.

Which files ``add`` takes: every Python file of a repository of at most 400 Python files; in a
larger one, the files of each project folder that holds an apex use (the nearest folder above
the use with a README, setup.py, requirements.txt or pyproject.toml, else the use's own folder),
so that the launcher, the engine and their helpers are planned together as a user's run would.
A copy of apex itself checked into a repository (a folder whose ``apex/amp/__init__.py`` is
there, e.g. ``apex/apex/amp``) is left out: its tests and internals are apex's code, not the
project's (NVIDIA/apex itself is the exception: its examples are what users copied).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

MANIFEST = Path(__file__).resolve().parent / "corpus" / "manifest.json"
APEX = re.compile(rb"apex|amp_backend|fp16_backend|half_precision_backend|configure_apex_amp|FP16_Optimizer")
MARKERS = ("README.md", "README.rst", "README", "setup.py", "requirements.txt", "pyproject.toml")


def load(manifest: Path = MANIFEST):
    return json.loads(manifest.read_text())["repos"]


def git_dir(mirrors: Path, repo: str) -> Path:
    d = mirrors / repo.replace("/", "+") / "repo"
    return d / ".git" if (d / ".git").is_dir() else d


def _clone(repo: str, commit: str, into: Path) -> Path:
    """A bare, blob-less clone of the public repository with the commit fetched."""
    gd = into / (repo.replace("/", "+") + ".git")
    if not gd.is_dir():
        subprocess.run(["git", "clone", "--bare", "--filter=blob:none", "--quiet",
                        f"https://github.com/{repo}", str(gd)], check=True)
    subprocess.run(["git", "--git-dir", str(gd), "fetch", "--quiet", "--filter=blob:none", "origin", commit],
                   check=False)
    return gd


def materialize(mirrors, out: Path, manifest: Path = MANIFEST, only: str = "all") -> int:
    missing = 0
    cache = Path(tempfile.mkdtemp(prefix="ampfix-corpus-clones-")) if mirrors is None else None
    for entry in load(manifest):
        if only != "all" and bool(entry.get("holdout")) != (only == "holdout"):
            continue
        try:
            gd = git_dir(mirrors, entry["repo"]) if mirrors is not None else _clone(entry["repo"], entry["commit"], cache)
        except subprocess.CalledProcessError:
            gd = None
        if gd is None or not gd.is_dir():
            print(f"missing: {entry['repo']} (no mirror or clone)", file=sys.stderr)
            missing += 1
            continue
        dest = out / entry["repo"].replace("/", "+")
        for path in entry["paths"]:
            data = subprocess.run(["git", "--git-dir", str(gd), "show", f"{entry['commit']}:{path}"],
                                  capture_output=True, check=True).stdout
            target = dest / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    return missing


def select(gd: Path, commit: str):
    """The Python files ``add`` takes at ``commit`` (see the module's docstring)."""
    files = subprocess.run(["git", "--git-dir", str(gd), "ls-tree", "-r", "--name-only", commit],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    vendored = {f[: -len("apex/amp/__init__.py")] for f in files if f.endswith("apex/amp/__init__.py")}
    vendored = {v for v in vendored if v and v.endswith("/")}
    py = [f for f in files if f.endswith(".py") and not any(f.startswith(v) for v in vendored)]
    if len(py) <= 400:
        return sorted(py)
    present = set(files)
    roots = set()
    for f in py:
        data = subprocess.run(["git", "--git-dir", str(gd), "show", f"{commit}:{f}"], capture_output=True).stdout
        if not APEX.search(data):
            continue
        parts = f.split("/")[:-1]
        root = "/".join(parts)
        for k in range(len(parts), 0, -1):
            d = "/".join(parts[:k])
            if any(f"{d}/{m}" in present for m in MARKERS):
                root = d
                break
        roots.add(root)
    return sorted(f for f in py if any(r == "" or f.startswith(r + "/") for r in roots))


def add(mirrors: Path, repo: str, holdout: bool, manifest: Path = MANIFEST, rev: str = "HEAD",
        batch: str | None = None) -> int:
    doc = json.loads(manifest.read_text())
    if any(e["repo"] == repo for e in doc["repos"]):
        print(f"{repo} is in the manifest already", file=sys.stderr)
        return 1
    gd = git_dir(mirrors, repo)
    commit = subprocess.run(["git", "--git-dir", str(gd), "rev-parse", rev + "^{commit}"], capture_output=True, text=True,
                            check=True).stdout.strip()
    entry = {"repo": repo, "commit": commit, "paths": select(gd, commit)}
    if holdout:
        entry["holdout"] = True
    if batch:
        entry["batch"] = batch
    doc["repos"].append(entry)
    manifest.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{repo} {commit[:10]} {len(entry['paths'])} files{' (holdout)' if holdout else ''}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("materialize")
    m.add_argument("--mirrors", type=Path, default=None, help="local mirrors (default: clone from GitHub)")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--only", choices=["all", "holdout", "tuned"], default="all")
    sub.add_parser("list")
    a = sub.add_parser("add")
    a.add_argument("--mirrors", type=Path, required=True)
    a.add_argument("repo")
    a.add_argument("--holdout", action="store_true")
    a.add_argument("--commit", default="HEAD",
                   help="the commit to pin (default: the mirror's HEAD); e.g. the last one before the project dropped apex")
    a.add_argument("--batch", default=None, help="a label for the entries added together, reported apart")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        for e in load():
            print(f"{e['repo']:55} {e['commit'][:10]} {len(e['paths']):4} files{'  holdout' if e.get('holdout') else ''}")
        return 0
    if args.cmd == "add":
        return add(args.mirrors, args.repo, args.holdout, rev=args.commit, batch=args.batch)
    return 1 if materialize(args.mirrors, args.out, only=args.only) else 0


if __name__ == "__main__":
    sys.exit(main())
