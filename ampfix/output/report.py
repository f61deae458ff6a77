"""Turning results into text: concise, full, json, github; diffs and the migrate report."""
from __future__ import annotations

import difflib
import json
from collections import Counter
from typing import Dict, List, Sequence, TextIO

from ampfix.version import __version__
from ampfix.model.diagnostic import Diagnostic, FileResult

FORMATS = ("concise", "full", "json", "github", "sarif", "gitlab")
#: where each rule's documentation lives (relative to the repository; ``ampfix explain CODE`` prints it)
DOCS = "docs/rules.md"


def doc_url(code: str) -> str:
    return f"{DOCS}#{code.lower()}"
JSON_SCHEMA_VERSION = 1


def _mark(d: Diagnostic) -> str:
    return " [*]" if d.fix == "safe" else (" [unsafe fix]" if d.fix == "unsafe" else "")


def use_color(stream) -> bool:
    """Colour on a terminal; never in a pipe or file; NO_COLOR and FORCE_COLOR (no-color.org,
    force-color.org) decide first."""
    import os

    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


BOLD, RED, CYAN, RESET = "\x1b[1m", "\x1b[31m", "\x1b[36m", "\x1b[0m"


def concise(d: Diagnostic, color: bool = False) -> str:
    if not color:
        return f"{d.where}: {d.code}{_mark(d)} {d.message}"
    mark = f" {CYAN}{_mark(d).strip()}{RESET}" if d.fix else ""
    return f"{BOLD}{d.where}{RESET}: {BOLD}{RED}{d.code}{RESET}{mark} {d.message}"


def full(d: Diagnostic, lines: List[str]) -> str:
    out = [f"{d.code} {d.name}: {d.message}", f"  --> {d.where}"]
    if d.cell is None and 1 <= d.line <= len(lines):
        src = lines[d.line - 1].rstrip("\r\n")
        gutter = str(d.line)
        pad = " " * len(gutter)
        width = (d.end_col - d.col) if d.end_line == d.line else len(src) - (d.col - 1)
        out += [f"{pad} |", f"{gutter} | {src}", f"{pad} | {' ' * (d.col - 1)}{'^' * max(1, width)}"]
    if d.fix_description:
        kind = "fix" if d.fix == "safe" else "unsafe fix"
        out.append(f"  = help ({kind}): {d.fix_description}")
    return "\n".join(out) + "\n"


def github(d: Diagnostic) -> str:
    msg = f"{d.code} {d.message}".replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return (f"::error title=ampfix ({d.code}),file={d.path},line={d.line},col={d.col},"
            f"endLine={d.end_line},endColumn={d.end_col}::{msg}")


def as_json(results: Sequence[FileResult], diags: Sequence[Diagnostic]) -> str:
    """The documented JSON schema (version 1); see README 'JSON output'."""
    doc = {
        "schema": JSON_SCHEMA_VERSION,
        "ampfix_version": __version__,
        "diagnostics": [
            {
                "code": d.code,
                "name": d.name,
                "message": d.message,
                "path": d.path,
                "location": {"line": d.line, "column": d.col},
                "end_location": {"line": d.end_line, "column": d.end_col},
                "fix": None if d.fix is None else {"applicability": d.fix, "message": d.fix_description},
                "url": doc_url(d.code),
                **({"cell": d.cell} if d.cell is not None else {}),
            }
            for d in diags
        ],
        "files_checked": len(results),
        "summary": summary_counts(diags),
    }
    return json.dumps(doc, indent=2)


def summary_counts(diags: Sequence[Diagnostic]) -> Dict[str, int]:
    return {
        "problems": len(diags),
        "fixable": sum(d.fix == "safe" for d in diags),
        "unsafe_fixable": sum(d.fix == "unsafe" for d in diags),
    }


def summary_line(diags: Sequence[Diagnostic], unsafe_on: bool = False) -> str:
    if not diags:
        return "All checks passed!"
    c = summary_counts(diags)
    n = c["problems"]
    fixable = c["fixable"] + (c["unsafe_fixable"] if unsafe_on else 0)
    text = f"Found {n} problem{'s' if n != 1 else ''}"
    unsafe = c["unsafe_fixable"] if not unsafe_on else 0
    if fixable and unsafe:
        text += (f" ({fixable} fixable with 'ampfix migrate --write'; {unsafe} more with "
                 "'ampfix migrate --write --unsafe-fixes')")
    elif fixable:
        text += f" ({fixable} fixable with 'ampfix migrate --write{' --unsafe-fixes' if unsafe_on else ''}')"
    elif unsafe:
        text += f" ({unsafe} fixable with 'ampfix migrate --write --unsafe-fixes')"
    return text + "."


