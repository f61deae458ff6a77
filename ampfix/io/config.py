"""``[tool.ampfix]`` in pyproject.toml (or ``ampfix.toml``), merged with command-line flags."""
from __future__ import annotations

import fnmatch
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Set

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ampfix.engine.codes import ENGINE_CODES
from ampfix.registry import all_rules
from ampfix.model.settings import DTYPES, TARGETS, Settings, parse_version

KEYS = {
    "select", "ignore", "extend-select", "per-file-ignores", "exclude", "extend-exclude",
    "target", "torch-version", "respect-gitignore", "unsafe-fixes", "extend", "dtype",
}


class ConfigError(Exception):
    """A configuration or usage problem: reported as one line, exit code 2."""


@dataclass
class Config:
    root: Path = field(default_factory=Path.cwd)
    source: Optional[Path] = None
    select: Optional[List[str]] = None
    extend_select: List[str] = field(default_factory=list)
    ignore: List[str] = field(default_factory=list)
    per_file_ignores: Dict[str, List[str]] = field(default_factory=dict)
    exclude: List[str] = field(default_factory=list)
    extend_exclude: List[str] = field(default_factory=list)
    respect_gitignore: bool = True
    unsafe_fixes: bool = False
    settings: Settings = field(default_factory=Settings)

    # -- rule selection ----------------------------------------------------------------------
    def selected_codes(self) -> List[str]:
        """As ruff resolves them: for each rule the most specific selector that names it wins
        (a code over a prefix over ``ALL``), and ``ignore`` wins a tie, so
        ``--select AMP301 --ignore AMP3`` keeps AMP301 and ``--select AMP3 --ignore AMP301``
        drops it."""
        for sels, origin in ((self.select or [], "select"), (self.extend_select, "extend-select"),
                             (self.ignore, "ignore")):
            expand(sels, origin=origin)  # unknown selectors are errors
        out = []
        for rule in all_rules():
            chosen = _specificity(rule.code, [*(self.select or []), *self.extend_select])
            if self.select is None and rule.default:
                chosen = max(chosen, 0)
            if chosen >= 0 and chosen > _specificity(rule.code, self.ignore):
                out.append(rule.code)
        return sorted(out)

    def codes_for(self, path: Path, selected: Sequence[str]) -> List[str]:
        drop: Set[str] = set()
        rel = _rel(path, self.root)
        for pattern, codes in self.per_file_ignores.items():
            if fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(path.name, pattern):
                drop |= set(expand(codes, origin=f"per-file-ignores[{pattern!r}]"))
        return [c for c in selected if c not in drop]

    @property
    def all_excludes(self) -> List[str]:
        return [*self.exclude, *self.extend_exclude]


