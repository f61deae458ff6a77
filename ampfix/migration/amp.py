"""apex.amp -> torch.autocast + GradScaler, planned over the project.

Seeds are the ``amp.initialize`` (and old ``amp.init``) calls.  A seed with optimizers makes a
GradScaler where it ran, hoisted out of the ``if`` that guarded it (``enabled=`` says when it
works).  Every function that scales a loss, clips master parameters, or saves or loads apex's
state must reach that scaler; :class:`Solver` finds how:

* the function of the seed itself: a local ``scaler``;
* a closure inside it: the same name;
* any function of a module whose seed runs at module level: the module global;
* a method of the class whose method holds the seed: ``self.scaler`` (made disabled in
  ``__init__`` first, so that it always exists);
* any other function: a keyword-only parameter ``scaler``, passed at every call site in the
  project, whose callers must reach a scaler themselves (across modules too).

A function that is used other than by calling it, or that nothing in the project calls, cannot
be reached: the group is refused, and says where.

A seed without optimizers (evaluation scripts) makes no scaler: the statements after it that
use the model run under autocast.  ``opt_level="O3"`` makes the model ``.half()``.
"""
from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Tuple

from ampfix.model.analysis import arg, has_star, is_const, kwargs, method_call, number_value, receiver, string_value
from ampfix.migration.groups import FileChanges, Group, Refuse
from ampfix.migration.flow import (
    ancestors_stmts, assigned, dominates, follows, forward_region, guards, loops_around, read, stmt_of,
)
from ampfix.migration.spell import STATIC_NOTE, as_bool, autocast_call, conj, description, scaler_call
from ampfix.rule import ImportSpec
from ampfix.model.apex import apex_uses
from ampfix.model.semantic import DEFS, block_of, dotted, walk

NOTES = {
    "keep_batchnorm_fp32": "autocast keeps batch norm in float32 itself",
    "master_weights": "the model stays float32, so its weights are the master weights",
    "cast_model_type": "the model stays float32; autocast casts per op",
    "patch_torch_functions": "autocast replaces the patching",
    "cast_model_outputs": "autocast outputs follow each op's dtype",
    "num_losses": "one GradScaler serves every loss",
    "min_loss_scale": "GradScaler has no lower bound on the scale",
    "max_loss_scale": "GradScaler has no upper bound on the scale",
    "verbosity": "not needed",
}
SCALER_KINDS = {"scale_loss", "master_params", "state_dict", "load_state_dict", "_amp_state", ""}
FUNCTION_KINDS = {"float_function", "half_function", "promote_function", "register_float_function",
                  "register_half_function", "register_promote_function", "disable_casts"}


def availability_check(node) -> Optional[ast.stmt]:
    """The statement, when a bare apex name only checks that apex is installed:
    ``assert amp is not None, ...`` or ``if amp is None: raise ...``."""
    st = stmt_of(node)
    if isinstance(st, ast.Assert) and any(n is node for n in walk(st.test)):
        return st
    if isinstance(st, ast.If) and any(n is node for n in walk(st.test)) and not st.orelse and \
            all(isinstance(x, (ast.Raise, ast.Expr)) for x in st.body) and any(isinstance(x, ast.Raise) for x in st.body):
        return st
    return None


SCALER_STATE_HELPER = '''def _scaler_state(scaler, state):
    """GradScaler state from a checkpoint, also one that apex.amp saved before the migration."""
    if "loss_scaler0" in state:  # apex.amp.state_dict(): {"loss_scaler0": {"loss_scale", "unskipped"}}
        old = state["loss_scaler0"]
        return {**scaler.state_dict(), "scale": float(old["loss_scale"]), "_growth_tracker": int(old["unskipped"])}
    return state
'''


def kind_of(qname: str) -> str:
    return qname[len("apex.amp."):].split(".")[0] if qname.startswith("apex.amp.") else ""


class Use:
    def __init__(self, module, node, qname: str) -> None:
        self.module = module
        self.node = node
        self.qname = qname
        self.kind = kind_of(qname)
        p = getattr(node, "_p", None)
        self.call = p if isinstance(p, ast.Call) and p.func is node else None
        self.func = module.function_of(node)
        if self.kind == "" and availability_check(node) is not None:
            self.kind = "check"

    @property
    def line(self) -> int:
        return self.node.lineno


class Seed:
    """An ``amp.initialize(...)`` / ``amp.init(...)``: what it makes and where."""

    def __init__(self, use: Use, idx: int) -> None:
        self.use = use
        self.idx = idx
        self.module = use.module
        self.func = use.func
        self.call = use.call
        self.stmt = stmt_of(use.node)
        self.models = None
        self.optimizers = None
        self.training = False

    @property
    def unit(self):
        return self.func.node if self.func is not None else self.module.tree


class Carrier:
    """How a function gets the scaler: ``expr`` is what it writes (``scaler``, ``self.scaler``)."""

    def __init__(self, kind: str, seeds: Set[int], expr: str, sites=()) -> None:
        self.kind = kind
        self.seeds = seeds
        self.expr = expr
        self.sites = list(sites)


class Solver:
    def __init__(self, project, seeds: List[Seed], name: str) -> None:
        self.p = project
        self.seeds = seeds
        self.name = name
        self.memo: Dict[object, Optional[Carrier]] = {}
        self.why: Dict[object, str] = {}
        self.stack: List[object] = []

    @staticmethod
    def key(module, func):
        return ("f", id(func.node)) if func is not None else ("m", module.path)

    def solve(self, module, func) -> Optional[Carrier]:
        k = self.key(module, func)
        if k in self.memo:
            return self.memo[k]
        if k in self.stack:
            return None
        self.stack.append(k)
        try:
            c = self._solve(module, func)
        finally:
            self.stack.pop()
        self.memo[k] = c
        return c

    def fail(self, module, func, why: str) -> None:
        self.why.setdefault(self.key(module, func), why)
        return None

    def _solve(self, module, func) -> Optional[Carrier]:
        own = [s for s in self.seeds if s.training and s.module is module and s.func is func]
        if own:
            # a seed in a method keeps the scaler on self, for the other methods of the class
            expr = "self." + self.name if func is not None and func.is_method else self.name
            return Carrier("local", {s.idx for s in own}, expr)
        if func is None:
            return self.fail(module, func, f"module-level code of {module.path} has no amp.initialize before it")
        if func.outer is not None:
            c = self.solve(module, func.outer)
            if c is not None and c.kind in ("local", "closure", "global") and not self._binds(func, c.expr):
                return Carrier("closure", c.seeds, c.expr)
        top = [s for s in self.seeds if s.training and s.module is module and s.func is None]
        if top and not self._binds(func, self.name):
            return Carrier("global", {s.idx for s in top}, self.name)
        if func.cls is not None and func.is_method:
            same = [s for s in self.seeds if s.training and s.func is not None and s.func.cls is not None
                    and s.func.is_method and self._related(s.func, func)]
            if same:
                return Carrier("self", {s.idx for s in same}, "self." + self.name)

        if func.cls is not None and func.is_method and func.node.name != "__init__":
            # whoever builds the object hands it the scaler: its __init__ keeps it on self
            c = self._via_init(module, func)
            if c is not None:
                return c
        refs = self.p.references(func)
        if refs:
            r = refs[0]
            return self.fail(module, func, f"`{func.qualname}` is used other than by a call (line {r.lineno}), "
                                           "so the scaler cannot be passed to it")
        sites = self.p.callers(func)
        if not sites and func.cls is not None and any(
                "register" in (dotted(d.func if isinstance(d, ast.Call) else d) or "") for d in func.cls.decorator_list):
            deco = next(d for d in func.cls.decorator_list
                        if "register" in (dotted(d.func if isinstance(d, ast.Call) else d) or ""))
            return self.fail(module, func, f"`{func.cls.name}` is built by a registry from the configuration "
                                           f"(@{module.src.code(deco)}), so no call can hand it the GradScaler: keep "
                                           "one where the optimizer lives (the runner) by hand")
        if not sites:
            name = func.cls.name if func.node.name == "__init__" and func.cls is not None else func.node.name
            elsewhere = self.p.mentioned_elsewhere(name)
            if elsewhere:
                return self.fail(module, func, f"`{func.qualname}` is used in {elsewhere[0]}, which was not given: run "
                                               "ampfix on the files that call it too")
            if self.name in func.positional or self.name in func.kwonly:
                return self.fail(module, func, f"`{func.qualname}` already has a parameter `{self.name}`")
            # nothing in the project calls it: dead code, or an entry point of the project's API;
            # it takes the scaler as a keyword-only parameter (and the report says so)
            c = Carrier("param", set(), self.name, [])
            c.entry = func
            return c
        seeds: Set[int] = set()
        for s in sites:
            c = self.solve(s.module, s.caller)
            if c is None:
                where = f"{s.caller.qualname}" if s.caller else "module level"
                return self.fail(module, func, f"`{func.qualname}` is also called from `{where}` ({s.module.path} "
                                               f"line {s.node.lineno}), where no amp.initialize comes first")
            seeds |= c.seeds
        if self.name in func.positional or self.name in func.kwonly:
            return self.fail(module, func, f"`{func.qualname}` already has a parameter `{self.name}`")
        return Carrier("param", seeds, self.name, sites)

    def _via_init(self, module, func) -> Optional[Carrier]:
        init = self.p._method(module, func.cls, "__init__")
        if init is None or init.cls is not func.cls:
            return None
        c = self.solve(init.module, init)
        if c is None or c.kind != "param":
            return None
        carrier = Carrier("self", c.seeds, "self." + self.name)
        carrier.via_init = (init, c)
        return carrier

    def _related(self, a, b) -> bool:
        """Methods of one class, or of a class and its project base."""
        if a.cls is b.cls:
            return True
        return any(isinstance(x, ast.Name) and x.id == a.cls.name for x in b.cls.bases) or any(
            isinstance(x, ast.Name) and x.id == b.cls.name for x in a.cls.bases)

    @staticmethod
    def _binds(func, name: str) -> bool:
        return name in func.positional or name in func.kwonly or any(
            isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in walk(func.node))


