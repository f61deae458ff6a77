"""Why the engine parses with Python's ``ast`` and not libcst: both parsers over the same files.

    pip install libcst
    python bench/parse_speed.py /tmp/corpus bench/results/parse_speed.json

Best of three passes over every file both parse; also whether libcst's round trip is exact
(ampfix gets the same exactness from text edits at positions: what it does not change stays
byte for byte)."""
import ast
import json
import pathlib
import platform
import sys
import time

import libcst


def main(folder: str, out: str) -> None:
    texts = []
    for f in sorted(pathlib.Path(folder).rglob("*.py")):
        try:
            t = f.read_text(encoding="utf-8")
            ast.parse(t)
            libcst.parse_module(t)
        except Exception:
            continue
        texts.append(t)

    def clock(fn):
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for t in texts:
                fn(t)
            best = min(best, time.perf_counter() - start)
        return best

    a, c = clock(ast.parse), clock(libcst.parse_module)
    fig = {"files": len(texts), "megabytes": round(sum(len(t) for t in texts) / 1e6, 2),
           "ast_parse_s": round(a, 2), "libcst_parse_s": round(c, 2), "ratio": round(c / a, 1),
           "libcst_round_trip_exact": all(libcst.parse_module(t).code == t for t in texts),
           "python": platform.python_version(), "libcst": __import__("importlib.metadata").metadata.version("libcst"),
           "command": "python bench/parse_speed.py /tmp/corpus bench/results/parse_speed.json"}
    pathlib.Path(out).write_text(json.dumps(fig, indent=1) + "\n")
    print(json.dumps(fig))


if __name__ == "__main__":
    main(*sys.argv[1:3])
