"""The codes the engine itself reports (no rule file has them): what each means, for `explain`,
the docs and the selectors.  They are always on: a file that cannot be read or parsed is not
checked at all, so silencing them would hide that."""
from __future__ import annotations

from typing import Dict, NamedTuple


class EngineCode(NamedTuple):
    code: str
    name: str
    summary: str
    doc: str


ENGINE_CODES: Dict[str, EngineCode] = {c.code: c for c in (
    EngineCode("AMP000", "syntax-error", "the file does not parse as Python (or a notebook as JSON)",
               "ampfix parses every file it is given with Python's own parser; a file that does not parse is "
               "reported at Python's line and column and nothing else is checked in it.  Fix the syntax error "
               "(or exclude the file: `extend-exclude`)."),
    EngineCode("AMP001", "io-error", "the file cannot be read or decoded",
               "A file that cannot be opened, is not a regular file (a FIFO), is not valid UTF-8 (or its "
               "coding cookie), or is larger than 10 MiB: it is named with the reason and the run goes on."),
    EngineCode("AMP002", "fix-failed", "a fix produced text that does not parse (a bug in ampfix)",
               "The fix is left out, the file keeps its text, and the other fixes are applied.  Please report "
               "it with the file."),
    EngineCode("AMP003", "noqa-unknown-code", "a `# noqa:` comment names an AMP code that no rule has",
               "`# noqa: AMP999` silences nothing: ampfix has no such rule (a typo, or a code from another "
               "version).  Name a code `ampfix rules` lists, or drop the comment.  Codes of other tools "
               "(E501, F401, ...) are theirs and not reported."),
)}