# a model's methods that do not run its forward
NOT_FORWARD = frozenset({
    "eval", "train", "to", "cuda", "cpu", "half", "float", "double", "bfloat16", "requires_grad_", "parameters",
    "named_parameters", "buffers", "named_buffers", "modules", "named_modules", "children", "named_children",
    "state_dict", "load_state_dict", "zero_grad", "apply", "register_forward_hook", "register_forward_pre_hook",
    "register_full_backward_hook", "register_buffer", "register_parameter", "add_module", "share_memory",
    "type", "get_submodule", "get_parameter", "extra_repr", "__repr__"})


class AmpPlanner:
    def __init__(self, project) -> None:
        self.p = project
        self.s = project.settings

    # -- collecting ----------------------------------------------------------------------------
    def groups(self) -> List[Group]:
        uses: List[Use] = []
        for m in list(self.p.modules.values()):
            if "apex" not in m.src.text:
                continue
            skip = getattr(self.p, "skip", set())
            for node, q in apex_uses(m.sem, m.tree):
                if (q == "apex.amp" or q.startswith("apex.amp.")) and id(node) not in skip:
                    uses.append(Use(m, node, q))
        uses = [u for u in uses if u.kind not in FUNCTION_KINDS]
        if not uses:
            return []
        seeds = [Seed(u, i) for i, u in enumerate(x for x in uses if x.kind in ("initialize", "init"))]
        if not seeds and not self.p.mentioned_elsewhere("initialize", other_parts=True) and \
                not self.p.mentioned_elsewhere("init", other_parts=True):
            # nothing initializes apex anywhere: its scale_loss and master_params raise
            self.p.uninitialized = {}
            for u in uses:
                if u.kind in ("scale_loss", "master_params"):
                    self.p.uninitialized.setdefault(u.module.path, []).append(u.node)
        groups: List[Group] = []
        bad_seeds = {}
        for s in seeds:
            try:
                self._read_seed(s)
            except Refuse as exc:
                bad_seeds[s.idx] = str(exc)
        seeds = self._export(seeds, uses, bad_seeds)
        name = self._scaler_name()
        solver = Solver(self.p, [s for s in seeds if s.idx not in bad_seeds], name)
        # every use that needs the scaler, with the seeds that reach it
        need: List[Tuple[Use, Optional[Carrier]]] = []
        checks = [u for u in uses if u.kind == "check"]
        uses = [u for u in uses if u.kind != "check"]
        for u in uses:
            if u.kind in SCALER_KINDS:
                need.append((u, solver.solve(u.module, u.func)))
            elif u.kind not in ("initialize", "init"):
                need.append((u, None))
        # union the seeds that share a function
        parent = {s.idx: s.idx for s in seeds}

        def find(x):
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for _, c in need:
            if c is not None and c.seeds:
                first = min(c.seeds)
                for other in c.seeds:
                    parent[find(other)] = find(first)
        for s in seeds:  # a setup() whose seed moved to its callers goes with them
            for v in getattr(s, "moved_to", ()):
                parent[find(v)] = find(s.idx)
        by_root: Dict[int, Group] = {}
        orphans: Dict[str, Group] = {}
        for s in seeds:
            root = find(s.idx)
            g = by_root.get(root)
            if g is None:
                g = by_root[root] = Group(f"apex.amp:{s.module.path}:{s.use.line}", "apex.amp")
                g.seeds = []
                g.needs = []
            g.seeds.append(s)
            moved = getattr(s, "exported_from", None)
            if moved is None:
                g.add_use(s.module.path, s.use.node)
            else:
                g.anchors.setdefault(s.module.path, []).append(
                    (s.call, f"`{moved[0].func.qualname}` initialized NVIDIA apex for this call; native AMP is set up "
                             "here now"))
        unattached = []
        for u, c in need:
            if c is not None and not c.seeds:
                unattached.append((u, c))
                continue
            if c is not None:
                g = by_root[find(min(c.seeds))]
                g.needs.append((u, c))
                g.add_use(u.module.path, u.node)
            else:
                key = u.module.path
                g = orphans.get(key)
                if g is None:
                    g = orphans[key] = Group(f"apex.amp:{key}:orphan", "apex.amp")
                    g.refusal = self._orphan_reason(u, solver)
                    g.seeds, g.needs = [], []
                g.add_use(u.module.path, u.node)
        # uses that no seed reaches (code nothing calls) go with a group of their module
        for u, c in unattached:
            g = next((gg for gg in by_root.values() if u.module.path in gg.uses), None)
            if g is None:
                key = u.module.path
                g = orphans.get(key)
                if g is None:
                    g = orphans[key] = Group(f"apex.amp:{key}:orphan", "apex.amp")
                    g.refusal = ("amp.initialize is not called in the project on the way here, so the scaler has no "
                                 "home (run ampfix on the files that initialize apex too)")
                    g.seeds, g.needs = [], []
                g.add_use(u.module.path, u.node)
                continue
            g.needs.append((u, c))
            g.add_use(u.module.path, u.node)
        # availability checks go with the group of their module (the first one there)
        for u in checks:
            g = next((gg for gg in by_root.values() if u.module.path in gg.uses), None)
            if g is None:
                g = orphans.get(u.module.path)
            if g is None:
                g = orphans[u.module.path] = Group(f"apex.amp:{u.module.path}:checks", "apex.amp")
                g.seeds, g.needs = [], []
                g.checks_only = True
            g.needs.append((u, None))
            g.add_use(u.module.path, u.node)
        for g in orphans.values():
            if getattr(g, "checks_only", False):
                try:
                    GroupPlan(self, g, solver).plan()
                except Refuse as exc:
                    g.refusal = str(exc)
        for g in by_root.values():
            bad = [bad_seeds[s.idx] for s in g.seeds if s.idx in bad_seeds]
            if bad:
                g.refusal = bad[0]
                continue
            try:
                GroupPlan(self, g, solver).plan()
            except Refuse as exc:
                g.refusal = str(exc)
            except Exception as exc:  # a planner bug: this group is left whole, the others go on
                g.refusal = f"ampfix could not plan this migration ({type(exc).__name__}: {exc}); please report it"
        groups.extend(by_root.values())
        groups.extend(orphans.values())
        return groups

    def _export(self, seeds: List["Seed"], uses: List[Use], bad: Dict[int, str]) -> List["Seed"]:
        """A function that only initializes and returns the model and optimizer (``setup()``):
        the seed moves to each caller, right after the call that receives them, with its
        ``enabled=`` said in the caller's terms (the call's arguments)."""
        out = []
        nxt = max((s.idx for s in seeds), default=-1) + 1
        for s in seeds:
            f = s.func
            if s.idx in bad or f is None or s.use.kind != "initialize" or not isinstance(s.stmt, ast.Assign):
                out.append(s)
                continue
            if any(u.func is f and u.kind in SCALER_KINDS for u in uses):
                out.append(s)
                continue
            returned = _returned_names(f)
            targets = [dotted(e) for e in (s.stmt.targets[0].elts if isinstance(s.stmt.targets[0], (ast.Tuple, ast.List))
                                           else [s.stmt.targets[0]])]
            if not returned or not all(t in returned for t in targets if t):
                out.append(s)
                continue
            sites = self.p.callers(f)
            if not sites or self.p.references(f):
                out.append(s)
                continue
            virtual = []
            try:
                self._read_seed(s)
                for cs in sites:
                    st = stmt_of(cs.node)
                    if not (isinstance(st, ast.Assign) and st.value is cs.node and len(st.targets) == 1):
                        raise Refuse(f"`{f.qualname}` at {cs.module.path} line {cs.node.lineno}: its result is not "
                                     "assigned; the scaler cannot be made beside it")
                    t = st.targets[0]
                    telts = list(t.elts) if isinstance(t, (ast.Tuple, ast.List)) else [t]
                    if len(telts) != len(returned):
                        raise Refuse(f"`{f.qualname}` at {cs.module.path} line {cs.node.lineno} unpacks "
                                     f"{len(telts)} values of {len(returned)}")
                    v = Seed(s.use, nxt)
                    nxt += 1
                    v.module, v.func, v.stmt, v.call = cs.module, cs.caller, st, cs.node
                    v.exported_from = (s, cs, telts, returned)
                    v.models = telts[returned.index(targets[0])] if targets[0] in returned else None
                    opt_target = targets[1] if len(targets) > 1 else None
                    passed = cs.argument(_param_of(s, f, "optimizers", 1)) if opt_target else None
                    v.optimizers = telts[returned.index(opt_target)] if opt_target in returned else None
                    v.training = v.optimizers is not None and not is_const(passed, None)
                    virtual.append(v)
            except Refuse as exc:
                bad[s.idx] = str(exc)
                out.append(s)
                continue
            s.exported = True
            s.moved_to = [v.idx for v in virtual]
            out.append(s)
            out.extend(virtual)
        return out

    def _orphan_reason(self, u: Use, solver: Solver) -> str:
        why = solver.why.get(Solver.key(u.module, u.func))
        if u.kind in SCALER_KINDS and why:
            return why
        if u.kind in SCALER_KINDS:
            return ("amp.initialize is not called in the project on the way here, so the scaler has no home "
                    "(run ampfix on the files that initialize apex too)")
        return f"apex.amp.{u.kind or '<module>'} has no automatic rewrite"

    def _scaler_name(self) -> str:
        taken = set()
        for m in self.p.modules.values():
            if "apex" in m.src.text:
                taken |= {n.id for n in walk(m.tree, into_functions=True) if isinstance(n, ast.Name)}
                taken |= {n.attr for n in walk(m.tree, into_functions=True) if isinstance(n, ast.Attribute)}
                taken |= {a.arg for n in walk(m.tree, into_functions=True) if isinstance(n, ast.arg) for a in [n]}
        for name in ("scaler", "grad_scaler", "amp_scaler"):
            if name not in taken:
                return name
        return "amp_grad_scaler"

    # -- seeds ---------------------------------------------------------------------------------
    def _read_seed(self, s: Seed) -> None:
        call = s.call
        if call is None:
            raise Refuse(f"`{s.use.qname}` at line {s.use.line} is used other than by calling it")
        if has_star(call):
            raise Refuse(f"amp.{s.use.kind} at line {s.use.line} has arguments that cannot be read")
        if s.use.kind == "init":
            s.training = False
            return
        models = arg(call, "models", 0)
        opts = arg(call, "optimizers", 1)
        if models is None:
            raise Refuse(f"amp.initialize at line {s.use.line} has no model")
        s.models = models
        s.optimizers = opts
        s.training = opts is not None and not is_const(opts, None) and not (
            isinstance(opts, (ast.List, ast.Tuple)) and not opts.elts)


