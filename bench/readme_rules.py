"""Rewrite the rule table in README.md from the registry (tests/test_readme.py checks it)."""
from pathlib import Path

from ampfix.registry import all_rules

README = Path(__file__).resolve().parents[1] / "README.md"


def main() -> None:
    lines = README.read_text(encoding="utf-8").splitlines(keepends=True)
    rows = [f"| {r.code} | {r.name} | {r.fix_kind or '-'} | {'yes' if r.default else 'no'} | {r.summary} |\n"
            for r in all_rules()]
    first = next(i for i, l in enumerate(lines) if l.startswith("| AMP"))
    last = max(i for i, l in enumerate(lines) if l.startswith("| AMP"))
    README.write_text("".join(lines[:first] + rows + lines[last + 1:]), encoding="utf-8")


if __name__ == "__main__":
    main()