def show_fixes(diags: Sequence[Diagnostic]) -> str:
    """What the available fixes do, per rule (``check --show-fixes``)."""
    counts = Counter((d.code, d.fix, d.fix_description or d.message) for d in diags if d.fix)
    if not counts:
        return "No fixes available.\n"
    out = ["Fixes available (apply with 'ampfix migrate --write', adding --unsafe-fixes for the unsafe ones):"]
    for (code, kind, what), n in sorted(counts.items()):
        out.append(f"  {n:4d} x {code} [{'safe' if kind == 'safe' else 'unsafe'}] {what}")
    return "\n".join(out) + "\n"


def statistics(diags: Sequence[Diagnostic]) -> str:
    counts = Counter((d.code, d.name) for d in diags)
    fixable = {d.code for d in diags if d.fix == "safe"}
    rows = [f"{n:6d}  {code}  {'[*]' if code in fixable else '   '} {name}"
            for (code, name), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    return "\n".join(rows)


def statistics_json(diags: Sequence[Diagnostic]) -> str:
    """``--statistics --output-format json``: a count per rule, as ruff gives it."""
    counts = Counter((d.code, d.name) for d in diags)
    fixable = {d.code for d in diags if d.fix == "safe"}
    return json.dumps([{"code": code, "name": name, "count": n, "fixable": code in fixable}
                       for (code, name), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))], indent=2)


def unified_diff(result: FileResult) -> str:
    if not result.changed:
        return ""
    return "".join(
        difflib.unified_diff(
            result.original.splitlines(keepends=True),
            result.fixed.splitlines(keepends=True),
            fromfile=f"a/{result.path.lstrip('/')}",
            tofile=f"b/{result.path.lstrip('/')}",
        )
    )


def original_line(original: str, fixed: str):
    """``(line, col) -> (line, col)``: a position in ``fixed`` as a position in ``original``.
    A line the rewrite left alone keeps its column; a line it changed maps to the first line of
    what it replaced, column 1."""
    a, b = original.splitlines(), fixed.splitlines()
    spans = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()

    def where(line: int, col: int):
        i = line - 1
        for tag, a0, a1, b0, b1 in spans:
            if b0 <= i < b1:
                if tag == "equal":
                    return a0 + (i - b0) + 1, col
                if tag == "replace" and a1 - a0 == b1 - b0:
                    # the line changed: its column through the characters the fix left alone
                    old, new = a[a0 + (i - b0)], b[i]
                    c = col - 1
                    for t2, x0, x1, y0, y1 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
                        if y0 <= c < y1:
                            return a0 + (i - b0) + 1, (x0 + (c - y0) if t2 == "equal" else x0) + 1
                    return a0 + (i - b0) + 1, 1
                return min(a0, max(len(a) - 1, 0)) + 1, 1
        return line, col

    return where


def migrate_report(results: Sequence[FileResult], wrote: bool, out: TextIO) -> None:
    """Per file: rewritten (what), left for a person (why, where), untouched."""
    untouched = 0
    for r in results:
        if r.error:
            out.write(f"{r.path}: error: {r.error}\n")
            continue
        if not r.changed and not r.diagnostics:
            untouched += 1
            continue
        verb = "rewritten" if wrote else "would be rewritten"
        if r.changed:
            kinds = Counter(r.applied)
            out.write(f"{r.path}: {verb}: " + "; ".join(
                f"{k}{f' (x{n})' if n > 1 else ''}" for k, n in kinds.items()) + "\n")
        else:
            out.write(f"{r.path}: not rewritten\n")
        # a dry run leaves the file as it is: positions are given in it, not in the rewritten text
        where = original_line(r.original, r.fixed) if (r.changed and not wrote) else None
        for d in r.diagnostics:
            why = ""
            if d.fix == "unsafe":
                reason = (d.fix_description or "").partition("(unsafe fix: ")[2].rstrip(")")
                why = f"needs --unsafe-fixes ({reason}): " if reason else "needs --unsafe-fixes: "
            if d.cell is not None:
                at = d.where if where is None else _cell_in_original(d, r, where)
            else:
                line, col = (d.line, d.col) if where is None else where(d.line, d.col)
                at = f"{d.path}:{line}:{col}"
            out.write(f"  left for a person: {at}: {d.code} {why}{d.message}\n")
    if untouched:
        out.write(f"{untouched} file{'s' if untouched != 1 else ''} untouched.\n")


def _cell_in_original(d: Diagnostic, r: FileResult, where) -> str:
    """A notebook diagnostic of a dry run, in the notebook as it is: its line in the fixed cells'
    module text, through the diff, back to a cell and a line of the original."""
    from ampfix.io.notebook import MARKER, where as cell_of

    marker = next((no for no, text in enumerate(r.fixed.split("\n"), 1)
                   if (m := MARKER.match(text)) and int(m.group(1)) == d.cell), None)
    if marker is None:
        return d.where
    line, col = where(marker + d.line, d.col)
    cell, in_cell = cell_of(r.original, line)
    return f"{d.path}:cell {cell}:{in_cell}:{col}" if cell is not None else d.where