class Rewriter:
    """What the planners of one group share: regions, hoisting, guard collapsing."""

    def __init__(self, project, g: Group) -> None:
        self.p = project
        self.s = project.settings
        self.g = g
        self.regions: Dict[int, Tuple[object, list, list]] = {}

    def fc(self, module) -> FileChanges:
        return self.g.file(module)

    def _add_region(self, module, block, i: int, j: int, header: str) -> None:
        entry = self.regions.setdefault(id(block), (module, block, []))
        entry[2].append((i, j, header))

    def _finish_regions(self) -> None:
        for module, block, ranges in self.regions.values():
            ranges = sorted(set(ranges))
            merged = []
            for i, j, h in ranges:
                if merged and i <= merged[-1][1]:
                    pi, pj, ph = merged[-1]
                    merged[-1] = (pi, max(pj, j), ph)
                else:
                    merged.append((i, j, h))
            fc = self.fc(module)
            for i, j, h in merged:
                fc.wrap(block[i], block[j], f"with {h}")

    def _under_autocast(self, stmt) -> bool:
        from ampfix.model.analysis import enclosing_autocast

        return enclosing_autocast(self._sem_of(stmt), stmt) is not None

    def _sem_of(self, node):
        for m in self.p.modules.values():
            if m.src.tree is not None and _in_tree(node, m.tree):
                return m.sem
        raise Refuse("internal: node without a module")

    @staticmethod
    def _kind(stmt, module):
        """What a statement of a branch is, for comparing an apex branch with its fp32 twin: a
        clip (with the same target, if its result is kept) or something else."""
        if isinstance(stmt, (ast.Expr, ast.Assign, ast.AugAssign)) and isinstance(stmt.value, ast.Call) and \
                "clip_grad" in (dotted(stmt.value.func) or ""):
            target = "" if isinstance(stmt, ast.Expr) else module.src.code(
                stmt.targets[0] if isinstance(stmt, ast.Assign) else stmt.target) + type(stmt).__name__
            return ("clip", target)
        if isinstance(stmt, ast.If) and not stmt.orelse and len(stmt.body) == 1:
            inner = Rewriter._kind(stmt.body[0], module)
            if inner[0] == "clip":  # `if max_norm > 0: clip(...)`, the same test in both branches
                return ("clip", inner[1], module.src.code(stmt.test))
        return ("other", id(stmt))


