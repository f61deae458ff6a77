"""The README's rule table matches the registry, so the docs never drift."""
from pathlib import Path

from ampfix.registry import all_rules

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def test_rule_table_matches_registry():
    rows = [line for line in README.splitlines() if line.startswith("| AMP")]
    expected = [f"| {r.code} | {r.name} | {r.fix_kind or '-'} | {'yes' if r.default else 'no'} | {r.summary} |"
                for r in all_rules()]
    assert rows == expected


def test_test_command_is_what_ci_runs():
    ci = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    assert "python -m pytest -q" in README and "python -m pytest -q" in ci
