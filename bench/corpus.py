"""The corpus of public training code that ampfix is measured on.

``bench/corpus/manifest.json`` names, for each public repository, a commit and the Python files
read there.  Nothing of theirs is kept in this repository: this script copies the files out of
git mirrors fetched beforehand (one folder per repository, ``owner+name/repo``, holding a git
directory, as the workplace's ``fetch`` leaves them).

    python bench/corpus.py materialize --mirrors /work/.mirror --out /tmp/corpus
    python bench/corpus.py list            # repository, commit, number of files

A repository whose mirror is missing is reported and skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

MANIFEST = Path(__file__).resolve().parent / "corpus" / "manifest.json"


def load(manifest: Path = MANIFEST):
    return json.loads(manifest.read_text())["repos"]


def git_dir(mirrors: Path, repo: str) -> Path:
    d = mirrors / repo.replace("/", "+") / "repo"
    return d / ".git" if (d / ".git").is_dir() else d


def materialize(mirrors: Path, out: Path, manifest: Path = MANIFEST) -> int:
    missing = 0
    for entry in load(manifest):
        gd = git_dir(mirrors, entry["repo"])
        if not gd.is_dir():
            print(f"missing mirror: {entry['repo']} (fetch it first)", file=sys.stderr)
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("materialize")
    m.add_argument("--mirrors", type=Path, default=Path(os.environ.get("AMPFIX_MIRRORS", "/work/.mirror")))
    m.add_argument("--out", type=Path, required=True)
    sub.add_parser("list")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        for e in load():
            print(f"{e['repo']:55} {e['commit'][:10]} {len(e['paths']):4} files")
        return 0
    return 1 if materialize(args.mirrors, args.out) else 0


if __name__ == "__main__":
    sys.exit(main())