class GroupPlan(Rewriter):
    """Plans one group: its seeds, and every use its scaler must reach."""

    def __init__(self, planner: AmpPlanner, g: Group, solver: Solver) -> None:
        super().__init__(planner.p, g)
        self.planner = planner
        self.solver = solver
        self.name = solver.name
        self.enabled: Dict[int, str] = {}  # seed idx -> enabled expression (in its function)
        self.autocast_enabled: Dict[object, str] = {}  # carrier key -> autocast enabled= in that function
        self.pure = False
        self.notes = g.notes
        self.scaled: Dict[object, Set[str]] = {}  # function key -> optimizer expressions scaled there
        self.backward_sites: Dict[object, List[ast.stmt]] = {}
        self.param_added: Set[object] = set()
        self.default_made: Set[int] = set()
        self.steps_of: Dict[object, List[ast.Call]] = {}  # function key -> the steps converted there

    # -- the whole group -----------------------------------------------------------------------
    def plan(self) -> None:
        g = self.g
        training = [s for s in g.seeds if s.training]
        for s in g.seeds:
            if getattr(s, "exported", False):
                self._exported_away(s)
            elif s.use.kind == "init":
                self._amp_init(s)
            elif s.training:
                self._training_seed(s)
            else:
                self._inference_seed(s)
        training = [s for s in training if not getattr(s, "exported", False)]
        if training and not self.pure and not any(u.kind == "scale_loss" for u, _ in g.needs):
            s = getattr(training[0], "exported_from", (training[0],))[0]
            raise Refuse(f"the optimizer of amp.initialize at line {s.use.line} is never used with amp.scale_loss in "
                         "the files given: its backward is unscaled; add the scaled backward by hand, or give "
                         "ampfix the files that train")
        if self.pure:
            g.description = "apex.amp -> model.half() (O3 is pure float16: no autocast, no master weights, no loss scaling)"
        elif not g.seeds:
            g.description = "apex.amp: the check that apex is installed goes"
        elif training:
            g.description = "apex.amp -> " + description(self.s)
        else:
            g.description = "apex.amp -> " + description(self.s).split(" + ")[0] + " around the model's forward"
        # the uses the scaler reaches
        carriers: Dict[object, Carrier] = {}
        for u, c in g.needs:
            carriers[Solver.key(u.module, u.func)] = c
        for u, c in sorted(g.needs, key=lambda x: (x[0].module.path, x[0].line)):
            if u.kind == "scale_loss":
                self._scale_loss(u, c)
        if not self.pure:
            self._steps()
        for u, c in g.needs:
            if u.kind == "master_params":
                self._master_params(u, c)
            elif u.kind in ("state_dict", "load_state_dict"):
                self._state_dict(u, c)
            elif u.kind == "_amp_state":
                self._private_scale(u)
            elif u.kind == "":
                self._bare(u, c)
            elif u.kind == "check":
                st = availability_check(u.node)
                if id(st) not in self.fc(u.module).touched:
                    self.fc(u.module).remove(st)
        self._carriers()
        self._finish_regions()
        for path in g.paths:
            m = self.p.modules[path]
            if path in g.changes or g.uses.get(path):
                fc = self.fc(m)
                fc.adds.append(ImportSpec("torch"))
                fc.removes.extend(apex_import_specs(m))

    # -- seeds -----------------------------------------------------------------------------------
    def _exported_away(self, s: Seed) -> None:
        """The seed of a ``setup()`` moved to its callers: here initialize goes (its targets are
        its arguments) and the function returns the model and optimizer as they are."""
        after = self._reassign(s)
        fc = self.fc(s.module)
        if after:
            fc.replace_statement(s.stmt, after)
        else:
            fc.remove(s.stmt)
        self.notes.add(f"`{s.func.qualname}` no longer initializes apex: each caller makes the GradScaler")

    def _options(self, s: Seed):
        call = s.call
        kws = kwargs(call)
        notes: Set[str] = set()
        scaler_args: List[str] = []
        enabled = "True"
        pure = False
        level = kws.get("opt_level")
        code = s.module.src.code
        if level is None:
            notes.add("opt_level defaulted to O1")
        elif string_value(level) is not None:
            lv = string_value(level).upper()
            if lv == "O3":
                pure = True
            elif lv == "O0":
                enabled = "False"
            elif lv not in ("O1", "O2"):
                raise Refuse(f"unknown opt_level {lv}")
        else:
            enabled = f'{code(level)} != "O0"'
            notes.add("opt_level is not a literal: AMP is enabled unless it is O0 (O3 runs as O1)")
        if "enabled" in kws:
            e = as_bool(code(kws["enabled"]), kws["enabled"])
            if pure:
                raise Refuse("opt_level O3 with `enabled`: convert the model with .half() by hand")
            enabled = "False" if is_const(kws["enabled"], False) else conj(e, enabled)
        ls = kws.get("loss_scale")
        if pure:
            if ls is not None and number_value(ls) != 1:
                raise Refuse("opt_level O3 with loss scaling: GradScaler cannot unscale float16 gradients; "
                             "use opt_level O1 (autocast) or scale the loss by hand")
            for k in kws:
                if k not in ("opt_level", "loss_scale", "models", "optimizers", "verbosity"):
                    raise Refuse(f"opt_level O3 with {k!r}: convert the model with .half() by hand")
            return enabled, notes, scaler_args, pure
        if ls is not None:
            if string_value(ls) == "dynamic" or is_const(ls, None):
                pass
            elif number_value(ls) is not None:
                scaler_args += [f"init_scale={code(ls)}", "growth_interval=2**31 - 1"]
                notes.add(STATIC_NOTE)
            elif isinstance(ls, (ast.Name, ast.Attribute, ast.Subscript)):
                v = code(ls)
                dyn = f'{v} in (None, 0, "dynamic")'
                scaler_args += [f"init_scale=2.0**16 if {dyn} else float({v})",
                                f"growth_interval=2000 if {dyn} else 2**31 - 1"]
                notes.add("loss_scale chosen at run time: dynamic when it is None, 0 or 'dynamic', else static")
            else:
                raise Refuse("loss_scale is neither 'dynamic', a number nor a name")
        for k in kws:
            if k in NOTES:
                notes.add(f"{k}: {NOTES[k]}")
            elif k not in ("opt_level", "enabled", "loss_scale", "models", "optimizers"):
                raise Refuse(f"amp.initialize argument {k!r} has no native mapping")
        return enabled, notes, scaler_args, pure

    def _hoist(self, s: Seed, enabled: str, reads: Set[str]):
        """Where the scaler (or nothing) replaces the seed: (statement to put it before, enabled).

        The seed's ``if`` guards (no ``else`` needed) fold into ``enabled``; any other enclosing
        control flow refuses: the scaler must exist wherever the step runs."""
        stmt = s.stmt
        unit = s.unit
        gs = guards(stmt, unit)
        for a in ancestors_stmts(stmt, unit):
            if a in gs or isinstance(a, DEFS):
                continue
            if isinstance(a, ast.If):  # stmt is in its else branch
                if a.orelse and isinstance(a.orelse[0], ast.If) and len(a.orelse) == 1:
                    raise Refuse(f"line {stmt.lineno} runs in one branch of the if/elif chain at line {a.lineno}: "
                                 "the scaler must exist wherever the step runs; make it once, before, by hand")
                raise Refuse(f"line {stmt.lineno} runs in the `else` of the `if` at line {a.lineno}: the scaler "
                             "must exist wherever the step runs; make it once, before, by hand")
            kind = {ast.For: "a `for` loop", ast.While: "a `while` loop", ast.With: "a `with` block"}.get(
                type(a), "a `try` statement")
            raise Refuse(f"line {stmt.lineno} runs inside {kind} (line {a.lineno}): the scaler must exist wherever "
                         f"the step runs; make it once, before, by hand")
        for gd in gs:
            # a name the enabled expression reads, assigned in the guard before the seed: stop there
            before = []
            for x in gd.body:
                if x is stmt or any(y is stmt for y in walk(x)):
                    break
                before.append(x)
            if any(assigned(b) & reads for b in before):
                raise Refuse(f"line {stmt.lineno}: `{', '.join(sorted(reads))}` is set inside the `if` at line "
                             f"{gd.lineno}; make the scaler by hand")
        cond = enabled
        for gd in reversed(gs):
            cond = conj(as_bool(s.module.src.code(gd.test), gd.test), cond) if cond != "False" else cond
        return (gs[-1] if gs else stmt), cond

    def _exported_options(self, s: Seed):
        """The options of the seed a virtual seed came from, said in its caller's terms."""
        orig, cs, telts, returned = s.exported_from
        enabled, notes, scaler_args, pure = self._options(orig)
        gs = guards(orig.stmt, orig.unit)
        for gd in reversed(gs):
            enabled = conj(as_bool(orig.module.src.code(gd.test), gd.test), enabled)
        mapped = [_substitute(x, orig, cs) for x in [enabled, *scaler_args]]
        return mapped[0], notes, mapped[1:], pure

    def _training_seed(self, s: Seed) -> None:
        if getattr(s, "exported_from", None) is not None:
            enabled, notes, scaler_args, pure = self._exported_options(s)
        else:
            enabled, notes, scaler_args, pure = self._options(s)
        self.notes |= notes
        m = s.module
        code = m.src.code
        fc = self.fc(m)
        if pure:
            self.pure = True
            self._pure_fp16(s)
            return
        if getattr(s, "exported_from", None) is not None:
            at, cond = self._hoist(s, enabled, set())
            target = self._scaler_target(s)
            col = m.src.char_col(s.stmt.lineno, s.stmt.col_offset)
            args = [*scaler_args, *([f"enabled={cond}"] if cond != "True" else [])]
            made = f"{target} = {scaler_call(self.s, args, col, target + ' = ')}"
            self.enabled[s.idx] = cond
            fc.insert_after(s.stmt, [made])
            if target.startswith("self."):
                self._default_in_init(s)
            return
        reads = read(s.call)
        at, cond = self._hoist(s, enabled, reads)
        self.enabled[s.idx] = cond
        # apex's private first loss scale, set beside initialize (ViT-pytorch and its copies)
        for u, c in self.g.needs:
            if u.kind == "_amp_state" and u.module is m:
                val = self._initial_scale(u)
                scaler_args = [a for a in scaler_args if not a.startswith("init_scale=")]
                scaler_args.insert(0, f"init_scale={val}")
                self.notes.add("apex's private _amp_state loss scale: the scaler's init_scale")
        args = [*scaler_args, *([f"enabled={cond}"] if cond != "True" else [])]
        target = self._scaler_target(s)
        col = m.src.char_col(at.lineno, at.col_offset)
        made = f"{target} = {scaler_call(self.s, args, col, target + ' = ')}"
        after = self._reassign(s)
        if at is s.stmt:
            fc.replace_statement(s.stmt, [made, *after])
        else:
            fc.insert_before(at, [made])
            if after:
                fc.replace_statement(s.stmt, after)
            else:
                fc.remove(s.stmt)
        if target.startswith("self."):
            self._default_in_init(s)

    def _scaler_target(self, s: Seed) -> str:
        c = self.solver.solve(s.module, s.func)
        return c.expr if c is not None else self.name

    def _default_in_init(self, s: Seed) -> None:
        """``self.scaler`` made in a method other than ``__init__``: ``__init__`` makes a disabled one
        first, so that the other methods always find it."""
        f = s.func
        if f.node.name == "__init__" or id(f.cls) in self.default_made or self._called_from_init(f):
            return
        self.default_made.add(id(f.cls))
        init = next((x for x in f.cls.body if isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and x.name == "__init__"), None)
        if init is None:
            raise Refuse(f"`self.{self.name}` is made in `{f.qualname}` and the class has no __init__ to make a "
                         "disabled one first")
        body = [b for b in init.body if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
        first = body[0] if body else init.body[0]
        # after super().__init__(...)
        for i, b in enumerate(body):
            if isinstance(b, ast.Expr) and method_call(b.value, "__init__"):
                first = body[i + 1] if i + 1 < len(body) else None
                if first is None:
                    self.fc(s.module).insert_after(b, [f"self.{self.name} = {scaler_call(self.s, ['enabled=False'])}"])
                    return
        self.fc(s.module).insert_before(first, [f"self.{self.name} = {scaler_call(self.s, ['enabled=False'])}"])

    def _called_from_init(self, f) -> bool:
        """Called unconditionally from its class's __init__: self.scaler always exists then."""
        for cs in self.p.callers(f):
            if cs.caller is not None and cs.caller.node.name == "__init__" and cs.caller.cls is f.cls:
                st = stmt_of(cs.node)
                if not guards(st, cs.caller.node) and not any(
                        isinstance(a, (ast.If, ast.For, ast.While, ast.Try, ast.With))
                        for a in ancestors_stmts(st, cs.caller.node)):
                    return True
        return False

    def _reassign(self, s: Seed) -> List[str]:
        """``a, b = amp.initialize(m, o)``: what the targets receive instead (nothing when they are
        the arguments themselves)."""
        assign = s.stmt
        code = s.module.src.code
        if isinstance(assign, ast.Expr) and assign.value is s.call:
            return []
        if not (isinstance(assign, ast.Assign) and assign.value is s.call and len(assign.targets) == 1):
            raise Refuse(f"amp.initialize at line {s.use.line} is not a statement of its own")
        target = assign.targets[0]
        src = [s.models] + ([s.optimizers] if s.optimizers is not None else [])
        tnodes = list(target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target])
        # `m, [o1, o2] = amp.initialize(m, [a, b])`: pair the inner lists element by element
        flat_t, flat_s = [], []
        for t, v in zip(tnodes, src):
            if isinstance(t, (ast.List, ast.Tuple)) and isinstance(v, (ast.List, ast.Tuple)) and len(t.elts) == len(v.elts):
                flat_t += t.elts
                flat_s += v.elts
            else:
                flat_t.append(t)
                flat_s.append(v)
        if len(tnodes) == len(src):
            tnodes, src = flat_t, flat_s
        tnames = [code(e) for e in tnodes]
        snames = [code(e) for e in src]
        if len(tnames) == len(snames):
            pairs = [(t, v) for t, v in zip(tnames, snames) if t != v and t != "_"]
            if not pairs:
                return []
            return [f"{', '.join(t for t, _ in pairs)} = {', '.join(v for _, v in pairs)}"]
        if len(tnames) == 1 and len(snames) > 1:
            return [f"{tnames[0]} = {', '.join(snames)}"]
        raise Refuse(f"amp.initialize at line {s.use.line} assigns {len(tnames)} names from {len(snames)} values")

    def _pure_fp16(self, s: Seed) -> None:
        """O3: the model itself in float16, and apex's cast of floating-point inputs kept as a
        forward pre-hook."""
        models = s.models
        if isinstance(models, (ast.List, ast.Tuple)):
            raise Refuse("opt_level O3 with a list of models: convert each with .half() by hand")
        code = s.module.src.code
        m = code(models)
        out = [f"{m} = {m}.half()",
               f"{m}.register_forward_pre_hook(lambda module, args: tuple(\n"
               f"    a.half() if torch.is_tensor(a) and a.is_floating_point() else a for a in args))"]
        assign = s.stmt
        if isinstance(assign, ast.Assign) and len(assign.targets) == 1:
            target = assign.targets[0]
            tnames = [code(e) for e in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target])]
            vals = [m] + ([code(s.optimizers)] if s.optimizers is not None else [])
            if len(tnames) == len(vals):
                pairs = [(t, v) for t, v in zip(tnames, vals) if t != v and t != "_"]
                if pairs:
                    out.append(f"{', '.join(t for t, _ in pairs)} = {', '.join(v for _, v in pairs)}")
            elif tnames != [m]:
                raise Refuse(f"amp.initialize at line {s.use.line} assigns {len(tnames)} names from {len(vals)} values")
        elif not isinstance(assign, ast.Expr):
            raise Refuse(f"amp.initialize at line {s.use.line} is not a statement of its own")
        for a in ancestors_stmts(s.stmt, s.unit):
            if not isinstance(a, (ast.If, *DEFS)):
                raise Refuse(f"opt_level O3 inside a loop, with or try (line {a.lineno}): convert the model with "
                             ".half() by hand")
        # nothing else needs it: the model becomes float16 where apex made it so (under its guard)
        self.fc(s.module).replace_statement(s.stmt, out)
        self.g.note_at_anchor = ("O3 is pure float16: migrate makes it model.half(), with no master weights and no "
                                 "loss scaling; opt_level O1's autocast is the safer choice")

    def _inference_seed(self, s: Seed) -> None:
        """``model = amp.initialize(model, opt_level=...)`` with no optimizer: what uses the model
        after it runs under autocast (or the model is .half() for O3)."""
        moved = getattr(s, "exported_from", None) is not None
        enabled, notes, scaler_args, pure = self._exported_options(s) if moved else self._options(s)
        self.notes |= {n for n in notes if "loss" not in n}
        if pure:
            if moved:
                raise Refuse(f"opt_level O3 in `{s.exported_from[0].func.qualname}`: convert the model with .half() "
                             "by hand where it is called")
            self.pure = True
            self._pure_fp16(s)
            return
        fc = self.fc(s.module)
        at, cond = self._hoist(s, enabled, set() if moved else read(s.call))
        if not moved:
            after = self._reassign(s)
            if after:
                fc.replace_statement(s.stmt, after)
            else:
                fc.remove(s.stmt)
        else:
            at = s.stmt
        model_names = {dotted(e) for e in (s.models.elts if isinstance(s.models, (ast.List, ast.Tuple)) else [s.models])}
        model_names.discard(None)
        owner, field, block = block_of(at)
        idx = next(i for i, x in enumerate(block) if x is at)
        # apex patched torch for what ran after it: autocast covers the statements from the first
        # that runs the model (or an object built from it) to the last such one
        held = set(model_names)
        touching = []
        for j in range(idx + 1, len(block)):
            x = block[j]
            if isinstance(x, ast.Return):
                break
            if self._under_autocast(x):
                continue
            if self._uses_model(x, held) or self._calls_on(x, held - model_names):
                if isinstance(x, DEFS) or any(method_call(n, "backward") for n in walk(x)):
                    raise Refuse(f"the model initialized at line {s.use.line} is trained at line {x.lineno} "
                                 "without amp.scale_loss: add the scaled backward by hand")
                touching.append(j)
            held |= self._holders(x, held)
        while touching and self._only_configures(block[touching[0]], model_names):
            touching.pop(0)
        regions = [(touching[0], touching[-1])] if touching else []
        if not regions:
            raise Refuse(f"nothing uses the model after amp.initialize at line {s.use.line} in this function, so "
                         "autocast has no forward to cover")
        for i, j in regions:
            self._add_region(s.module, block, i, j, autocast_call(self.s, cond))
        self.g.note_at_anchor = "inference: the model's forward runs under autocast (no GradScaler: nothing trains)"

    def _holders(self, stmt, held: Set[str]) -> Set[str]:
        """Names bound to an object built from the model (``r = Retriever(model)``,
        ``m = get_model_obj(model)``): calling them may run it."""
        out = set()
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
            call = stmt.value
            name = (dotted(call.func) or "").split(".")[-1]
            if any(dotted(a) in held for a in [*call.args, *(k.value for k in call.keywords)]) and (
                    name[:1].isupper() or any(w in name.lower() for w in ("model", "encoder", "get_", "wrap"))):
                for t in stmt.targets:
                    out |= {dotted(e) for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]) if dotted(e)}
        return out

    def _calls_on(self, stmt, objs: Set[str]) -> bool:
        return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and dotted(n.func.value) in objs
                   for n in [stmt, *walk(stmt)])

    def _only_configures(self, stmt, names: Set[str]) -> bool:
        """``model.eval()``, ``model.to(device)``: the model's own methods that do not run it."""
        return isinstance(stmt, ast.Expr) and method_call(stmt.value, "eval", "train", "to", "cuda", "half", "float",
                                                         "requires_grad_") and dotted(receiver(stmt.value)) in names

    def _uses_model(self, stmt, names: Set[str]) -> bool:
        """Whether a statement runs the model: calls it, or hands it to a function that may (not
        a torch wrapper such as DataParallel or torch.jit.script, not one of its own methods)."""
        sem = self._sem_of(stmt)
        for n in [stmt, *walk(stmt, into_functions=False)]:
            if isinstance(n, ast.Call):
                if dotted(n.func) in names:
                    return True
                # its submodules and methods that compute (encoder.c(x), model.generate(x))
                if (isinstance(n.func, ast.Attribute) and dotted(n.func.value) in names
                        and n.func.attr not in NOT_FORWARD):
                    return True
                if any(dotted(a) in names for a in [*n.args, *(k.value for k in n.keywords)]):
                    if isinstance(n.func, ast.Attribute) and dotted(n.func.value) in names:
                        continue
                    if any(q.startswith("torch.") or q.startswith("builtins.") for q in sem.qnames(n)):
                        continue
                    return True
        return False

    def _amp_init(self, s: Seed) -> None:
        """apex's first API, ``handle = amp.init(enabled=...)``: it patched torch for the rest of the
        run.  Natively, autocast covers the statements after it, in its block."""
        call = s.call
        kws = kwargs(call)
        for k in kws:
            if k not in ("enabled", "verbose", "enable_caching"):
                raise Refuse(f"amp.init argument {k!r} has no native mapping")
        code = s.module.src.code
        enabled = as_bool(code(kws["enabled"]), kws["enabled"]) if "enabled" in kws else "True"
        stmt = s.stmt
        if isinstance(stmt, ast.Assign):
            handle = {dotted(t) for t in stmt.targets}
            m = s.module
            for n in walk(m.tree, into_functions=True):
                if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load) and dotted(n) in handle:
                    raise Refuse(f"the handle of amp.init is used at line {n.lineno}: migrate it by hand")
        elif not isinstance(stmt, ast.Expr):
            raise Refuse(f"amp.init at line {s.use.line} is not a statement of its own")
        at, cond = self._hoist(s, enabled, read(call))
        fc = self.fc(s.module)
        fc.remove(s.stmt)
        owner, field, block = block_of(at)
        idx = next(i for i, x in enumerate(block) if x is at)
        rest = [j for j in range(idx + 1, len(block)) if not isinstance(block[j], (ast.Return, *DEFS))]
        while rest and rest[-1] != len(block) - 1 and False:
            rest.pop()
        if not rest:
            raise Refuse(f"nothing runs after amp.init at line {s.use.line}")
        end = rest[-1]
        if isinstance(block[end], ast.Return):
            end -= 1
        self._add_region(s.module, block, rest[0], end, autocast_call(self.s, cond))
        self.g.description = "apex.amp.init -> torch.autocast around what follows it"

    def _initial_scale(self, u: Use) -> str:
        """``amp._amp_state.loss_scalers[0]._loss_scale = 2**20``: the value, and the line goes."""
        n = u.node
        sub, attr = getattr(n, "_p", None), getattr(getattr(n, "_p", None), "_p", None)
        stmt = stmt_of(n)
        code = u.module.src.code
        if not (isinstance(sub, ast.Subscript) and isinstance(attr, ast.Attribute) and attr.value is sub
                and attr.attr == "_loss_scale" and code(sub.slice) == "0"
                and isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and stmt.targets[0] is attr):
            raise Refuse(f"apex's private state is used at line {u.line}: migrate it by hand")
        value = stmt.value
        if any(isinstance(x, (ast.Name, ast.Attribute, ast.Call)) for x in [value, *walk(value)]):
            raise Refuse(f"the loss scale set at line {stmt.lineno} is not a number")
        self.fc(u.module).remove(stmt)
        return code(value)

    def _private_scale(self, u: Use) -> None:
        seeds = [s for s in self.g.seeds if s.module is u.module]
        if not seeds:
            raise Refuse(f"apex's private loss scale at line {u.line} is not beside amp.initialize")

    # -- uses ------------------------------------------------------------------------------------
    def _key(self, u: Use):
        return Solver.key(u.module, u.func)

    def _scaler_in(self, module, func, c: Optional[Carrier]) -> str:
        return c.expr if c is not None else self.name

    def _autocast_enabled(self, module, func, c: Carrier) -> str:
        """What autocast's enabled= says in a function: the seed's condition where it is visible,
        else the scaler's own."""
        if c.kind in ("local", "closure") and len(c.seeds) == 1:
            idx = next(iter(c.seeds))
            return self.enabled.get(idx, "True")
        return f"{c.expr}.is_enabled()"

    def _scale_loss(self, u: Use, c: Carrier) -> None:
        call = u.call
        if call is None:
            raise Refuse(f"amp.scale_loss at line {u.line} is not called")
        item = getattr(call, "_p", None)
        w = getattr(item, "_p", None)
        if not (isinstance(item, ast.withitem) and isinstance(w, ast.With) and len(w.items) == 1):
            raise Refuse(f"amp.scale_loss at line {u.line} is not a plain `with` statement")
        loss = arg(call, "loss", 0)
        opt = arg(call, "optimizers", 1)
        if loss is None or opt is None:
            raise Refuse(f"amp.scale_loss at line {u.line} lacks its loss or optimizer")
        kws = kwargs(call)
        if "loss_id" in kws:
            self.notes.add("loss_id: one GradScaler serves every loss")
        if "delay_unscale" in kws:
            self.notes.add("delay_unscale: GradScaler unscales only in scaler.step()")
        for k in kws:
            if k not in ("loss", "optimizers", "loss_id", "delay_unscale", "model", "delay_overflow_check"):
                raise Refuse(f"amp.scale_loss argument {k!r} has no native mapping")
        code = u.module.src.code
        fc = self.fc(u.module)
        key = self._key(u)
        if isinstance(opt, (ast.List, ast.Tuple)):
            names = [code(e) for e in opt.elts]
        else:
            names = [code(opt)]
        self.scaled.setdefault(key, set()).update(names)
        scaler = c.expr
        alias = item.optional_vars.id if isinstance(item.optional_vars, ast.Name) else None
        if item.optional_vars is not None and alias is None:
            raise Refuse(f"amp.scale_loss at line {u.line} binds something other than a name")
        body = w.body
        first = body[0]
        loss_code = code(loss)
        scaled = f"{scaler}.scale({loss_code})" if not self.pure else loss_code
        if isinstance(loss, (ast.BinOp, ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr)):
            scaled = f"{scaler}.scale({loss_code})" if not self.pure else f"({loss_code})"
        rest_uses = alias is not None and any(alias in read(x) for x in body[1:])
        simple = (isinstance(first, ast.Expr) and method_call(first.value, "backward")
                  and dotted(receiver(first.value)) == alias and not rest_uses)
        if w.lineno == first.lineno:
            # `with amp.scale_loss(loss, opt) as s: s.backward()` on one line
            if not (simple and len(body) == 1):
                raise Refuse(f"line {w.lineno}: the body of `with amp.scale_loss` shares its line")
            call = first.value
            fc.replace_statement(w, [f"{scaled}{u.module.src.code(call)[len(u.module.src.code(receiver(call))):]}"])
            site = self._collapse(u, w, loss_code)
            self.backward_sites.setdefault(key, []).append(site)
            if not self.pure:
                self._plan_region(u, c, site, loss)
            return
        if simple:
            fc.replace(receiver(first.value), scaled)
        else:
            fc.insert_before(first, [f"{alias or '_'} = {scaled}"])
        fc.unwrap(w, body)
        fc.touched.add(id(w))
        site = self._collapse(u, w, loss_code)
        self.backward_sites.setdefault(key, []).append(site)
        if not self.pure:
            self._plan_region(u, c, site, loss)

    def _collapse(self, u: Use, w: ast.With, loss_code: str):
        """``if fp16: <scaled backward ...> else: <loss.backward() ...>`` becomes the scaled path
        alone when the else branch is its fp32 twin; returns the statement the backward is in now."""
        gd = getattr(w, "_p", None)
        if not (isinstance(gd, ast.If) and gd.orelse and any(x is w for x in gd.body)):
            return w
        els = gd.orelse
        if not any(isinstance(x, ast.Expr) and method_call(x.value, "backward") and
                   u.module.src.code(receiver(x.value)) == loss_code for x in els):
            return w
        # every else statement must be the twin of one in the body: the backward, a clip
        body_kinds = [self._kind(x, u.module) for x in gd.body if x is not w and not (
            isinstance(x, (ast.Import, ast.ImportFrom)) and "apex" in u.module.src.code(x))]  # the import goes
        else_kinds = [self._kind(x, u.module) for x in els if not (
            isinstance(x, ast.Expr) and method_call(x.value, "backward"))]
        if sorted(body_kinds, key=str) != sorted(else_kinds, key=str) or any(k[0] == "other" for k in else_kinds):
            return w
        fc = self.fc(u.module)
        fc.unwrap(gd, gd.body)
        fc.touched.add(id(gd))
        return gd

    def _plan_region(self, u: Use, c: Carrier, site, loss) -> None:
        """The autocast region of the forward pass that computes ``loss``: before the scaled
        backward in its function, or in every caller when the loss is a parameter."""
        func = u.func
        unit = func.node if func is not None else u.module.tree
        barriers = [s.stmt for s in self.g.seeds if s.module is u.module]
        if self._under_autocast(site):
            return
        region, missing = forward_region(site, loss, unit, barriers, self._models(u.module, func))
        header = autocast_call(self.s, self._autocast_enabled(u.module, func, c))
        if region is not None:
            if any(self._under_autocast(x) for x in region.stmts):
                return
            self._add_region(u.module, region.block, region.first, region.last, header)
            return
        params = set(func.positional if func else []) | set(func.kwonly if func else [])
        missing_params = missing & params
        if func is None or not missing_params or len(missing_params) > 1:
            raise Refuse(f"the loss `{u.module.src.code(loss)}` is not computed before the scaled backward at line "
                         f"{u.line}: wrap its forward pass in {header} by hand")
        param = next(iter(missing_params))
        sites = self.p.callers(func)
        if not sites or self.p.references(func):
            raise Refuse(f"the loss reaches line {u.line} as the parameter `{param}` of `{func.qualname}`, whose "
                         "callers cannot all be followed: wrap their forward passes in autocast by hand")
        for cs in sites:
            a = cs.argument(param)
            call_stmt = stmt_of(cs.node)
            if a is None or not isinstance(a, (ast.Name, ast.Attribute)):
                raise Refuse(f"`{func.qualname}` at {cs.module.path} line {cs.node.lineno} gets the loss as an "
                             "expression: compute it first, or wrap the forward in autocast by hand")
            cunit = cs.caller.node if cs.caller else cs.module.tree
            if self._under_autocast(call_stmt):
                continue
            r, still = forward_region(call_stmt, a, cunit, [s.stmt for s in self.g.seeds if s.module is cs.module])
            if r is None:
                raise Refuse(f"the loss passed to `{func.qualname}` at {cs.module.path} line {cs.node.lineno} is not "
                             "computed before it")
            cc = self.solver.solve(cs.module, cs.caller)
            hdr = autocast_call(self.s, self._autocast_enabled(cs.module, cs.caller, cc) if cc else "True")
            self._add_region(cs.module, r.block, r.first, r.last, hdr)

    def _models(self, module, func) -> Set[str]:
        """Names that hold an initialized model where a region is planned (a region starts at
        the first statement that uses one: input preparation stays outside)."""
        out: Set[str] = set()
        for s in self.g.seeds:
            if s.models is None or s.module is not module:
                continue
            names = {dotted(e) for e in (s.models.elts if isinstance(s.models, (ast.List, ast.Tuple)) else [s.models])}
            if isinstance(s.stmt, ast.Assign) and not getattr(s, "exported_from", None):
                t = s.stmt.targets[0]
                names |= {dotted(e) for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])}
            names.discard(None)
            if s.func is func:
                out |= names
            elif func is not None and s.func is not None and func.cls is not None and func.cls is s.func.cls:
                # another method of the seed's class: what the seed's method keeps on self
                out |= {n for n in names if n.startswith("self.")}
                for x in walk(s.func.node):
                    if isinstance(x, ast.Assign) and dotted(x.value) in names:
                        out |= {dotted(t) for t in x.targets if (dotted(t) or "").startswith("self.")}
        return out - {"self", None}

    # -- steps and update ----------------------------------------------------------------------
    def _steps(self) -> None:
        """Every ``opt.step()`` of a scaled optimizer that follows a scaled backward in its function
        becomes ``scaler.step(opt)``; one ``scaler.update()`` follows the last of them."""
        for u, c in self.g.needs:
            if u.kind != "scale_loss":
                continue
        done = set()
        for u, c in self.g.needs:
            if u.kind != "scale_loss":
                continue
            key = self._key(u)
            if key in done:
                continue
            done.add(key)
            unit = u.func.node if u.func is not None else u.module.tree
            names = self.scaled.get(key, set())
            loop_vars = self._loop_vars(unit, names)
            backs = self.backward_sites.get(key, [])
            steps = []
            for n in walk(unit):
                if method_call(n, "step") and not n.args and not n.keywords:
                    r = u.module.src.code(receiver(n))
                    if r in names or r in loop_vars:
                        steps.append(n)
            converted = [s for s in steps if follows(stmt_of(s), backs, unit)]
            self.steps_of[key] = converted
            if not converted:
                self._steps_elsewhere(u, c, names)
                continue
            fc = self.fc(u.module)
            for s in converted:
                st = stmt_of(s)
                if not (isinstance(st, ast.Expr) and st.value is s):
                    raise Refuse(f"`{u.module.src.code(s)}` at line {s.lineno} is not a statement of its own")
                fc.replace(s, f"{c.expr}.step({u.module.src.code(receiver(s))})")
            last = max(converted, key=lambda n: (n.lineno, n.col_offset))
            anchor = stmt_of(last)
            # after a loop over the optimizers, once
            for a in ancestors_stmts(anchor, unit):
                if isinstance(a, (ast.For, ast.AsyncFor)) and u.module.src.code(receiver(last)) in self._targets(a):
                    anchor = a
            fc.insert_after(anchor, [f"{c.expr}.update()"])

    def _loop_vars(self, unit, names: Set[str]) -> Set[str]:
        out = set()
        for n in walk(unit):
            if isinstance(n, (ast.For, ast.AsyncFor)) and isinstance(n.target, ast.Name):
                it = n.iter
                if dotted(it) in names or (isinstance(it, ast.Call) and method_call(it, "values") and dotted(receiver(it)) in names):
                    out.add(n.target.id)
        return out

    @staticmethod
    def _targets(loop) -> Set[str]:
        return {dotted(t) for t in ([loop.target] if not isinstance(loop.target, ast.Tuple) else loop.target.elts)}

    def _steps_elsewhere(self, u: Use, c: Carrier, names: Set[str]) -> None:
        func = u.func
        raise Refuse(f"the step of `{', '.join(sorted(names))}` after the scaled backward at line {u.line} is not in "
                     f"`{func.qualname if func else 'module level'}`: migrate the step by hand")

    # -- master_params, state ---------------------------------------------------------------------
    def _master_params(self, u: Use, c: Carrier) -> None:
        """``amp.master_params(opt)`` -> the optimizer's parameters, unscaled first where the
        gradients are read after a scaled backward.  ``scaler.unscale_`` may run once per step: a
        clip that runs more often than the step (every micro-batch of an accumulation) moves to
        the step (:meth:`_clip_at_the_step`)."""
        call = u.call
        opt = arg(call, "optimizer", 0) if call is not None else None
        if opt is None:
            raise Refuse(f"amp.master_params at line {u.line} is not called with an optimizer")
        code = u.module.src.code
        o = code(opt)
        fc = self.fc(u.module)
        params = f'(p for group in {o}.param_groups for p in group["params"])'
        st = stmt_of(call)
        key = self._key(u)
        unit = u.func.node if u.func is not None else u.module.tree
        backs = self.backward_sites.get(key, [])
        steps = self.steps_of.get(key, [])
        if not self.pure and follows(st, backs, unit) and steps and not any(
                _runs_as_often(st, stmt_of(s), unit) for s in steps):
            self._clip_at_the_step(u, c, call, steps, o, params)
            return
        fc.replace(call, params)
        if self.pure or not follows(st, backs, unit):
            return
        done = getattr(self, "_unscaled", None)
        if done is None:
            done = self._unscaled = []
        if any(m is u.module and oo == o and dominates(prev, st) for m, oo, prev in done):
            return
        done.append((u.module, o, st))
        fc.insert_before(st, [f"{c.expr}.unscale_({o})"])
        self._collapse_clip(u, st)

    def _clip_at_the_step(self, u: Use, c: Carrier, call, steps, o: str, params: str) -> None:
        """A clip of ``amp.master_params(opt)`` on every micro-batch, where the optimizer steps less
        often (gradient accumulation): apex had unscaled the gradients after each backward, native
        AMP unscales once per step.  Scaling the threshold by ``scaler.get_scale()`` would keep the
        numbers but copy the scale to the host on every micro-batch (a sync, AMP303), so the clip
        moves to the step, after ``scaler.unscale_(opt)``: once per step, on the accumulated
        gradients.  That differs from clipping each partial sum when accumulating, so the fix is
        unsafe and says so."""
        code = u.module.src.code
        clip = getattr(call, "_p", None)
        if not (isinstance(clip, ast.Call) and "clip_grad" in (dotted(clip.func) or "") and clip.args
                and clip.args[0] is call):
            raise Refuse(f"amp.master_params at line {u.line} is read on micro-batches where the optimizer does "
                         "not step: migrate it by hand")
        st = stmt_of(clip)
        if not (isinstance(st, ast.Expr) and st.value is clip):
            raise Refuse(f"the clip at line {clip.lineno} runs on every micro-batch and its result is used; native AMP "
                         "unscales once per optimizer step: move the clip to the step by hand")
        if len(steps) != 1:
            raise Refuse(f"the clip at line {clip.lineno} runs on every micro-batch and the optimizer steps in "
                         f"{len(steps)} places: move the clip to the step by hand")
        # a clip under its own condition (`if max_norm > 0:`) moves with it
        gd = getattr(st, "_p", None)
        mover = st
        if isinstance(gd, ast.If) and gd.body == [st] and not gd.orelse and id(gd) not in self.fc(u.module).touched:
            mover, gd = gd, getattr(gd, "_p", None)
        # only where both precisions clipped alike: under no guard, or under the fp16/fp32 branches
        # the migration made one (else the fp32 path would clip twice)
        step_st = stmt_of(steps[0])
        la = loops_around(mover, u.func.node if u.func is not None else u.module.tree)
        common = next((l for l in loops_around(step_st, u.func.node if u.func is not None else u.module.tree)
                       if any(l is x for x in la)), None)
        twin = isinstance(gd, ast.If) and gd.body == [mover] and len(gd.orelse) == 1 \
            and self._kind(gd.orelse[0], u.module) == self._kind(mover, u.module)
        left = [g for g in guards(mover, common) if id(g) not in self.fc(u.module).touched and not (twin and g is gd)]
        if left:
            raise Refuse(f"the clip at line {clip.lineno} runs on every micro-batch under the condition at line "
                         f"{left[0].lineno}, and native AMP unscales once per optimizer step: move the clip to the "
                         "step by hand (scaler.unscale_ first)")
        # the fp32 branch beside it often clips the same parameters by their own name: reuse it
        gone = mover
        if twin:
            gone = gd
        for sib in (gd.orelse if isinstance(gd, ast.If) and any(mover is s for s in gd.body) else []):
            sib = sib.body[0] if isinstance(sib, ast.If) and len(sib.body) == 1 and not sib.orelse else sib
            v = sib.value if isinstance(sib, ast.Expr) else None
            if isinstance(v, ast.Call) and dotted(v.func) == dotted(clip.func) and v.args:
                params = code(v.args[0])
        if clip.lineno == clip.end_lineno:
            text = code(clip)
            i = text.index(code(call))
            moved = text[:i] + params + text[i + len(code(call)):]
        else:
            copy = ast.Call(func=clip.func, args=[ast.parse(params, mode="eval").body, *clip.args[1:]],
                            keywords=clip.keywords)
            moved = ast.unparse(copy)
        fc = self.fc(u.module)
        fc.remove(gone)
        lines = [moved]
        if mover is not st:
            lines = [f"if {code(mover.test)}:", self._indent_unit(u.module, mover, st) + moved]
        fc.insert_before(step_st, [f"{c.expr}.unscale_({o})", *lines])
        self.g.unsafe = ("the gradient clip ran on every micro-batch and now runs once per optimizer step, after "
                         "scaler.unscale_, on the accumulated gradients: with accumulation the two differ; "
                         "no host sync is added")

    @staticmethod
    def _indent_unit(module, outer, inner) -> str:
        """The indentation one block adds in this file (``inner`` sits one block inside ``outer``)."""
        a, b = module.src.line_text(outer.lineno), module.src.line_text(inner.lineno)
        return b[len(a) - len(a.lstrip()):len(b) - len(b.lstrip())] or "    "

    def _collapse_clip(self, u: Use, st) -> None:
        """``if fp16: clip(amp.master_params(opt)) else: clip(model.parameters())`` -> the first."""
        gd = getattr(st, "_p", None)
        if not (isinstance(gd, ast.If) and gd.body == [st] and len(gd.orelse) == 1) or id(gd) in self.fc(u.module).touched:
            return
        if self._kind(gd.orelse[0], u.module) == self._kind(st, u.module) and self._kind(st, u.module)[0] == "clip":
            fc = self.fc(u.module)
            fc.unwrap(gd, gd.body)
            fc.touched.add(id(gd))

    def _state_dict(self, u: Use, c: Carrier) -> None:
        """``amp.state_dict()`` -> the scaler's; ``amp.load_state_dict(x)`` -> the scaler's, through a
        helper that also reads what apex saved before the migration (its
        ``{"loss_scaler0": {"loss_scale", "unskipped"}}``), so old checkpoints still resume."""
        if self.pure:
            raise Refuse(f"amp.{u.kind} at line {u.line}: O3 has no loss scaler to save")
        fc = self.fc(u.module)
        if u.kind == "state_dict":
            fc.replace(u.node, f"{c.expr}.state_dict")
            return
        call = u.call
        if call is None or len(call.args) != 1 or call.keywords:
            raise Refuse(f"amp.load_state_dict at line {u.line} is not called with one state")
        code = u.module.src.code
        fc.replace(call, f"{c.expr}.load_state_dict(_scaler_state({c.expr}, {code(call.args[0])}))")
        from ampfix.migration.groups import add_module_helper

        add_module_helper(fc, u.module, SCALER_STATE_HELPER, "_scaler_state")
        self.notes.add("old checkpoints: _scaler_state() reads apex's loss-scaler state too")

    def _bare(self, u: Use, c: Carrier) -> None:
        """``apex.amp`` handed over as a value (``amp=apex.amp`` to a checkpoint helper that calls its
        state_dict/load_state_dict): the scaler has both."""
        p = getattr(u.node, "_p", None)
        if isinstance(p, ast.keyword) or (isinstance(p, ast.Call) and u.node in p.args):
            self.fc(u.module).replace(u.node, c.expr)
            return
        raise Refuse(f"`apex.amp` is used as a value at line {u.line}: migrate it by hand")

    # -- carriers ----------------------------------------------------------------------------------
    def _carriers(self) -> None:
        """Parameters and call sites that bring the scaler where it is used."""
        todo = [c for _, c in self.g.needs if c is not None]
        seen = set()
        kept = set()
        while todo:
            c = todo.pop()
            if id(c) in seen:
                continue
            seen.add(id(c))
            via = getattr(c, "via_init", None)
            if via is not None:
                init, ic = via
                todo.append(ic)
                if id(init.node) not in kept:
                    kept.add(id(init.node))
                    self._keep_in_init(init)
            if c.kind != "param":
                continue
            entry = getattr(c, "entry", None)
            if entry is not None and id(entry.node) not in self.param_added:
                self.param_added.add(id(entry.node))
                self._add_param(entry)
                what = entry.cls.name if entry.node.name == "__init__" and entry.cls is not None else entry.qualname
                self.notes.add(f"`{what}` is not called in the project: it now takes the GradScaler as `{self.name}=`")
            for cs in c.sites:
                cc = self.solver.solve(cs.module, cs.caller)
                todo.append(cc)
                f = cs.callee
                k = id(f.node)
                if k not in self.param_added:
                    self.param_added.add(k)
                    self._add_param(f)
                self._pass(cs, cc.expr)

    def _keep_in_init(self, init) -> None:
        """``self.scaler = scaler`` first in __init__ (after ``super().__init__(...)``), so that
        what __init__ calls finds it."""
        body = init.node.body
        fc = self.fc(init.module)
        line = f"self.{self.name} = {self.name}"
        i = 0
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            i = 1
        for j, b in enumerate(body):
            if isinstance(b, ast.Expr) and method_call(b.value, "__init__"):
                fc.insert_after(b, [line])
                return
        if i < len(body):
            fc.insert_before(body[i], [line])
        else:
            fc.insert_after(body[-1], [line])

    def _add_param(self, f) -> None:
        """A keyword-only ``scaler`` parameter, last."""
        node = f.node
        fc = self.fc(f.module)
        a = node.args
        src = f.module.src
        if a.kwarg is not None:
            # before **kwargs
            star = a.kwarg
            at = src.offset(star.lineno, star.col_offset) - 2
            text = f"{self.name}, " if (a.vararg or a.kwonlyargs) else f"*, {self.name}, "
            fc.edits.append(_insert(at, text))
            return
        items = [*getattr(a, "posonlyargs", []), *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs]
        if not items:
            p = fc.b.open_paren_def(node)
            fc.edits.append(_insert(p, f"*, {self.name}"))
            return
        last = max(items, key=lambda x: (x.end_lineno, x.end_col_offset))
        end = src.offset(last.end_lineno, last.end_col_offset)
        # a default after the last parameter
        defaults = [d for d in [*a.defaults, *a.kw_defaults] if d is not None]
        for d in defaults:
            de = src.offset(d.end_lineno, d.end_col_offset)
            if de > end:
                end = de
        text = f", {self.name}" if (a.vararg or a.kwonlyargs) else f", *, {self.name}"
        fc.edits.append(_insert(end, text))

    def _pass(self, cs, expr: str) -> None:
        fc = self.fc(cs.module)
        fc.edits.append(fc.b.insert_arg(cs.node, f"{self.name}={expr}"))
        self.g.anchors.setdefault(cs.module.path, []).append(
            (cs.node, f"`{cs.callee.qualname}` now takes the GradScaler of the apex.amp migration: pass it here"))


