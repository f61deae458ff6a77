"""NVIDIA apex's public names: what each becomes in native PyTorch, and where a module uses them
(by qualified name, through imports and aliases).  Read by the apex rules and the migration."""
from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Tuple

from ampfix.model.analysis import has_star, is_const, kwargs, number_value
from ampfix.model.semantic import dotted, names_own_class, param_defaults, walk

REPLACEMENTS: Dict[str, str] = {
    "apex.amp.initialize": "torch.amp.GradScaler('cuda') plus a torch.autocast('cuda') region around the forward pass",
    "apex.amp.scale_loss": "scaler.scale(loss).backward(), then scaler.step(optimizer) and scaler.update()",
    "apex.amp.master_params": "scaler.unscale_(optimizer), then clip the optimizer's own parameters",
    "apex.amp.state_dict": "scaler.state_dict()",
    "apex.amp.load_state_dict": "scaler.load_state_dict(...)",
    "apex.amp.float_function": "running the function with autocast off, on float32 inputs",
    "apex.amp.half_function": "running the function under float16 autocast",
    "apex.amp.promote_function": "autocast (it promotes mixed inputs itself)",
    "apex.amp.register_float_function": "autocast's own float32 op list (or the function run with autocast off)",
    "apex.amp.register_half_function": "autocast's own float16 op list",
    "apex.amp.register_promote_function": "autocast (it promotes mixed inputs itself)",
    "apex.amp.disable_casts": "torch.autocast('cuda', enabled=False)",
    "apex.amp.init": "torch.amp.GradScaler('cuda') plus torch.autocast('cuda') regions",
    "apex.amp": "native torch.amp (torch.autocast + torch.amp.GradScaler)",
    "apex.fp16_utils.FP16_Optimizer": "the plain optimizer with torch.amp.GradScaler (scaler.scale(loss).backward())",
    "apex.fp16_utils.network_to_half": "torch.autocast (keep the weights in float32)",
    "apex.fp16_utils.BN_convert_float": "torch.autocast (it keeps batch norm in float32 itself)",
    "apex.fp16_utils": "native torch.amp",
    "apex.parallel.DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel",
    "apex.parallel.convert_syncbn_model": "torch.nn.SyncBatchNorm.convert_sync_batchnorm",
    "apex.parallel.SyncBatchNorm": "torch.nn.SyncBatchNorm",
    "apex.parallel": "torch.nn.parallel / torch.distributed",
    "apex.optimizers.FP16_Optimizer": "the plain optimizer with torch.amp.GradScaler (scaler.scale(loss).backward())",
    "apex.optimizers.FusedAdam": "torch.optim.AdamW/Adam(..., fused=True)",
    "apex.optimizers.FusedSGD": "torch.optim.SGD(..., fused=True)",
    "apex.optimizers.FusedLAMB": "no torch equivalent: keep apex for it or choose another optimizer",
    "apex.optimizers.FusedNovoGrad": "no torch equivalent: keep apex for it or choose another optimizer",
    "apex.optimizers.FusedAdagrad": "torch.optim.Adagrad(..., fused=True) on recent torch",
    "apex.optimizers": "torch.optim with fused=True where it exists",
    "apex.normalization.FusedLayerNorm": "torch.nn.LayerNorm",
    "apex.normalization.MixedFusedLayerNorm": "torch.nn.LayerNorm",
    "apex.normalization.FusedRMSNorm": "torch.nn.RMSNorm (torch>=2.4)",
    "apex.normalization": "torch.nn normalization layers",
    "apex": "native PyTorch (torch.amp, torch.nn.parallel, fused torch.optim)",
}


def replacement_for(qname: str) -> str:
    best = max((k for k in REPLACEMENTS if qname == k or qname.startswith(k + ".")), key=len, default="apex")
    return REPLACEMENTS[best]


