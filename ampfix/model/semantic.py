"""A small semantic model of one module, computed once and shared by every rule.

One iterative walk over Python's ``ast`` records, for every node, its parent, and for every
name, the scope it is read or bound in.  Scopes follow Python's rules: functions, lambdas
and comprehensions have their own; a class body is a scope that its methods do not see;
``global`` and ``nonlocal`` redirect a name; defaults, decorators and annotations belong to
the enclosing scope.

Qualified names come from imports alone (``import torch.nn as nn`` makes ``nn.Linear``
``torch.nn.Linear``), plus ``builtins.X`` for a builtin that nothing shadows: a local
``amp = None`` is not ``apex.amp``, but where an import and an assignment bind one name in
one scope (``try: from apex import amp`` / ``except ImportError: amp = None``) the import
counts.
"""
from __future__ import annotations

import ast
import builtins
from typing import Dict, Iterable, Iterator, List, Optional, Set, Tuple

_BUILTINS = frozenset(dir(builtins))
FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
COMPS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
LOOPS = (ast.For, ast.AsyncFor, ast.While)


class Binding:
    """One way a name is bound in a scope.  ``kind``: import, assign, param, def, class,
    loop, with, except, del, star.  ``qname`` for imports; ``value`` the assigned expression
    when the target is the plain name (``x = value``)."""

    __slots__ = ("kind", "name", "node", "qname", "value", "scope")

    def __init__(self, kind, name, node, scope, qname=None, value=None):
        self.kind, self.name, self.node, self.scope, self.qname, self.value = kind, name, node, scope, qname, value

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Binding({self.kind}, {self.name}, {self.qname})"


class Scope:
    __slots__ = ("kind", "node", "parent", "bindings", "globals", "nonlocals", "children")

    def __init__(self, kind: str, node, parent: Optional["Scope"]) -> None:
        self.kind = kind  # module, class, function, lambda, comprehension
        self.node = node
        self.parent = parent
        self.bindings: Dict[str, List[Binding]] = {}
        self.globals: Set[str] = set()
        self.nonlocals: Set[str] = set()
        self.children: List["Scope"] = []

    def bind(self, b: Binding) -> None:
        self.bindings.setdefault(b.name, []).append(b)


def dotted(node) -> Optional[str]:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def base_name(node) -> Optional[ast.Name]:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node if isinstance(node, ast.Name) else None


def _targets(t) -> Iterator[ast.expr]:
    """Plain Name targets of an assignment target (tuples and starred unpacked)."""
    if isinstance(t, ast.Name):
        yield t
    elif isinstance(t, (ast.Tuple, ast.List)):
        for e in t.elts:
            yield from _targets(e)
    elif isinstance(t, ast.Starred):
        yield from _targets(t.value)


