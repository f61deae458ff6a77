"""The project: the modules one run looks at together, and how they call each other.

A migration that spans functions and modules (``amp.initialize`` in a launcher, the loss
scaled in an engine module that receives the model and optimizer) is planned over a
:class:`Project`: the files given, plus the modules of the same tree that they import (read
only: a plan that must edit one of those is refused, and says so).

Modules are named the way Python would import them: from each file's folder (a script's
``sys.path[0]``), from the folder above its package (``__init__.py`` chains), and from the
project root.  A call is resolved to a function of the project when its name is bound by a
``def``, an import of a project module, ``self.method`` in a class, or a local bound to an
instance of a project class.
"""
from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ampfix.model.semantic import Model, dotted, walk
from ampfix.model.source import Source, SourceError

FUNC = (ast.FunctionDef, ast.AsyncFunctionDef)


class Function:
    """A function or method of a project module."""

    def __init__(self, module: "Module", node, qualname: str, cls=None, outer=None) -> None:
        self.module = module
        self.node = node
        self.qualname = qualname
        self.cls = cls  # the ClassDef it is a method of
        self.outer = outer  # the Function it is nested in (a closure)
        a = node.args
        self.positional = [x.arg for x in (*getattr(a, "posonlyargs", []), *a.args)]
        self.kwonly = [x.arg for x in a.kwonlyargs]
        self.vararg = a.vararg.arg if a.vararg else None
        self.kwarg = a.kwarg.arg if a.kwarg else None

    @property
    def is_method(self) -> bool:
        return self.cls is not None and bool(self.positional) and not any(
            dotted(d) in ("staticmethod", "classmethod") for d in self.node.decorator_list)

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"<{self.module.name or self.module.path}:{self.qualname}>"


class CallSite:
    """A call of a project function: ``node`` (ast.Call) in ``caller`` (None at module level)."""

    def __init__(self, node: ast.Call, module: "Module", caller: Optional[Function], callee: Function,
                 bound_self: bool, bound: Sequence[ast.expr] = ()) -> None:
        self.node = node
        self.module = module
        self.caller = caller
        self.callee = callee
        self.bound_self = bound_self  # self.m(...) / obj.m(...): the first parameter is implicit
        #: the positional arguments ``functools.partial`` bound before this call's
        #: (``backwards = partial(loss_backwards, self.fp16)`` ... ``backwards(loss, opt)``)
        self.bound = list(bound)

    @property
    def args(self) -> List[ast.expr]:
        """The positional arguments the callee receives, the partial's first."""
        return [*self.bound, *self.node.args]

    def argument(self, param: str) -> Optional[ast.expr]:
        """The expression this call passes for ``param`` (None if none or unknowable)."""
        call, f = self.node, self.callee
        for k in call.keywords:
            if k.arg == param:
                return k.value
        pos = f.positional[1:] if self.bound_self or (f.is_method and f.qualname.endswith(".__init__")) else f.positional
        for i, a in enumerate(self.args):
            if isinstance(a, ast.Starred):
                return None
            if i < len(pos) and pos[i] == param:
                return a
        return None


def _module_files(folder: Path, parts: List[str]) -> Tuple[Path, Path]:
    """The two files a dotted name's parts may be below ``folder``: a module, or a package."""
    return folder.joinpath(*parts).with_suffix(".py"), folder.joinpath(*parts, "__init__.py")


def _chosen_call(n: ast.AST) -> Optional[ast.Call]:
    """The call whose callee is a conditional expression with ``n`` as one of its choices."""
    p = getattr(n, "_p", None)
    while isinstance(p, ast.IfExp) and n is not p.test:
        c = getattr(p, "_p", None)
        if isinstance(c, ast.Call) and c.func is p:
            return c
        n, p = p, c
    return None


def _choices(e: ast.AST) -> List[ast.AST]:
    """What a conditional expression (``a if t else b if u else c``) may give."""
    return [*_choices(e.body), *_choices(e.orelse)] if isinstance(e, ast.IfExp) else [e]


def dispatch_pattern(call: ast.Call) -> Optional[Tuple[str, str]]:
    """``globals()["train_" + args.target](...)`` / ``globals().get("train_" + kind)(...)``: a call
    of the module's own function picked by name at run time, a constant prefix (or suffix, or
    both, an f-string's) around what picks it: (prefix, suffix); None for any other call."""
    f = call.func
    key = None
    if isinstance(f, ast.Subscript) and _is_globals(f.value):
        key = f.slice
    elif isinstance(f, ast.Call) and isinstance(f.func, ast.Attribute) and f.func.attr == "get" and \
            _is_globals(f.func.value) and len(f.args) == 1 and not f.keywords:
        key = f.args[0]
    if key is None:
        return None
    pre = suf = ""
    if isinstance(key, ast.BinOp) and isinstance(key.op, ast.Add):
        if isinstance(key.left, ast.Constant) and isinstance(key.left.value, str):
            pre = key.left.value
        if isinstance(key.right, ast.Constant) and isinstance(key.right.value, str):
            suf = key.right.value
        if bool(pre) == bool(suf):
            return None
    elif isinstance(key, ast.JoinedStr) and key.values:
        vals = key.values
        if isinstance(vals[0], ast.Constant):
            pre = vals[0].value
        if isinstance(vals[-1], ast.Constant) and len(vals) > 1:
            suf = vals[-1].value
        if len([v for v in vals if isinstance(v, ast.FormattedValue)]) != 1 or not (pre or suf):
            return None
    else:
        return None
    return pre, suf