def canonical(qname: str) -> str:
    """apex's submodule spellings as one name (``apex.normalization.fused_layer_norm.FusedLayerNorm``
    is ``apex.normalization.FusedLayerNorm``; ``apex.parallel.distributed.X`` is ``apex.parallel.X``)."""
    parts = qname.split(".")
    if len(parts) >= 4 and parts[0] == "apex" and parts[1] in ("normalization", "parallel", "optimizers",
                                                                 "fp16_utils"):
        return ".".join(parts[:2] + parts[-1:])
    return qname


#: words in a file that make it one to look at for apex: its name, and amp's `scale_loss`
#: (``args.amp.scale_loss`` in a module that imports nothing of apex)
MARKERS = ("apex", "scale_loss")


def names_apex(text) -> bool:
    """Whether a file's text (str or bytes) may use apex (:data:`MARKERS`)."""
    if isinstance(text, bytes):
        return any(m.encode() in text for m in MARKERS)
    return any(m in text for m in MARKERS)


def imports_apex(x) -> bool:
    """``import apex...`` or ``from apex... import ...`` (absolute)."""
    if isinstance(x, ast.Import):
        return any(a.name.split(".")[0] == "apex" for a in x.names)
    return isinstance(x, ast.ImportFrom) and not x.level and (x.module or "").split(".")[0] == "apex"


def attribute_aliases(sem, tree) -> Dict[Tuple[int, str], Tuple[str, str]]:
    """apex's amp kept on an object (:func:`self_aliases`, :func:`object_aliases`), computed once
    per module."""
    cached = sem.__dict__.get("_apex_attr_aliases")
    if cached is None:
        cached = self_aliases(sem, tree)
        for k, v in object_aliases(sem, tree).items():
            cached.setdefault(k, v)
        sem._apex_attr_aliases = cached
    return cached


def apex_name_of(sem, tree, node) -> Optional[str]:
    """:func:`apex_qname`, or the apex name of ``self.amp.scale_loss`` / ``args.amp.scale_loss``
    where the attribute holds apex's amp: what the apex rules report."""
    q = apex_qname(sem, node)
    if q is None and isinstance(node, ast.Attribute):
        aliases = attribute_aliases(sem, tree)
        if aliases:
            q = _through_alias(node, aliases)
    return q


def apex_uses(sem, tree) -> List[Tuple[ast.AST, str]]:
    """Each apex reference outside imports: (outermost Name/Attribute, canonical qualified name)."""
    out = []
    aliases = attribute_aliases(sem, tree)
    for n in walk(tree, into_functions=True):
        if not isinstance(n, (ast.Name, ast.Attribute)) or not isinstance(n.ctx, ast.Load):
            continue
        p = getattr(n, "_p", None)
        if isinstance(p, ast.Attribute) and p.value is n:
            continue
        q = apex_qname(sem, n)
        if q is None and aliases and isinstance(n, ast.Attribute):
            q = _through_alias(n, aliases)
        if q is not None:
            out.append((n, q))
    # `self.amp = importlib.import_module("apex.amp")`: the import, as a value
    out.extend((n, q) for n in walk(tree, into_functions=True) if isinstance(n, ast.Call)
               and (q := imported_apex(sem, n)) is not None)
    return out


def imported_apex(sem, call) -> Optional[str]:
    """The apex module ``importlib.import_module("apex.amp")`` imports, canonical; None else."""
    q = sem.imported_by(call) if isinstance(call, ast.Call) else None
    return canonical(q) if q is not None and (q == "apex" or q.startswith("apex.")) else None


