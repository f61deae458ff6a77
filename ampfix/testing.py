"""Running a rule's VALID/INVALID examples (used by the test suite; handy for rule authors)."""
from __future__ import annotations

from typing import List, Tuple

from ampfix.engine.check import check_source
from ampfix.rule import Example
from ampfix.model.settings import Settings


def run_example(rule: type, example: Example) -> Tuple[List, str]:
    """Diagnostics of ``rule`` on the example, and the code after its fixes."""
    if getattr(rule, "files", None):
        return _run_file_example(rule, example)
    settings = Settings().with_overrides(**example.settings)
    data = example.code.encode("utf-8")
    checked = check_source(data, "example.py", [rule], settings)
    fixed = check_source(data, "example.py", [rule], settings, fix="unsafe" if example.unsafe else "safe")
    return checked.diagnostics, fixed.fixed if fixed.fixed is not None else example.code


def check_valid(rule: type, example: Example) -> None:
    diags, _ = run_example(rule, example)
    assert not diags, f"{rule.code} reported on a VALID example:\n{example.code}\n" + "\n".join(
        f"{d.line}:{d.col} {d.message}" for d in diags)


def check_invalid(rule: type, example: Example) -> None:
    diags, fixed = run_example(rule, example)
    assert [d.code for d in diags] == [rule.code] * example.count, (
        f"{rule.code}: expected {example.count} report(s), got {len(diags)} on:\n{example.code}\n"
        + "\n".join(f"{d.line}:{d.col} {d.code} {d.message}" for d in diags))
    if example.message is not None:
        assert any(example.message in d.message for d in diags), (
            f"{rule.code}: no message contains {example.message!r}: {[d.message for d in diags]}")
    if example.expected is not None:
        assert fixed == example.expected, f"{rule.code} fix:\n--- got\n{fixed}\n--- expected\n{example.expected}"
        # idempotent: fixing the fixed code again changes nothing
        again, refixed = run_example(rule, Example(fixed, settings=example.settings, unsafe=example.unsafe,
                                                          filename=example.filename, project=example.project))
        assert refixed == fixed, f"{rule.code}: second fix pass changed the code again"


def _run_file_example(rule: type, example: Example) -> Tuple[List, str]:
    """A file rule's example: the file in a temporary project with its Python files."""
    import tempfile
    from pathlib import Path

    from ampfix.engine import datafiles

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / example.filename).write_text(example.code)
        python = {}
        for name, text in example.project.items():
            (root / name).write_text(text)
            python[str(root / name)] = text
        files = [root / example.filename]
        checked = datafiles.check(files, lambda p: [rule.code], [rule], python, [tmp], None)[0]
        fixed = datafiles.check(files, lambda p: [rule.code], [rule], python, [tmp], "safe")[0]
    return checked.diagnostics, fixed.fixed if fixed.fixed is not None else example.code