def _returned_names(f) -> List[str]:
    """The names a function returns (``return model, optimizer``), the same at every return."""
    out = None
    for n in walk(f.node):
        if isinstance(n, ast.Return):
            v = n.value
            names = [dotted(e) for e in (v.elts if isinstance(v, (ast.Tuple, ast.List)) else [v])] if v is not None else []
            if None in names or (out is not None and names != out):
                return []
            out = names
    return out or []


def _param_of(s, f, keyword: str, position: int) -> Optional[str]:
    """The parameter of ``f`` that the seed's argument ``keyword``/``position`` reads, if it is one."""
    a = arg(s.call, keyword, position)
    if isinstance(a, ast.Name) and (a.id in f.positional or a.id in f.kwonly):
        return a.id
    return None


def _substitute(text: str, orig, cs) -> str:
    """An expression over the parameters of the seed's function, said with the call's arguments
    (or the parameters' defaults); a name that is neither refuses."""
    f = orig.func
    tree = ast.parse(text, mode="eval")
    defaults = {}
    a = f.node.args
    pos = [*getattr(a, "posonlyargs", []), *a.args]
    for p, d in zip(pos[len(pos) - len(a.defaults):], a.defaults):
        defaults[p.arg] = orig.module.src.code(d)
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        if d is not None:
            defaults[p.arg] = orig.module.src.code(d)

    class Sub(ast.NodeTransformer):
        def visit_Name(self, node):
            if node.id in ("True", "False", "None", "bool", "float", "int", "str"):
                return node
            if node.id in f.positional or node.id in f.kwonly:
                argv = cs.argument(node.id)
                src = cs.module.src.code(argv) if argv is not None else defaults.get(node.id)
                if src is None:
                    raise Refuse(f"`{f.qualname}` at {cs.module.path} line {cs.node.lineno} does not pass `{node.id}`")
                return ast.parse(src, mode="eval").body
            raise Refuse(f"amp.initialize in `{f.qualname}` depends on `{node.id}`, which its callers cannot see")

    return ast.unparse(_fold(Sub().visit(tree)))


