"""Crash-freedom over a large real corpus: the Python sources of the installed torch package.

    python bench/crash_corpus.py [--sample N] [--seed S] [--out bench/results/crash_corpus.json]

For every file: `check --select ALL` and a migrate (fixes applied in memory, never written):
no internal error, every fixed text parses, a second migrate changes nothing.  Prints and
writes the figures (files, seconds, internal errors, non-parsing fixes, non-idempotent files).
"""
import argparse
import ast
import json
import os
import random
import sys
import time

from ampfix.engine.check import check_source
from ampfix.registry import all_rules
from ampfix.model.settings import Settings


def torch_sources():
    import importlib.util

    spec = importlib.util.find_spec("torch")
    root = os.path.dirname(spec.origin)
    out = []
    for d, _, files in os.walk(root):
        out.extend(os.path.join(d, f) for f in files if f.endswith(".py"))
    return sorted(out)


def run(paths):
    rules = all_rules()
    st = Settings()
    figures = {"files": 0, "internal_errors": [], "fixes_that_do_not_parse": [], "not_idempotent": [],
               "files_fixed": 0}
    t0 = time.perf_counter()
    for p in paths:
        with open(p, "rb") as fh:
            data = fh.read()
        figures["files"] += 1
        try:
            check_source(data, p, rules, st)
            r = check_source(data, p, rules, st, fix="unsafe")
        except Exception as exc:  # noqa: BLE001 - what this bench looks for
            figures["internal_errors"].append(f"{p}: {type(exc).__name__}: {exc}")
            continue
        if any(d.code == "AMP001" and "internal" in d.message for d in r.diagnostics):
            figures["internal_errors"].append(p)
        if r.changed:
            figures["files_fixed"] += 1
            try:
                ast.parse(r.fixed)
            except SyntaxError as exc:
                figures["fixes_that_do_not_parse"].append(f"{p}: {exc}")
                continue
            again = check_source(r.fixed_bytes, p, rules, st, fix="unsafe")
            if again.changed:
                figures["not_idempotent"].append(p)
    figures["seconds"] = round(time.perf_counter() - t0, 1)
    return figures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sample", type=int, default=0, help="check N files chosen at random (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out")
    a = ap.parse_args()
    paths = torch_sources()
    if a.sample:
        paths = random.Random(a.seed).sample(paths, min(a.sample, len(paths)))
    fig = run(paths)
    import torch

    fig["torch"] = torch.__version__
    fig["command"] = "python bench/crash_corpus.py" + (f" --sample {a.sample}" if a.sample else "")
    print(json.dumps({k: (v if not isinstance(v, list) else len(v)) for k, v in fig.items()}, indent=1))
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(fig, fh, indent=1)
    return 1 if fig["internal_errors"] or fig["fixes_that_do_not_parse"] or fig["not_idempotent"] else 0


if __name__ == "__main__":
    sys.exit(main())
