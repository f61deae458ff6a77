"""Every rule's VALID and INVALID examples are its tests (Fixit-style)."""
import pytest

from ampfix.registry import all_rules
from ampfix.testing import check_invalid, check_valid

VALID = [pytest.param(r, i, id=f"{r.code}-valid-{i}") for r in all_rules() for i in range(len(r.VALID))]
INVALID = [pytest.param(r, i, id=f"{r.code}-invalid-{i}") for r in all_rules() for i in range(len(r.INVALID))]


@pytest.mark.parametrize("rule,index", VALID)
def test_valid(rule, index):
    check_valid(rule, rule.VALID[index])


@pytest.mark.parametrize("rule,index", INVALID)
def test_invalid(rule, index):
    check_invalid(rule, rule.INVALID[index])


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_rule_is_documented(rule):
    doc = rule.documentation()
    for section in ("## What it does", "## Why is this bad?", "## Example", "## Use instead"):
        assert section in doc, f"{rule.code} lacks {section}"
    assert rule.code.startswith("AMP") and len(rule.code) == 6
    assert rule.name and rule.summary and rule.triggers
    assert rule.INVALID and rule.VALID, f"{rule.code} needs VALID and INVALID examples"
    assert rule.fix_kind in (None, "safe", "unsafe", "sometimes")


def test_codes_and_names_unique():
    rules = all_rules()
    assert len({r.code for r in rules}) == len(rules)
    assert len({r.name for r in rules}) == len(rules)
