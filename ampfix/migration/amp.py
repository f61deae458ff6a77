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
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

from ampfix.model.analysis import arg, has_star, is_const, spread_kwargs
from ampfix.migration.groups import Group, Refuse
from ampfix.migration.flow import (
    OPTIMIZERS,
    ancestors_stmts,
    stmt_of,
)
from ampfix.migration.spell import bf16, description
from ampfix.migration.handoff import SCHEDULE, param_given, schedule_class
from ampfix.rule import ImportSpec
from ampfix.model.apex import apex_uses, names_apex
from ampfix.model.semantic import base_name, block_of, dotted, param_defaults, walk
from ampfix.migration.evaluation import EvaluationRewrites
from ampfix.migration.placement import CarrierRewrites, Solver
from ampfix.migration.seed_rewrites import SeedRewrites
from ampfix.migration.use_rewrites import UseRewrites
from ampfix.migration.wrappers import WrapperSteps
from ampfix.migration.switches import SwitchSeed, built_by_configuration, find_switches, handed_to_framework

from ampfix.migration.rewriter import Rewriter, none_tests, param_of, returned_after, returns_in
from ampfix.migration.seeds import (
    Carrier, FUNCTION_KINDS, NOTES, SCALER_KINDS, Seed, Use, apex_import_specs, availability_check,
)



#: why a use that no amp.initialize reaches is left as it is
NO_HOME = ("amp.initialize is not called in the project on the way here, so the scaler has no home (run ampfix on "
           "the files that initialize apex too)")


def _guards_only(u: Use, s: Seed) -> bool:
    """``if amp:`` / ``if amp is not None:`` whose whole body is the seed's initialize."""
    node = u.node
    p = getattr(node, "_p", None)
    if isinstance(p, ast.Compare) and p.left is node and len(p.ops) == 1 and isinstance(p.ops[0], ast.IsNot) and \
            is_const(p.comparators[0], None):
        node, p = p, getattr(p, "_p", None)
    return isinstance(p, ast.If) and p.test is node and len(p.body) == 1 and p.body[0] is s.stmt and not p.orelse


def _last_param(f, name: Optional[str]) -> bool:
    """``name`` is the def's last parameter, with nothing after it (so it can go)."""
    a = f.node.args
    return bool(name) and not (a.vararg or a.kwonlyargs or a.kwarg) and bool(a.args) and a.args[-1].arg == name