def _rel(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def _specificity(code: str, selectors: Iterable[str]) -> int:
    """How specifically the selectors name ``code``: -1 not at all, 0 ``ALL``, else the length
    of the longest prefix that matches."""
    best = -1
    for sel in selectors:
        sel = str(sel).strip().upper()
        if sel == "ALL":
            best = max(best, 0)
        elif sel and code.startswith(sel):
            best = max(best, len(sel))
    return best


def expand(selectors: Iterable[str], origin: str = "select") -> List[str]:
    """Rule codes for selectors: ``ALL``, a prefix (``AMP3``) or a code; unknown ones are errors."""
    codes = [r.code for r in all_rules()]
    out: List[str] = []
    for sel in selectors:
        sel = str(sel).strip().upper()
        if not sel:
            continue
        hit = codes if sel == "ALL" else [c for c in codes if c.startswith(sel)]
        if not hit and sel in ENGINE_CODES:
            if origin == "ignore" or "ignore" in origin:
                raise ConfigError(f"{sel} in {origin}: the engine's codes are always on (a file that cannot be read "
                                  "or parsed is not checked at all); exclude the file instead")
            continue  # always on: selecting it changes nothing
        if not hit:
            raise ConfigError(f"unknown rule selector {sel!r} in {origin} (see 'ampfix rules')")
        out.extend(hit)
    return out


def find_config(start: Path) -> Optional[Path]:
    start = start.resolve()
    if start.is_file():
        start = start.parent
    for d in [start, *start.parents]:
        for name in ("ampfix.toml", "pyproject.toml"):
            f = d / name
            if f.is_file():
                if name == "ampfix.toml":
                    return f
                try:
                    text = f.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                try:
                    data = tomllib.loads(text)
                except tomllib.TOMLDecodeError as exc:
                    if "ampfix" in text:  # our configuration is in there: never run without it
                        raise ConfigError(f"{f}: invalid TOML: {exc}") from None
                    continue
                if "ampfix" in _tool_table(data, f):
                    return f
    return None


def project_dir(start: Path) -> Path:
    """The nearest folder at or above ``start`` that holds a project file (pyproject.toml,
    setup.py, setup.cfg, requirements.txt, .git)."""
    start = start.resolve()
    if start.is_file():
        start = start.parent
    for d in [start, *start.parents]:
        if any((d / m).exists() for m in ("pyproject.toml", "setup.py", "setup.cfg", "requirements.txt", ".git")):
            return d
    return start


def with_pinned_torch(cfg: "Config", start: Path) -> "Config":
    """When nothing set torch-version, the release the project's dependency files pin."""
    if cfg.settings.torch_version_source != "default":
        return cfg
    from ampfix.io.deps import find_torch_pin

    found = find_torch_pin(project_dir(start))
    if found is not None:
        version, source = found
        cfg.settings = cfg.settings.with_overrides(torch_version=version, torch_version_source=source)
    return cfg


def load_config(path: Optional[Path], start: Optional[Path] = None, _extending: tuple = ()) -> Config:
    """Load ``path`` (or search upwards from ``start``); defaults when none is found.  A file's
    ``extend = "../pyproject.toml"`` loads that one first."""
    if path is None:
        path = find_config(start or Path.cwd())
    if path is None:
        return Config(root=(start or Path.cwd()).resolve() if start and start.is_dir() else Path.cwd())
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    table = data if Path(path).name == "ampfix.toml" else _tool_table(data, path).get("ampfix", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.ampfix] must be a table, not {type(table).__name__} {table!r}")
    cfg = Config(root=Path(path).resolve().parent, source=Path(path))
    if "extend" in table:  # another configuration first, then this one over it (ruff's `extend`)
        base = table["extend"]
        if not isinstance(base, str):
            raise ConfigError(f"{path}: 'extend' must be the path of another pyproject.toml or ampfix.toml")
        base_path = (Path(path).resolve().parent / base).resolve()
        chain = _extending + (Path(path).resolve(),)
        if base_path in chain:
            raise ConfigError(f"{path}: 'extend' goes round in a circle ({base})")
        if not base_path.is_file():
            raise ConfigError(f"{path}: 'extend' names {base}, which does not exist")
        parent = load_config(base_path, _extending=chain)
        cfg.select, cfg.extend_select, cfg.ignore = parent.select, list(parent.extend_select), list(parent.ignore)
        cfg.per_file_ignores, cfg.exclude = dict(parent.per_file_ignores), list(parent.exclude)
        cfg.extend_exclude, cfg.respect_gitignore = list(parent.extend_exclude), parent.respect_gitignore
        cfg.unsafe_fixes, cfg.settings = parent.unsafe_fixes, parent.settings
        table = {k: v for k, v in table.items() if k != "extend"}
    apply_table(cfg, table, str(path))
    return cfg


def _tool_table(data: dict, path) -> dict:
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        if "ampfix" in str(tool):
            raise ConfigError(f"{path}: 'tool' must be a table holding [tool.ampfix]")
        raise ConfigError(f"{path}: 'tool' is {type(tool).__name__} {tool!r}, not a table (PEP 518); "
                          "ampfix cannot look for [tool.ampfix] in it")
    return tool


def _list(value, key, origin) -> List[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{origin}: '{key}' must be a list of strings")
    return list(value)


def apply_table(cfg: Config, table: dict, origin: str) -> None:
    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise ConfigError(f"{origin}: unknown key(s) in [tool.ampfix]: {', '.join(unknown)} "
                          f"(known: {', '.join(sorted(KEYS))})")
    if "select" in table:
        cfg.select = _list(table["select"], "select", origin)
        expand(cfg.select, f"{origin}: select")
    for key, attr in (("extend-select", "extend_select"), ("ignore", "ignore"),
                      ("exclude", "exclude"), ("extend-exclude", "extend_exclude")):
        if key in table:
            setattr(cfg, attr, _list(table[key], key, origin))
    expand(cfg.extend_select, f"{origin}: extend-select")
    expand(cfg.ignore, f"{origin}: ignore")
    if "per-file-ignores" in table:
        pfi = table["per-file-ignores"]
        if not isinstance(pfi, dict):
            raise ConfigError(f"{origin}: 'per-file-ignores' must be a table of glob = [codes]")
        cfg.per_file_ignores = {k: _list(v, f"per-file-ignores.{k}", origin) for k, v in pfi.items()}
        for k, v in cfg.per_file_ignores.items():
            expand(v, f"{origin}: per-file-ignores[{k!r}]")
    for key, attr in (("respect-gitignore", "respect_gitignore"), ("unsafe-fixes", "unsafe_fixes")):
        if key in table:
            if not isinstance(table[key], bool):
                raise ConfigError(f"{origin}: '{key}' must be true or false")
            setattr(cfg, attr, table[key])
    if "target" in table:
        cfg.settings = cfg.settings.with_overrides(target=check_target(table["target"], origin))
    if "dtype" in table:
        cfg.settings = cfg.settings.with_overrides(dtype=check_dtype(table["dtype"], origin))
    if "torch-version" in table:
        if not isinstance(table["torch-version"], str):
            raise ConfigError(f"{origin}: torch-version must be a string such as \"2.10\", not "
                              f"{type(table['torch-version']).__name__} {table['torch-version']!r} "
                              "(TOML reads 2.10 as the number 2.1)")
        cfg.settings = cfg.settings.with_overrides(torch_version=check_version(table["torch-version"], origin),
                                                   torch_version_source=f"{origin}: torch-version")


def check_dtype(value, origin="--dtype") -> str:
    if value not in DTYPES:
        raise ConfigError(f"{origin}: dtype must be one of {', '.join(DTYPES)}, not {value!r}")
    return value


def check_target(value, origin="--target") -> str:
    if value not in TARGETS:
        raise ConfigError(f"{origin}: target must be one of {', '.join(TARGETS)}, not {value!r}")
    return value


def check_version(value, origin="--torch-version"):
    try:
        return parse_version(str(value))
    except ValueError as exc:
        raise ConfigError(f"{origin}: {exc}") from None


def _csv(text) -> List[str]:
    if text is None:
        return []
    if isinstance(text, (list, tuple)):
        return [str(t).strip() for t in text if str(t).strip()]
    return [t for t in str(text).replace(" ", ",").split(",") if t]


def apply_overrides(cfg: Config, start: Path, *, select=None, extend_select=None, ignore=None, target=None,
                    torch_version=None, extend_exclude=(), respect_gitignore: bool = True,
                    origin: str = "--", dtype=None) -> Config:
    """Flags (the command line's, or an editor's initializationOptions) over a loaded
    configuration: they win over every file.  Lists or comma-separated strings."""
    if select is not None:
        cfg.select = _csv(select)
        if not expand(cfg.select, f"{origin}select") and not any(s.strip().upper() in ENGINE_CODES for s in cfg.select):
            raise ConfigError(f"{origin}select {select!r} selects no rule (give codes or prefixes, e.g. AMP1, or ALL)")
    if extend_select:
        cfg.extend_select += _csv(extend_select)
        expand(cfg.extend_select, f"{origin}extend-select")
    if ignore:
        cfg.ignore += _csv(ignore)
        expand(cfg.ignore, f"{origin}ignore")
    if target:
        cfg.settings = cfg.settings.with_overrides(target=check_target(target, f"{origin}target"))
    if dtype:
        cfg.settings = cfg.settings.with_overrides(dtype=check_dtype(dtype, f"{origin}dtype"))
    if torch_version:
        cfg.settings = cfg.settings.with_overrides(torch_version=check_version(torch_version, f"{origin}torch-version"),
                                                   torch_version_source=f"{origin}torch-version")
    else:
        cfg = with_pinned_torch(cfg, start)
    cfg.extend_exclude += list(extend_exclude or ())
    if not respect_gitignore:
        cfg.respect_gitignore = False
    return cfg