def _fold(tree):
    """Fold what became constant (``'O1' != 'O0'``, ``True and x``) after substitution."""
    class Fold(ast.NodeTransformer):
        def visit_Compare(self, node):
            self.generic_visit(node)
            if isinstance(node.left, ast.Constant) and len(node.ops) == 1 and isinstance(node.comparators[0], ast.Constant):
                try:
                    return ast.Constant(eval(compile(ast.Expression(node), "<fold>", "eval")))
                except Exception:
                    return node
            return node

        def visit_Call(self, node):
            self.generic_visit(node)
            if isinstance(node.func, ast.Name) and node.func.id == "bool" and len(node.args) == 1 and \
                    isinstance(node.args[0], ast.Constant):
                return ast.Constant(bool(node.args[0].value))
            return node

        def visit_BoolOp(self, node):
            self.generic_visit(node)
            vals = []
            for v in node.values:
                if isinstance(v, ast.Constant) and isinstance(v.value, bool):
                    if isinstance(node.op, ast.And) and v.value is False or isinstance(node.op, ast.Or) and v.value:
                        return ast.Constant(v.value)
                    continue
                vals.append(v)
            if not vals:
                return ast.Constant(isinstance(node.op, ast.And))
            return vals[0] if len(vals) == 1 else ast.BoolOp(op=node.op, values=vals)

    return Fold().visit(tree)