class AmpPlanner:
    def __init__(self, project) -> None:
        self.p = project
        self.s = project.settings
        #: (id of a def, parameter) that apex's amp was handed in and that goes with the migration
        self.dropped_params: Set[Tuple[int, str]] = set()
        #: id of a module -> ids of the modules it imports or is imported by (built when first asked)
        self._imports: Optional[Dict[int, Set[int]]] = None

    # -- collecting ----------------------------------------------------------------------------
    def groups(self) -> List[Group]:
        uses: List[Use] = []
        for m in list(self.p.modules.values()):
            if not names_apex(m.src.text):
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
        checks = [u for u in uses if u.kind in ("check", "installed")]
        uses = [u for u in uses if u.kind not in ("check", "installed")]
        for u in uses:
            if u.kind in SCALER_KINDS:
                need.append((u, solver.solve(u.module, u.func)))
            elif u.kind not in ("initialize", "init"):
                need.append((u, None))
        seeds, solver, need = self._switched(seeds, need, solver, bad_seeds, name)
        # a function that only some callers reach with a scaler may only save or load its state
        # (the seeds that do reach it stay with it: their group is refused with it, or the group
        # would migrate while this use keeps calling apex, which nothing initializes any more)
        reached_by: Dict[int, Set[int]] = {}
        for i, (u, c) in enumerate(need):
            if c is not None and getattr(c, "optional", None) and u.kind == "scale_loss" and \
                    _guarded_by_what_they_leave_none(u, getattr(c, "missing_sites", [])):
                continue
            if c is not None and getattr(c, "optional", None) and u.kind not in ("state_dict", "load_state_dict"):
                solver.why.setdefault(Solver.key(u.module, u.func), c.optional)
                need[i] = (u, None)
                if c.seeds:
                    reached_by[id(u)] = set(c.seeds)
        # apex's state saved or loaded where no amp.initialize reaches, in code that nothing
        # importing it or imported by it initializes apex or scales a loss with it (a runner
        # copied beside a project that never uses apex): it goes, the other uses stay as they are
        for i, (u, c) in enumerate(need):
            if c is None and u.kind in ("state_dict", "load_state_dict") and id(u) not in reached_by and \
                    Solver.key(u.module, u.func) in solver.unreached and self._alone_with_state(u.module, uses):
                c = Carrier("dropped", set(), "")
                c.unreached = True
                need[i] = (u, c)
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
        for s in seeds:  # a setup whose initialize goes for a switched trainer's scaler goes with it
            for home in getattr(s, "dropped", None) or ():
                parent[find(home.idx)] = find(s.idx)
        for s in seeds:  # a setup() whose seed moved to its callers goes with them
            for v in getattr(s, "moved_to", ()):
                parent[find(v)] = find(s.idx)
        # a subclass's override of the method that initializes apex (nnUNet's `_maybe_init_amp` with
        # O2) goes with its ancestor's: `self` is one object, and the scaler's disabled default is
        # made once, where the ancestor's __init__ is
        methods = [s for s in seeds if s.func is not None and s.func.cls is not None and s.func.is_method]
        for s1 in methods:
            ups = {id(c) for _, c in self.p.ancestors(s1.module, s1.func.cls)}
            for s2 in methods:
                if s2 is not s1 and s2.func.node.name == s1.func.node.name and id(s2.func.cls) in ups:
                    parent[find(s1.idx)] = find(s2.idx)
        # seeds written in one function go together: apex patched torch for the whole process, so
        # one left behind (refused) beside one migrated would mix apex and native AMP in one run
        first_in: Dict[tuple, int] = {}
        for s in seeds:
            base = getattr(s, "exported_from", None)
            base = base[0] if base else s
            if base.func is None:
                continue
            k = (base.module.path, id(base.func.node))
            if k in first_in:
                parent[find(s.idx)] = find(first_in[k])
            else:
                first_in[k] = s.idx
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
            if isinstance(s, SwitchSeed):
                pass  # its uses are the group's needs
            elif moved is None:
                g.add_use(s.module.path, s.use.node)
            else:
                g.anchors.setdefault(s.module.path, []).append(
                    (s.call, f"`{moved[0].func.qualname}` initialized NVIDIA apex for this call; native AMP is set up "
                             "here now"))
        unattached = []
        stale: Dict[str, Group] = {}
        imported = []  # `amp = importlib.import_module("apex.amp")` at module level: an import
        for u, c in need:
            if u.kind == "" and _module_import_call(u):
                imported.append(u)
                continue
            if u.kind == "seed_guard":
                g = by_root[find(u.seed.idx)]
                g.needs.append((u, None))
                g.add_use(u.module.path, u.node)
                continue
            if c is not None and getattr(c, "unreached", False):
                g = stale.get(u.module.path)
                if g is None:
                    g = stale[u.module.path] = Group(f"apex.amp:{u.module.path}:state", "apex.amp")
                    g.seeds, g.needs = [], []
                g.needs.append((u, c))
                g.add_use(u.module.path, u.node)
                continue
            if c is not None and not c.seeds:
                unattached.append((u, c))
                continue
            if c is not None:
                g = by_root[find(min(c.seeds))]
                g.needs.append((u, c))
                g.add_use(u.module.path, u.node)
            elif id(u) in reached_by:
                g = by_root[find(min(reached_by[id(u)]))]
                g.refusal = g.refusal or self._orphan_reason(u, solver)
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
        entries: Dict[str, Group] = {}
        for u, c in unattached:
            g = next((gg for gg in by_root.values() if u.module.path in gg.uses), None)
            if g is None and _library_entry(c):
                # a function of a library module that nothing in the project calls, whose caller
                # initialized apex (a training script outside the files given): it takes the
                # scaler as `scaler=`, and its own uses migrate against it
                g = entries.get(u.module.path)
                if g is None:
                    g = entries[u.module.path] = Group(f"apex.amp:{u.module.path}:entry", "apex.amp")
                    g.seeds, g.needs = [], []
                g.needs.append((u, c))
                g.add_use(u.module.path, u.node)
                continue
            if g is None:
                key = u.module.path
                g = orphans.get(key)
                if g is None:
                    g = orphans[key] = Group(f"apex.amp:{key}:orphan", "apex.amp")
                    g.refusal = NO_HOME
                    g.seeds, g.needs = [], []
                g.add_use(u.module.path, u.node)
                continue
            g.needs.append((u, c))
            g.add_use(u.module.path, u.node)
        # an import made by importlib goes with the group of its module, which removes it when
        # that group rewrites every read of the name (UseRewrites._bare)
        for u in imported:
            g = next((gg for gg in by_root.values() if u.module.path in gg.uses), None)
            if g is None:
                g = orphans.get(u.module.path)
            if g is None:
                g = orphans[u.module.path] = Group(f"apex.amp:{u.module.path}:orphan", "apex.amp")
                g.refusal = f"apex is imported with importlib at line {u.line} and nothing here initializes it"
                g.seeds, g.needs = [], []
            g.needs.append((u, None))
            g.add_use(u.module.path, u.node)
        # availability checks go with the group of their module (the first one there)
        for u in checks:
            g = next((gg for gg in by_root.values() if u.module.path in gg.uses), None)
            if g is None:
                g = orphans.get(u.module.path) or entries.get(u.module.path) or stale.get(u.module.path)
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
            if g.refusal:  # a use that only some of its seeds reach (see reached_by)
                continue
            self._plan(g, solver)
        for path, g in entries.items():
            orphan = orphans.get(path)
            if orphan is not None and orphan.refusal and not getattr(orphan, "checks_only", False):
                # the module's other apex uses are refused: half of its apex code migrated would
                # mix the two in one file
                g.refusal = orphan.refusal
            elif not any(u.kind == "scale_loss" for u, _ in g.needs):
                # a checkpoint helper that only saves apex's state trains nothing: a scaler
                # parameter there would be one more thing its callers (a runner) must find
                g.refusal = NO_HOME
            else:
                self._plan(g, solver)
        for path, g in stale.items():
            orphan = orphans.get(path)
            if orphan is not None and orphan.refusal and not getattr(orphan, "checks_only", False):
                g.refusal = orphan.refusal  # half of a module's apex code migrated would mix the two
            else:
                self._plan(g, solver)
        groups.extend(by_root.values())
        groups.extend(entries.values())
        groups.extend(stale.values())
        groups.extend(orphans.values())
        return groups

    def _plan(self, g: Group, solver: Solver) -> None:
        """Plans ``g``; what stops it becomes its refusal."""
        try:
            GroupPlan(self, g, solver).plan()
        except Refuse as exc:
            g.refusal = str(exc)
        except Exception as exc:  # a planner bug: this group is left whole, the others go on
            g.refusal = f"ampfix could not plan this migration ({type(exc).__name__}: {exc}); please report it"

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
            if f.is_method and f.cls is not None and any(
                    u.func is not None and u.func is not f and u.func.cls is f.cls and u.kind in SCALER_KINDS
                    for u in uses):
                # `model, optimizer = self.wrap_up(...)` in a trainer whose own methods scale the
                # loss and save the state: the scaler stays on the object (self.scaler)
                out.append(s)
                continue
            alias = Solver.alias_of(f)
            mine = [u for u in uses if u.func is f and u.kind in SCALER_KINDS]
            if any(u.kind == "" and not (alias and isinstance(u.node, ast.Name) and u.node.id == alias) for u in mine):
                out.append(s)
                continue
            guards = [u for u in mine if u.kind == "" and _guards_only(u, s)]
            drop = bool(guards) and len(guards) == len(mine) and _last_param(f, alias)
            own = set() if drop else {u.kind for u in mine}
            if own - {"state_dict", "load_state_dict", ""}:
                out.append(s)
                continue
            returned = returned_after(f, s.stmt)
            # the arities of the returns a path without the seed reaches (`return model` when not
            # training): a call that unpacks that many values never gets the seed's optimizer
            other = {len(r.value.elts) if isinstance(r.value, (ast.Tuple, ast.List)) else 1
                     for r in returns_in(f.node) if r.value is not None} - {len(returned)}
            targets = s.target_names
            if returned:
                targets = [(self._returned_through(f, s.stmt, t, returned) or t) if t and t not in returned else t
                           for t in targets]
                if self._optimizer_left_behind(s, f, targets, returned, bad):
                    # `return model, config` after initializing for inference with an optimizer
                    # made only for apex: the callers get the model alone, and evaluate with it
                    targets = [targets[0], None]
            if not returned or not all(t in returned for t in targets if t):
                if self._reached_by_no_caller(s, f, bad):
                    # `if optimizer is None:` ... `if teacher is None:` ... `else:` initialize
                    # the teacher too: no caller in the project takes that branch, so it goes
                    s.exported = True
                    s.moved_to = []
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
                    if len(telts) != len(returned) and len(telts) in other:
                        continue
                    if self._not_this_callers(s, f, cs):
                        continue
                    held = {id(a) for a, param, wants_none in none_tests(s.stmt, f)
                            if not wants_none and self._an_optimizer(cs, cs.argument(param))}
                    if len(telts) != len(returned):
                        raise Refuse(f"`{f.qualname}` at {cs.module.path} line {cs.node.lineno} unpacks "
                                     f"{len(telts)} values of {len(returned)}")
                    v = Seed(s.use, nxt)
                    nxt += 1
                    v.module, v.func, v.stmt, v.call = cs.module, cs.caller, st, cs.node
                    v.exported_from = (s, cs, telts, returned)
                    v.none_held = held
                    # the setup also saves or loads apex's state: the scaler is made before the
                    # call and handed to it, so its options may only read the call's arguments
                    v.before_call = bool(own)
                    v.models = telts[returned.index(targets[0])] if targets[0] in returned else None
                    opt_target = targets[1] if len(targets) > 1 else None
                    passed = cs.argument(param_of(s, f, "optimizers", 1)) if opt_target else None
                    v.optimizers = telts[returned.index(opt_target)] if opt_target in returned else None
                    # a caller that throws the optimizer away (`model, _ = setup(...)`) only evaluates
                    v.training = v.optimizers is not None and not is_const(passed, None) and not (
                        isinstance(v.optimizers, ast.Name) and v.optimizers.id == "_")
                    virtual.append(v)
            except Refuse as exc:
                bad[s.idx] = str(exc)
                out.append(s)
                continue
            if not virtual:
                out.append(s)
                continue
            s.exported = True
            s.moved_to = [v.idx for v in virtual]
            if drop:
                # `if amp: model, optimizer = amp.initialize(...)` was all the setup did with the
                # amp it was handed: the test goes with the initialize, the parameter with both
                for u in guards:
                    u.kind = "seed_guard"
                    u.seed = s
                self.dropped_params.add((id(f.node), alias))
            out.append(s)
            out.extend(virtual)
        return out

    def _switched(self, seeds: List[Seed], need, solver: Solver, bad: Dict[int, str], name: str):
        """Scaled backwards that no initialize reaches, each under its trainer's own switch
        (``if self.use_amp:``), and setups that initialize apex and hand out the optimizer with
        no scaled backward of their own: the scaler is made where the switch is set and the
        setups' initialize goes (see :mod:`ampfix.migration.switches`).  Returns the seeds, the
        solver and the needs to plan with: the same ones when the pairing does not hold."""
        same = (seeds, solver, need)
        failing = [u for u, c in need if (c is None or not c.seeds) and u.kind in SCALER_KINDS]
        if not failing:
            return same
        scaled_by: Set[int] = set()
        for u, c in need:
            if u.kind == "scale_loss" and c is not None:
                scaled_by |= c.seeds
        lone = []
        for s in seeds:
            if getattr(s, "exported_from", None) is not None or s.use.kind != "initialize":
                continue
            if s.idx in bad:
                try:  # refused on its way to the callers, not for what it says
                    self._read_seed(s)
                except Refuse:
                    return same
            virtual = [v.idx for v in seeds if getattr(v, "exported_from", (None,))[0] is s]
            if not s.training or s.idx in scaled_by or scaled_by & set(virtual):
                continue
            if not self._hands_out(s) and not handed_to_framework(self.p, s):
                return same
            lone.append(s)
        if not lone:
            return same
        unswitched: List[Use] = []
        switch = find_switches(self.p, failing, max(s.idx for s in seeds) + 1, unswitched)
        if not switch:
            return same
        # a scaled backward with no switch stays as it is (refused on its own), when no setup
        # that goes is as near it in the folders as to its own trainer's switch
        if any(_shared_folders(s.module.path, u.module.path) >= _nearness(s.module.path, switch)
               for s in lone for u in unswitched):
            return same
        alone = {id(u) for u in unswitched}
        kept = [s for s in seeds if s not in lone and getattr(s, "exported_from", (None,))[0] not in lone]
        new = Solver(self.p, [s for s in kept if s.idx not in bad] + switch, name)
        again = [(u, new.solve(u.module, u.func) if u.kind in SCALER_KINDS else None) for u, _ in need]
        cands = [i for i, (u, c) in enumerate(again) if u.kind in SCALER_KINDS and (c is None or not c.seeds)
                 and id(u) not in alone and not any(_shared_folders(u.module.path, x.module.path) > _nearness(
                     u.module.path, switch) for x in unswitched)]
        # a sibling copy of the same module nearer the switch (object_detection/mmcv_custom/runner
        # beside semantic_segmentation/mmcv_custom/runner) is the switch's; this one belongs to a
        # project with none, and stays as it is
        left = [i for i in cands if not any(
            _tail(again[j][0].module.path) == _tail(again[i][0].module.path)
            and _nearness(again[j][0].module.path, switch) > _nearness(again[i][0].module.path, switch)
            for j in cands)]
        if left:
            # the scaler lives in objects a registry builds from the configuration: a checkpoint
            # helper or a runner that saved apex's state cannot reach it.  Its state is dropped
            # there (a resumed run starts from the initial scale and finds its own again), and
            # only there: every other use must reach the scaler.
            if any(again[i][0].kind not in ("state_dict", "load_state_dict") for i in left) or \
                    not built_by_configuration(self.p, switch) or \
                    any(s.training and s.idx not in bad and _shared_folders(s.module.path, again[i][0].module.path)
                        >= _nearness(again[i][0].module.path, switch) for s in kept for i in left):
                return same
            for i in left:
                u = again[i][0]
                again[i] = (u, Carrier("dropped", {sw.idx for sw in _nearest(switch, u.module.path)}, ""))
        # each setup goes with the trainers nearest it in the folders (a monorepo's copies of one
        # project pair up among themselves); a trainer no setup is nearest to goes with all of them
        near = {s.idx: _nearest(switch, s.module.path) for s in lone}
        if any(not any(sw in near[s.idx] for s in lone) for sw in switch):
            near = {s.idx: list(switch) for s in lone}
        for s in lone:
            s.dropped = near[s.idx]
            s.exported = False
            s.moved_to = []
            bad.pop(s.idx, None)
        return kept + lone + switch, new, again

    @staticmethod
    def _hands_out(s: Seed) -> bool:
        """An initialize in a setup that returns the optimizer it initialized (to a trainer)."""
        if s.func is None or s.optimizers is None:
            return False
        names = s.target_names
        opt = names[1] if len(names) > 1 else None
        return opt is not None and opt in returned_after(s.func, s.stmt)

    @staticmethod
    def _returned_through(f, stmt, name: str, returned: List[str]) -> Optional[str]:
        """``modelD, optimizers = amp.initialize(modelD, [opt_D] + opts_T)`` then ``opt_D, opts_T =
        optimizers[0], optimizers[1:]`` and both returned: the optimizers reach the caller under
        returned names; the first of them stands for the list.  None where ``name`` is read any
        other way after the seed."""
        reads = [n for n in walk(f.node) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
                 and n.lineno > stmt.end_lineno]
        if not reads:
            return None
        first = None
        for n in reads:
            sub = getattr(n, "_p", None)
            elt = getattr(sub, "_p", None)
            st = getattr(elt, "_p", None)
            if not (isinstance(sub, ast.Subscript) and sub.value is n and isinstance(elt, ast.Tuple)
                    and isinstance(st, ast.Assign) and st.value is elt and len(st.targets) == 1
                    and isinstance(st.targets[0], ast.Tuple) and len(st.targets[0].elts) == len(elt.elts)):
                return None
            i = next(j for j, e in enumerate(elt.elts) if e is sub)
            got = dotted(st.targets[0].elts[i])
            if got not in returned:
                return None
            first = first or got
        return first

    def _alone_with_state(self, module, uses: List[Use]) -> bool:
        """Nothing in the modules connected to ``module`` by imports (either way, among those read),
        nor in its top folder, initializes apex, scales a loss with it or reads its master
        parameters: only its state is saved or loaded there, and checks that it is installed."""
        graph = self._imports
        if graph is None:
            graph = self._imports = {}
            by_id = {id(m) for m in self.p.modules.values()}
            for m in list(self.p.modules.values()):
                for imp in m.sem.imports:
                    for name in self.p.imported_names(m, imp):
                        other = self.p.imported_module(m, name, read_more=False)
                        if other is not None and other is not m and id(other) in by_id:
                            graph.setdefault(id(m), set()).add(id(other))
                            graph.setdefault(id(other), set()).add(id(m))
        seen, todo = {id(module)}, [id(module)]
        while todo:
            for n in graph.get(todo.pop(), ()):
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        # nor in its part of the repository (the folder it shares with them: a registry, not an
        # import, brings a runner and the training code that initializes apex together)
        top = self._top_folder(module.path)
        if any((id(u.module) in seen or top is None or self._top_folder(u.module.path) == top)
               and u.kind not in ("state_dict", "load_state_dict", "check", "installed") for u in uses):
            return False
        # the files of the other parts of the run, and those not read
        for name in ("initialize", "scale_loss", "master_params"):
            for path in self.p.mentioned_elsewhere(name, other_parts=True):
                if top is None or self._top_folder(path) == top:
                    return False
        return True

    def _top_folder(self, path: str) -> Optional[str]:
        """The first folder of ``path`` under the project's root (None: a file at the root)."""
        rel = Path(path)
        root = getattr(self.p, "root", None)
        if root is not None:
            try:
                rel = Path(path).resolve().relative_to(Path(root).resolve())
            except ValueError:
                pass
        return rel.parts[0] if len(rel.parts) > 1 else None

    def _orphan_reason(self, u: Use, solver: Solver) -> str:
        why = solver.why.get(Solver.key(u.module, u.func))
        if u.kind in SCALER_KINDS and why:
            return why
        if u.kind in SCALER_KINDS:
            return NO_HOME
        return f"apex.amp.{u.kind or '<module>'} has no automatic rewrite"

    def _scaler_name(self) -> str:
        taken = set()
        for m in self.p.modules.values():
            if "apex" in m.src.text:
                taken |= {n.id for n in walk(m.tree, into_functions=True) if isinstance(n, ast.Name)}
                taken |= {n.attr for n in walk(m.tree, into_functions=True) if isinstance(n, ast.Attribute)}
                taken |= {a.arg for n in walk(m.tree, into_functions=True) if isinstance(n, ast.arg) for a in [n]}
        for name in (("use_amp", "amp_enabled", "use_bf16") if bf16(self.p.settings) else
                     ("scaler", "grad_scaler", "amp_scaler")):
            if name not in taken:
                return name
        return "amp_grad_scaler"

    # -- seeds ---------------------------------------------------------------------------------
    def _not_this_callers(self, s: Seed, f, cs) -> bool:
        """The seed runs only where a parameter is None (``if optimizer is None: model =
        amp.initialize(model, ...)``, the setup's inference path) and this call hands it an
        optimizer that torch made, or only where it is not None and this call hands it None
        (or leaves it at a default of None): the seed never runs for this caller."""
        spread = any(isinstance(a, ast.Starred) for a in cs.node.args) or any(k.arg is None for k in cs.node.keywords)
        defaults = param_defaults(f.node.args)
        for _, param, wants_none in none_tests(s.stmt, f):
            given = cs.argument(param)
            if given is None and not spread:
                given = defaults.get(param)
            if (wants_none and self._an_optimizer(cs, given)) or (not wants_none and is_const(given, None)):
                return True
        return False

    def _reached_by_no_caller(self, s: Seed, f, bad) -> bool:
        """An inference seed under tests of parameters against None that no call of ``f`` in the
        project passes (:meth:`_not_this_callers`); ``f`` is not used other than by calling it."""
        if s.idx in bad or s.training or not none_tests(s.stmt, f):
            return False
        sites = self.p.callers(f)
        return bool(sites) and not self.p.references(f) and all(self._not_this_callers(s, f, cs) for cs in sites)

    @staticmethod
    def _assigned_values(unit, name: str, skip=None) -> Optional[List[ast.expr]]:
        """What ``unit`` assigns to ``name`` (leaving out the statement ``skip``); None where a
        binding is not a plain assignment (a loop, a with, an unpacking of something else)."""
        binds = [stmt_of(n) for n in walk(unit) if isinstance(n, ast.Name) and n.id == name
                 and isinstance(n.ctx, ast.Store)]
        if not all(isinstance(b, ast.Assign) for b in binds):
            return None
        return [b.value for b in binds if b is not skip]

    def _an_optimizer(self, cs, a) -> bool:
        """``a``, at the call ``cs``, is a name the caller binds only to optimizers that torch
        makes (``optimizer = AdamW(...)``, or a project function that returns one)."""
        if not isinstance(a, ast.Name):
            return False
        unit = cs.caller.node if cs.caller is not None else cs.module.tree
        values = self._assigned_values(unit, a.id, skip=stmt_of(cs.node))
        return bool(values) and all(self._makes_optimizer(cs.module, v) for v in values)

    def _makes_optimizer(self, module, v, depth: int = 0) -> bool:
        if not isinstance(v, ast.Call):
            return False
        if (dotted(v.func) or "").split(".")[-1] in OPTIMIZERS:
            return True
        f, _ = self.p.resolve(module, v.func)
        if f is None or depth > 1:
            return False
        rets = returns_in(f.node)
        for r in rets:
            values = self._assigned_values(f.node, r.value.id) if isinstance(r.value, ast.Name) else [r.value]
            if not values or not all(self._makes_optimizer(f.module, x, depth + 1) for x in values):
                return False
        return bool(rets)

    def _read_seed(self, s: Seed) -> None:
        call = s.call
        if call is None:
            raise Refuse(f"`{s.use.qname}` at line {s.use.line} is used other than by calling it")
        if has_star(call):
            self._spread(s)
            call = s.call
        if s.use.kind == "init":
            s.training = False
            return
        self._unpacked(s)
        models = arg(call, "models", 0)
        opts = arg(call, "optimizers", 1)
        if models is None:
            raise Refuse(f"amp.initialize at line {s.use.line} has no model")
        s.models = models
        s.optimizers = opts
        s.training = opts is not None and not is_const(opts, None) and not (
            isinstance(opts, (ast.List, ast.Tuple)) and not opts.elts)
        if s.training and isinstance(opts, ast.Name) and s.func is not None and any(
                p == opts.id and wants_none for _, p, wants_none in none_tests(s.stmt, s.func)):
            s.training = False  # `if optimizer is None: amp.initialize(model, optimizer)`: None there
            s.optimizer_none = True
        if s.training and self._never_trains(s):
            s.training = False

    @staticmethod
    def _spread(s: Seed) -> None:
        """``amp.initialize(model, opt, **amp_args)`` with ``amp_args`` built by the statements right
        before it: the seed reads the options from the dict, and those statements go with it.
        A key that only a condition sets must be one whose value changes nothing native."""
        why = f"amp.{s.use.kind} at line {s.use.line} has arguments that cannot be read"
        sp = spread_kwargs(s.call, s.stmt, s.unit)
        if sp is None:
            raise Refuse(why)
        odd = sorted(k for k in sp.conditional if k not in NOTES)
        if odd:
            raise Refuse(f"amp.{s.use.kind} at line {s.use.line} takes {odd[0]!r} from a dict that sets it only "
                         f"under a condition (line {sp.statements[0].lineno}): migrate it by hand")
        call = ast.Call(func=s.call.func, args=s.call.args, keywords=sp.keywords)
        ast.copy_location(call, s.call)
        call._p = getattr(s.call, "_p", None)
        s.call = call
        s.spread = sp.statements

    @staticmethod
    def _unpacked(s: Seed) -> None:
        """``inits = amp.initialize(model, optimizers=optimizer, ...)`` unpacked by the statement
        right after it: ``model, optimizer = inits``, or (NVIDIA's BERT scripts and their copies)
        ``model, optimizer = (inits if steps is not None else (inits, None))``, where the optimizer
        handed in is made only under that same test.  Both statements are the seed: its targets
        are the unpacked names, and the unpacking goes with it.  ``inits`` read anywhere else
        leaves the seed as it is."""
        st = s.stmt
        if not (isinstance(st, ast.Assign) and st.value is s.use.call and len(st.targets) == 1
                and isinstance(st.targets[0], ast.Name)):
            return
        name = st.targets[0].id
        _, _, block = block_of(st)
        i = next(k for k, x in enumerate(block) if x is st)
        nxt = block[i + 1] if i + 1 < len(block) else None
        if not (isinstance(nxt, ast.Assign) and len(nxt.targets) == 1
                and isinstance(nxt.targets[0], (ast.Tuple, ast.List)) and len(nxt.targets[0].elts) == 2):
            return

        def is_inits(e) -> bool:
            return isinstance(e, ast.Name) and e.id == name

        v = nxt.value
        if is_inits(v):
            test = None
        elif isinstance(v, ast.IfExp) and is_inits(v.body) and isinstance(v.orelse, ast.Tuple) and \
                len(v.orelse.elts) == 2 and is_inits(v.orelse.elts[0]) and is_const(v.orelse.elts[1], None):
            test = v.test
        else:
            return
        inside = {id(n) for n in walk(nxt)}
        if any(isinstance(n, ast.Name) and n.id == name and id(n) not in inside
               for n in walk(s.unit, into_functions=True) if n is not st.targets[0]):
            return
        if test is not None:
            # on the `else` side the optimizer becomes None: so it must have been None there
            opt = arg(s.call, "optimizers", 1)
            tested = {n.id for n in walk(test) if isinstance(n, ast.Name)}
            rebound = {t.id for n in walk(s.unit, into_functions=True)
                       if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                       for t in walk(n) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
            why = (f"amp.initialize at line {s.use.line} is unpacked at line {nxt.lineno} with the optimizer "
                   "None on one side, and ampfix cannot tell that the optimizer handed in is None there: "
                   "migrate it by hand")
            if not isinstance(opt, ast.Name) or tested & rebound:
                raise Refuse(why)
            want = ast.dump(test)
            for n in walk(s.unit, into_functions=True):
                if not (isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and n.lineno < st.lineno and any(
                        isinstance(t, ast.Name) and t.id == opt.id and isinstance(t.ctx, ast.Store) for t in walk(n))):
                    continue
                values = n.value.elts if isinstance(n, ast.Assign) and isinstance(n.value, ast.Tuple) else [n.value]
                if isinstance(n, ast.Assign) and all(is_const(x, None) for x in values):
                    continue
                p, under = n, False
                while p is not None and p is not s.unit:
                    q = getattr(p, "_p", None)
                    if isinstance(q, ast.If) and ast.dump(q.test) == want and any(x is p for x in q.body):
                        under = True
                        break
                    p = q
                if not under:
                    raise Refuse(why)
        s.unpack = nxt

    @staticmethod
    def _optimizer_left_behind(s: Seed, f, targets, returned, bad) -> bool:
        """An inference seed (``model, optimizer = amp.initialize(model, optimizer)`` where nothing
        trains: :meth:`_never_trains`) in a loader that returns the model but not the optimizer,
        which nothing reads after the seed (the optimizer was made for apex alone), and that
        reads the model after it only to return it."""
        if s.idx in bad or s.training or len(targets) != 2 or not targets[0] or targets[0] not in returned:
            return False
        opt = targets[1]
        if not opt or opt in returned or "." in opt or not isinstance(s.models, ast.Name) or not (
                isinstance(s.optimizers, ast.Name) and s.optimizers.id == opt):
            return False
        end = s.stmt.end_lineno
        after = [n for n in walk(f.node, into_functions=True)
                 if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.lineno > end]
        # the loader only hands the model back: where it also runs it (an evaluation after the
        # setup), the regions are there, with the seed where it is
        returns = {id(n) for r in walk(f.node) if isinstance(r, ast.Return) for n in walk(r)}
        return not any(n.id == opt or (n.id == targets[0] and id(n) not in returns) for n in after)

    def _never_trains(self, s: Seed) -> bool:
        """An evaluation script that copied ``model, optimizer = amp.initialize(...)`` from its
        trainer: nothing reads the optimizer after it and nothing in the module runs a backward,
        so apex only cast the forward passes (an inference seed)."""
        m = s.module
        if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward"
               for n in walk(m.tree, into_functions=True)):
            return False
        opt_names = {dotted(x) for x in (s.optimizers.elts if isinstance(s.optimizers, (ast.Tuple, ast.List))
                                         else [s.optimizers])}
        # what the call's result is bound to: plain names only (`self.optimizer` may train elsewhere)
        if isinstance(s.stmt, ast.Assign):
            for t in s.stmt.targets:
                # `model, optimizer = ...`: the optimizer's place; a single target holds both
                x = t.elts[1] if isinstance(t, (ast.Tuple, ast.List)) and len(t.elts) == 2 else t
                for y in (x.elts if isinstance(x, (ast.Tuple, ast.List)) else [x]):
                    if not isinstance(y, ast.Name):
                        return False
                    opt_names.add(y.id)
        elif not isinstance(s.stmt, ast.Expr):
            return False
        if not opt_names or None in opt_names or any(n.startswith("self.") or "." in n for n in opt_names):
            return False
        unit = s.func.node if s.func is not None else m.tree
        end = s.stmt.end_lineno
        # (a function nothing in the project calls would take a scaler from its callers for what it
        # hands the optimizer to: only where it is called, or is module-level code, may it be read)
        called = s.func is None or bool(self.p.callers(s.func))
        for n in walk(unit, into_functions=True):
            if isinstance(n, ast.Name) and n.id in opt_names and isinstance(n.ctx, ast.Load) and (
                    n.lineno > end or m.function_of(n) is not s.func) and not (
                    called and self._handed_to_no_training(m, n)):
                return False
        return True

    def _handed_to_no_training(self, m, n) -> bool:
        """``n`` (the optimizer) is an argument of a call of a project function that only reads it:
        calls its methods other than ``step`` (``load_state_dict``), reads its ``param_groups``,
        hands it to a schedule (``CosineLRScheduler(optimizer, ...)``) or to another such function
        (``build_scheduler(config, optimizer, steps)``, ``load_checkpoint(..., optimizer, ...)``, a
        ``train_one_epoch`` stubbed out in an evaluation copy of the training script).  Stored,
        returned or handed to anything else, it may train there."""
        call = getattr(n, "_p", None)
        if isinstance(call, ast.keyword):
            call = getattr(call, "_p", None)
        if not isinstance(call, ast.Call) or call.func is n:
            return False
        f, bound = self.p.resolve(m, call.func)
        todo = [(f, param_given(call, n, f, bound))]
        seen: Set[tuple] = set()
        while todo:
            f, param = todo.pop()
            if f is not None and f.node.name == "__init__" and f.cls is not None and SCHEDULE.search(f.cls.name):
                # a schedule keeps the optimizer to set its learning rate: none of its code trains
                if not schedule_class(f):
                    return False
                continue
            if f is None or param is None or f.node.name == "__init__":
                return False  # a library's function, an argument not named, or kept by an object
            if (id(f.node), param) in seen:
                continue
            seen.add((id(f.node), param))
            if len(seen) > 20:
                return False
            for x in walk(f.node, into_functions=True):
                if isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute) and x.func.attr in (
                        "backward", "scale_loss"):
                    return False
                if not (isinstance(x, ast.Name) and x.id == param and isinstance(x.ctx, ast.Load)):
                    continue
                p = getattr(x, "_p", None)
                if isinstance(p, ast.Attribute) and p.value is x:
                    if p.attr == "step":
                        return False
                    continue  # `optimizer.load_state_dict(...)`, `optimizer.param_groups`
                c = getattr(p, "_p", None) if isinstance(p, ast.keyword) else p
                if not isinstance(c, ast.Call) or c.func is x:
                    return False
                g, gb = self.p.resolve(f.module, c.func)
                if g is None:
                    if not SCHEDULE.search(dotted(c.func) or ""):
                        return False  # a library's function other than a schedule's: it may train
                    continue
                todo.append((g, param_given(c, x, g, gb)))
        return True


