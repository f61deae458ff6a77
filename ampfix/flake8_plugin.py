"""flake8 plugin: ampfix's diagnostics in editors and CI set-ups that run flake8.

Registered as the ``AMP`` extension (``flake8 --select AMP``); the rules, ``[tool.ampfix]``
settings and ``# noqa`` work as in ``ampfix check``.  Each file is checked on its own (a
migration planned across modules is ``ampfix check``'s job).
"""
from __future__ import annotations

from typing import Iterator, Sequence, Tuple

from ampfix.version import __version__


class AmpfixChecker:
    name = "ampfix"
    version = __version__

    def __init__(self, tree, filename: str = "stdin", lines: Sequence[str] = ()) -> None:
        self.filename = filename
        self.lines = list(lines)

    def _codes(self):
        from pathlib import Path

        from ampfix.io.config import load_config

        start = Path(self.filename).resolve().parent if self.filename not in ("stdin", "-") else Path.cwd()
        cfg = load_config(None, start)
        return cfg, cfg.codes_for(Path(self.filename), cfg.selected_codes())

    def run(self) -> Iterator[Tuple[int, int, str, type]]:
        from ampfix.engine.check import check_source
        from ampfix.registry import rules_by_code

        if self.lines:
            data = "".join(self.lines).encode("utf-8")
        else:
            with open(self.filename, "rb") as fh:
                data = fh.read()
        cfg, codes = self._codes()
        result = check_source(data, self.filename, [rules_by_code()[c] for c in codes], cfg.settings)
        for d in result.diagnostics:
            if d.code in ("AMP000", "AMP001"):
                continue  # flake8 reports syntax errors itself (E999)
            mark = " [*]" if d.fix == "safe" else ""
            yield d.line, d.col - 1, f"{d.code}{mark} {d.message}", type(self)
