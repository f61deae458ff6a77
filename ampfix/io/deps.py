"""A project's dependency and environment files: the torch it pins, and where apex is named.

Read: ``requirements*.txt`` (also under ``requirements/``), ``pyproject.toml`` (PEP 621
dependencies and optional dependencies, Poetry), ``setup.cfg`` (``install_requires``),
``setup.py`` (its text), ``environment.yml`` / ``environment.yaml`` (conda), ``Dockerfile*``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

REQUIREMENTS_GLOBS = ("requirements*.txt", "requirements/*.txt", "requirements*.in", "*requirements.txt")
FILES = ("pyproject.toml", "setup.cfg", "setup.py", "environment.yml", "environment.yaml")
_TORCH = re.compile(r"""(?:^|[\s"'\[,(])(?:torch|pytorch)\s*(?:\[[^\]]*\])?\s*(===|==|>=|~=|>|=)\s*v?([0-9]+)\.([0-9]+)""",
                    re.M | re.I)
#: a line that names the apex package: a requirement, a conda pip entry, a quoted name in setup.py
_APEX_REQ = re.compile(r"""^\s*(?:-\s*)?["']?apex\b[^A-Za-z0-9_.-]""", re.I)
_APEX_GIT = re.compile(r"github\.com[/:]NVIDIA/apex", re.I)


@dataclass(frozen=True)
class Finding:
    """A line of a dependency or environment file that names apex."""

    path: str
    line: int  # 1-based
    col: int  # 1-based
    text: str
    kind: str  # "requirement" (an entry a tool can remove) | "dockerfile" | "other"


def dependency_files(root: Path) -> List[Path]:
    out: List[Path] = []
    for pattern in REQUIREMENTS_GLOBS:
        out.extend(p for p in sorted(root.glob(pattern)) if p.is_file())
    for name in FILES:
        p = root / name
        if p.is_file():
            out.append(p)
    out.extend(p for p in sorted(root.glob("Dockerfile*")) if p.is_file())
    out.extend(p for p in sorted(root.glob("docker/Dockerfile*")) if p.is_file())
    seen, uniq = set(), []
    for p in out:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            uniq.append(p)
    return uniq


def find_torch_pin(root: Optional[Path]) -> Optional[Tuple[Tuple[int, int], str]]:
    """The torch release the project pins (the lowest lower bound found) and where."""
    if root is None:
        return None
    best = None
    for path in dependency_files(root):
        if path.name.startswith("Dockerfile"):
            continue
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        runtime = _runtime_requirements(path.name, text)
        for m in _TORCH.finditer(text):
            major, minor = int(m.group(2)), int(m.group(3))
            if major > 3:  # not a torch release (a CUDA version, a date)
                continue
            line = text.count("\n", 0, m.start()) + 1
            if runtime is not None and not any(_TORCH.search(" " + r) and m.group(0).strip(" \"'[,(") in r
                                               for r in runtime):
                continue  # an optional extra, a dev or build requirement: not what the code runs on
            version = (major, minor)
            src = f"{path.name}:{line}: {m.group(0).strip(chr(34) + chr(39) + ' [,(')}"
            if best is None or version < best[0]:
                best = (version, src)
    return best


def _runtime_requirements(name: str, text: str) -> Optional[List[str]]:
    """The run-time requirement strings of a pyproject.toml ([project] dependencies, Poetry's
    dependencies) or setup.cfg (install_requires), read as data; None for the other files, whose
    every line is a requirement of the environment.  Optional extras (``verify = ["torch>=2.0"]``),
    dependency groups and build requirements are left out."""
    if name == "pyproject.toml":
        try:
            import tomllib
        except ImportError:  # pragma: no cover - Python < 3.11
            import tomli as tomllib
        try:
            doc = tomllib.loads(text)
        except Exception:
            return []
        project = doc.get("project") if isinstance(doc.get("project"), dict) else {}
        reqs = [r for r in project.get("dependencies") or [] if isinstance(r, str)]
        poetry = ((doc.get("tool") or {}).get("poetry") or {}).get("dependencies") or {}
        for key, spec in poetry.items() if isinstance(poetry, dict) else ():
            if isinstance(spec, str):
                reqs.append(f"{key}=={spec.lstrip('^~=')}" if spec[:1].isdigit() or spec[:1] in "^~"
                            else f"{key}{spec}")
            elif isinstance(spec, dict) and isinstance(spec.get("version"), str):
                v = spec["version"]
                reqs.append(f"{key}=={v.lstrip('^~=')}" if v[:1].isdigit() or v[:1] in "^~" else f"{key}{v}")
        return reqs
    if name == "setup.cfg":
        import configparser

        cp = configparser.ConfigParser(interpolation=None)
        try:
            cp.read_string(text)
        except configparser.Error:
            return []
        value = cp.get("options", "install_requires", fallback="")
        return [line.strip() for line in value.splitlines() if line.strip()]
    return None


def apex_findings(root: Path) -> List[Finding]:
    """Every line of the project's dependency and environment files that names NVIDIA apex."""
    out: List[Finding] = []
    for path in dependency_files(root):
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        docker = path.name.startswith("Dockerfile")
        for i, line in enumerate(lines, start=1):
            stripped = line.split("#", 1)[0] if not docker else line
            if docker:
                if _APEX_GIT.search(line) or re.search(r"\bapex\b", line, re.I) and re.search(
                        r"(pip|git|cd|install|clone)", line):
                    out.append(Finding(str(path), i, 1 + len(line) - len(line.lstrip()), line.strip(), "dockerfile"))
                continue
            if _APEX_GIT.search(stripped) or _APEX_REQ.search(stripped + " ") or re.search(
                    r"""["']apex\b[^A-Za-z0-9_.-]""", stripped):
                kind = "requirement" if path.suffix in (".txt", ".in", ".yml", ".yaml", ".toml", ".cfg") else "other"
                col = 1 + len(line) - len(line.lstrip())
                out.append(Finding(str(path), i, col, line.strip(), kind))
    return out


def requirement_removal(path: Path, lines_to_drop: Iterable[int]) -> Optional[str]:
    """The text of ``path`` without the given lines (1-based); None when it would not stay a
    well-formed file of its kind (the line is not a whole entry)."""
    drop = set(lines_to_drop)
    text = path.read_text(encoding="utf-8")
    keep = [ln for i, ln in enumerate(text.splitlines(keepends=True), start=1) if i not in drop]
    out = "".join(keep)
    if path.suffix == ".toml":
        try:
            import tomllib
        except ImportError:  # pragma: no cover
            import tomli as tomllib
        try:
            tomllib.loads(out)
        except Exception:
            return None
    return out