class Model:
    """The semantic model of a module.  ``parent(node)``, ``scope_of(name_node)``,
    ``qnames(node)``, ``bindings_of(name_node)``."""

    def __init__(self, tree: ast.Module, star_exports: Optional[Dict[str, Tuple[str, ...]]] = None,
                 collect: Iterable[str] = ()) -> None:
        self.tree = tree
        #: nodes of the types named in ``collect`` (class names), in source order
        self.nodes: Dict[str, List[ast.AST]] = {name: [] for name in collect}
        self.star_exports = star_exports or {}
        self.module_scope = Scope("module", tree, None)
        self.scopes: List[Scope] = [self.module_scope]
        self._opened: Dict[int, Scope] = {}  # id(def/lambda/class/comprehension) -> the scope it opens
        self.star_names: Dict[str, str] = {}  # name -> module, from `from X import *` of a known module
        self.imports: List[ast.stmt] = []
        self._unbound: Optional[Dict[str, str]] = None
        self._importing: Set[int] = set()  # import_module calls being resolved (see imported_by)
        self._walk()

    # -- building ------------------------------------------------------------------------------
    def _walk(self) -> None:
        tree = self.tree
        tree._p = None
        # (node, scope) pairs; a node's children are pushed with the scope they belong to
        stack: List[Tuple[ast.AST, Scope]] = [(tree, self.module_scope)]
        opened = self._opened
        nodes = self.nodes
        while stack:
            node, scope = stack.pop()
            node._s = scope
            t = type(node)
            if nodes:
                bucket = nodes.get(t.__name__)
                if bucket is not None:
                    bucket.append(node)
            if t is ast.Name:
                if isinstance(node.ctx, ast.Store):
                    b = self._assign_binding(node, scope)
                    self._owner(scope, node.id).bind(b)
                elif isinstance(node.ctx, ast.Del):
                    self._owner(scope, node.id).bind(Binding("del", node.id, node, scope))
                continue
            if t in (ast.FunctionDef, ast.AsyncFunctionDef):
                self._owner(scope, node.name).bind(Binding("def", node.name, node, scope))
                inner = Scope("function", node, scope)
                scope.children.append(inner)
                self.scopes.append(inner)
                opened[id(node)] = inner
                self._push_function(node, scope, inner, stack)
                continue
            if t is ast.Lambda:
                inner = Scope("lambda", node, scope)
                scope.children.append(inner)
                self.scopes.append(inner)
                opened[id(node)] = inner
                self._push_function(node, scope, inner, stack)
                continue
            if t is ast.ClassDef:
                self._owner(scope, node.name).bind(Binding("class", node.name, node, scope))
                inner = Scope("class", node, scope)
                scope.children.append(inner)
                self.scopes.append(inner)
                opened[id(node)] = inner
                later = []
                for child in (*node.decorator_list, *node.bases, *node.keywords):
                    child._p = node
                    later.append((child, scope))
                for child in node.body:
                    child._p = node
                    later.append((child, inner))
                stack.extend(reversed(later))
                for tp in getattr(node, "type_params", ()) or ():
                    tp._p = node
                continue
            if t in COMPS:
                inner = Scope("comprehension", node, scope)
                scope.children.append(inner)
                self.scopes.append(inner)
                opened[id(node)] = inner
                first = True
                later = []
                for name in ("elt", "key", "value"):
                    child = getattr(node, name, None)
                    if child is not None:
                        child._p = node
                        later.append((child, inner))
                for gen in node.generators:
                    gen._p = node
                    gen._s = inner
                    gen.iter._p = gen
                    later.append((gen.target, inner))
                    gen.target._p = gen
                    later.append((gen.iter, scope if first else inner))
                    first = False
                    for cond in gen.ifs:
                        cond._p = gen
                        later.append((cond, inner))
                stack.extend(reversed(later))
                continue
            if t in (ast.Import, ast.ImportFrom):
                self.imports.append(node)
                self._bind_import(node, scope)
            elif t is ast.Global:
                scope.globals.update(node.names)
                if scope is not self.module_scope:
                    # a declaration holds for the whole function, also above it (`from apex
                    # import amp` then `global amp` binds the module's amp)
                    for name in node.names:
                        for b in scope.bindings.pop(name, ()):
                            self.module_scope.bind(b)
            elif t is ast.Nonlocal:
                scope.nonlocals.update(node.names)
            elif t is ast.ExceptHandler and node.name:
                self._owner(scope, node.name).bind(Binding("except", node.name, node, scope))
            elif t is ast.NamedExpr:
                target_scope = scope
                while target_scope.kind == "comprehension" and target_scope.parent is not None:
                    target_scope = target_scope.parent
                node.target._s = target_scope
                self._owner(target_scope, node.target.id).bind(
                    Binding("assign", node.target.id, node, target_scope, value=node.value))
                node.target._p = node
                node.value._p = node
                stack.append((node.value, scope))
                continue
            elif t is ast.MatchAs or t is ast.MatchStar:
                if node.name:
                    self._owner(scope, node.name).bind(Binding("assign", node.name, node, scope))
            elif t is ast.MatchMapping and node.rest:
                self._owner(scope, node.rest).bind(Binding("assign", node.rest, node, scope))
            children = list(ast.iter_child_nodes(node))
            for child in children:
                child._p = node
            stack.extend((child, scope) for child in reversed(children))

    def _push_function(self, node, scope, inner, stack) -> None:
        args = node.args
        outer = [*args.defaults, *(d for d in args.kw_defaults if d is not None)]
        if not isinstance(node, ast.Lambda):
            outer += [*node.decorator_list, *([node.returns] if node.returns else [])]
        all_args = [*getattr(args, "posonlyargs", []), *args.args, *args.kwonlyargs,
                    *([args.vararg] if args.vararg else []), *([args.kwarg] if args.kwarg else [])]
        for a in all_args:
            a._p = args
            inner.bind(Binding("param", a.arg, a, inner))
            a._s = inner
            if a.annotation is not None:
                outer.append(a.annotation)
                a.annotation._p = a
        args._p = node
        args._s = inner
        later = []
        for child in outer:
            if getattr(child, "_p", None) is None:
                child._p = node
            later.append((child, scope))
        body = node.body if isinstance(node.body, list) else [node.body]
        for child in body:
            child._p = node
            later.append((child, inner))
        stack.extend(reversed(later))
        for tp in getattr(node, "type_params", ()) or ():
            tp._p = node

    def _owner(self, scope: Scope, name: str) -> Scope:
        """The scope a binding of ``name`` in ``scope`` lands in (global/nonlocal aware)."""
        if name in scope.globals:
            return self.module_scope
        if name in scope.nonlocals:
            s = scope.parent
            while s is not None:
                if s.kind in ("function", "lambda") and name in s.bindings:
                    return s
                s = s.parent
        return scope

    def _assign_binding(self, name: ast.Name, scope: Scope) -> Binding:
        parent = name._p
        value = None
        kind = "assign"
        if isinstance(parent, ast.Assign) and name in parent.targets:
            value = parent.value
        elif isinstance(parent, (ast.AnnAssign, ast.AugAssign)) and parent.target is name:
            value = parent.value
            kind = "assign" if isinstance(parent, ast.AnnAssign) else "augassign"
        elif isinstance(parent, (ast.For, ast.AsyncFor, ast.comprehension)):
            kind = "loop"
        elif isinstance(parent, ast.withitem):
            kind = "with"
        return Binding(kind, name.id, parent if value is not None else name, scope, value=value)

    def _bind_import(self, node, scope: Scope) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    self._owner(scope, a.asname).bind(Binding("import", a.asname, node, scope, qname=a.name))
                else:
                    top = a.name.split(".")[0]
                    self._owner(scope, top).bind(Binding("import", top, node, scope, qname=top))
            return
        mod = ("." * node.level) + (node.module or "")
        for a in node.names:
            if a.name == "*":
                for n in self.star_exports.get(mod, ()):
                    self.star_names.setdefault(n, mod)
                    self._owner(scope, n).bind(Binding("star", n, node, scope, qname=f"{mod}.{n}"))
                continue
            bound = a.asname or a.name
            q = f"{mod}.{a.name}" if mod and not mod.endswith(".") else f"{mod}{a.name}"
            self._owner(scope, bound).bind(Binding("import", bound, node, scope, qname=q))

    # -- queries -------------------------------------------------------------------------------
    def parent(self, node) -> Optional[ast.AST]:
        return getattr(node, "_p", None)

    def ancestors(self, node) -> Iterator[ast.AST]:
        p = getattr(node, "_p", None)
        while p is not None:
            yield p
            p = getattr(p, "_p", None)

    def scope_of(self, node) -> Scope:
        """The scope a node is evaluated (a name: read or bound) in."""
        while node is not None:
            s = getattr(node, "_s", None)
            if s is not None:
                return s
            node = getattr(node, "_p", None)
        return self.module_scope

    def scope_for(self, node) -> Optional[Scope]:
        """The scope that a function, lambda, class or comprehension node opens."""
        return self._opened.get(id(node))

    def resolve(self, name: str, scope: Scope) -> Optional[Scope]:
        """The scope whose bindings ``name`` read in ``scope`` refers to (None: builtin/unbound)."""
        if name in scope.globals:
            return self.module_scope if name in self.module_scope.bindings else None
        s: Optional[Scope] = scope
        first = True
        while s is not None:
            if (first or s.kind != "class") and name in s.bindings and name not in s.nonlocals:
                return s
            if name in s.globals:
                return self.module_scope if name in self.module_scope.bindings else None
            first = False
            s = s.parent
        return None

    def bindings_of(self, name_node: ast.Name) -> List[Binding]:
        scope = self.resolve(name_node.id, self.scope_of(name_node))
        return scope.bindings.get(name_node.id, []) if scope is not None else []

    def values_of(self, name_node: ast.Name) -> List[ast.expr]:
        """Expressions assigned to the name where it is read (flow-insensitive)."""
        return [b.value for b in self.bindings_of(name_node) if b.value is not None]

    def qnames(self, node) -> Set[str]:
        """Fully qualified names ``node`` (a Name, an Attribute chain or a Call) refers to through
        imports, or ``builtins.X``; empty for anything else."""
        if isinstance(node, ast.Call):
            node = node.func
        base = base_name(node)
        if base is None:
            return set()
        d = dotted(node)
        rest = d[len(base.id):]
        scope = self.resolve(base.id, self.scope_of(base))
        if scope is None:
            if base.id in _BUILTINS:
                return {f"builtins.{d}"}
            q = self.unbound_import(base.id)
            return {q + rest} if q is not None else set()
        out = set()
        for b in scope.bindings.get(base.id, ()):
            if b.qname is not None:
                out.add(b.qname + rest)
            elif b.kind == "assign" and isinstance(b.value, ast.Call):
                q = self.imported_by(b.value)
                if q is not None:
                    out.add(q + rest)
        return out

    def imported_by(self, call: ast.Call) -> Optional[str]:
        """The module ``importlib.import_module("apex.amp")`` imports (a string constant, no
        package): the name it is assigned to refers to that module as an import would make it."""
        if not (isinstance(call, ast.Call) and len(call.args) == 1 and not call.keywords
                and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)
                and not call.args[0].value.startswith(".")
                and (dotted(call.func) or "").split(".")[-1] == "import_module"):
            return None
        if id(call) in self._importing:  # `import_module = import_module("x")`: read through itself
            return None
        self._importing.add(id(call))
        try:
            return call.args[0].value if self.qnames(call.func) == {"importlib.import_module"} else None
        finally:
            self._importing.discard(id(call))

    def unbound_import(self, name: str) -> Optional[str]:
        """What a name that nothing binds where it is read was meant to be: apex's, where the
        module imports it under that name inside functions only and always the same
        (``from apex import amp`` in ``main``, ``amp.scale_loss`` in ``train``): that read raised
        NameError, so the name has no other meaning to keep.  None for anything else."""
        if self._unbound is None:
            seen: Dict[str, Set[str]] = {}
            for s in self.scopes:
                if s.kind == "module":
                    continue
                for n, bs in s.bindings.items():
                    for b in bs:
                        if b.kind == "import" and b.qname is not None:
                            seen.setdefault(n, set()).add(b.qname)
            self._unbound = {n: q for n, (q, *more) in ((n, sorted(qs)) for n, qs in seen.items())
                             if not more and q.split(".")[0] == "apex" and n not in self.module_scope.bindings}
        return self._unbound.get(name)

    def is_local(self, name_node: ast.Name) -> bool:
        """Bound in its scope by something other than an import."""
        return any(b.qname is None for b in self.bindings_of(name_node))