class GroupPlan(SeedRewrites, UseRewrites, WrapperSteps, CarrierRewrites, EvaluationRewrites, Rewriter):
    """Plans one group: its seeds, and every use its scaler must reach."""

    @property
    def noscale(self) -> bool:
        """Nothing scales the loss: O3's pure float16, or bfloat16."""
        return self.pure or self.bf16

    def needs_flag(self) -> bool:
        """bfloat16: whether a use's function reads the AMP switch through what is carried (a
        flag on self, a parameter, a module global), not the seed's own condition."""
        for u, c in self.g.needs:
            if c is None:
                continue
            if Solver.key(u.module, u.func) in self.no_carrier:
                # the switch is not carried there: the callers' regions read what they have
                for cs in c.sites:
                    cc = self.solver.solve(cs.module, cs.caller)
                    if cc is None or not cc.sees_seed or len(cc.seeds) != 1:
                        return True
                continue
            # a closure of the seed's function reads the seed's own condition too (_autocast_enabled)
            if not c.sees_seed or len(c.seeds) != 1:
                return True
        return False

    def __init__(self, planner: AmpPlanner, g: Group, solver: Solver) -> None:
        super().__init__(planner.p, g)
        self.planner = planner
        self.solver = solver
        self.name = solver.name
        self.enabled: Dict[int, str] = {}  # seed idx -> enabled expression (in its function)
        self.autocast_enabled: Dict[object, str] = {}  # carrier key -> autocast enabled= in that function
        self.pure = False
        #: --dtype bfloat16: autocast to bfloat16, and no GradScaler: the carried object is a flag
        self.bf16 = bf16(self.s)
        self.notes = g.notes
        self.scaled: Dict[object, Set[str]] = {}  # function key -> optimizer expressions scaled there
        self.backward_sites: Dict[object, List[ast.stmt]] = {}
        self.param_added: Set[object] = set()
        #: globals() dispatch calls handed the scaler: id -> (module, call)
        self.dispatch_passed: Dict[int, tuple] = {}
        self.default_made: Set[int] = set()
        self.must_default: Set[int] = set()
        self.steps_of: Dict[object, List[ast.Call]] = {}  # function key -> the steps converted there
        self.step_methods: Set[object] = set()  # keys of methods that step after another's scaled backward
        #: (module, optimizer, call statement, scaler) where a helper that reads unscaled gradients is called
        self.caller_unscales: List[Tuple[object, str, ast.stmt, str]] = []
        self.unscaled: List[tuple] = []  # (module, optimizer, statement) where scaler.unscale_ is already called
        #: helper calls that are the scaled backward in their caller: what reads gradients there is checked last
        self.reads_after_calls: List[tuple] = []
        self.made_at: Dict[tuple, str] = {}  # (path, id of a call statement) -> the scaler made after it
        #: seed index -> the line before which (or on which) its scaler is made: a call that is handed
        #: the scaler from that function must come after it (see CarrierRewrites._passed_before_made)
        self.made_line: Dict[int, int] = {}
        #: (path, id of a block, target, the scaler's code) -> the call statement it was made after
        self.made_in_block: Dict[tuple, ast.stmt] = {}
        #: what shares one scaler, where the setups called in one block do (see _made_already)
        self.shared_by_setups: Optional[str] = None
        self.alias_nones: Set[int] = set()  # `self.amp = None` statements of an apex alias, removed
        self.outside_made: Set[int] = set()  # classes whose __init__ got the disabled scaler of a setup function
        #: seed index -> where the training scales natively: initializes left over from apex, which go
        self.leftover: Dict[int, str] = {}
        self.installed_folded: Set[int] = set()  # tests of whether apex is installed, folded
        self.made_before: Dict[tuple, dict] = {}  # (path, id of the statement, target) -> the scaler made there
        self.twins: Set[str] = set()  # modules where a model initialized beside the trained one went
        self.guarded: Set[int] = set()  # ifs that got `scaler is not None and` first
        self.params_gone: Set[int] = set()  # defs whose apex-amp parameter goes
        self.nones_gone: Set[int] = set()  # `else: amp = None` beside a caller's apex import, removed
        self.scales_gone: Set[int] = set()  # apex's private first loss scale lines, removed
        self.write_backs_gone: Set[int] = set()  # `models[i] = model` after an initialize that went
        #: bfloat16: functions (solver keys) that the AMP switch is not carried to (carriers_not_read)
        self.no_carrier: Set[object] = set()

    # -- the whole group -----------------------------------------------------------------------
    def plan(self) -> None:
        g = self.g
        self.no_carrier = self.carriers_not_read() if self.bf16 else set()
        training = [s for s in g.seeds if s.training]
        leftover = self.leftover = self._leftovers()
        for s in g.seeds:
            if isinstance(s, SwitchSeed):
                self._switch_seed(s)
            elif s.idx in leftover:
                self._leftover(s, leftover[s.idx])
            elif getattr(s, "dropped", None):
                self._dropped(s)
            elif getattr(s, "exported", False):
                self._exported_away(s)
            elif s.use.kind == "init":
                self._amp_init(s)
            elif s.training:
                self._training_seed(s)
            else:
                self._inference_seed(s)
            if not isinstance(s, SwitchSeed):
                self._install_checks_go(s)
            if getattr(s, "unpack", None) is not None and id(s.stmt) in self.fc(s.module).touched:
                self.fc(s.module).remove(s.unpack)
            if getattr(s, "spread", ()) and id(s.stmt) in self.fc(s.module).touched:
                for x in s.spread:
                    self.fc(s.module).remove(x)
        training = [s for s in training if not getattr(s, "exported", False) and not getattr(s, "dropped", None)
                    and s.idx not in leftover]
        scaled_by = set()
        for u, c in g.needs:
            if u.kind == "scale_loss" and c is not None:
                scaled_by |= set(c.seeds)
        unscaled = [s for s in training if s.idx not in scaled_by]
        if unscaled and not self.pure:
            s = getattr(unscaled[0], "exported_from", (unscaled[0],))[0]
            unbound = self._unbound_scale_loss()
            if unbound:
                raise Refuse(unbound)
            elsewhere = self._scale_loss_outside()
            if elsewhere:
                # the project scales a loss where no call from here was followed (a use refused on its
                # own, or reached in a way the planner does not follow): "never used" would be untrue
                raise Refuse(f"the optimizer of amp.initialize at line {s.use.line} reaches no amp.scale_loss that "
                             f"ampfix follows from here; the one at {elsewhere} is planned apart, with its own "
                             "result: where it scales this optimizer, migrate the two together by hand")
            raise Refuse(f"the optimizer of amp.initialize at line {s.use.line} is never used with amp.scale_loss in "
                         "the files given: its backward is unscaled; add the scaled backward by hand, or give "
                         "ampfix the files that train")
        if self.pure:
            g.description = "apex.amp -> model.half() (O3 is pure float16: no autocast, no master weights, no loss scaling)"
        elif leftover and len(leftover) == len(g.seeds):
            g.description = "apex.amp: the initialize goes (the training it feeds runs native AMP already)"
        elif not g.seeds and any(u.kind == "scale_loss" for u, _ in g.needs):
            # a library function whose caller initialized apex: the scaler comes in as a parameter
            g.description = "apex.amp -> " + description(self.s)
        elif not g.seeds and any(getattr(c, "unreached", False) for _, c in g.needs):
            g.description = "apex.amp: its saved state goes (nothing here initializes apex)"
        elif not g.seeds:
            g.description = "apex.amp: the check that apex is installed goes"
        elif training:
            g.description = "apex.amp -> " + description(self.s)
        else:
            g.description = "apex.amp -> " + description(self.s).split(" + ")[0].split(",")[0] + " around the model's forward"
        # the uses the scaler reaches
        carriers: Dict[object, Carrier] = {}
        for u, c in g.needs:
            carriers[Solver.key(u.module, u.func)] = c
        for u, c in sorted(g.needs, key=lambda x: (x[0].module.path, x[0].line)):
            if u.kind == "scale_loss":
                self._scale_loss(u, c)
                base = base_name(u.node)
                if base is not None and not u.module.sem.bindings_of(base):
                    self.notes.add(f"`{base.id}.scale_loss` at {u.module.path} line {u.line} read a name that only "
                                   "an import inside another function binds: the fp16 path raised NameError "
                                   "there before, and runs now")
        if not self.noscale:
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
            elif u.kind == "seed_guard":
                self._param_goes(u)
            elif u.kind == "installed":
                self._installed_test_folds(u)
            elif u.kind == "check":
                st = availability_check(u.node)
                if id(st) not in self.fc(u.module).touched:
                    self.fc(u.module).remove(st)
        self._unscale_before_calls()
        self._check_reads_after_calls()
        self._carriers()
        if not self.pure:
            self._evaluation_calls()
        self._finish_regions()
        self._dropped_argument_names()
        self._imports_that_went()
        if self.bf16:
            # what the notes say of a GradScaler does not apply: there is none
            for n in [n for n in self.notes if "GradScaler" in n or "unscale" in n]:
                self.notes.discard(n)
        for path in g.paths:
            m = self.p.modules[path]
            if path in g.changes or g.uses.get(path):
                fc = self.fc(m)
                fc.adds.append(ImportSpec("torch"))
                fc.removes.extend(apex_import_specs(m))

    def _leftovers(self) -> Dict[int, str]:
        """seed index -> where its training scales natively, for a group whose only apex is
        initializes no ``amp.scale_loss`` ever follows, each of whose optimizer goes to project
        code that already scales the loss with a GradScaler of its own (scene_graph_benchmark's
        ``do_train``, aitoolbox's ``TrainLoop(..., use_amp=True)``): apex's initialize was left
        over from before, and goes.  Only at opt levels O0/O1 (O2 and O3 cast the model, which
        the native scaler never saw working)."""
        g = self.g
        if not g.seeds or any(isinstance(s, SwitchSeed) or not s.training or getattr(s, "dropped", None)
                              or getattr(s, "exported", False) or s.use.kind != "initialize" for s in g.seeds):
            return {}
        if any(u.kind not in ("check", "installed") for u, _ in g.needs):
            return {}
        out = {}
        for s in g.seeds:
            found = self._scaled_natively(s)
            if found is None or not _low_levels(s):
                return {}
            where, call = found
            if not _switch_follows(s, call):
                # its AMP may be off where apex's O1 ran the forward in float16 (unscaled): taking
                # the initialize away would train in float32 there, slower and with more memory
                raise Refuse(f"amp.initialize at line {s.use.line} looks left over (the training it feeds scales "
                             f"the loss with a GradScaler of its own, {where}), but that AMP has a switch of its own "
                             f"that the call at line {call.lineno} does not set where apex was on: remove the "
                             "initialize by hand once that switch is on")
            out[s.idx] = where
        return out

    def _scaled_natively(self, s: Seed) -> Optional[Tuple[str, ast.Call]]:
        """(``path line N``, the call) of a native scaled backward (``scaler.scale(loss).backward()`` with
        ``scaler = GradScaler(...)`` in its module) in the project code the seed's optimizer is
        handed to after the initialize: the function called, or the class built (its bases too)."""
        names = s.target_names
        opt = names[1] if len(names) > 1 else dotted(s.optimizers) if s.optimizers is not None else None
        if not opt:
            return None
        for call in walk(s.unit):
            if not (isinstance(call, ast.Call) and call.lineno > s.stmt.end_lineno):
                continue
            if not any(dotted(a) == opt for a in [*call.args, *(k.value for k in call.keywords)]):
                continue
            f, _ = self.p.resolve(s.module, call.func)
            if f is None:
                continue
            mods = [f.module]
            if f.cls is not None:
                mods += [m for m, _ in self.p.ancestors(f.module, f.cls)]
            for m in mods:
                hit = native_scaled_backward(m.tree)
                if hit is not None:
                    return f"{m.path} line {hit}", call
        return None

    def _leftover(self, s: Seed, where: str) -> None:
        self._initialize_goes(s)
        self.notes.add(f"apex's initialize was left over: the training it hands the optimizer to scales the loss "
                       f"with a GradScaler of its own ({where})")

    def _dropped_argument_names(self) -> None:
        """``task2scaler = {t: i for i, t in enumerate(tasks)}`` read only by the arguments that
        go with apex (``num_losses=len(task2scaler)``, ``loss_id=task2scaler[name]``): the
        assignment goes too, when it computes nothing but that (UNITER's pretraining scripts and
        their many copies)."""
        calls = [(s.module, s.func, s.call, s.stmt) for s in self.g.seeds if getattr(s, "call", None) is not None]
        calls += [(u.module, u.func, u.call, getattr(getattr(u.call, "_p", None), "_p", None))
                  for u, _ in self.g.needs if u.kind == "scale_loss" and u.call is not None]
        kept = {"models", "optimizers", "loss", "opt_level", "loss_scale", "enabled"}
        if self.bf16:
            kept.discard("loss_scale")  # no scaler takes it
        leftover = {id(s.call) for s in self.g.seeds if s.idx in self.leftover}
        dropped = {}
        for m, func, call, stmt in calls:
            if stmt is None or id(stmt) not in self.fc(m).touched:
                continue
            for k in call.keywords:
                # a left-over initialize goes whole: its opt level and loss scale with it
                if k.arg is not None and (k.arg not in kept or (id(call) in leftover and k.arg not in (
                        "models", "optimizers"))):
                    dropped.setdefault((id(m), id(func)), (m, func, []))[2].append(k.value)
            if self.bf16 and (dotted(call.func) or "").endswith("scale_loss"):
                # bfloat16: the backward is the loss's own, and no scaler reads the optimizers
                # handed to scale_loss (`optimizer_list = [optimizer, optimizer_lif]` only for it)
                given = call.args[1:2] + [k.value for k in call.keywords if k.arg == "optimizers"]
                dropped.setdefault((id(m), id(func)), (m, func, []))[2].extend(given)
        for m, func, values in dropped.values():
            unit = func.node if func is not None else m.tree
            inside = {id(n) for v in values for n in ast.walk(v)}
            every = list(walk(unit, into_functions=True))
            if any(isinstance(n, (ast.Global, ast.Nonlocal)) for n in every):
                continue
            todo = sorted({n.id for v in values for n in ast.walk(v) if isinstance(n, ast.Name)})
            seen = set()
            while todo:
                name = todo.pop(0)
                if name in seen:
                    continue
                seen.add(name)
                nodes = [n for n in every if isinstance(n, ast.Name) and n.id == name and id(n) not in inside]
                stores = [n for n in nodes if isinstance(n.ctx, ast.Store)]
                if len(stores) != len(nodes) or not stores:
                    continue
                # each binding goes; one alone in an `if` takes the `if` with it (carbonati's
                # `keep_bn_fp32 = config.get(...)` / `if opt_level == 'O1': keep_bn_fp32 = None`)
                gone = [_goes_with(stmt_of(x), x) for x in stores]
                if any(g is None or id(g) in self.fc(m).touched for g in gone):
                    continue
                gone = list({id(g): g for g in gone}.values())  # an if/else that binds it in both branches
                if func is None and self.p.mentioned_elsewhere(name):
                    continue
                for g in gone:
                    self.fc(m).remove(g, described=True)  # and a comment above it that speaks of apex
                    self.fc(m).touched.add(id(g))
                # and the commented-out code of the unit that reads it (`# print(keep_batchnorm_fp32)`)
                first, last = (unit.lineno, unit.end_lineno) if func is not None else (1, m.src.line_count)
                self.fc(m).drop_commented_code(first, last, name)
                self.notes.add(f"`{name}`, which only apex's arguments read, goes too")
                # what only the bindings that went read goes next (`use_mixed_precision` behind
                # `amp_opt_level = 'O1' if use_mixed_precision else 'O0'`)
                inside |= {id(n) for g in gone for n in ast.walk(g)}
                todo += sorted({n.id for g in gone for n in ast.walk(g) if isinstance(n, ast.Name)
                                and isinstance(n.ctx, ast.Load)} - seen)

    def _scale_loss_outside(self) -> Optional[str]:
        """Where an ``amp.scale_loss`` of the given files lies that this group does not hold
        (``path line N``, the first), or None."""
        mine = {id(n) for nodes in self.g.uses.values() for n in nodes}
        # the group's own modules first (a closure beside the initialize), then the others
        for path in sorted(self.p.modules, key=lambda x: (x not in self.g.paths, x)):
            m = self.p.modules[path]
            if not m.editable or "scale_loss" not in m.src.text:
                continue
            for n, q in apex_uses(m.sem, m.tree):
                if q == "apex.amp.scale_loss" and id(n) not in mine:
                    return f"{m.path} line {n.lineno}"
        return None

    def _unbound_scale_loss(self) -> Optional[str]:
        """``amp.scale_loss`` where ``amp`` is bound by nothing in its scope, in a module that
        imports apex's amp only inside a function (``Trainer.__init__``): the fp16 path raised
        NameError there.  The reason to give instead of "never used with amp.scale_loss"."""
        # the group's modules and what they import (the trainer module a script hands its model
        # to): another script's bug is not this one's
        mods = [self.p.modules[p] for p in sorted(self.g.paths)]
        for m in list(mods):
            for imp in m.sem.imports:
                for name in self.p.imported_names(m, imp):
                    # only modules read already: a refusal's wording reads no more files
                    other = self.p.imported_module(m, name, read_more=False)
                    if other is not None and all(other is not x for x in mods):
                        mods.append(other)
        for m in mods:
            if "scale_loss" not in m.src.text or "apex" not in m.src.text:
                continue
            inner = [n for n in walk(m.tree, into_functions=True) if isinstance(n, ast.ImportFrom) and n.module
                     and n.module.split(".")[0] == "apex" and any((a.asname or a.name) == "amp" for a in n.names)
                     and m.function_of(n) is not None]
            if not inner:
                continue
            for n in walk(m.tree, into_functions=True):
                if isinstance(n, ast.Attribute) and n.attr == "scale_loss" and isinstance(n.value, ast.Name) and \
                        n.value.id == "amp" and not m.sem.bindings_of(n.value):
                    where = m.function_of(inner[0])
                    return (f"`amp.scale_loss` at {m.path} line {n.lineno} reads a name `amp` that nothing binds there "
                            f"(apex's amp is imported inside `{where.qualname}` only), so the fp16 path raised "
                            "NameError: import it at the module's top, then migrate")
        return None