def _runs_as_often(a, b, unit) -> bool:
    """Whether every ``if`` that guards ``b`` (below the loops they share) guards ``a`` too: then
    ``a`` never runs on an iteration where ``b`` does not."""
    from ampfix.migration.flow import loops_around

    la = loops_around(a, unit)
    common = next((l for l in loops_around(b, unit) if any(l is x for x in la)), unit)
    ga = {id(x) for x in guards(a, common)}
    return all(id(x) in ga for x in guards(b, common))


def _insert(at: int, text: str):
    from ampfix.model.edits import Edit

    return Edit(at, at, text)


def _in_tree(node, tree) -> bool:
    p = node
    while getattr(p, "_p", None) is not None:
        p = p._p
    return p is tree


def apex_import_specs(module) -> List[ImportSpec]:
    """Every import of apex in a module, as specs the tidy removes once nothing reads them."""
    out = []
    for imp in module.sem.imports:
        if isinstance(imp, ast.Import):
            for a in imp.names:
                if a.name.split(".")[0] == "apex":
                    out.append(ImportSpec(a.name if a.asname else a.name, None, a.asname))
        elif not imp.level and imp.module and imp.module.split(".")[0] == "apex":
            for a in imp.names:
                if a.name != "*":
                    out.append(ImportSpec(imp.module, a.name, a.asname))
    return out
