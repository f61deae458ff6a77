"""The project: the modules one run looks at together (stub; the planner fills it in)."""
from __future__ import annotations

from typing import Dict, Optional, Set


class Project:
    def __init__(self, sources: Dict[str, object], settings, rules=()) -> None:
        self.sources = sources
        self.settings = settings
        self.rules = rules
        self.allowed_groups: Optional[Set[str]] = None
        self._plans: Dict[object, object] = {}

    @classmethod
    def single(cls, src, rules, settings) -> "Project":
        return cls({src.path: src}, settings, rules)

    def plan(self, planner):
        if planner not in self._plans:
            self._plans[planner] = planner(self)
        return self._plans[planner]


def plan_projects(jobs, settings, fix):
    """path -> the Project its migration was planned in (stub: every file on its own)."""
    return {}