def _relative(path: str) -> str:
    """A path as code scanning wants it: relative to the working folder, with forward slashes."""
    import os

    try:
        rel = os.path.relpath(path)
    except ValueError:
        rel = path
    if rel.startswith(".."):
        rel = os.path.abspath(path)
    return rel.replace(os.sep, "/")


def as_sarif(results: Sequence[FileResult], diags: Sequence[Diagnostic]) -> str:
    """SARIF 2.1.0, as GitHub code scanning takes it (``github/codeql-action/upload-sarif``)."""
    from urllib.parse import quote

    from ampfix.registry import rules_by_code

    known = rules_by_code()
    codes = sorted({d.code for d in diags})
    index = {c: i for i, c in enumerate(codes)}
    rules = []
    for c in codes:
        r = known.get(c)
        summary = r.summary if r is not None else next(d.name for d in diags if d.code == c)
        entry = {"id": c, "name": r.name if r is not None else c, "shortDescription": {"text": summary},
                 "properties": {"documentation": doc_url(c)},  # helpUri must be absolute: an anchor here
                 "defaultConfiguration": {"level": "error" if c in ("AMP000", "AMP001") else "warning"}}
        if r is not None:
            entry["help"] = {"text": r.documentation(), "markdown": r.documentation()}
        rules.append(entry)
    out = []
    for d in diags:
        region = {"startLine": d.line, "startColumn": d.col}
        if d.end_line >= d.line:
            region["endLine"] = d.end_line
            if d.end_line > d.line or d.end_col > d.col:
                region["endColumn"] = d.end_col
        res = {"ruleId": d.code, "ruleIndex": index[d.code],
               "level": "error" if d.code in ("AMP000", "AMP001") else "warning",
               "message": {"text": d.message},
               "locations": [{"physicalLocation": {"artifactLocation": {"uri": quote(_relative(d.path))},
                                                   "region": region}}]}
        if d.fix:
            res["properties"] = {"fix": d.fix, "fixDescription": d.fix_description or ""}
        if d.cell is not None:
            res.setdefault("properties", {})["cell"] = d.cell
        out.append(res)
    doc = {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
           "runs": [{"tool": {"driver": {"name": "ampfix", "version": __version__,
                                         "rules": rules}},
                     "results": out}]}
    return json.dumps(doc, indent=2)


def as_gitlab(diags: Sequence[Diagnostic]) -> str:
    """GitLab Code Quality: a JSON array of issues with a stable fingerprint each."""
    import hashlib

    seen: Counter = Counter()
    out = []
    for d in diags:
        base = f"{d.code}:{_relative(d.path)}:{d.message}"
        seen[base] += 1  # the same problem twice in a file: both kept, told apart by order
        out.append({"description": f"{d.code} {d.message}", "check_name": d.code,
                    "fingerprint": hashlib.sha256(f"{base}:{seen[base]}".encode()).hexdigest(),
                    "severity": "blocker" if d.code in ("AMP000", "AMP001") else "major",
                    "location": {"path": _relative(d.path),
                                 "positions": {"begin": {"line": d.line, "column": d.col},
                                               "end": {"line": d.end_line, "column": d.end_col}}}})
    return json.dumps(out, indent=2)


def rules_markdown() -> str:
    """docs/rules.md: every rule's documentation under a heading its code names (the anchor
    that JSON, SARIF and GitLab output link to)."""
    from ampfix.registry import all_rules

    parts = ["# ampfix rules", "",
             "Generated by `ampfix rules --output-format markdown`; `ampfix explain CODE` prints one.", ""]
    for r in all_rules():
        fix = {"safe": "safe fix", "unsafe": "unsafe fix", "sometimes": "safe or unsafe fix, by case",
               None: "no automatic fix"}[r.fix_kind]
        parts += [f"## {r.code}", "", f"`{r.name}`: {r.summary}", "",
                  f"Fix: {fix}. On by default: {'yes' if r.default else 'no'}. Advice holds from torch {r.since}.",
                  "", "\n".join("#" + line if line.startswith("#") else line
                                 for line in r.documentation().strip().splitlines()), ""]
    return "\n".join(parts)


def write_diagnostics(results, diags, fmt: str, out: TextIO, color: bool = False) -> None:
    if fmt == "json":
        out.write(as_json(results, diags) + "\n")
        return
    if fmt == "sarif":
        out.write(as_sarif(results, diags) + "\n")
        return
    if fmt == "gitlab":
        out.write(as_gitlab(diags) + "\n")
        return
    sources: Dict[str, List[str]] = {}
    for d in diags:
        if fmt == "concise":
            out.write(concise(d, color) + "\n")
        elif fmt == "github":
            out.write(github(d) + "\n")
        else:
            if d.path not in sources:
                sources[d.path] = _read_lines(d.path)
            out.write(full(d, sources[d.path]) + "\n")


def _read_lines(path: str) -> List[str]:
    from ampfix.model.source import decode_text as decode

    try:
        with open(path, "rb") as fh:
            return decode(fh.read()).splitlines()
    except (OSError, ValueError):
        return []