# ------------------------------------------------------------------------------ node helpers
def _children(node, AST=ast.AST, list_=list) -> List[ast.AST]:
    out = []
    for f in node._fields:
        v = getattr(node, f, None)
        if isinstance(v, AST):
            out.append(v)
        elif isinstance(v, list_):
            out.extend([x for x in v if isinstance(x, AST)])
    return out


def param_defaults(args: ast.arguments) -> Dict[str, ast.expr]:
    """Parameter name -> its default expression (positional and keyword-only)."""
    pos = [*getattr(args, "posonlyargs", []), *args.args]
    out = {p.arg: d for p, d in zip(pos[len(pos) - len(args.defaults):], args.defaults)}
    out.update({p.arg: d for p, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
    return out


def names_own_class(node: ast.Name) -> bool:
    """``node`` reads the name of a class from inside that class's body (``super(Foo, self)`` in
    ``class Foo``): when the body runs the name is bound to the class itself, whatever else binds
    it in the module (a ``try: from x import Foo / except ImportError: class Foo: ...`` fallback).
    Not its bases or decorators, which run before the class is bound."""
    child, p = node, getattr(node, "_p", None)
    while p is not None:
        if isinstance(p, ast.ClassDef) and p.name == node.id:
            return any(child is x for x in p.body)
        child, p = p, getattr(p, "_p", None)
    return False


def walk(node, into_functions: bool = False) -> Iterator[ast.AST]:
    """Every node below ``node`` (pre-order), not entering nested defs/classes/lambdas.

    A whole module walked with ``into_functions`` is kept (a list on the tree): the planners
    and rules walk the same module many times, and a tree is never edited in place."""
    if into_functions and type(node) is ast.Module:
        every = node.__dict__.get("_every")
        if every is None:
            every = node._every = list(_walk(node, True))
        return iter(every)
    return _walk(node, into_functions)


def _walk(node, into_functions: bool) -> Iterator[ast.AST]:
    stack = _children(node)
    stack.reverse()
    stop = () if into_functions else (*DEFS, ast.Lambda)
    pop, extend = stack.pop, stack.extend
    while stack:
        n = pop()
        yield n
        if stop and isinstance(n, stop):
            continue
        kids = _children(n)
        if kids:
            kids.reverse()
            extend(kids)


def statement_of(node) -> Optional[ast.stmt]:
    """The innermost statement holding ``node`` (the node itself if it is one)."""
    while node is not None and not isinstance(node, ast.stmt):
        node = getattr(node, "_p", None)
    return node


def block_of(stmt: ast.stmt) -> Tuple[Optional[ast.AST], str, List[ast.stmt]]:
    """(owner, field, statements): the block that holds ``stmt`` (``owner.field``)."""
    owner = getattr(stmt, "_p", None)
    if owner is None:
        return None, "", [stmt]
    for field in ("body", "orelse", "finalbody", "handlers"):
        seq = getattr(owner, field, None)
        if isinstance(seq, list) and any(s is stmt for s in seq):
            return owner, field, seq
    if isinstance(owner, ast.ExceptHandler) or isinstance(owner, getattr(ast, "match_case", ())):
        return owner, "body", owner.body
    return owner, "", [stmt]


def enclosing(node, types) -> Optional[ast.AST]:
    p = getattr(node, "_p", None)
    while p is not None:
        if isinstance(p, types):
            return p
        p = getattr(p, "_p", None)
    return None


def enclosing_function(node) -> Optional[ast.AST]:
    return enclosing(node, (ast.FunctionDef, ast.AsyncFunctionDef))


def iter_statements(body: Iterable[ast.stmt], into_functions: bool = False) -> Iterator[ast.stmt]:
    """Every statement in a block, nested blocks included (pre-order)."""
    for s in body:
        yield s
        if not into_functions and isinstance(s, DEFS):
            continue
        for field in ("body", "orelse", "finalbody"):
            seq = getattr(s, field, None)
            if isinstance(seq, list):
                yield from iter_statements(seq, into_functions)
        for h in getattr(s, "handlers", ()) or ():
            yield from iter_statements(h.body, into_functions)
        for c in getattr(s, "cases", ()) or ():
            yield from iter_statements(c.body, into_functions)