#: calls that compute a value and nothing else
_VALUE_CALLS = {"enumerate", "len", "range", "zip", "dict", "list", "set", "tuple", "sorted", "reversed", "keys",
                "values", "items"}


def native_scaled_backward(tree) -> Optional[int]:
    """The line of ``X.scale(loss).backward()`` in ``tree`` where ``X`` is bound to a
    ``GradScaler(...)`` there (``self.scaler = torch.cuda.amp.GradScaler(...)``), or None."""
    scalers = set()
    for n in walk(tree, into_functions=True):
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and \
                (dotted(n.value.func) or "").split(".")[-1] == "GradScaler":
            scalers |= {dotted(t) for t in n.targets if dotted(t)}
    for n in walk(tree, into_functions=True):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward" and \
                isinstance(n.func.value, ast.Call) and isinstance(n.func.value.func, ast.Attribute) and \
                n.func.value.func.attr == "scale" and dotted(n.func.value.func.value) in scalers:
            return n.lineno
    return None


def _switch_follows(s: Seed, call: ast.Call) -> bool:
    """The call that hands the optimizer on switches its AMP on wherever apex's initialize ran:
    a keyword named for AMP (``use_amp``, ``fp16``, ``mixed_precision``) given ``True``, or the
    test of the ``if`` that guards the initialize (``use_amp=args.fp16`` under ``if args.fp16:``)."""
    tests = {dotted(a.test) for a in ancestors_stmts(s.stmt, s.unit) if isinstance(a, ast.If)} - {None}
    unguarded = not any(isinstance(a, ast.If) for a in ancestors_stmts(s.stmt, s.unit))
    for k in call.keywords:
        if k.arg is None or not any(w in k.arg.lower() for w in ("amp", "fp16", "mixed", "half")):
            continue
        if (isinstance(k.value, ast.Constant) and k.value.value is True and unguarded) or dotted(k.value) in tests:
            return True
    return False


