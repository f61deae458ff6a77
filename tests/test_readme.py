"""The README's rule table matches the registry, so the docs never drift."""
from pathlib import Path

from ampfix.registry import all_rules

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def test_rule_table_matches_registry():
    rows = [line for line in README.splitlines() if line.startswith("| AMP")]
    expected = [f"| {r.code} | {r.name} | {r.fix_kind or '-'} | {'yes' if r.default else 'no'} | {r.summary} |"
                for r in all_rules()]
    assert rows == expected


def quick_start():
    block = README.split("## Quick start", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_quick_start_is_two_commands_and_ci_runs_the_second_verbatim():
    ci = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text().splitlines()
    first, second = quick_start()
    assert first.startswith("pip install .") and "ampfix check fixtures/" in first
    assert second.endswith("python -m pytest -q") and "torch==2.13.0" in second
    assert second in ci