def self_aliases(sem, tree) -> Dict[Tuple[int, str], Tuple[str, str]]:
    """``self.amp = amp`` (apex's amp module kept on the object, the only value ``self.amp`` is
    ever given in its class, besides ``None``): (id of the method, ``amp``) -> (``self``, ``apex.amp``)
    for every method of that class, so ``self.amp.scale_loss`` is ``apex.amp.scale_loss``."""
    out: Dict[Tuple[int, str], Tuple[str, str]] = {}
    for cls in walk(tree, into_functions=True):
        if not isinstance(cls, ast.ClassDef):
            continue
        methods = [f for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.args.args]
        given: Dict[str, List[Optional[str]]] = {}
        for f in methods:
            me = f.args.args[0].arg
            for n in walk(f, into_functions=True):
                if isinstance(n, ast.Assign):
                    targets, value = n.targets, n.value
                elif isinstance(n, (ast.AnnAssign, ast.AugAssign)):
                    targets, value = [n.target], None
                elif isinstance(n, (ast.For, ast.AsyncFor, ast.withitem)):
                    targets, value = [n.target if isinstance(n, (ast.For, ast.AsyncFor)) else n.optional_vars], None
                else:
                    continue
                flat = [e for t in targets if t is not None for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
                for t in flat:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == me:
                        q = None
                        if len(flat) == 1 and isinstance(value, (ast.Name, ast.Attribute)):
                            q = apex_qname(sem, value)
                        elif len(flat) == 1 and isinstance(value, ast.Call):
                            q = imported_apex(sem, value)
                        elif len(flat) == 1 and isinstance(value, ast.Constant) and value.value is None:
                            q = "None"
                        given.setdefault(t.attr, []).append(q)
        for attr, qs in given.items():
            if ("apex.amp" in qs or attr in set_outside(cls, methods, qs, attr)) and \
                    all(q in ("apex.amp", "None") for q in qs):
                for f in methods:
                    out[(id(f), attr)] = (f.args.args[0].arg, "apex.amp")
    return out


def set_outside(cls, methods, given: List[Optional[str]], attr: str) -> Set[str]:
    """``{attr}`` where the class only ever sets ``self.<attr>`` to None and reads it only to call
    amp's API on it (``scale_loss`` among the calls) or to test it for None, and ``amp`` is in its
    name: apex's amp is put there from outside (argus models: ``self.amp = None`` in ``__init__``,
    ``model.amp = amp`` in a setup function of another module)."""
    if "amp" not in attr.lower() or not given or any(q != "None" for q in given):
        return set()
    calls = set()
    for f in methods:
        me = f.args.args[0].arg
        for n in walk(f, into_functions=True):
            if not (isinstance(n, ast.Attribute) and n.attr == attr and isinstance(n.value, ast.Name)
                    and n.value.id == me and isinstance(n.ctx, ast.Load)):
                continue
            p = getattr(n, "_p", None)
            if isinstance(p, ast.Attribute) and p.value is n and p.attr in _AMP_API:
                calls.add(p.attr)
            elif not none_test_of(n):
                return set()
    return {attr} if "scale_loss" in calls else set()


def none_test_of(node) -> Optional[Tuple[ast.AST, bool]]:
    """(the test, negated) where ``node`` is only tested for being given: ``x``, ``not x``,
    ``x is None``, ``x is not None`` in an ``if``/``while``/``assert`` test, a boolean operation or
    a conditional expression; None elsewhere."""
    test, negated = node, False
    p = getattr(test, "_p", None)
    if isinstance(p, ast.Compare) and len(p.ops) == 1 and p.left is test and \
            isinstance(p.ops[0], (ast.Is, ast.IsNot)) and isinstance(p.comparators[0], ast.Constant) and \
            p.comparators[0].value is None:
        test, negated = p, isinstance(p.ops[0], ast.Is)
        p = getattr(test, "_p", None)
    if isinstance(p, ast.UnaryOp) and isinstance(p.op, ast.Not):
        test, negated = p, not negated
        p = getattr(test, "_p", None)
    while isinstance(p, ast.BoolOp):
        p = getattr(p, "_p", None)
    if isinstance(p, (ast.If, ast.While, ast.IfExp, ast.Assert)) and any(x is test for x in [p.test, *walk(p.test)]):
        return test, negated
    return None


def _enclosing_def(node):
    """The function definition ``node`` lies in, or None at module level."""
    f = getattr(node, "_p", None)
    while f is not None and not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
        f = getattr(f, "_p", None)
    return f


def _method_self(n: ast.Name) -> bool:
    """Whether the name is the first parameter of the method it is read or set in (``self``)."""
    f = _enclosing_def(n)
    owner = getattr(f, "_p", None) if f is not None else None
    return isinstance(owner, ast.ClassDef) and bool(f.args.args) and f.args.args[0].arg == n.id


def object_alias_attrs(sem, tree) -> Set[str]:
    """``args.amp = amp``: apex's amp kept on an object that functions hand around (UER-py's and
    its copies' ``args``), where every value any ``<name>.amp`` is given in the module is apex's
    amp or None and every read of ``<name>.amp`` calls amp's API on it (``args.amp.scale_loss``):
    such an attribute names apex's amp wherever it is read (``self`` is :func:`self_aliases`')."""
    cached = sem.__dict__.get("_apex_object_attrs")
    if cached is not None:
        return cached
    given: Dict[str, List[Optional[str]]] = {}
    bad: Set[str] = set()
    read: Set[str] = set()
    for n in walk(tree, into_functions=True):
        if not (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)) or _method_self(n.value):
            continue
        if isinstance(n.ctx, ast.Store):
            p = getattr(n, "_p", None)
            q = None
            if isinstance(p, ast.Assign) and p.targets == [n]:
                if isinstance(p.value, (ast.Name, ast.Attribute)):
                    q = apex_qname(sem, p.value)
                elif isinstance(p.value, ast.Constant) and p.value.value is None:
                    q = "None"
            given.setdefault(n.attr, []).append(q)
        elif isinstance(n.ctx, ast.Load):
            p = getattr(n, "_p", None)
            if not (isinstance(p, ast.Attribute) and p.value is n and p.attr in _AMP_API):
                bad.add(n.attr)
            elif p.attr == "scale_loss":
                read.add(n.attr)
        else:
            bad.add(n.attr)
    out = {a for a, qs in given.items() if a not in bad and "apex.amp" in qs and all(q in ("apex.amp", "None")
                                                                                      for q in qs)}
    # a module that only reads it (the scripts that import the shared step set `args.amp = amp`):
    # an attribute named for amp whose every read calls amp's API, `scale_loss` among them (no
    # GradScaler has one), never given a value here
    out |= {a for a in read - bad - set(given) if "amp" in a.lower()}
    sem._apex_object_attrs = out
    return out


