"""The parts of a run: its files joined wherever Python could import one from another.

A part is planned as a whole (a migration that spans modules is decided at once); parts are
independent of each other, so they are planned side by side and cached apart.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence

PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
# the markers of one installable project: its modules import each other by name from anywhere in
# it.  A checkout's `.git` alone marks where the run's paths are read from, not one package: a
# monorepo's top-level folders are projects of their own (a copy of `transformers` vendored in one
# is not what another imports)
PACKAGE_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg")


def project_root(paths: Sequence[str]) -> Optional[Path]:
    """The folder a run's modules are imported from: the nearest ancestor of the files given that
    holds a pyproject.toml, setup.py, setup.cfg or .git; else their common folder."""
    if not paths:
        return None
    absolute = [Path(p).resolve() for p in paths]
    try:
        common = Path(os.path.commonpath([str(p if p.is_dir() else p.parent) for p in absolute]))
    except ValueError:
        return None
    for d in [common, *common.parents]:
        if any((d / marker).exists() for marker in PROJECT_MARKERS):
            return d
    return common


_WORD = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")


def import_components(texts: Dict[str, bytes], root: Optional[Path] = None) -> "Parts":
    """The files of a run (resolved path -> bytes) joined wherever one may import another.

    A file joins another whose module name (its stem, or its package's folder) it names, when
    Python could import that one from it: from a folder above the first file whose folders down
    to the other it names too (``import pkg.mod``, ``from .mod import f``, ``pkg.mod.f``), or
    anywhere in the same project (an installed package, a src layout, a launcher's root), or,
    in a checkout, right in a folder that a ``sys.path`` edit names, from the file that makes the
    edit or imports the module that does (``import _init_paths``).  More joins only make a part larger; the planner also joins parts
    whose planning reads a file of another."""
    parts = Parts(texts)
    top = str(root.resolve()) if root is not None else None
    # a root that is not one package (a checkout's .git alone, or no marker: a folder of
    # checkouts) holds several projects: its top-level folders are told apart, and only
    # Python's own lookup, or a sys.path edit, joins across them
    marked = root is not None and any((root / m).exists() for m in PACKAGE_MARKERS)

    def project_of(path: str) -> Optional[str]:
        """The project that holds ``path``: "" under a marked root, else the top-level folder
        under the root (None: a file at the root itself, or outside it)."""
        if top is None or marked:
            return ""
        if not path.startswith(top + os.sep):
            return None
        rest = path[len(top) + 1:]
        return rest.split(os.sep, 1)[0] if os.sep in rest else None

    # module name -> project -> the files it names (a module's stem, a package's folder)
    by_name: Dict[bytes, Dict[Optional[str], List[Path]]] = {}
    projects = {}
    for path in texts:
        p = Path(path)
        projects[path] = project_of(path)
        name = (p.parent.name if p.stem == "__init__" else p.stem).encode("ascii", "replace")
        by_name.setdefault(name, {}).setdefault(projects[path], []).append(p)
    # in one project any file that names a module may import it: the files of one project
    # with one module name go together
    for groups in by_name.values():
        for proj, files in groups.items():
            if proj is not None:
                for other in files[1:]:
                    parts.join(str(files[0]), str(other))

    # in one checkout (a .git at the root) a sys.path edit reaches the folders it names; in a
    # folder of several checkouts it stays in its own project
    free = _path_editors(texts) if root is not None and (root / ".git").exists() else {}
    for path, data in texts.items():
        words = set(_WORD.findall(data))
        mine = projects[path]
        for name in words.intersection(by_name):
            for proj, files in by_name[name].items():
                if proj is not None and proj == mine:
                    parts.join(path, str(files[0]))
                    continue
                if path in free:
                    # the folders its sys.path edit names: a module right in one, or a package
                    for other in files:
                        folder = other.parent.parent if other.stem == "__init__" else other.parent
                        if folder.name.encode("utf-8", "replace") in free[path]:
                            parts.join(path, str(other))
                if proj is not None and proj.encode("ascii", "replace") not in words:
                    continue  # another project: importable only through its folder's name
                for other in files:  # Python's lookup: a folder above `path`, then named folders
                    folder = other.parent.parent if other.stem == "__init__" else other.parent
                    while True:
                        if path.startswith(os.path.join(str(folder), "")):
                            parts.join(path, str(other))
                            break
                        if folder.name.encode("ascii", "replace") not in words or folder == folder.parent:
                            break
                        folder = folder.parent
    return parts


_SYS_PATH = re.compile(rb"\bsys\.path\s*(?:\.\s*(?:append|insert|extend)\b|\[|\+=|=(?!=))")
_STRING = re.compile(rb"""["']([^"'\n]{1,200})["']""")
_IMPORTED = re.compile(rb"^[ \t]*(?:import|from)[ \t]+([A-Za-z_][A-Za-z0-9_.]*)", re.M)


def _path_editors(texts: Dict[str, bytes]) -> Dict[str, set]:
    """The files that edit ``sys.path``, or import by its bare name a module that does (the
    ``_init_paths`` of many repositories), each with the folder names its strings give
    (``sys.path.append("../input/severstal-src/")``, ``osp.join(this_dir, "..", "lib")``): Python
    may import from them what lies right in such a folder of the checkout."""
    editors = {}
    for path, data in texts.items():
        if _SYS_PATH.search(data):
            editors[path] = {c for s in _STRING.findall(data) for c in re.split(rb"[/\\]+", s)
                             if c and c not in (b".", b"..")}
    by_stem: Dict[bytes, set] = {}
    for p, comps in editors.items():
        if Path(p).stem != "__init__":
            by_stem.setdefault(Path(p).stem.encode("ascii", "replace"), set()).update(comps)
    free = dict(editors)
    if by_stem:
        for path, data in texts.items():
            for m in _IMPORTED.findall(data):
                comps = by_stem.get(m.split(b".")[0])
                if comps is not None:
                    free.setdefault(path, set()).update(comps)
    return free


class Parts:
    """Union-find over the files of a run."""

    def __init__(self, files) -> None:
        self.up = {f: f for f in files}

    def find(self, f: str) -> str:
        while self.up[f] != f:
            self.up[f] = self.up[self.up[f]]
            f = self.up[f]
        return f

    def join(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.up[max(ra, rb)] = min(ra, rb)

    def members(self, root: str) -> List[str]:
        return sorted(f for f in self.up if self.find(f) == root)


_NAMES_INIT = re.compile(rb"(?<![A-Za-z0-9_])(?:initialize|init)(?![A-Za-z0-9_])")


def part_keys(jobs, texts, digests, planned, key):
    """For the result cache: (path -> the key of its part's plan, for every file of a part that
    holds a planned file; part key -> a signature of the other parts' files that name
    ``initialize`` or ``init``, which a plan may read: is apex initialized anywhere)."""
    import hashlib

    named: Dict[str, str] = {}
    rtexts: Dict[str, bytes] = {}
    for p, _ in jobs:
        if not p.endswith(".py") or p not in texts:
            continue
        r = str(Path(p).resolve())
        if r not in named:
            named[r], rtexts[r] = p, texts[p]
    parts = import_components(rtexts, project_root([p for p, _ in jobs]))
    codes = dict(jobs)
    tops = sorted({parts.find(r) for r in (str(Path(p).resolve()) for p, _ in planned) if r in rtexts})
    naming = sorted(r for r, data in rtexts.items() if _NAMES_INIT.search(data))
    part_of: Dict[str, str] = {}
    outside: Dict[str, str] = {}
    members_of: Dict[str, List[str]] = {}
    for f in rtexts:
        members_of.setdefault(parts.find(f), []).append(f)
    for top in tops:
        members = sorted(members_of[top])
        k = key(sorted((named[m], tuple(codes[named[m]]), digests[named[m]]) for m in members))
        others = [(named[r], digests[named[r]]) for r in naming if parts.find(r) != top]
        outside[k] = hashlib.sha256(repr(others).encode("utf-8", "surrogatepass")).hexdigest()
        for m in members:
            part_of[named[m]] = k
    return part_of, outside, parts
