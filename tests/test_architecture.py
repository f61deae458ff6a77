"""The house: no import cycles among ampfix's modules, no module reaching into another's private
names, and docs/ARCHITECTURE.md naming every folder the package has."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"ampfix": ROOT / "ampfix", "ampfix.rules": ROOT / "rules"}


def modules():
    """module name -> parsed tree, for every module of the package (rules included)."""
    out = {}
    for prefix, folder in PACKAGES.items():
        for f in folder.rglob("*.py"):
            rel = f.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([prefix, *parts]) if parts else prefix
            if prefix == "ampfix" and parts[:1] == ["rules"]:
                continue
            out[name] = (ast.parse(f.read_text(encoding="utf-8")), f.name == "__init__.py")
    return out


def imports(name, tree, is_pkg, known):
    """(imported module, names taken from it) for each import of an ampfix module, lazy ones too:
    a cycle through a function-level import is still a cycle in the design."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known:
                    yield a.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod not in known:
                continue
            names = []
            for a in node.names:
                sub = f"{mod}.{a.name}"
                if sub in known:
                    yield sub, []
                else:
                    names.append(a.name)
            if names:
                yield mod, names


def graph():
    mods = modules()
    g = {m: set() for m in mods}
    taken = []
    for m, (tree, is_pkg) in mods.items():
        for target, names in imports(m, tree, is_pkg, mods):
            if target != m:
                g[m].add(target)
            taken.extend((m, target, n) for n in names)
    return g, taken


def cycles(g):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    g, _ = graph()
    assert cycles(g) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_takes_another_modules_private_names():
    _, taken = graph()
    private = [(m, t, n) for m, t, n in taken if n.startswith("_") and not n.startswith("__") and m != t]
    assert private == []


def test_architecture_doc_names_every_folder():
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    folders = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "ampfix").rglob("__init__.py")}
    missing = sorted(f for f in folders | {"rules"} if f"{f}/" not in doc)
    assert missing == []