def _low_levels(s: Seed) -> bool:
    """The seed's opt_level is O0 or O1 on every way: absent (apex's default, O1), a literal, or a
    name its function binds only to such literals (``'O1' if use_mixed_precision else 'O0'``)."""
    lv = next((k.value for k in s.call.keywords if k.arg == "opt_level"), None)
    if lv is None and len(s.call.args) > 2:
        return False
    if lv is None:
        return True

    def low(e) -> bool:
        if isinstance(e, ast.Constant):
            return e.value in ("O0", "O1")
        if isinstance(e, ast.IfExp):
            return low(e.body) and low(e.orelse)
        return False

    if low(lv):
        return True
    if not isinstance(lv, ast.Name):
        return False
    binds = [n for n in walk(s.unit) if isinstance(n, ast.Name) and n.id == lv.id and not isinstance(n.ctx, ast.Load)]
    values = [getattr(b, "_p", None) for b in binds]
    return bool(values) and all(isinstance(v, ast.Assign) and v.targets == [b] and low(v.value)
                                for b, v in zip(binds, values)) and not (
        s.func is not None and (lv.id in s.func.positional or lv.id in s.func.kwonly))


def _goes_with(st, store) -> Optional[ast.stmt]:
    """What goes with the binding ``store`` of a name only apex's arguments read: its assignment
    (one target, a value that computes nothing else), or the ``if`` (no ``else``, a test that
    computes nothing else) whose whole body it is; None where it cannot go."""
    if not (isinstance(st, ast.Assign) and len(st.targets) == 1 and st.targets[0] is store
            and _computes_nothing_else(st.value)):
        return None
    owner, _, block = block_of(st)
    if len(block) > 1:
        return st
    if isinstance(owner, ast.If) and len(owner.body) == 1 and owner.body[0] is st and not owner.orelse and \
            _computes_nothing_else(owner.test):
        return owner
    # `if lif is not None: opts = [opt, lif] else: opts = [opt]`: each branch binds the name alone
    if isinstance(owner, ast.If) and len(owner.body) == 1 and len(owner.orelse) == 1 and \
            _computes_nothing_else(owner.test) and any(x is st for x in (owner.body[0], owner.orelse[0])):
        other = owner.orelse[0] if owner.body[0] is st else owner.body[0]
        if isinstance(other, ast.Assign) and len(other.targets) == 1 and isinstance(other.targets[0], ast.Name) \
                and other.targets[0].id == store.id and _computes_nothing_else(other.value):
            return owner
    return None


