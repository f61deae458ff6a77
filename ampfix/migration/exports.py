"""Names a module binds by importing apex that another module of the project imports from it.

``try: from apex.normalization.fused_layer_norm import FusedLayerNorm as BertLayerNorm / except
ImportError: class BertLayerNorm(nn.Module): ...`` in ``modeling_bert.py``, and ``from
.modeling_bert import BertLayerNorm as LayerNorm`` in ``modeling_gpt2.py`` (transformers 1.x and
its many copies): once AMP105 rewrote the module's own uses, the import read nothing there and went
with its fallback, and the other module's import failed.  The plan names such bindings in the fact
``"apex-exported"`` of the module; the apex rules leave their imports (and the fallbacks) where
they are.  A file checked on its own is planned alone: a file under the root that names the
binding counts as importing it (:meth:`ampfix.project.graph.Project.imported_from`).
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional

from ampfix.model.semantic import walk
from ampfix.project.plan import FilePlan


def apex_bindings(tree) -> List[str]:
    """The names module-level code binds by importing from apex (``from apex... import X as Y``:
    ``Y``; ``import apex``: ``apex``), at the top or inside a module-level ``try``/``if``."""
    out = []
    for st in walk(tree):
        if isinstance(st, ast.ImportFrom) and not st.level and (st.module or "").split(".")[0] == "apex":
            out.extend(a.asname or a.name for a in st.names if a.name != "*")
        elif isinstance(st, ast.Import):
            out.extend((a.asname or a.name).split(".")[0] for a in st.names if a.name.split(".")[0] == "apex")
    return sorted(set(out))


def _relative_target(path: str, imp: ast.ImportFrom) -> Optional[Path]:
    """The file ``from .modeling_bert import X`` in ``path`` names, where it exists."""
    folder = Path(path).resolve().parent
    for _ in range(imp.level - 1):
        folder = folder.parent
    parts = (imp.module or "").split(".") if imp.module else []
    for cand in (folder.joinpath(*parts).with_suffix(".py") if parts else None,
                 folder.joinpath(*parts, "__init__.py")):
        if cand is not None and cand.is_file():
            return cand.resolve()
    return None


def _stem(m) -> str:
    """The last part of the dotted name ``m`` is imported by: its file's stem, or its package's
    folder for an ``__init__.py``."""
    p = Path(m.path)
    return p.parent.name if p.name == "__init__.py" else p.stem


def _names_module(module: Optional[str], stem: str) -> bool:
    """``from X import ...`` with ``X``'s last dotted part ``stem``."""
    return bool(module) and module.split(".")[-1] == stem


def imported_elsewhere(project, m, name: str) -> bool:
    """Whether another module takes ``name`` from ``m`` (``from .modeling_bert import
    BertLayerNorm``, ``from modeling import BertLayerNorm``): an import of the name from a module
    whose dotted name ends in ``m``'s (a relative one: that names ``m``'s file, or a file that
    cannot be found), in a module of the run or a file under the root not read for it.  Copies of
    one modeling file in several packages each keep their own; ``from torch.nn.parallel import
    DistributedDataParallel`` elsewhere is no import of ``m``'s."""
    stem = _stem(m)
    project.read_mentioning(name)
    for path in project.mentioned_elsewhere(name):
        imports = project.from_imports_of(path)
        if imports is None:
            return True  # cannot be read: it may import it
        for module, level, names in imports:
            if name in names and (_names_module(module, stem) or (level and not module)):
                return True
    mine = Path(m.path).resolve()
    for other in list(project.modules.values()):
        if other is m or name not in other.src.text:
            continue
        for st in walk(other.tree, into_functions=True):
            if not (isinstance(st, ast.ImportFrom) and any(a.name == name for a in st.names)):
                continue
            if st.level:
                target = _relative_target(other.path, st)
                if target is None or target == mine:
                    return True
                continue
            if not _names_module(st.module, stem):
                continue
            found = project.module_named(st.module or "")
            if found is None or found is m:
                return True
    return False


def plan(project) -> Dict[str, FilePlan]:
    out: Dict[str, FilePlan] = {}
    for m in list(project.modules.values()):  # (the lookups read more files into the project)
        if "apex" not in m.src.text or not m.editable:
            continue
        names = [n for n in apex_bindings(m.tree) if imported_elsewhere(project, m, n)]
        if names:
            out[m.path] = FilePlan(m.path, facts={"apex-exported": ",".join(names)})
    return out
