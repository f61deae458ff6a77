"""Resolved settings that rules may read (picklable, passed to worker processes)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Tuple

TARGETS = ("torch.amp", "torch.cuda.amp")
#: The half precision a migration writes: float16 (autocast + GradScaler) or bfloat16 (autocast alone).
DTYPES = ("float16", "bfloat16")


def parse_version(text: str) -> Tuple[int, int]:
    """``"2.1"``, ``"1.13.1"``, ``"2.3.0+cu121"`` -> ``(2, 1)``; raise ValueError otherwise."""
    core = str(text).split("+")[0].strip()
    parts = core.split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise ValueError(f"not a torch release: {text!r} (expected e.g. '2.4')")
    return int(parts[0]), int(parts[1])


@dataclass(frozen=True)
class Settings:
    #: What native spelling fixes write: "torch.amp" or "torch.cuda.amp"; None: what the torch
    #: release has (torch.amp from 2.3 on).
    target_setting: Optional[str] = None
    #: The torch release the code runs on; rules whose advice depends on it read it.
    torch_version: Tuple[int, int] = (2, 4)
    #: Where torch_version came from ("--torch-version", "requirements.txt: torch>=1.13", "default").
    torch_version_source: str = "default"
    #: The half precision migrations write: "float16" (a GradScaler scales the loss) or
    #: "bfloat16" (Ampere and newer: float32's range, no loss scaling, no GradScaler).
    dtype: str = "float16"
    #: Files larger than this (bytes) are skipped with a message.
    max_file_size: int = 10 * 1024 * 1024

    @property
    def target(self) -> str:
        if self.target_setting:
            return self.target_setting
        return "torch.amp" if self.torch_version >= (2, 3) else "torch.cuda.amp"

    def with_overrides(self, **kw) -> "Settings":
        if "target" in kw:
            kw["target_setting"] = kw.pop("target")
        if "torch_version" in kw and isinstance(kw["torch_version"], str):
            kw["torch_version"] = parse_version(kw["torch_version"])
        return replace(self, **kw)