def _accepts(a: ast.arguments, call: ast.Call) -> bool:
    """Whether a function with the parameters ``a`` can take the arguments of ``call`` (its
    positional count, its keywords); a call that spreads ``*x`` / ``**x`` is taken as fitting."""
    if any(isinstance(x, ast.Starred) for x in call.args) or any(k.arg is None for k in call.keywords):
        return True
    pos = [*getattr(a, "posonlyargs", []), *a.args]
    if len(call.args) > len(pos) and a.vararg is None:
        return False
    named = {p.arg for p in [*a.args, *a.kwonlyargs]}
    if a.kwarg is None and any(k.arg not in named for k in call.keywords):
        return False
    required = len(pos) - len(a.defaults)
    given = len(call.args) + sum(1 for k in call.keywords if k.arg in {p.arg for p in pos[len(call.args):required]})
    kw_required = {p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is None}
    return given >= required and kw_required <= {k.arg for k in call.keywords}


def _is_globals(e) -> bool:
    return isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id == "globals" and \
        not e.args and not e.keywords


def _partial_calls(n) -> Optional[List[ast.Call]]:
    """``alias = partial(f, a, b)`` (``n`` is ``f``) in a function (or the module) whose every other
    use of ``alias`` calls it: those calls, which call ``f`` with ``a, b`` first; None otherwise
    (the partial is handed on, stored, given keywords or reassigned: ``f`` is used as a value)."""
    p = getattr(n, "_p", None)
    if not (isinstance(p, ast.Call) and p.args and p.args[0] is n and not p.keywords
            and (dotted(p.func) or "") in ("partial", "functools.partial")
            and not any(isinstance(a, ast.Starred) for a in p.args)):
        return None
    st = getattr(p, "_p", None)
    if not (isinstance(st, ast.Assign) and st.value is p and len(st.targets) == 1
            and isinstance(st.targets[0], ast.Name)):
        return None
    alias = st.targets[0].id
    unit = st
    while unit is not None and not isinstance(unit, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        unit = getattr(unit, "_p", None)
    if unit is None:
        return None
    calls = []
    for x in walk(unit, into_functions=True):
        if isinstance(x, ast.Name) and x.id == alias and x is not st.targets[0]:
            q = getattr(x, "_p", None)
            if not (isinstance(x.ctx, ast.Load) and isinstance(q, ast.Call) and q.func is x):
                return None
            calls.append(q)
        elif isinstance(x, (ast.Global, ast.Nonlocal)) and alias in x.names:
            return None
    return calls


class Module:
    def __init__(self, path: str, src: Source, editable: bool = True) -> None:
        self.path = path
        self.src = src
        self.editable = editable
        self.name: Optional[str] = None  # dotted import name, when known
        self.names: Set[str] = set()  # every name it can be imported as
        self._sem: Optional[Model] = None
        #: the names a ``from <project module> import *`` binds here (set by the project)
        self.star_lookup = None
        self.functions: Dict[str, Function] = {}
        self.classes: Dict[str, ast.ClassDef] = {}
        self._indexed = False

    @property
    def tree(self) -> ast.Module:
        return self.src.tree

    @property
    def sem(self) -> Model:
        if self._sem is None:
            from ampfix.model.analysis import STAR_EXPORTS

            stars = STAR_EXPORTS
            if self.star_lookup is not None and "*" in self.src.text:
                for n in ast.walk(self.src.tree):
                    if isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names):
                        mod = "." * n.level + (n.module or "")
                        if mod not in stars:
                            names = self.star_lookup(self, mod)
                            if names:
                                stars = {**stars, mod: names}
            self._sem = Model(self.src.tree, stars)
        return self._sem

    def index(self) -> None:
        if self._indexed:
            return
        self._indexed = True
        self.sem  # parents and scopes

        def visit(body, prefix, cls, outer):
            for n in body:
                if isinstance(n, FUNC):
                    q = f"{prefix}{n.name}"
                    f = Function(self, n, q, cls, outer)
                    self.functions[q] = f
                    visit(n.body, q + ".<locals>.", None, f)
                elif isinstance(n, ast.ClassDef):
                    q = f"{prefix}{n.name}"
                    self.classes[q] = n
                    visit(n.body, q + ".", n, outer)
                else:
                    for field in ("body", "orelse", "finalbody"):
                        sub = getattr(n, field, None)
                        if isinstance(sub, list):
                            visit(sub, prefix, cls, outer)
                    for h in getattr(n, "handlers", ()) or ():
                        visit(h.body, prefix, cls, outer)

        visit(self.tree.body, "", None, None)
        self.by_node = {id(f.node): f for f in self.functions.values()}

    def by_last_name(self):
        """(name -> [(order, node)], name -> {alias}): the calls and loaded names of the module
        by the last name they end in (``f(...)``, ``x.f``), and ``from m import f as g`` aliases;
        built in one walk, for the call graph."""
        got = self.__dict__.get("_by_last")
        if got is None:
            nodes: Dict[str, list] = {}
            aliases: Dict[str, Set[str]] = {}
            for i, n in enumerate(walk(self.tree, into_functions=True)):
                t = type(n)
                if t is ast.Call:
                    f = n.func
                    last = f.id if type(f) is ast.Name else f.attr if type(f) is ast.Attribute else None
                    if last is not None:
                        nodes.setdefault(last, []).append((i, n))
                elif t is ast.Name:
                    if type(n.ctx) is ast.Load:
                        nodes.setdefault(n.id, []).append((i, n))
                elif t is ast.Attribute:
                    if type(n.ctx) is ast.Load:
                        nodes.setdefault(n.attr, []).append((i, n))
                elif t is ast.ImportFrom:
                    for a in n.names:
                        if a.asname:
                            aliases.setdefault(a.name, set()).add(a.asname)
            got = self._by_last = (nodes, aliases)
        return got

    def function_of(self, node) -> Optional[Function]:
        """The innermost project function holding ``node``."""
        self.index()
        p = node if isinstance(node, FUNC) else getattr(node, "_p", None)
        while p is not None:
            if isinstance(p, FUNC):
                return self.by_node.get(id(p))
            p = getattr(p, "_p", None)
        return None