def object_aliases(sem, tree) -> Dict[Tuple[int, str], Tuple[str, str]]:
    """(id of a function, attribute) -> (the object's name there, ``apex.amp``) for each function
    that reads ``<name>.<attribute>.<amp API>`` where the attribute is one of
    :func:`object_alias_attrs` (one name per function)."""
    attrs = object_alias_attrs(sem, tree)
    out: Dict[Tuple[int, str], Tuple[str, str]] = {}
    if not attrs:
        return out
    seen: Dict[Tuple[int, str], Set[str]] = {}
    for n in walk(tree, into_functions=True):
        if not (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and n.attr in attrs
                and isinstance(n.value, ast.Name)) or _method_self(n.value):
            continue
        f = _enclosing_def(n)
        if f is not None:
            seen.setdefault((id(f), n.attr), set()).add(n.value.id)
    for k, names in seen.items():
        if len(names) == 1:
            out[k] = (next(iter(names)), "apex.amp")
    return out


def _through_alias(node: ast.Attribute, aliases) -> Optional[str]:
    """The apex name of ``self.amp.x.y`` in a method where ``self.amp`` aliases apex.amp."""
    chain = []
    n = node
    while isinstance(n, ast.Attribute):
        chain.append(n.attr)
        n = n.value
    if not isinstance(n, ast.Name) or not chain:
        return None
    attr, rest = chain[-1], list(reversed(chain[:-1]))
    f = _enclosing_def(node)
    hit = aliases.get((id(f), attr)) if f is not None else None
    if hit is None or hit[0] != n.id:
        return None
    return ".".join([hit[1], *rest])


def stands_for_apex(sem, node, qname: str, spec=None) -> None:
    """Record that the callee ``node`` (``amp.scale_loss`` of ``import amp_support as amp``) is a
    call of apex's ``qname`` under another name: a project function that only forwards to it
    (:mod:`ampfix.migration.shims`); ``spec``, the import that binds it, goes once nothing reads it."""
    sem.__dict__.setdefault("_apex_stand_ins", {})[id(node)] = qname
    if spec is not None:
        sem.__dict__.setdefault("_apex_stand_in_imports", []).append(spec)


