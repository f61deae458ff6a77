"""Access to the rules registered in ``ampfix.rules`` (the engine knows none by name)."""
from __future__ import annotations

from functools import lru_cache
from typing import Dict, List


@lru_cache(maxsize=None)
def all_rules() -> List[type]:
    from ampfix.rules import RULES

    return sorted(RULES, key=lambda r: r.code)


@lru_cache(maxsize=None)
def rules_by_code() -> Dict[str, type]:
    return {r.code: r for r in all_rules()}