def _package_root(path: Path) -> Tuple[Path, List[str]]:
    """(folder above the top package, [package, ..., module]) for a file."""
    parts = [path.stem] if path.name != "__init__.py" else []
    d = path.parent
    while (d / "__init__.py").is_file():
        parts.insert(0, d.name)
        d = d.parent
    return d, parts


class Project:
    """Modules read together.  ``sources`` maps path -> Source (parsed or not)."""

    def __init__(self, sources: Dict[str, Source], settings, rules=(), root: Optional[Path] = None,
                 load_more: bool = True, given: Iterable[str] = (), run_files: Iterable[str] = ()) -> None:
        self.settings = settings
        #: files named for this run (editable when loaded on demand): resolved path -> path as named
        self.given = {str(Path(p).resolve()): p for p in given}
        #: every file of the run (resolved), when this project is one part of it
        self.run_files: Set[str] = set(run_files) | set(self.given)
        #: files of the run outside this part that its planning turned out to import: the part
        #: is joined with theirs and planned again
        self.foreign: Set[str] = set()
        self.asked_other_parts = False
        self.rules = rules
        self.root = root
        self.load_more = load_more
        #: files a star import was read from without adding them to the run: resolved path -> tree
        self._peeked: Dict[str, Optional[ast.Module]] = {}
        self.allowed_groups: Optional[Set[str]] = None
        self.modules: Dict[str, Module] = {}
        self.by_name: Dict[str, Module] = {}
        self.all_by_name: Dict[str, List[Module]] = {}  # every module read for a name (copies in a monorepo)
        self.roots: List[Path] = []
        self._plans: Dict[object, object] = {}
        self._calls: Dict[int, List[CallSite]] = {}
        self._refs: Dict[int, List[ast.AST]] = {}
        self._indexed: Set[str] = set()
        #: files under the root not read for the run, each read, split into words and parsed once
        #: (mentioned_elsewhere): path -> its words; -> (the names it uses, its `from` imports), None
        #: where it does not parse; path -> its resolved path
        self._other_tokens: Dict[str, frozenset] = {}
        self._other_facts: Dict[str, Optional[tuple]] = {}
        self._resolved_paths: Dict[str, str] = {}
        for path, src in sources.items():
            self._add(path, src, editable=True)

    @classmethod
    def single(cls, src: Source, rules, settings) -> "Project":
        return cls({src.path: src}, settings, rules, load_more=False)

    # -- modules -----------------------------------------------------------------------------
    def _star_names(self, module: "Module", mod: str) -> Tuple[str, ...]:
        """The functions and classes ``from <mod> import *`` binds in ``module``, where ``mod`` is a
        module of the project (its ``__all__`` where it lists them, else its public defs): so a
        call of ``train_model`` there is the project's (UER-py's finetune scripts share one
        ``train_model`` that way), and what a package's ``__init__`` imports from its own modules;
        other globals it passes on are not followed.  A module not read yet is only peeked at:
        reading it here would read files in an order that changes what other names resolve to."""
        name = self.absolute(module, mod)
        target = self.loaded_named(name)
        if target is module:
            return ()
        tree = target.tree if target is not None else self._peek(module, name)
        if tree is None:
            return ()
        defs = [n.name for n in tree.body if isinstance(n, (FUNC, ast.ClassDef))]
        # a package's ``__init__`` passes on what it imports from its own modules
        # (``from .ppo_util import step``): ``from util import *`` binds those too
        defs += [a.asname or a.name for n in tree.body
                 if isinstance(n, ast.ImportFrom) and n.level and n.module for a in n.names if a.name != "*"]
        listed = None
        for n in tree.body:
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets) \
                    and isinstance(n.value, (ast.List, ast.Tuple)) and all(
                        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in n.value.elts):
                listed = {e.value for e in n.value.elts}
        return tuple(d for d in defs if (d in listed if listed is not None else not d.startswith("_")))

    def _peek(self, module: "Module", name: str) -> Optional[ast.Module]:
        """The parsed file the dotted ``name`` imports from ``module`` (its own folder first, then
        the project's import roots) without reading it into the project: what a star import binds
        must not change which modules the run has read (that decides what other names resolve to)."""
        if not self.load_more or not name:
            return None
        parts = name.split(".")
        for folder in (Path(module.path).resolve().parent, *self.roots):
            for cand in _module_files(folder, parts):
                if cand.is_file():
                    key = str(cand.resolve())
                    if key not in self._peeked:
                        try:
                            self._peeked[key] = ast.parse(cand.read_bytes())
                        except (OSError, SyntaxError, ValueError):
                            self._peeked[key] = None
                    return self._peeked[key]
        return None

    def _add(self, path: str, src: Source, editable: bool) -> Optional[Module]:
        if src.tree is None:
            try:
                src.parse()
            except SourceError:
                return None
        m = Module(path, src, editable)
        m.star_lookup = self._star_names
        self.modules[path] = m
        self.resolved_paths = getattr(self, "resolved_paths", {})
        self.resolved_paths[path] = str(Path(path).resolve())
        p = Path(path)
        if p.suffix == ".py" and p.parent.exists():
            root, parts = _package_root(p.resolve())
            names = {".".join(parts)} if parts else set()
            names.add(p.stem)  # a script's own folder is on sys.path
            if self.root is not None:
                try:
                    rel = p.resolve().relative_to(self.root.resolve()).with_suffix("")
                    names.add(".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts))
                except ValueError:
                    pass
            m.names = {n for n in names if n}
            m.name = ".".join(parts) if parts else p.stem
            for r in (root, p.resolve().parent, *( [self.root.resolve()] if self.root else [])):
                if r not in self.roots:
                    self.roots.append(r)
        else:
            m.name = p.stem
            m.names = {p.stem}
        for n in m.names:
            self.by_name.setdefault(n, m)
            self.all_by_name.setdefault(n, []).append(m)
        return m

    def _shared(self, a: str, b: str) -> int:
        """How many leading folders the modules at ``a`` and ``b`` share, resolved."""
        resolved = getattr(self, "resolved_paths", {})
        pa = (resolved.get(a) or str(Path(a).resolve())).split(os.sep)[:-1]
        pb = (resolved.get(b) or str(Path(b).resolve())).split(os.sep)[:-1]
        n = 0
        for x, y in zip(pa, pb):
            if x != y:
                break
            n += 1
        return n

    def _nearest(self, name: str, near: Module) -> Optional[Module]:
        """Of several modules read for ``name``, the one nearest ``near`` in the folders (None
        unless there are several)."""
        many = self.all_by_name.get(name, ())
        return max(many, key=lambda c: self._shared(c.path, near.path)) if len(many) > 1 else None

    def import_is_quiet(self, full: str) -> bool:
        """Importing ``full`` (a dotted name, ``.``-relative ones unknown) only binds names: a
        standard-library module, or a project module whose top level only defines and imports.
        An import of it that nothing reads can go without skipping an effect."""
        top = full.lstrip(".").split(".")[0]
        if not full.startswith(".") and top in sys.stdlib_module_names:
            return True
        target = None if full.startswith(".") else self.module_named(full)
        if target is None:
            return False
        return all(isinstance(x, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                   or (isinstance(x, ast.Expr) and isinstance(x.value, ast.Constant))
                   or (isinstance(x, (ast.Assign, ast.AnnAssign)) and not any(
                       isinstance(y, ast.Call) for y in ast.walk(x)))
                   for x in target.tree.body)

    def module_named(self, name: str, near: Optional[Module] = None) -> Optional[Module]:
        """The module of the dotted ``name``; where several read so far have it (copies of one
        package in two parts of a monorepo), the one nearest ``near`` in the folders."""
        m = self.by_name.get(name)
        if m is not None and near is not None:
            return self._nearest(name, near) or m
        if m is not None:
            return m
        # a name looked for in vain stays unknown until a module is added
        missing = getattr(self, "_missing", None)
        if missing is None or missing[0] != len(self.modules):
            missing = self._missing = (len(self.modules), set())
        if name in missing[1]:
            return None
        m = self._module_named(name)
        if m is None and len(self.modules) == missing[0]:
            missing[1].add(name)
        return m

    def _real_paths(self):
        """(resolved path, module) of every module read so far."""
        resolved = getattr(self, "resolved_paths", {})
        return [(resolved.get(pth) or str(Path(pth).resolve()), mm) for pth, mm in self.modules.items()]

    def module_beside(self, module: "Module", name: str) -> Tuple[bool, Optional["Module"]]:
        """(whether a file for the absolute dotted ``name`` lies in ``module``'s own folder, the
        module read for it if any): a script's folder comes first on ``sys.path``, so
        ``from model import Seq2Seq`` beside a ``model.py`` is that file, whatever other
        ``model`` package the project has."""
        folder = Path(module.path).resolve().parent
        parts = name.split(".")
        for cand in _module_files(folder, parts):
            if cand.is_file():
                real = str(cand.resolve())
                return True, next((mm for r, mm in self._real_paths() if r == real), None)
        return False, None

    def loaded_named(self, name: str) -> Optional[Module]:
        """The one module read so far whose path ends like the dotted name (the run's root may be
        below the folder Python imports it from); None if none or several."""
        parts = name.split(".")
        tails = ("/" + "/".join(parts) + ".py", "/" + "/".join(parts) + "/__init__.py")
        hits = [mm for r, mm in self._real_paths() if r.endswith(tails)]
        return hits[0] if len(hits) == 1 else None

    def imported_names(self, module: "Module", imp) -> List[str]:
        """The dotted module names an import statement may load (a relative one made absolute)."""
        if isinstance(imp, ast.Import):
            return [a.name for a in imp.names]
        base = self.absolute(module, "." * imp.level + (imp.module or ""))
        if not base:
            return []
        return [base, *(f"{base}.{a.name}" for a in imp.names if a.name != "*")]

    def imported_module(self, module: "Module", name: str, read_more: bool = True) -> Optional["Module"]:
        """The module ``module`` gets by importing the dotted ``name``: the file in its own folder
        first, else by name (``read_more=False``: only among the modules read already)."""
        beside, found = self.module_beside(module, name)
        if beside:
            return found
        if read_more:
            return self.module_named(name, near=module)
        return self._nearest(name, module) or self.loaded_named(name)

    def _module_named(self, name: str) -> Optional[Module]:
        parts = name.split(".")
        hit = self.loaded_named(name)
        if hit is not None:
            self.by_name[name] = hit
            return hit
        if not self.load_more:
            return None
        for root in self.roots:
            for cand in _module_files(root, parts):
                if cand.is_file():
                    key = self.given.get(str(cand.resolve()), str(cand))
                    real = str(cand.resolve())
                    known = next((mm for r, mm in self._real_paths() if r == real), None)
                    if known is not None:
                        self.by_name[name] = known
                        return known
                    if real in self.run_files and real not in self.given:
                        self.foreign.add(real)  # imported from another part of the run
                    try:
                        src = Source(cand.read_bytes(), key)
                    except (OSError, SourceError):
                        return None
                    m = self._add(key, src, editable=str(cand.resolve()) in self.given)
                    if m is not None:
                        self.by_name[name] = m
                    return m
        return None

    def module(self, path: str) -> Optional[Module]:
        return self.modules.get(path)

    # -- resolving calls -----------------------------------------------------------------------
    def resolve(self, module: Module, func_expr, depth: int = 0) -> Tuple[Optional[Function], bool]:
        """(the project function a call's ``func`` refers to, whether ``self`` is bound)."""
        if depth > 8:
            return None, False
        module.index()
        sem = module.sem
        if isinstance(func_expr, ast.Name):
            # a def of the module's own shadows what `from x import *` bound before it
            for b in sorted(sem.bindings_of(func_expr), key=lambda b: b.kind == "star"):
                if b.kind == "def":
                    f = module.by_node.get(id(b.node))
                    if f is not None:
                        return f, False
                if b.kind == "class":
                    return self._method(module, b.node, "__init__"), True
                if b.kind in ("import", "star") and b.qname:
                    f, bound = self._imported(module, b.qname)
                    if f is not None:
                        return f, bound
            return None, False
        if isinstance(func_expr, ast.Attribute):
            base = func_expr.value
            if isinstance(base, ast.Name) and base.id == "self":
                f = module.function_of(func_expr)
                while f is not None and f.cls is None and f.outer is not None:
                    f = f.outer
                if f is not None and f.cls is not None:
                    m = self._method(module, f.cls, func_expr.attr)
                    return (m, True) if m is not None else (None, False)
                return None, False
            d = dotted(func_expr)
            if d is not None:
                q = sem.qnames(func_expr)
                for name in sorted(q):
                    f, bound = self._imported(module, name)
                    if f is not None:
                        return f, bound
            if isinstance(base, ast.Name):
                # a local bound to an instance of a project class
                for v in sem.values_of(base):
                    if isinstance(v, ast.Call) and isinstance(v.func, ast.Subscript):
                        m = self._registry_method(module, v.func, func_expr.attr, depth)
                        if m is not None:
                            return m, True
                    if isinstance(v, ast.Call):
                        cls_init, _ = self.resolve(module, v.func, depth + 1)
                        if cls_init is not None and cls_init.cls is not None:
                            m = self._method(cls_init.module, cls_init.cls, func_expr.attr)
                            if m is not None:
                                return m, True
        return None, False

    def _registry_method(self, module: Module, sub: ast.Subscript, name: str, depth: int) -> Optional[Function]:
        """``trainer = str2trainer[args.kind](args)`` where ``str2trainer`` is a dict literal of
        the project's classes: ``trainer.train`` is their ``train`` when every class has the same
        one (inherited from their base, UER-py's trainers)."""
        if not isinstance(sub.value, ast.Name):
            return None
        found = None
        for d in module.sem.values_of(sub.value):
            if not isinstance(d, ast.Dict) or not d.values:
                return None
            for v in d.values:
                if not isinstance(v, (ast.Name, ast.Attribute)):
                    return None
                local = [b.node for b in module.sem.bindings_of(v) if b.kind == "class"] \
                    if isinstance(v, ast.Name) else []
                if len(local) == 1:  # a class of this module (with or without an __init__ of its own)
                    m = self._method(module, local[0], name)
                else:
                    init, bound = self.resolve(module, v, depth + 1)
                    if init is None or init.cls is None or not bound:
                        return None
                    m = self._method(init.module, init.cls, name)
                if m is None or (found is not None and m is not found):
                    return None
                found = m
        return found

    @staticmethod
    def absolute(module: Module, qname: str) -> str:
        """``qname`` said from ``module``'s package when it is relative (``.file_utils.x``)."""
        if not qname.startswith("."):
            return qname
        pkg = (module.name or "").split(".")
        level = len(qname) - len(qname.lstrip("."))
        is_pkg = module.path.endswith("__init__.py")
        base = pkg[: len(pkg) - level + (1 if is_pkg else 0)]
        return ".".join([*base, qname.lstrip(".")])

    def _imported(self, module: Module, qname: str, depth: int = 0) -> Tuple[Optional[Function], bool]:
        if depth > 10:  # re-exports that import each other (`a` from `b`, `b` from `a`)
            return None, False
        qname = self.absolute(module, qname)
        parts = qname.split(".")
        for i in range(len(parts) - 1, 0, -1):
            mod = self.module_named(".".join(parts[:i]), near=module)
            if mod is None:
                continue
            mod.index()
            rest = ".".join(parts[i:])
            if rest in mod.functions:
                return mod.functions[rest], False
            if rest in mod.classes:
                return self._method(mod, mod.classes[rest], "__init__"), True
            # re-exported through an import in that module
            head = parts[i]
            for b in mod.sem.module_scope.bindings.get(head, ()):
                if b.kind == "import" and b.qname and b.qname != qname:
                    return self._imported(mod, b.qname + ("." + ".".join(parts[i + 1:]) if len(parts) > i + 1 else ""),
                                          depth + 1)
            return None, False
        return None, False

    def ancestors(self, module: Module, cls: ast.ClassDef, depth: int = 0) -> List[Tuple[Module, ast.ClassDef]]:
        """The project classes ``cls`` inherits from, nearest first (bases named in the module or
        imported from a project module)."""
        out: List[Tuple[Module, ast.ClassDef]] = []
        if depth > 5:
            return out
        module.index()
        for base in cls.bases:
            got = None
            if isinstance(base, ast.Name):
                for b in module.sem.bindings_of(base):
                    if b.kind == "class":
                        got = (module, b.node)
            if got is None and isinstance(base, (ast.Name, ast.Attribute)):
                for q in sorted(module.sem.qnames(base)):
                    parts = self.absolute(module, q).split(".")
                    for i in range(len(parts) - 1, 0, -1):
                        mod = self.module_named(".".join(parts[:i]), near=module)
                        if mod is not None:
                            mod.index()
                            rest = ".".join(parts[i:])
                            if rest in mod.classes:
                                got = (mod, mod.classes[rest])
                            break
                    if got is not None:
                        break
            if got is not None and all(got[1] is not c for _, c in out):
                out.append(got)
                out.extend(x for x in self.ancestors(got[0], got[1], depth + 1) if all(x[1] is not c for _, c in out))
        return out

    def may_share_objects(self, a: Tuple[Module, ast.ClassDef], b: Tuple[Module, ast.ClassDef]) -> bool:
        """Whether an object of class ``a`` may also be one of class ``b``: one is the other or
        extends it, or a class extends both (a mixin).  Every file of the run that names either is
        read first; a base that names one of them and cannot be followed, or a file outside the
        run that names both, counts as sharing."""
        ca, cb = a[1], b[1]
        if ca is cb:
            return True
        names = {ca.name, cb.name}
        for name in names:
            self._load_mentioning(name)
        for mod in list(self.modules.values()):
            if not any(n in mod.src.text for n in names):
                continue
            mod.index()
            for x in walk(mod.tree, into_functions=True):
                if not isinstance(x, ast.ClassDef):
                    continue
                ancestors = [k for _, k in self.ancestors(mod, x)]
                mro = [x, *ancestors]
                if any(k is ca for k in mro) and any(k is cb for k in mro):
                    return True
                followed = {k.name for k in ancestors}
                if any((dotted(base) or "").split(".")[-1] in names - followed and not self._external(mod, base)
                       for base in x.bases):
                    return True  # `class X(Trainer)` whose `Trainer` cannot be followed: maybe one of them
        return bool(set.intersection(*(set(self.mentioned_elsewhere(n)) for n in names)))

    def _external(self, module: Module, expr) -> bool:
        """``expr`` names something imported from outside the project (``transformers.Trainer``)."""
        qs = module.sem.qnames(expr)
        return bool(qs) and all(not q.startswith(".") and self.module_named(q.split(".")[0], near=module) is None
                                and "." in q for q in qs)

    def method(self, module: Module, cls: ast.ClassDef, name: str) -> Optional[Function]:
        """The method ``name`` of ``cls``, its own or inherited from a project base class."""
        return self._method(module, cls, name)

    def _method(self, module: Module, cls: ast.ClassDef, name: str, depth: int = 0) -> Optional[Function]:
        module.index()
        for f in module.functions.values():
            if f.cls is cls and f.node.name == name and f.qualname.endswith(cls.name + "." + name):
                return f
        if depth < 5:  # inherited from a project base class
            for base in cls.bases:
                if isinstance(base, (ast.Name, ast.Attribute)):
                    init, _ = self.resolve(module, base, 6)
                    if init is not None and init.cls is not None:
                        m = self._method(init.module, init.cls, name, depth + 1)
                        if m is not None:
                            return m
                    elif isinstance(base, ast.Name):
                        for b in module.sem.bindings_of(base):
                            if b.kind == "class":
                                m = self._method(module, b.node, name, depth + 1)
                                if m is not None:
                                    return m
        return None

    # -- the call graph ------------------------------------------------------------------------
    def _index_calls(self, name: str) -> None:
        """Index the calls of, and other references to, functions called ``name`` in every module
        read so far whose text names it (resolving may read more: they are indexed in turn).
        Only the nodes that end in ``name`` (or an alias imported for it) are resolved."""

        pat = re.compile(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"(?![A-Za-z0-9_])")
        while True:
            todo = [m for p, m in list(self.modules.items()) if (p, name) not in self._indexed]
            if not todo:
                return
            for m in todo:
                self._indexed.add((m.path, name))
                if not pat.search(m.src.text):
                    continue
                m.index()
                by_last, aliases = m.by_last_name()
                local = [name, *sorted(aliases.get(name, ()))]
                found = [x for ln in local for x in by_last.get(ln, ())]
                if len(local) > 1:
                    found.sort(key=lambda x: x[0])
                for _, n in found:
                    if isinstance(n, ast.Call):
                        f, bound = self.resolve(m, n.func)
                        if f is not None:
                            self._calls.setdefault(id(f.node), []).append(CallSite(n, m, m.function_of(n), f, bound))
                    else:
                        p = getattr(n, "_p", None)
                        if isinstance(p, ast.Call) and p.func is n:
                            continue
                        if isinstance(p, ast.Attribute) and p.value is n:
                            continue
                        if isinstance(n, ast.Name) or isinstance(n.value, ast.Name):
                            f, bound = self.resolve(m, n)
                            if f is None:
                                continue
                            chosen = _chosen_call(n)
                            if chosen is not None and all(
                                    self.resolve(m, x)[0] is f for x in _choices(chosen.func)):
                                # `(AMPTrainer if fp16 else SimpleTrainer)(model, loader, optimizer)`
                                # where both are built by one __init__: a call of it, whichever
                                # the test picks (an argument added goes to both)
                                sites = self._calls.setdefault(id(f.node), [])
                                if not any(c.node is chosen for c in sites):
                                    sites.append(CallSite(chosen, m, m.function_of(chosen), f, bound))
                                continue
                            calls = _partial_calls(n)
                            if calls is None:
                                self._refs.setdefault(id(f.node), []).append(n)
                                continue
                            for c in calls:
                                self._calls.setdefault(id(f.node), []).append(
                                    CallSite(c, m, m.function_of(c), f, False, p.args[1:]))

    def read_mentioning(self, name: str) -> None:
        """Read the files given for this run whose text names ``name`` as a word (they become
        modules): where a use of an attribute the migration removes may be."""
        self._load_mentioning(name)

    def _load_mentioning(self, name: str) -> None:
        """Read the files given for this run (not read yet) whose text names ``name``: callers
        may live there (a script that calls a setup() and never mentions apex)."""

        if not hasattr(self, "_unread"):
            loaded = {str(Path(p).resolve()) for p in self.modules}
            self._unread = {r: p for r, p in self.given.items() if r not in loaded and p.endswith(".py")}
            self._unread_text: Dict[str, bytes] = {}
        if not self._unread:
            return
        pat = re.compile(rb"(?<![A-Za-z0-9_])" + re.escape(name.encode()) + rb"(?![A-Za-z0-9_])")
        # a file read since (resolving an import loads it): it is a module already, never twice
        loaded = set(getattr(self, "resolved_paths", {}).values())
        for r, p in list(self._unread.items()):
            if r in loaded:
                del self._unread[r]
                continue
            data = self._unread_text.get(r)
            if data is None:
                try:
                    with open(p, "rb") as fh:
                        data = self._unread_text[r] = fh.read()
                except OSError:
                    del self._unread[r]
                    continue
            if pat.search(data):
                del self._unread[r]
                try:
                    self._add(p, Source(data, p), editable=True)
                except SourceError:
                    continue

    def imported_from(self, module: "Module", name: str) -> bool:
        """Whether another module takes ``name`` from ``module`` (``from train import
        build_optimizer``): one given for this run (read now if it names it), or a file under the
        root not read for it.  An import from a module the run cannot place (relative, or not
        among the files) may be from this one: it counts."""
        self._load_mentioning(name)
        if self.mentioned_elsewhere(name):
            return True
        for other in self.modules.values():
            if other is module or name not in other.src.text:
                continue
            for st in walk(other.tree, into_functions=True):
                if isinstance(st, ast.ImportFrom) and any(a.name == name for a in st.names):
                    target = self.module_named(st.module or "") if not st.level else None
                    if target is None or target is module:
                        return True
        return False

    def _called_as(self, f: Function) -> str:
        return f.cls.name if f.node.name == "__init__" and f.cls is not None else f.node.name

    def callers(self, f: Function) -> List[CallSite]:
        self._index_function(f)
        return self._calls.get(id(f.node), [])

    def references(self, f: Function) -> List[ast.AST]:
        """Uses of the function other than calling it (passed as a callback, stored)."""
        self._index_function(f)
        return self._refs.get(id(f.node), [])

    def dispatched(self, module: "Module") -> List[Tuple[ast.Call, str, str]]:
        """The calls of ``module`` that pick one of its own functions by name from ``globals()``
        (:func:`dispatch_pattern`), each with its prefix and suffix."""
        got = module.__dict__.get("_dispatched")
        if got is None:
            got = []
            if "globals()" in module.src.text:
                for n in walk(module.tree, into_functions=True):
                    if isinstance(n, ast.Call):
                        pat = dispatch_pattern(n)
                        if pat is not None:
                            got.append((n, *pat))
            module._dispatched = got
        return got

    def dispatch_targets(self, module: "Module", call: ast.Call) -> List[Function]:
        """The module-level functions of ``module`` a dispatch call (:meth:`dispatched`) may pick."""
        module.index()
        for n, pre, suf in self.dispatched(module):
            if n is call:
                return [g for q, g in module.functions.items() if "." not in q and g.outer is None and g.cls is None
                        and q.startswith(pre) and q.endswith(suf) and len(q) > len(pre) + len(suf)
                        and _accepts(g.node.args, call)]
        return []

    def _index_dispatch(self, f: Function) -> None:
        """``f`` (a module-level function) called by a ``globals()`` dispatch of its module."""
        picks = self.dispatched(f.module)
        if not picks or f.cls is not None or f.outer is not None:
            return
        sites = self._calls.setdefault(id(f.node), [])
        for n, _, _ in picks:
            if any(g is f for g in self.dispatch_targets(f.module, n)) and not any(c.node is n for c in sites):
                sites.append(CallSite(n, f.module, f.module.function_of(n), f, False))

    def _index_function(self, f: Function) -> None:
        """Index the calls of ``f`` and the other uses of its name.  An ``__init__`` is also called
        by building a project subclass that has none of its own (``class AMPTrainer(SimpleTrainer)``
        built as ``AMPTrainer(model, loader, optimizer)``): those classes' names are indexed too, and
        naming the class as their base is no other use.  A subclass with an ``__init__`` of its own
        stays such a use (its ``super().__init__(...)`` is not followed)."""
        self._index_dispatch(f)
        names = [self._called_as(f)]
        seen: Set[str] = set()
        while names:
            name = names.pop()
            if name in seen:
                continue
            seen.add(name)
            self._load_mentioning(name)
            self._index_calls(name)
            if f.node.name != "__init__" or f.cls is None:
                return
            refs = self._refs.get(id(f.node), [])
            for n in list(refs):
                sub = getattr(n, "_p", None)
                if isinstance(sub, ast.ClassDef) and any(b is n for b in sub.bases) and not any(
                        isinstance(x, FUNC) and x.name == "__init__" for x in sub.body):
                    refs.remove(n)
                    names.append(sub.name)

    def named_elsewhere(self, module: Module, name: str) -> bool:
        """Another module of the run names ``name`` as a word (a module that binds it itself, with
        its own ``def name`` or ``name = ...``, reads its own), or a file not read for this run
        does: a module-level function or flag of ``module`` may be read there."""
        word = re.compile(r"\b" + re.escape(name) + r"\b")
        own = re.compile(r"^[ \t]*(?:(?:async[ \t]+)?def[ \t]+" + re.escape(name) + r"\b|" + re.escape(name)
                         + r"[ \t]*=[^=])", re.M)
        return any(m is not module and word.search(m.src.text) and not own.search(m.src.text)
                   for m in self.modules.values()) or bool(self.mentioned_elsewhere(name))

    def mentioned_elsewhere(self, name: str, other_parts: bool = False) -> List[str]:
        """Python files under the project root, not read for this run, whose text holds ``name`` as
        a word: where a function nothing given calls may be called from.  The files of other parts
        of the run count only with ``other_parts`` (they cannot call into this one)."""
        if self.root is None:
            return []
        if not hasattr(self, "_other_texts"):
            import re

            self._other_texts = {}
            loaded = {str(Path(p).resolve()) for p in self.modules}
            count = 0
            for dirpath, dirnames, filenames in os.walk(self.root):
                dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in (
                    "node_modules", "site-packages", "__pycache__", "build", "dist", "venv", ".venv")]
                for fn in filenames:
                    if not fn.endswith(".py"):
                        continue
                    path = os.path.join(dirpath, fn)
                    real = str(Path(path).resolve())
                    if real in loaded:
                        continue
                    count += 1
                    if count > 20000:
                        break
                    try:
                        with open(path, "rb") as fh:
                            self._other_texts[path] = fh.read()
                    except OSError:
                        continue
            self._word = re
        if other_parts:
            self.asked_other_parts = True  # the plan depends on the other parts' text too
        out = []
        word = name.encode()
        for p, t in self._other_texts.items():
            # the file's words, split once (a word: a run of letters, digits and `_`)
            have = self._other_tokens.get(p)
            if have is None:
                have = self._other_tokens[p] = frozenset(self._word.findall(rb"[A-Za-z0-9_]+", t))
            if word not in have:
                continue
            if not other_parts and self._resolved(p) in self.run_files:
                continue  # another part of the run: it does not import this one, so it cannot call it
            facts = self._facts_of(p, t)
            # a comment or a string that names it is not a use (a file that does not parse: maybe one)
            if facts is None or name in facts[0]:
                out.append(p)
        return sorted(out)

    def from_imports_of(self, path: str):
        """The ``from X import a, b`` statements of a file (its module, level and names), parsed
        once; None where it cannot be read or parsed."""
        facts = self._other_facts.get(path)
        if facts is not None:
            return facts[1]
        try:
            tree = ast.parse(Path(path).read_text(errors="replace"))
        except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        return [(st.module, st.level, tuple(a.name for a in st.names))
                for st in ast.walk(tree) if isinstance(st, ast.ImportFrom)]

    def _resolved(self, path: str) -> str:
        if path not in self._resolved_paths:
            self._resolved_paths[path] = str(Path(path).resolve())
        return self._resolved_paths[path]

    def _facts_of(self, path: str, text: bytes) -> Optional[tuple]:
        """(the names a file not read for this run uses: names, attributes, the last part and
        alias of each import; its ``from`` imports as :meth:`from_imports_of` gives them), from one
        parse; None where it does not parse."""
        if path in self._other_facts:
            return self._other_facts[path]
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            self._other_facts[path] = None
            return None
        words, froms = set(), []
        for n in ast.walk(tree):
            if isinstance(n, ast.Name):
                words.add(n.id)
            elif isinstance(n, ast.Attribute):
                words.add(n.attr)
            elif isinstance(n, ast.alias):
                words.add(n.name.split(".")[-1])
                if n.asname:
                    words.add(n.asname)
            elif isinstance(n, ast.ImportFrom):
                froms.append((n.module, n.level, tuple(a.name for a in n.names)))
        self._other_facts[path] = (frozenset(words), froms)
        return self._other_facts[path]

    #: ``runner(fn, items) -> [fn(item)]`` over worker processes (None: here, in order)
    runner = None
    #: how the engine tries a planned rewrite in memory (apply, parse, self-check): a function
    #: of one job that returns None or why the rewrite is refused; set by whoever builds the
    #: project (the engine), so that planners need not import the engine
    trial = None

    def map(self, fn, items: list) -> list:
        """``[fn(x) for x in items]``, in the run's worker processes when it has them (``fn``
        and the items must pickle)."""
        if self.runner is None or len(items) < 2:
            return [fn(x) for x in items]
        return self.runner(fn, items)

    def plan(self, planner):
        if planner not in self._plans:
            self._plans[planner] = planner(self)
        return self._plans[planner]