def stand_in(sem, node) -> Optional[str]:
    """The apex function the callee ``node`` stands for (:func:`stands_for_apex`), or None."""
    return sem.__dict__.get("_apex_stand_ins", {}).get(id(node))


def stand_in_imports(sem) -> list:
    """The imports of the module's stand-ins for apex (:func:`stands_for_apex`)."""
    return list(sem.__dict__.get("_apex_stand_in_imports", ()))


def apex_qname(sem, node) -> Optional[str]:
    if isinstance(node, ast.Name) and names_own_class(node):
        # `super(BertLayerNorm, self)` inside the fallback `class BertLayerNorm` of a `try: from
        # apex... import FusedLayerNorm as BertLayerNorm / except ImportError:`: the class itself
        return None
    q = stand_in(sem, node)
    if q is not None:
        return q
    names = sorted(q for q in sem.qnames(node) if q == "apex" or q.startswith("apex."))
    if names:
        return canonical(names[0])
    return _param_qname(sem, node, param_aliases(sem))


def _param_qname(sem, node, aliases) -> Optional[str]:
    """``amp.scale_loss`` where ``amp`` is a parameter in ``aliases``: ``apex.amp.scale_loss``."""
    if not aliases:
        return None
    if isinstance(node, ast.Call):
        node = node.func
    base = node
    while isinstance(base, ast.Attribute):
        base = base.value
    if not isinstance(base, ast.Name):
        return None
    bs = sem.bindings_of(base)
    if not bs or any(b.kind != "param" for b in bs):
        return None
    q = aliases.get((id(bs[0].scope.node), base.id))
    return q + dotted(node)[len(base.id):] if q else None


#: what a function must read from a parameter for it to be apex's amp handed in
_AMP_API = frozenset({"initialize", "scale_loss", "master_params", "state_dict", "load_state_dict", "init"})