def _computes_nothing_else(expr) -> bool:
    """A literal, a comprehension or a view of names (``{t: i for i, t in enumerate(d.keys())}``)."""
    for n in ast.walk(expr):
        if isinstance(n, ast.Call):
            f = n.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            # `config.get("keep_batchnorm_fp32", True)`: a key's value, read from a mapping
            keyed = name == "get" and isinstance(f, ast.Attribute) and isinstance(
                f.value, (ast.Name, ast.Attribute, ast.Subscript)) and 1 <= len(n.args) <= 2 and not n.keywords \
                and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)
            if name not in _VALUE_CALLS and not keyed:
                return False
        elif isinstance(n, (ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)):
            return False
    return True


def _guarded_by_what_they_leave_none(u: Use, sites) -> bool:
    """``if opt is not None: with amp.scale_loss(loss, opt) ...`` in a function whose callers
    without a scaler (an evaluation that attacks its inputs with no optimizer) all leave ``opt``
    None: they never reach the scaled backward, so the scaler may be an optional parameter
    there (fast_adversarial's ``attack_pgd``)."""
    f = u.func
    if f is None or not sites:
        return False
    st = stmt_of(u.node)
    tested = None
    child = st
    for a in ancestors_stmts(st, f.node):
        if isinstance(a, ast.If) and any(x is child for x in a.body):
            t = a.test
            if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.IsNot) and \
                    isinstance(t.left, ast.Name) and is_const(t.comparators[0], None):
                tested = t.left.id
            elif isinstance(t, ast.Name):
                tested = t.id
            if tested is not None and (tested in f.positional or tested in f.kwonly):
                break
            tested = None
        child = a
    if tested is None:
        return False
    default = param_defaults(f.node.args).get(tested)
    for cs in sites:
        if any(isinstance(x, ast.Starred) for x in cs.node.args) or any(k.arg is None for k in cs.node.keywords):
            return False
        a = cs.argument(tested)
        if a is None and not is_const(default, None):
            return False
        if a is not None and not is_const(a, None):
            return False
    return True