def param_aliases(sem) -> Dict[Tuple[int, str], str]:
    """apex's amp handed to a function as an argument (``prepare(args, model, amp=amp)``, where
    the caller's ``amp`` is ``from apex import amp`` or ``None``): (id of the function, parameter)
    -> ``apex.amp`` when every call of the function in the module passes apex's amp or None for
    that parameter (at least one passes amp), the function is used only by those calls, never
    rebinds the parameter, and reads amp's API from it.  Followed down a chain of such calls."""
    cached = sem.__dict__.get("_apex_params")
    if cached is not None:
        return cached
    sem._apex_params = {}
    sem._apex_params_none = set()
    funcs = [f for f in walk(sem.tree, into_functions=True) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    candidates = []
    for f in funcs:
        scope = sem.scope_for(f)
        if scope is None or sem.scope_of(f).kind == "class":
            continue
        params = [a.arg for a in f.args.posonlyargs + f.args.args + f.args.kwonlyargs]
        read = {n.value.id for n in walk(f) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                and n.attr in _AMP_API}
        for name in params:
            if name in read and [b.kind for b in scope.bindings.get(name, ())] == ["param"]:
                candidates.append((f, name))
    if not candidates:
        return sem._apex_params
    calls: Dict[int, List[ast.Call]] = {}
    others: Set[int] = set()
    ids = {id(f) for f, _ in candidates}
    for n in walk(sem.tree, into_functions=True):
        if not isinstance(n, ast.Name) or not isinstance(n.ctx, ast.Load):
            continue
        hit = [b.node for b in sem.bindings_of(n) if b.kind == "def" and id(b.node) in ids]
        if not hit:
            continue
        p = getattr(n, "_p", None)
        if isinstance(p, ast.Call) and p.func is n:
            calls.setdefault(id(hit[0]), []).append(p)
        else:
            others.add(id(hit[0]))
    aliases: Dict[Tuple[int, str], str] = {}
    for _ in range(4):  # a chain of helpers: main -> train(amp) -> prepare(amp)
        found = {}
        for f, name in candidates:
            sites = calls.get(id(f), [])
            if not sites or id(f) in others:
                continue
            kinds = [_passed(sem, f, name, c, aliases) for c in sites]
            if all(k in ("apex.amp", "None") for k in kinds) and "apex.amp" in kinds:
                found[(id(f), name)] = "apex.amp"
                if "None" in kinds:
                    sem._apex_params_none.add((id(f), name))
        if found == aliases:
            break
        aliases = found
    sem._apex_params = aliases
    return aliases


def param_may_be_none(sem, func_node, name: str) -> bool:
    """Whether a call hands the parameter None (or leaves it to a None default)."""
    param_aliases(sem)
    d = param_defaults(func_node.args).get(name)
    return (id(func_node), name) in sem._apex_params_none or (isinstance(d, ast.Constant) and d.value is None)


def _passed(sem, f, name: str, call: ast.Call, aliases) -> Optional[str]:
    """What ``call`` hands ``f``'s parameter ``name``: ``apex.amp``, ``None`` or None (anything else)."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    positional = [a.arg for a in f.args.posonlyargs + f.args.args]
    arg = next((k.value for k in call.keywords if k.arg == name), None)
    if arg is None and name in positional and positional.index(name) < len(call.args):
        arg = call.args[positional.index(name)]
    if arg is None:  # the default
        arg = param_defaults(f.args).get(name)
    if isinstance(arg, ast.Constant) and arg.value is None:
        return "None"
    if not isinstance(arg, (ast.Name, ast.Attribute)):
        return None
    names = sorted(q for q in sem.qnames(arg) if q == "apex" or q.startswith("apex."))
    q = canonical(names[0]) if names else _param_qname(sem, arg, aliases)
    return q if q == "apex.amp" else None


def apex_value_condition(sem, func_node, name: str) -> Optional[ast.expr]:
    """Where ``name`` in the function ``func_node`` is apex's amp exactly when a test holds
    (``if args.fp16: from apex import amp`` / ``else: amp = None``, the import perhaps in a
    ``try`` whose ``except ImportError`` raises): that test; None for any other binding."""
    scope = sem.scope_for(func_node)
    bs = scope.bindings.get(name, []) if scope is not None else []
    imports = [b for b in bs if b.kind == "import" and b.qname == "apex.amp"]
    nones = [b for b in bs if b.kind == "assign" and isinstance(b.value, ast.Constant) and b.value.value is None]
    if len(imports) != 1 or len(nones) != 1 or len(bs) != 2:
        return None
    imp, none = imports[0].node, nones[0].node
    while not isinstance(imp, ast.stmt):
        imp = getattr(imp, "_p", None)
    while not isinstance(none, ast.stmt):
        none = getattr(none, "_p", None)
    node = getattr(imp, "_p", None)
    while node is not None and node is not func_node:
        if isinstance(node, ast.If):
            body = {id(x) for s in node.body for x in [s, *walk(s)]}
            if id(imp) in body and any(x is none for x in node.orelse):
                return node.test
            return None
        if isinstance(node, ast.Try):
            if not all(any(isinstance(x, ast.Raise) for x in h.body) for h in node.handlers):
                return None  # `except ImportError: amp = None`: whether apex is installed
        elif not isinstance(node, ast.stmt):
            return None
        node = getattr(node, "_p", None)
    return None


def none_if_missing(sem, name_node: ast.Name) -> bool:
    """``name`` is apex's amp where apex is installed and None where it is not: every binding of
    it is ``from apex import amp`` in a ``try`` body or ``amp = None`` in that ``try``'s
    ``except`` (nnUNet, allennlp: ``try: from apex import amp / except ImportError: amp = None``).
    A test of it (``amp is not None``) asks whether apex is installed."""
    bs = sem.bindings_of(name_node)
    imports = [b for b in bs if b.kind == "import" and b.qname == "apex.amp"]
    nones = [b for b in bs if b.kind == "assign" and isinstance(b.value, ast.Constant) and b.value.value is None]
    if len(imports) != 1 or not nones or len(imports) + len(nones) != len(bs):
        return False
    imp = imports[0].node
    while imp is not None and not isinstance(imp, ast.stmt):
        imp = getattr(imp, "_p", None)
    t = getattr(imp, "_p", None)
    if not (isinstance(t, ast.Try) and any(x is imp for x in t.body)):
        return False
    for b in nones:
        st = b.node
        while st is not None and not isinstance(st, ast.stmt):
            st = getattr(st, "_p", None)
        h = getattr(st, "_p", None)
        if not (isinstance(h, ast.ExceptHandler) and getattr(h, "_p", None) is t and any(x is st for x in h.body)):
            return False
    return True


#: apex.amp's public functions, in every release since the first: a test that asks for one asks
#: whether apex is installed
AMP_FUNCTIONS = frozenset({
    "initialize", "init", "scale_loss", "state_dict", "load_state_dict", "master_params", "disable_casts",
    "half_function", "float_function", "promote_function", "register_half_function", "register_float_function",
    "register_promote_function"})


def feature_probe(node) -> Optional[ast.expr]:
    """The test when ``node`` (the read of apex's amp) asks whether amp has one of its own
    functions: ``'load_state_dict' in amp.__dict__`` (``node`` is ``amp.__dict__``; the train
    scripts copied from timm before 2020 resume so) or ``hasattr(amp, "state_dict")``.  It holds
    wherever apex is installed; None else."""
    p = getattr(node, "_p", None)
    if isinstance(node, ast.Attribute) and node.attr == "__dict__":
        if isinstance(p, ast.Compare) and len(p.ops) == 1 and isinstance(p.ops[0], ast.In) and \
                p.comparators[0] is node and isinstance(p.left, ast.Constant) and p.left.value in AMP_FUNCTIONS:
            return p
        return None
    if isinstance(p, ast.Call) and isinstance(p.func, ast.Name) and p.func.id == "hasattr" and len(p.args) == 2 \
            and not p.keywords and p.args[0] is node and isinstance(p.args[1], ast.Constant) and \
            p.args[1].value in AMP_FUNCTIONS:
        return p
    return None


def _probe(sem, test) -> bool:
    """``test`` is a :func:`feature_probe` of apex's amp."""
    if isinstance(test, ast.Compare) and len(test.comparators) == 1:
        inner = test.comparators[0]
    elif isinstance(test, ast.Call) and test.args:
        inner = test.args[0]
    else:
        return False
    if feature_probe(inner) is not test:
        return False
    q = apex_qname(sem, inner.value if isinstance(inner, ast.Attribute) else inner)
    return q == "apex.amp"


def installed_test(sem, node) -> Optional[Tuple[ast.expr, bool]]:
    """(the expression, its value where apex is installed) when ``node`` (a Name) is a
    :func:`none_if_missing` name tested as such: ``amp is not None`` (True), ``amp is None``
    (False), ``amp`` / ``not amp`` as a truth value in a test or a boolean operation; or when
    ``node`` is the read of apex's amp in a :func:`feature_probe` (True)."""
    probe = feature_probe(node)
    if probe is not None and _probe(sem, probe):
        return probe, True
    if not isinstance(node, ast.Name) or not none_if_missing(sem, node):
        return None
    p = getattr(node, "_p", None)
    if isinstance(p, ast.Compare) and len(p.ops) == 1 and p.left is node and \
            isinstance(p.ops[0], (ast.Is, ast.IsNot)) and isinstance(p.comparators[0], ast.Constant) and \
            p.comparators[0].value is None:
        return p, isinstance(p.ops[0], ast.IsNot)
    if isinstance(p, ast.UnaryOp) and isinstance(p.op, ast.Not):
        return p, False
    if isinstance(p, ast.BoolOp) or (isinstance(p, (ast.If, ast.While, ast.IfExp, ast.Assert)) and p.test is node):
        return node, True
    return None


def fold_installed(sem, code, test):
    """``test`` where apex is installed (native AMP always is, once apex goes): True or False,
    the text of what is left (``not fp16 or amp is None or not cuda`` -> ``not fp16 or not
    cuda``), or None when it has no :func:`installed_test` in it.  A test that reads such a
    name any other way raises ValueError."""
    if _probe(sem, test):
        return True
    got = installed_test(sem, test.left if isinstance(test, ast.Compare) else
                         test.operand if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) else test)
    if got is not None and got[0] is test:
        return got[1]
    if isinstance(test, ast.BoolOp):
        parts = [fold_installed(sem, code, v) for v in test.values]
        if all(x is None for x in parts):
            return None
        is_and = isinstance(test.op, ast.And)
        kept = []
        for i, (v, x) in enumerate(zip(test.values, parts)):
            if x is (not is_and):
                # it decides the operation: what the operands before it called would be lost
                if any(isinstance(n, ast.Call) for w in test.values[:i] for n in [w, *walk(w)]):
                    raise ValueError(code(test))
                return not is_and
            if x is None:
                kept.append(code(v) if not isinstance(v, ast.BoolOp) else f"({code(v)})")
            elif isinstance(x, str):
                kept.append(f"({x})")
        if not kept:
            return is_and
        return f" {'and' if is_and else 'or'} ".join(kept)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        x = fold_installed(sem, code, test.operand)
        if x is None:
            return None
        return (not x) if isinstance(x, bool) else f"not ({x})"
    if any(isinstance(n, ast.Name) and none_if_missing(sem, n) for n in walk(test)):
        raise ValueError(code(test))
    return None


#: apex's DistributedDataParallel, and the methods only it has (torch's has none: a call of one on
#: the wrapped model raises AttributeError once the wrapper is torch's)
APEX_DDP = "apex.parallel.DistributedDataParallel"
APEX_DDP_ONLY = frozenset({"enable_allreduce", "disable_allreduce", "sync_bucket_structure", "allreduce_bucket",
                           "allreduce_maybe_retain", "allreduce_fallback", "comm_ready_buckets", "create_hooks"})
#: apex DDP keywords that torch's DDP can do without (or, message_size, say as bucket_cap_mb)
APEX_DDP_KEYWORDS = frozenset({"delay_allreduce", "gradient_average", "gradient_predivide_factor", "message_size",
                               "module"})


def apex_ddp_call_changes(call: ast.Call) -> bool:
    """A call of apex's DistributedDataParallel whose arguments torch's takes (the model, and
    keywords torch's DDP does without or says otherwise)."""
    if has_star(call):
        return False
    kws = kwargs(call)
    if len(call.args) + ("module" in kws) != 1 or set(kws) - APEX_DDP_KEYWORDS:
        return False
    ga = kws.get("gradient_average")
    if ga is not None and not is_const(ga, True):
        return False
    return "message_size" not in kws or number_value(kws["message_size"]) is not None


def maybe_not_apex(sem, node) -> bool:
    """A name bound to an apex class on one path and to something else on another (``if
    use_apex: from apex.parallel import DDP else: from torch.nn.parallel import DDP``, ``except
    ImportError: DDP = torch.nn.parallel.DistributedDataParallel``)."""
    if any(not (q == "apex" or q.startswith("apex.")) for q in sem.qnames(node)):
        return True
    return isinstance(node, ast.Name) and any(
        b.kind != "import" or not (b.qname or "").startswith("apex.") for b in sem.bindings_of(node))


def apex_ddp_only_calls(tree) -> List[ast.Call]:
    """Calls of a method only apex's DistributedDataParallel has (``model.disable_allreduce()``)."""
    return [n for n in walk(tree, into_functions=True) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr in APEX_DDP_ONLY]


def subclassed_at(node) -> Optional[ast.ClassDef]:
    """The class whose bases name ``node`` (``class CustomDDP(DistributedDataParallel):``)."""
    p = getattr(node, "_p", None)
    return p if isinstance(p, ast.ClassDef) and any(b is node for b in p.bases) else None