def _library_entry(c: Optional[Carrier]) -> bool:
    """The scaler reaches ``c`` as the keyword-only parameter of a plain function (not a method:
    its object's protocol is not ours to change) that nothing in the project calls."""
    f = getattr(c, "entry", None)
    return c is not None and c.kind == "param" and not c.seeds and f is not None and f.cls is None and \
        f.outer is None


def _shared_folders(a: str, b: str) -> int:
    """How many leading folders the paths ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a.split("/")[:-1], b.split("/")[:-1]):
        if x != y:
            break
        n += 1
    return n


def _nearness(path: str, switch: List[SwitchSeed]) -> int:
    """The most leading folders ``path`` shares with a switch seed's module: a training seed at
    least that near may be the project whose state ``path`` saves (another project of a
    monorepo, a classifier beside a detector, is not)."""
    return max(_shared_folders(sw.module.path, path) for sw in switch)


def _tail(path: str) -> str:
    return "/".join(path.split("/")[-2:])


def _nearest(switch: List[SwitchSeed], path: str) -> List[SwitchSeed]:
    """The switch seeds whose modules share the most leading folders with ``path``."""
    best = _nearness(path, switch)
    return [sw for sw in switch if _shared_folders(sw.module.path, path) == best]


def _module_import_call(u: Use) -> bool:
    """``amp = importlib.import_module("apex.amp")`` at module level: the use is the import."""
    p = getattr(u.node, "_p", None)
    return isinstance(u.node, ast.Call) and u.func is None and isinstance(p, ast.Assign) and p.value is u.node \
        and len(p.targets) == 1 and isinstance(p.targets[0], ast.Name)
