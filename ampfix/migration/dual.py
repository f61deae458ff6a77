"""Programs that already have a native AMP path beside the apex one.

timm-style training scripts choose ``--amp-impl apex|native`` (or ``--apex-amp`` /
``--native-amp``), keep a mode variable (``use_amp = "apex"``), a ``has_apex`` flag from a
guarded import, and an apex wrapper class beside its native twin (``ApexScaler`` /
``NativeScaler``).  Migrating the apex branch in place would keep two native paths; leaving it
breaks ``--amp-impl apex`` once apex is gone.  Instead every apex choice is routed to the native
one:

* facts: a ``has_apex``-style flag (True in a ``try`` that imports apex, False in its
  ``except ImportError``) is False; a test of the torch version against a 0.x / 1.x release
  (``version.parse(torch.__version__) < version.parse("1.6")``, where Hugging Face's Trainer
  of 2020 and its copies fall back to apex) has its value on the torch that native AMP needs,
  and a module-level flag that such code settles (``_use_apex = False`` / ``_use_native_amp =
  True``) has the value it ends with, in the functions that read it; a command-line selector
  that could say ``"apex"`` (for mixed precision: ``--sync-bn apex`` is not one) is rewritten
  right after the arguments are parsed (``if args.amp_impl == "apex": print(...);
  args.amp_impl = "native"``: the old value keeps working, and says so once); a variable
  compared with ``"apex"`` whose every ``= "apex"`` lies in code that can no longer run never
  equals it;
* ``if`` tests are evaluated under those facts (to a fixpoint): a branch that cannot run goes
  (an ``elif`` after it becomes the ``if``; an ``else`` body takes its place; an ``elif`` whose
  test only restates what the ``if`` before it tested, once the facts are folded, goes with its
  body), ``assert``s that always hold go, and so do the log lines in the branches that claimed
  apex;
* the apex wrapper class becomes an alias of its native twin (``ApexScaler = NativeScaler``),
  so that code importing it keeps working.

What remains of apex (imports, the flag, the guarded import) goes once unused.  The apex uses
in dead code belong to this group; the other planners leave them alone.
"""
from __future__ import annotations

import ast
import re
from typing import Dict, List, Optional, Set, Tuple

from ampfix.engine.tidy import apex_comment_above, checks_for_apex
from ampfix.model.analysis import (AUTOCAST, GRADSCALER, is_const, is_log_call, method_call, receiver, string_value,
                                   torch_version_test)
from ampfix.migration.flow import stmt_of
from ampfix.migration.groups import Group, Refuse
from ampfix.migration.rewriter import none_tests
from ampfix.migration.seeds import apex_import_specs
from ampfix.rule import ImportSpec
from ampfix.model.apex import apex_uses, imports_apex
from ampfix.model.semantic import block_of, dotted, walk

APEX_WORDS = ("apex",)

#: apex flags a framework's base class settles for the classes that extend it.  Hugging Face's
#: ``Trainer`` sets ``self.use_apex = True`` only for ``half_precision_backend="apex"`` (the
#: framework-flag rule rewrites that choice) and raises at construction when apex is not
#: installed: in a subclass that overrides ``train()``, ``if self.use_apex:`` is code that can no
#: longer run once apex is gone.
FRAMEWORK_FLAGS = {
    "transformers.Trainer": {"use_apex": False},
    "transformers.trainer.Trainer": {"use_apex": False},
    "transformers.Seq2SeqTrainer": {"use_apex": False},
    "transformers.trainer_seq2seq.Seq2SeqTrainer": {"use_apex": False},
}


class DualPlanner:
    def __init__(self, project) -> None:
        self.p = project
        #: id of every node in code that can no longer run (or that goes): the other planners skip it
        self.dead: Set[int] = set()

    def groups(self) -> List[Group]:
        plans: List["DualModule"] = []
        for m in list(self.p.modules.values()):
            if not m.editable or "apex" not in m.src.text:
                continue
            plans.append(DualModule(self.p, m))
        # apex's state is the process's: a fallback (`try: amp.initialize(...) except: scaler =
        # GradScaler()`) goes only where no apex.amp use in the project outlives the project's
        # fallbacks (one that still scales a loss would find apex uninitialized)
        by_module = {id(plan.m): plan for plan in plans}
        fallbacks_ok, seen = True, set()
        while fallbacks_ok:  # (looking at callers may read more modules of the project)
            fresh = [m for m in list(self.p.modules.values()) if id(m) not in seen]
            if not fresh:
                break
            seen |= {id(m) for m in fresh}
            fallbacks_ok = all((by_module.get(id(m)) or DualModule(self.p, m)).find_fallbacks()
                               for m in fresh if "apex" in m.src.text)
        if not fallbacks_ok:
            for plan in plans:
                plan.fallbacks, plan.apex_elses = [], []
        final: Dict[str, "DualModule"] = {}
        out: List[Group] = []
        for plan in list(plans):
            try:
                if plan.applies():
                    final[plan.m.path] = plan
            except Exception as exc:  # a planner bug: the module's apex code is left whole, with the
                # reason (the other planners would take a dual program's apex path for its only one)
                out.append(self._planner_bug(plan.m, exc))
                plans.remove(plan)
        # `self.use_apex` of a class whose every `= True` can no longer run is False in its
        # subclasses too, in other modules: they are planned with it, in one group (all or nothing)
        facts = {cid: (plan, flags) for plan in final.values() for cid, flags in plan.class_flags().items()}
        parent: Dict[str, str] = {path: path for path in final}

        def root(path: str) -> str:
            while parent[path] != path:
                path = parent[path]
            return path

        for plan in plans:
            inherited, owners = plan.inherit(facts) if facts else ({}, [])
            if not inherited:
                continue
            fresh = DualModule(self.p, plan.m, inherited)
            fresh.fallbacks, fresh.apex_elses = plan.fallbacks, plan.apex_elses
            if not fresh.applies():
                continue
            final[plan.m.path] = fresh
            parent.setdefault(plan.m.path, plan.m.path)
            for owner in owners:
                parent[root(plan.m.path)] = root(owner.m.path)
        components: Dict[str, List["DualModule"]] = {}
        for path in sorted(final):
            components.setdefault(root(path), []).append(final[path])
        for members in components.values():
            g = Group(f"dual:{members[0].m.path}", "dual")
            try:
                for x in members:
                    x.plan(g)
                for x in members:
                    self.dead |= x.dead
                self._classes_that_go(members, g)
            except Refuse as exc:
                g.refusal = str(exc)
            except Exception as exc:  # a planner bug: the module is left whole
                g.refusal = f"ampfix could not plan this migration ({type(exc).__name__}: {exc}); please report it"
            for x in members:
                for n in x.claimed:
                    g.add_use(x.m.path, n)
            out.append(g)
        return out

    def _classes_that_go(self, members: List["DualModule"], g: Group) -> None:
        """An apex wrapper class that only the apex path used (``loss_scaler = ApexScaler()`` in
        the branch that goes, imported from the project's ``util/misc.py``, whose native twin has
        another name: ``NativeScalerWithGradNormCount``) goes with it, where every module that
        names it is planned here and reads it only in code that goes (its import goes then too),
        and no file outside the run names it."""
        planned = {id(x.m): x for x in members}
        dead: Set[int] = set().union(*(x.dead for x in members))
        for m in list(self.p.modules.values()):
            if not m.editable or "apex" not in m.src.text:
                continue
            for c in m.tree.body:
                if not isinstance(c, ast.ClassDef) or "apex" not in c.name.lower() or id(c) in self.dead \
                        or c.decorator_list:
                    continue
                uses = apex_uses(m.sem, c)
                if not any(q.startswith("apex.amp") for _, q in uses) or self._read_outside(c, m, planned, dead) \
                        or self.p.mentioned_elsewhere(c.name):
                    continue
                fc = g.file(m)
                fc.remove(c, obsolete=True)
                fc.removes.extend(apex_import_specs(m))
                for n, _ in uses:
                    g.add_use(m.path, n)
                self.dead |= {id(x) for x in walk(c, into_functions=True)}

    def _read_outside(self, c: ast.ClassDef, home, planned, dead: Set[int]) -> bool:
        """Some module reads class ``c`` (of module ``home``) in code that stays, or names it in a
        way this plan does not remove (an import in a module not planned here, ``__all__``)."""
        inside = {id(x) for x in walk(c, into_functions=True)}
        named = False
        self.p.read_mentioning(c.name)
        for mm in list(self.p.modules.values()):
            if c.name not in mm.src.text:
                continue
            for n in walk(mm.tree, into_functions=True):
                if isinstance(n, ast.Constant) and n.value == c.name:
                    return True  # `__all__ = ["ApexScaler"]`, getattr(misc, "ApexScaler")
                if isinstance(n, (ast.Import, ast.ImportFrom)) and any(
                        (a.asname or a.name).split(".")[-1] == c.name for a in n.names):
                    if mm is not home and id(mm) not in planned:
                        return True
                    continue
                hit = (isinstance(n, ast.Name) and n.id == c.name) or (isinstance(n, ast.Attribute) and n.attr == c.name)
                if not hit or id(n) in inside:
                    continue
                if id(n) not in dead:
                    return True
                named = True
        return not named

    def _planner_bug(self, m, exc) -> Group:
        """The refused group of a module whose planning failed: its apex uses, which the other
        planners then skip."""
        g = Group(f"dual:{m.path}", "dual")
        g.refusal = f"ampfix could not plan this migration ({type(exc).__name__}: {exc}); please report it"
        for n, _ in apex_uses(m.sem, m.tree):
            g.add_use(m.path, n)
            self.dead.add(id(n))  # (the other planners skip it)
        return g


class DualModule:
    def __init__(self, project, module, inherited: Optional[Dict[int, Dict[str, bool]]] = None) -> None:
        self.p = project
        self.m = module
        #: id of a class of this module -> the apex flags (``self.use_apex``) its base classes settle
        self.inherited: Dict[int, Dict[str, bool]] = inherited or {}
        self.attr_flags: Dict[int, Dict[str, bool]] = {}  # id of a class -> its own settled apex flags
        self.code = module.src.code
        self.flags: Set[str] = set()  # names that are False (apex availability)
        self.settled: Dict[str, bool] = {}  # module-level flags' values once the module has loaded
        self._in_function = False  # the test being evaluated is inside a function
        self.selectors: Dict[str, str] = {}  # expression source -> its native value
        self.compared: Set[str] = set()  # selectors compared with "apex" (:meth:`_selectors`)
        self.cli: Dict[str, Tuple[str, str]] = {}  # args.X -> (native value / twin flag, kind "value"|"flag")
        self.dead_branches: List[Tuple[ast.If, str]] = []  # (if, "body"|"orelse") that cannot run
        #: `try: <apex's initialize> except: scaler = GradScaler()`: the handler, which runs now
        self.fallbacks: List[Tuple[ast.Try, ast.ExceptHandler, str]] = []
        #: `if scaler is not None: <native> else: <apex>` where the scaler is the fallback's: the
        #: `else` can no longer run (the `if` and its test stay); both found by the planner
        #: (:meth:`find_fallbacks`), where no apex.amp use in the project outlives them
        self.apex_elses: List[ast.If] = []
        self.dead_exprs: List[Tuple[ast.IfExp, ast.expr]] = []  # (a if t else b, the side that runs)
        #: a local selector read from a configuration (`fp16_type = fp16_cfg.pop("type")`) -> the
        #: statements that set it, where the apex choice is routed right after
        self.routes: Dict[str, List[ast.stmt]] = {}
        self.dead: Set[int] = set()
        self.folded: Set[int] = set()  # ids of reads of a flag now True that leave their test
        self.claimed: List[ast.AST] = []
        self.unwrapped: Dict[int, object] = {}  # id of a dropped `if` -> the edit that unwraps its else
        #: id of a class that extends a framework's trainer -> the apex flags the framework settles
        self.framework: Dict[int, Dict[str, bool]] = self._framework_flags()
        for c, flags in self.framework.items():
            self.inherited.setdefault(c, {}).update({a: v for a, v in flags.items()
                                                     if a not in self.inherited.get(c, {})})

    # -- recognising the shape -------------------------------------------------------------------
    def applies(self) -> bool:
        tree = self.m.tree
        # a class that extends a framework's trainer has its native path there (`self.use_amp`)
        old_torch_only = self._old_torch_only()
        if not self._native_path() and not self.framework and not old_torch_only:
            # no native path beside the apex one: the apex branch itself becomes native AMP (the
            # other planners), and a has_apex flag keeps True, the value of that path
            return False
        self._flags()
        self._selectors()
        gated = bool(self.fallbacks) or old_torch_only or any(
            isinstance(n, ast.If) and (torch_version_test(n.test) is not None or self._apex_choice(n))
            for n in walk(tree, into_functions=True))
        if not self.compared and not self.cli and not self.flags and not gated and not self.inherited:
            return False
        self._evaluate()
        # a dual path: some apex use sits in a branch that can no longer run
        uses = [n for n, q in apex_uses(self.m.sem, tree)]
        return any(id(n) in self.dead for n in uses)

    def _old_torch_only(self) -> bool:
        """Apex is used only under a test that holds on a torch older than native AMP (``if
        use_fp16 and LooseVersion(torch.__version__) < LooseVersion('1.6.0'): amp.initialize(...)``,
        EasyCV's ``train_model``, whose hooks use native AMP from 1.6 on): that branch never runs on
        the torch native AMP needs, so it goes, whether or not this module has native AMP itself."""
        uses = [n for n, q in apex_uses(self.m.sem, self.m.tree) if q.startswith("apex.amp")]
        if not uses:
            return False
        gone: Set[int] = set()
        for n in walk(self.m.tree, into_functions=True):
            if isinstance(n, ast.If) and any(torch_version_test(x) is False for x in ast.walk(n.test)) and \
                    self._value(n.test) is False:
                gone |= {id(x) for st in n.body for x in walk(st, into_functions=True)}
        return bool(gone) and all(id(n) in gone or isinstance(stmt_of(n), (ast.Import, ast.ImportFrom)) for n in uses)

    def _native_path(self) -> bool:
        """The module (or one it imports a twin from) already has native AMP: autocast, GradScaler,
        torch.cuda.amp, a Native* wrapper class, or a "native" choice."""
        known = AUTOCAST | GRADSCALER
        for n in walk(self.m.tree, into_functions=True):
            if isinstance(n, (ast.Name, ast.Attribute)):
                p = getattr(n, "_p", None)
                if isinstance(p, ast.Attribute) and p.value is n:
                    continue  # the whole chain is looked at once, at its outermost node
                q = self.m.sem.qnames(n)
                # the names of the chain's inner nodes are the prefixes of the outermost one's
                if any(x.startswith("torch.cuda.amp") or x.startswith("torch.amp") for x in q) or any(
                        ".".join(parts[:k]) in known for x in q for parts in [x.split(".")]
                        for k in range(1, len(parts) + 1)):
                    return True
                low = (dotted(n) or "").lower()
                if "native" in low and ("scaler" in low or "native_amp" in low):
                    return True  # NativeScaler, _use_native_amp, is_native_amp_available
            if isinstance(n, ast.ImportFrom) and not n.level and (n.module or "") in ("torch.cuda.amp", "torch.amp"):
                return True
            if string_value(n) is not None and n.value.lower() == "native":
                return True
        return False

    def _flags(self) -> None:
        """``try: import apex...; has_apex = True / except ImportError: has_apex = False``."""
        for t in walk(self.m.tree, into_functions=True):
            if not isinstance(t, ast.Try):
                continue
            if not any(imports_apex(x) for x in t.body):
                continue
            trues = {dotted(x.targets[0]) for x in t.body if isinstance(x, ast.Assign) and len(x.targets) == 1
                     and is_const(x.value, True)}
            falses = {dotted(x.targets[0]) for h in t.handlers for x in h.body if isinstance(x, ast.Assign)
                      and len(x.targets) == 1 and is_const(x.value, False)}
            # `has_apex = False` right before `try: from apex import amp; has_apex = True`
            owner, field, block = block_of(t)
            i = next((k for k, x in enumerate(block) if x is t), 0)
            before = block[i - 1] if i > 0 else None
            if isinstance(before, ast.Assign) and len(before.targets) == 1 and is_const(before.value, False):
                falses.add(dotted(before.targets[0]))
            self.flags |= {f for f in trues & falses if f}

    def _selectors(self) -> None:
        """Expressions compared with the string "apex" in tests, and command-line flags for apex."""
        others: Dict[str, Set[str]] = {}
        for n in walk(self.m.tree, into_functions=True):
            if isinstance(n, ast.Compare) and len(n.ops) == 1 and isinstance(n.ops[0], (ast.Eq, ast.NotEq)):
                a, b = n.left, n.comparators[0]
                for e, lit in ((a, b), (b, a)):
                    v = string_value(lit)
                    d = dotted(e)
                    if v is not None and d:
                        others.setdefault(d, set()).add(v)
            elif (member := _membership(n)) is not None:
                # `fp16_type in ["apex"]`, `assert fp16_type in [None, "apex", "pytorch"]`
                others.setdefault(member[0], set()).update(member[1])
        dests = self._argparse_dests()
        #: every expression compared with "apex" (a mode variable, an option)
        self.compared = {d for d, values in others.items() if "apex" in values and self._chooses_amp(d)}
        for d, values in others.items():
            if "apex" in values and d in self.compared:
                natives = sorted(v for v in values if v != "apex" and "native" in v.lower())
                natives = natives or sorted(v for v in values if v != "apex" and v)
                parts = d.split(".")
                if not natives and len(parts) == 2 and parts[1] in dests:
                    # compared with "apex" only: the option's default (or a choice) is the other path
                    action, default, choices = dests[parts[1]]
                    natives = [v for v in [default, *choices] if isinstance(v, str) and v and v != "apex"]
                if natives:
                    self.selectors[d] = natives[0]
        # argparse flags: --apex-amp (store_true) with a --native-amp twin; --amp-impl's values
        for dest, (action, _, _) in dests.items():
            if action == "store_true" and "apex" in dest and any("native" in d for d in dests):
                twin = next((d for d in dests if "native" in d and dests[d][0] == "store_true"), None)
                if twin is not None:
                    self.cli[dest] = (twin, "flag")
        for d, native in self.selectors.items():
            parts = d.split(".")
            if len(parts) == 2 and parts[1] in dests:
                self.cli[d.split(".")[1]] = (native, "value")
        for d in self.selectors:
            if "." not in d:
                sets = self._config_sets(d)
                if sets:
                    self.routes[d] = sets

    def _chooses_amp(self, d: str) -> bool:
        """``d == "apex"`` picks apex's mixed precision, not another apex feature (``--sync-bn
        apex`` picks apex's SyncBatchNorm): the name says so (amp, fp16, half, precision, mixed),
        or a branch it guards uses apex.amp / apex.fp16_utils."""
        last = d.split(".")[-1].lower()
        if any(w in last for w in ("amp", "fp16", "half", "precision", "mixed")):
            return True
        for n in walk(self.m.tree, into_functions=True):
            if not (isinstance(n, ast.If) and any(dotted(x) == d for x in walk(n.test))
                    and any(string_value(x) == "apex" for x in walk(n.test))):
                continue
            for x in walk(n, into_functions=True):
                if isinstance(x, (ast.Name, ast.Attribute)) and any(
                        q.startswith(("apex.amp", "apex.fp16_utils")) for q in self.m.sem.qnames(x)):
                    return True
        return False

    def _argparse_dests(self) -> Dict[str, tuple]:
        """dest -> (action, default, choices) of the module's argparse options."""
        out = {}
        for n in walk(self.m.tree, into_functions=True):
            if method_call(n, "add_argument") and n.args:
                names = [string_value(a) for a in n.args]
                if not all(names):
                    continue
                long = [x for x in names if x.startswith("--")]
                if not long:
                    continue
                dest = next((string_value(k.value) for k in n.keywords if k.arg == "dest"), None) or \
                    long[0][2:].replace("-", "_")
                action = next((string_value(k.value) for k in n.keywords if k.arg == "action"), None) or "store"
                default = next((k.value.value for k in n.keywords if k.arg == "default"
                                and isinstance(k.value, ast.Constant)), None)
                choices = next(([string_value(e) for e in k.value.elts] for k in n.keywords if k.arg == "choices"
                                and isinstance(k.value, (ast.List, ast.Tuple))), [])
                out[dest] = (action, default, choices)
        return out

    # -- partial evaluation ----------------------------------------------------------------------
    def _value(self, e) -> Optional[bool]:
        if isinstance(e, ast.Constant):
            return bool(e.value)
        d = dotted(e)
        if d in self.flags:
            return False
        if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
            v = self._class_fact(e)
            if v is not None:
                return v
        if self._in_function and isinstance(e, ast.Name) and e.id in self.settled:
            return self.settled[e.id]
        v = torch_version_test(e)
        if v is not None:
            return v
        if d and d.count(".") == 1 and self.cli.get(d.split(".")[1], (None, None))[1] == "flag":
            return False
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
            v = self._value(e.operand)
            return None if v is None else not v
        if isinstance(e, ast.BoolOp):
            vals = [self._value(v) for v in e.values]
            if isinstance(e.op, ast.And):
                if any(v is False for v in vals):
                    return False
                return True if all(v is True for v in vals) else None
            if any(v is True for v in vals):
                return True
            return False if all(v is False for v in vals) else None
        member = _membership(e)
        if member is not None and member[1] == {"apex"} and self._never_apex(member[0]):
            return isinstance(e.ops[0], ast.NotIn)  # `fp16_type in ["apex"]`
        if isinstance(e, ast.Compare) and len(e.ops) == 1 and isinstance(e.ops[0], (ast.Eq, ast.NotEq)):
            a, b = e.left, e.comparators[0]
            for x, lit in ((a, b), (b, a)):
                if string_value(lit) == "apex" and self._never_apex(dotted(x)):
                    return isinstance(e.ops[0], ast.NotEq)
        return None

    def _never_apex(self, d: Optional[str]) -> bool:
        if d is None or d not in self.compared:
            return False
        parts = d.split(".")
        if len(parts) == 2 and parts[1] in self.cli:
            return True  # routed when the arguments are parsed
        if d in self.routes:
            # routed where it is read from the configuration; a literal "apex" must be dead code
            return all(id(n) in self.dead for n in self._literal_sets(d, "apex"))
        # every `d = "apex"` lies in code that can no longer run
        for n in walk(self.m.tree, into_functions=True):
            if isinstance(n, ast.Assign) and any(dotted(t) == d for t in n.targets) and string_value(n.value) == "apex":
                if id(n) not in self.dead:
                    return False
        return True

    def _evaluate(self) -> None:
        for t, h, _ in self.fallbacks:
            self._mark(t.body)
        for n in self.apex_elses:
            self._mark(n.orelse)
        changed = True
        while changed:
            changed = False
            settled = self._settle()
            if settled != self.settled:
                self.settled = settled
                changed = True
            attrs = self._settle_attrs()
            if attrs != self.attr_flags:
                self.attr_flags = attrs
                changed = True
            for n in walk(self.m.tree, into_functions=True):
                if id(n) in self.dead:
                    continue
                if isinstance(n, (ast.If, ast.Assert)):
                    self._in_function = self.m.function_of(n) is not None
                if isinstance(n, (ast.If, ast.Assert, ast.IfExp)) and (
                        _constant(n.test) or self._version_test_of_other_things(n)):
                    continue  # `if True:  # args.distributed`: the author's own switch, not apex's
                if isinstance(n, ast.If):
                    v = self._value(n.test)
                    if v is None and self._restates_the_if_before(n):
                        v = False
                    if v is None:
                        side = self._apex_choice(n)
                        v = {"body": False, "orelse": True}.get(side)
                    if v is False and (n, "body") not in self.dead_branches:
                        self.dead_branches.append((n, "body"))
                        self._mark(n.body)
                        changed = True
                    elif v is True and n.orelse and (n, "orelse") not in self.dead_branches:
                        self.dead_branches.append((n, "orelse"))
                        self._mark(n.orelse)
                        changed = True
                elif isinstance(n, ast.Assert) and self._value(n.test) is True:
                    self.dead.add(id(n))
                elif isinstance(n, ast.IfExp) and all(e is not n for e, _ in self.dead_exprs):
                    self._in_function = self.m.function_of(n) is not None
                    v = self._value(n.test)
                    if v is None:
                        continue
                    live, gone = (n.body, n.orelse) if v else (n.orelse, n.body)
                    # `amp.master_params(opt) if self.use_apex else model.parameters()`,
                    # `"amp" if _native_amp else "apex"`: the apex side goes
                    if any(string_value(x) == "apex" for x in [gone, *walk(gone)]) or apex_uses(
                            self.m.sem, ast.Expr(value=gone)):
                        self.dead_exprs.append((n, live))
                        self._mark([gone, n.test])
                        changed = True
        # apex wrapper classes with a native twin in the module
        self.twins: List[Tuple[ast.ClassDef, ast.ClassDef]] = []
        classes = {c.name: c for c in self.m.tree.body if isinstance(c, ast.ClassDef)}
        for name, c in classes.items():
            if "apex" not in name.lower():
                continue
            twin = classes.get(name.replace("Apex", "Native").replace("apex", "native"))
            uses_amp = any(q.startswith("apex.amp") for x in walk(c, into_functions=True)
                           if isinstance(x, (ast.Name, ast.Attribute)) for q in self.m.sem.qnames(x))
            if twin is not None and uses_amp:
                self.twins.append((c, twin))
                self._mark([c])

    # -- apex tried first, native AMP in the handler ------------------------------------------------
    def find_fallbacks(self) -> bool:
        """Finds the module's fallbacks and the apex branches they make dead; whether every apex.amp
        use of the module (besides its imports) lies in one of them."""
        self._fallbacks()
        self.apex_elses = self._apex_elses()
        covered = {id(x) for t, _, _ in self.fallbacks for st in t.body for x in [st, *walk(st)]}
        covered |= {id(x) for n in self.apex_elses for st in n.orelse for x in [st, *walk(st)]}
        return all(not q.startswith("apex.amp") or id(n) in covered or
                   isinstance(stmt_of(n), (ast.Import, ast.ImportFrom)) for n, q in apex_uses(self.m.sem, self.m.tree))

    def _fallbacks(self) -> None:
        """``try: model, optim = amp.initialize(model, optim, opt_level="O1") / except: scaler =
        torch.cuda.amp.GradScaler()``: apex where it is installed, native AMP where the try fails
        (apex's guarded import left ``amp`` unbound).  Once apex is gone the handler is what runs:
        the try becomes its body.  Only a try whose body is apex's setup (its initialize, imports,
        log lines) and whose one handler makes the GradScaler (and logs), with no ``else`` that
        does more than log and no ``finally``."""
        for t in walk(self.m.tree, into_functions=True):
            if not isinstance(t, ast.Try) or t.finalbody or len(t.handlers) != 1:
                continue
            if not all(_is_message(x) or is_log_call(x) for x in t.orelse):
                continue
            inits = [x for x in t.body if isinstance(x, (ast.Assign, ast.Expr)) and isinstance(x.value, ast.Call)
                     and any(q.startswith("apex.amp.initialize") for q in self.m.sem.qnames(x.value.func))]
            if not inits or not all(any(x is y for y in inits) or imports_apex(x) or is_log_call(x) for x in t.body):
                continue
            h = t.handlers[0]
            made = [x for x in h.body if isinstance(x, ast.Assign) and len(x.targets) == 1 and
                    isinstance(x.value, ast.Call) and any(q in GRADSCALER for q in self.m.sem.qnames(x.value.func))]
            if len(made) != 1 or not dotted(made[0].targets[0]) or h.name or not all(
                    x is made[0] or is_log_call(x) for x in h.body):
                continue
            self.fallbacks.append((t, h, dotted(made[0].targets[0])))

    def _apex_elses(self) -> List[ast.If]:
        """``if scaler is not None: <scaler's backward and step> else: <apex's scaled backward>`` in
        a function whose every call hands ``scaler`` the name a fallback's handler makes the
        GradScaler in (from the function of that try, after it): apex's branch ran only where the
        try's body had run (the scaler stayed None there), and there the scaler exists now."""
        out: List[ast.If] = []
        for use, q in apex_uses(self.m.sem, self.m.tree):
            st, f = stmt_of(use), self.m.function_of(use)
            if not q.startswith("apex.amp") or st is None or f is None:
                continue
            for n, name, where_none in none_tests(st, f):
                if not where_none or not isinstance(n.test.ops[0], ast.IsNot) or any(n is x for x in out) or (
                        isinstance(n.orelse[0], ast.If) and self._is_elif(n.orelse[0])):
                    continue
                if not any(isinstance(y, ast.Call) and isinstance(y.func, ast.Attribute) and dotted(y.func.value) == name
                           for x in n.body for y in walk(x)):
                    continue  # the other branch is not the scaler's own path
                sites = self.p.callers(f)
                if sites and not self.p.references(f) and all(
                        cs.caller is not None and any(
                            made == dotted(cs.argument(name)) and self.m.function_of(t) is cs.caller
                            and t.lineno < cs.node.lineno and not _rebound_after(cs.caller.node, made, t, h)
                            for t, h, made in self.fallbacks) for cs in sites):
                    out.append(n)
        return out

    # -- a branch that only picks apex, beside one that sets native AMP up ------------------------
    def _apex_choice(self, n: ast.If) -> Optional[str]:
        """``if backend == "amp": self.use_amp = True; self.scaler = GradScaler() else: if not
        apex_available(): raise ImportError(...); self.use_apex = True``: the branch that only
        picks apex ("body" or "orelse") cannot run once every apex choice takes the native path
        (the other branch, which sets native AMP up); an ``elif`` that only picks apex goes
        beside the ``if`` before it that sets native AMP up."""
        parent = getattr(n, "_p", None)
        is_elif = isinstance(parent, ast.If) and len(parent.orelse) == 1 and parent.orelse[0] is n and self._is_elif(n)
        if self._picks_apex(n.orelse) and self._sets_native_up(n.body):
            return "orelse"
        if self._picks_apex(n.body) and (self._sets_native_up(n.orelse) or (is_elif and self._sets_native_up(parent.body))):
            return "body"
        return None

    def _picks_apex(self, stmts) -> bool:
        """Every statement only checks that apex is there, logs, or sets an apex flag to True (one
        at least)."""
        if not stmts:
            return False
        flag = False
        for st in stmts:
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and is_const(st.value, True) and \
                    "apex" in (dotted(st.targets[0]) or "").split(".")[-1].lower():
                flag = True
            elif isinstance(st, ast.If) and not st.orelse and "apex" in self.m.src.code(st.test).lower() and \
                    all(isinstance(x, ast.Raise) or is_log_call(x) or _is_message(x) for x in st.body):
                continue
            elif isinstance(st, ast.Raise) or is_log_call(st) or isinstance(st, ast.Pass):
                continue
            elif imports_apex(st):
                continue
            else:
                return False
        return flag

    def _sets_native_up(self, stmts) -> bool:
        for st in stmts:
            for x in [st, *walk(st)]:
                if isinstance(x, ast.Call) and any(q in GRADSCALER for q in self.m.sem.qnames(x.func)):
                    return True
                if isinstance(x, ast.Assign) and len(x.targets) == 1 and is_const(x.value, True):
                    last = (dotted(x.targets[0]) or "").split(".")[-1].lower()
                    if "apex" not in last and ("amp" in last or "native" in last):
                        return True
        return False

    # -- apex flags on self ------------------------------------------------------------------------
    def _classes(self) -> List[ast.ClassDef]:
        return [c for c in walk(self.m.tree, into_functions=True) if isinstance(c, ast.ClassDef)]

    def _class_of(self, n) -> Optional[ast.ClassDef]:
        f = self.m.function_of(n)
        while f is not None and f.cls is None and f.outer is not None:
            f = f.outer
        return f.cls if f is not None and f.is_method else None

    def _settle_attrs(self) -> Dict[int, Dict[str, bool]]:
        """``self.use_apex``: an attribute whose name says apex, stored only as True / False by the
        methods of its class, is False in them once every ``= True`` lies in code that can no
        longer run, and nothing else in the project stores it."""
        stores: Dict[Tuple[int, str], List[ast.AST]] = {}
        classes: Dict[int, ast.ClassDef] = {}
        foreign: Set[str] = set()
        for n in walk(self.m.tree, into_functions=True):
            if not (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and "apex" in n.attr.lower()):
                continue
            c = self._class_of(n)
            st = getattr(n, "_p", None)
            if c is None or not (isinstance(n.value, ast.Name) and n.value.id == "self"):
                foreign.add(n.attr)
                continue
            ok = isinstance(st, ast.Assign) and len(st.targets) == 1 and st.targets[0] is n and \
                isinstance(st.value, ast.Constant) and isinstance(st.value.value, bool)
            stores.setdefault((id(c), n.attr), []).append(st if ok else None)
            classes[id(c)] = c
        out: Dict[int, Dict[str, bool]] = {}
        for (cid, attr), sts in stores.items():
            if attr in foreign or any(x is None for x in sts) or self._stored_elsewhere(attr, classes[cid]):
                continue
            trues = [x for x in sts if x.value.value is True]
            if trues and all(id(x) in self.dead for x in trues):
                out.setdefault(cid, {})[attr] = False
        return out

    def _stored_elsewhere(self, attr: str, c: Optional[ast.ClassDef] = None) -> bool:
        """``attr`` is stored in another module of the project; with ``c``, by code that may
        store it on an object of class ``c`` (a copy of the same trainer in another folder, a
        class of its own, stores on its own objects only)."""
        store = re.compile(r"\." + re.escape(attr) + r"\s*=[^=]")
        for m in list(self.p.modules.values()):  # (telling classes apart may read more files)
            if m is self.m or attr not in m.src.text or not store.search(m.src.text):
                continue
            if c is None or self._may_store_on(m, attr, c):
                return True
        return False

    def _may_store_on(self, m, attr: str, c: ast.ClassDef) -> bool:
        """Some store of ``attr`` in module ``m`` may reach an object of class ``c``: any but
        ``self.<attr> = ...`` in the methods of a class whose objects are never ``c``'s (a copy
        of the same trainer in another folder)."""
        stores = [n for n in walk(m.tree, into_functions=True)
                  if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and n.attr == attr]
        own: Set[int] = set()
        for k in walk(m.tree, into_functions=True):
            if not isinstance(k, ast.ClassDef) or k.keywords or k.decorator_list:
                continue
            mine = {id(n) for n in walk(k, into_functions=True) if isinstance(n, ast.Attribute)
                    and isinstance(n.value, ast.Name) and n.value.id == "self"}
            if any(id(n) in mine for n in stores) and not self.p.may_share_objects((m, k), (self.m, c)):
                own |= mine
        return any(id(n) not in own for n in stores)

    def _class_fact(self, e: ast.Attribute) -> Optional[bool]:
        c = self._class_of(e)
        if c is None:
            return None
        for cid in self._lineage(c):
            flags = self.attr_flags.get(cid) or self.inherited.get(cid) or {}
            if e.attr in flags:
                return flags[e.attr]
        return None

    def _lineage(self, c: ast.ClassDef) -> List[int]:
        """``c`` and its base classes of this module (ids), nearest first."""
        out, todo = [], [c]
        local = {x.name: x for x in self._classes()}
        while todo and len(out) < 8:
            x = todo.pop(0)
            out.append(id(x))
            todo.extend(local[b.id] for b in x.bases if isinstance(b, ast.Name) and b.id in local)
        return out

    def _framework_flags(self) -> Dict[int, Dict[str, bool]]:
        """The apex flags (:data:`FRAMEWORK_FLAGS`) of this module's classes that extend a
        framework's class directly, where the class stores none of them itself."""
        out: Dict[int, Dict[str, bool]] = {}
        for c in self._classes():
            stored = {n.attr for n in walk(c, into_functions=True) if isinstance(n, ast.Attribute)
                      and isinstance(n.ctx, ast.Store)}
            for base in c.bases:
                for q in self.m.sem.qnames(base):
                    flags = {a: v for a, v in FRAMEWORK_FLAGS.get(q, {}).items() if a not in stored}
                    if flags and not self._stored_anywhere(flags):
                        out.setdefault(id(c), {}).update(flags)
        return out

    def _stored_anywhere(self, flags) -> bool:
        """Some flag is stored in this module (outside the class that would read it as the
        framework's: its own were taken out before) or in another module."""
        for n in walk(self.m.tree, into_functions=True):
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and n.attr in flags:
                return True
        return any(self._stored_elsewhere(a) for a in flags)

    def class_flags(self) -> Dict[int, Dict[str, bool]]:
        """The settled apex flags of this module's classes (after :meth:`applies`)."""
        return dict(self.attr_flags)

    def inherit(self, facts) -> Tuple[Dict[int, Dict[str, bool]], list]:
        """The apex flags this module's classes inherit from classes of other modules whose plans
        settle them (``facts``: id of a class -> (its plan, its flags)), and those plans."""
        out: Dict[int, Dict[str, bool]] = {}
        owners = []
        for c in self._classes():
            stored = {n.attr for n in walk(c, into_functions=True) if isinstance(n, ast.Attribute)
                      and isinstance(n.ctx, ast.Store)}
            for base in c.bases:
                if not isinstance(base, (ast.Name, ast.Attribute)):
                    continue
                init, _ = self.p.resolve(self.m, base)
                if init is None or init.cls is None or init.module is self.m or id(init.cls) not in facts:
                    continue
                plan, flags = facts[id(init.cls)]
                kept = {a: v for a, v in flags.items() if a not in stored}
                if kept:
                    out[id(c)] = kept
                    owners.append(plan)
        return out, owners

    def _settle(self) -> Dict[str, bool]:
        """Module-level names bound only to True / False at module level: the value each has once
        the module has run, following the branches known to run (None where it depends)."""
        binds: Dict[str, List[ast.AST]] = {}
        for n in walk(self.m.tree, into_functions=True):
            if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                    for x in ast.walk(t):
                        if isinstance(x, ast.Name):
                            binds.setdefault(x.id, []).append(n)
            elif isinstance(n, (ast.Global, ast.Nonlocal)):
                for name in n.names:
                    binds.setdefault(name, []).append(n)
        out: Dict[str, bool] = {}
        for name, nodes in binds.items():
            if not all(isinstance(x, ast.Assign) and len(x.targets) == 1 and isinstance(x.targets[0], ast.Name)
                       and isinstance(x.value, ast.Constant) and isinstance(x.value.value, bool)
                       and self.m.function_of(x) is None for x in nodes):
                continue
            v = self._run(self.m.tree.body, name, None)
            if isinstance(v, bool):
                out[name] = v
        return out

    def _run(self, stmts, name: str, value):
        """The value of ``name`` after ``stmts`` run ("?" where it cannot be told)."""
        for st in stmts:
            if id(st) in self.dead:
                continue
            if isinstance(st, ast.Assign) and isinstance(st.targets[0], ast.Name) and st.targets[0].id == name:
                value = st.value.value
            elif isinstance(st, ast.If) and any(isinstance(x, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == name for t in x.targets) for x in walk(st)):
                # `if torch >= 1.6: flag = True` (no else); not a version test of other things
                known = None if self._version_test_of_other_things(st) else self._value(st.test)
                dead_body = (st, "body") in self.dead_branches or known is False
                dead_else = (st, "orelse") in self.dead_branches or known is True
                if dead_body:
                    value = self._run(st.orelse, name, value)
                elif dead_else:
                    value = self._run(st.body, name, value)
                else:
                    return "?"
            elif not isinstance(st, ast.If) and any(isinstance(x, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == name for t in x.targets) for x in walk(st)):
                return "?"
            if value == "?":
                return "?"
        return value

    def _version_test_of_other_things(self, n) -> bool:
        """``if version.parse(torch.__version__) < version.parse("1.2"): _use_ddp_no_sync = False``:
        a test of the torch version whose statement says nothing of mixed precision (no apex, no
        amp, no fp16 in it) is the author's own business: it is not folded."""
        if not any(torch_version_test(x) is not None for x in ast.walk(n.test)):
            return False
        text = self.m.src.code(n).lower()
        return not re.search(r"apex|\bamp\b|_amp\b|\bamp_|fp16|half|autocast|scaler", text)

    def _restates_the_if_before(self, n: ast.If) -> bool:
        """``if a and <true fact>: ... elif a: ...``: the ``elif`` runs only where ``a`` is false,
        so never."""
        parent = getattr(n, "_p", None)
        if not (isinstance(parent, ast.If) and len(parent.orelse) == 1 and parent.orelse[0] is n):
            return False
        if not self._is_elif(n):
            return False
        test = parent.test
        rest = [v for v in test.values if self._value(v) is not True] if isinstance(test, ast.BoolOp) and \
            isinstance(test.op, ast.And) else [test]
        if len(rest) == len(getattr(test, "values", [test])):
            return False  # nothing folded: not this module's facts
        return len(rest) == 1 and ast.dump(rest[0]) == ast.dump(n.test)

    def _mark(self, stmts) -> None:
        for s in stmts:
            self.dead.add(id(s))
            for x in walk(s, into_functions=True):
                self.dead.add(id(x))

    # -- the rewrite -----------------------------------------------------------------------------
    def plan(self, g: Group) -> None:
        fc = g.file(self.m)
        m = self.m
        for n, q in apex_uses(m.sem, m.tree):
            if id(n) in self.dead:
                self.claimed.append(n)
        done = set()
        for node, field in sorted(self.dead_branches, key=lambda x: x[0].lineno):
            if id(node) in self.dead or id(node) in done:  # inside a branch that goes anyway
                continue
            done.add(id(node))
            self._drop_branch(fc, node, field)
        for t, h, _ in self.fallbacks:
            # the handler's body in the try's place; `# mixed precision with apex.amp` above it
            # spoke of the body that went
            fc.unwrap(t, h.body)
            fc.touched.add(id(t))
            fc.drop_comment_above(t, named=True)
        for n in self.apex_elses:
            if id(n) in self.dead or self._inside_dropped(n):
                continue
            # `else:` and its body go, from the line after the body to the end of the `else`
            src = m.src
            fc.edits.append(_edit(src.line_end(n.body[-1].end_lineno), src.line_end(n.orelse[-1].end_lineno), ""))
            fc.touched.add(id(n))
        for n in walk(m.tree, into_functions=True):
            if isinstance(n, ast.Assert) and id(n) in self.dead and not self._inside_dropped(n):
                fc.remove(n)
        for n, live in self.dead_exprs:
            if id(n) not in self.dead and not self._inside_dropped(n):
                fc.replace(n, m.src.code(live))
        for c, twin in self.twins:
            if c.lineno > twin.lineno:
                fc.replace_statement(c, [f"{c.name} = {twin.name}"])
            else:
                fc.remove(c)
                fc.insert_after(twin, ["", "", f"{c.name} = {twin.name}"], indent=fc.b.indent(twin))
        self._route_cli(fc)
        self._route_config(fc)
        self._fold_true_flags(fc)
        self._drop_flags(fc)
        self._helpers_go(fc)
        fc.removes.extend(apex_import_specs(m))
        fc.removes.extend(self._imports_read_only_in_dead_code())
        # `# Multi-gpu training (should be after apex fp16 initialization)`, where an initialize went
        for n in walk(m.tree, into_functions=True):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    id(x) in self.dead and "initialize" in (dotted(x) or "") for x in walk(n)
                    if isinstance(x, ast.Attribute)):
                fc.drop_ordering_notes(n.lineno, n.end_lineno)
        g.description = "the apex path goes: every apex choice now takes the native AMP path"
        notes = []
        if self.cli:
            notes.append("the command line still accepts the apex choice, and says it now means native AMP")
        if self.twins:
            notes.append(", ".join(f"{c.name} is now {t.name}" for c, t in self.twins))
        g.notes |= set(notes)

    def _helpers_go(self, fc) -> None:
        """A module-level function that only code that goes called (``apex_installed()`` in the
        branch that picked apex) goes too, when no other module names it."""
        for d in self.m.tree.body:
            if not isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) or d.decorator_list or id(d) in self.dead:
                continue
            inside = {id(x) for x in walk(d, into_functions=True)}
            reads = [n for n in walk(self.m.tree, into_functions=True) if isinstance(n, ast.Name) and n.id == d.name
                     and id(n) not in inside]
            if not reads or not all(id(n) in self.dead or self._in_dead_test(n) for n in reads):
                continue
            if self.p.named_elsewhere(self.m, d.name):
                continue
            fc.remove(d, obsolete=True)
            self._mark([d])

    def _imports_read_only_in_dead_code(self) -> List[ImportSpec]:
        """Imports whose name only code that goes reads (``ApexScaler`` from another package)."""
        reads: Dict[str, List[ast.AST]] = {}
        for n in walk(self.m.tree, into_functions=True):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                reads.setdefault(n.id, []).append(n)
        out = []
        for imp in self.m.sem.imports:
            for a in imp.names:
                bound = (a.asname or a.name).split(".")[0]
                r = reads.get(bound, [])
                if r and all(id(x) in self.dead or self._in_dead_test(x) or self._in_apex_guard(x) for x in r):
                    if isinstance(imp, ast.Import):
                        out.append(ImportSpec(a.name if a.asname else a.name.split(".")[0], None, a.asname))
                    else:  # (a relative one as `.file_utils`)
                        out.append(ImportSpec("." * imp.level + (imp.module or ""), a.name, a.asname))
        return out

    def _in_apex_guard(self, n) -> bool:
        """``n`` is in the test of ``if importlib.util.find_spec("apex") is not None: from apex
        import amp``, which goes with the apex import."""
        p = getattr(n, "_p", None)
        while p is not None and not isinstance(p, ast.stmt):
            p = getattr(p, "_p", None)
        return isinstance(p, ast.If) and not p.orelse and checks_for_apex(p.test) and all(
            imports_apex(x) for x in p.body) and any(
            y is n for y in walk(p.test))

    def _is_elif(self, n: ast.If) -> bool:
        return self.m.src.line_text(n.lineno).lstrip().startswith("elif")

    def _kept_whole(self, n) -> bool:
        """``n`` is a statement of the branch that stays of a dropped ``if`` (``else:
        _use_native_amp = True`` under a version test) beside others: it can go on its own (where the
        others go too, so does the ``if``)."""
        p = getattr(n, "_p", None)
        for node, field in self.dead_branches:
            if p is node and field == "body" and not (node.orelse and self._is_elif(node.orelse[0])):
                live = node.orelse
            elif p is node and field == "orelse":
                live = node.body
            else:
                continue
            # a branch of the store alone stays as it was: its `if` would have to go whole
            return any(s is n for s in live) and len(live) > 1
        return False

    def _inside_dropped(self, n) -> bool:
        p = getattr(n, "_p", None)
        while p is not None:
            if any(p is i for i, _ in self.dead_branches):
                return True
            p = getattr(p, "_p", None)
        return False

    def _drop_branch(self, fc, node: ast.If, field: str) -> None:
        b = fc.b
        src = self.m.src
        if field == "body" and self._is_elif(node):
            # `elif dead: ...` goes, from its line to the `else` / `elif` that follows it
            end = node.end_lineno
            if node.orelse:
                end = next(no for no in range(node.body[-1].end_lineno + 1, node.orelse[0].lineno + 1)
                           if src.line_text(no).lstrip().startswith(("else", "elif"))) - 1
            fc.edits.append(_edit(src.starts[node.lineno - 1], src.line_end(end), ""))
            fc.touched.add(id(node))
            # `# --amp chooses native amp before apex` above the chain spoke of the branch that went
            head = node
            while isinstance(getattr(head, "_p", None), ast.If) and head in head._p.orelse and self._is_elif(head):
                head = head._p
            fc.drop_comment_above(head, named=True)
            return
        if field == "orelse":
            # `if True-test: body else: dead` -> body
            fc.unwrap(node, node.body)
            fc.touched.add(id(node))
            fc.drop_comment_above(node)
            return
        if not node.orelse:
            fc.remove(node, described=True)
            return
        first = node.orelse[0]
        if len(node.orelse) == 1 and isinstance(first, ast.If) and self._is_elif(first):
            # drop `if dead: ...` and make the `elif` the `if`
            a = src.starts[b.first_line(node) - 1]
            elif_at = src.offset(first.lineno, first.col_offset)
            indent = b.indent(node)
            fc.edits.append(_edit(a, elif_at + len("elif"), indent + "if"))
            fc.touched.add(id(node))
            # `# for backwards compat, --amp tries apex before native amp`: that try went
            fc.drop_comment_above(node, named=True)
            return
        fc.unwrap(node, node.orelse)
        self.unwrapped[id(node)] = fc.edits[-1]
        fc.touched.add(id(node))
        fc.drop_comment_above(node)  # `# switch between native AMP and apex` no longer says anything

    def _config_sets(self, d: str) -> List[ast.stmt]:
        """The statements that set the local ``d`` from something other than a string literal
        (``fp16_type, grad_scaler = fp16_cfg.pop("type"), None``), when every binding of ``d`` in
        the module is such an assignment or a literal one (no parameter, loop or import binds it)."""
        out = []
        for n in walk(self.m.tree, into_functions=True):
            if isinstance(n, ast.arg) and n.arg == d:
                return []
            if isinstance(n, ast.Name) and n.id == d and isinstance(n.ctx, ast.Store):
                st = getattr(n, "_p", None)
                while isinstance(st, (ast.Tuple, ast.List)):
                    st = getattr(st, "_p", None)
                if not (isinstance(st, ast.Assign) and len(st.targets) == 1):
                    return []
                v = self._assigned(st, d)
                if v is None:
                    return []
                if not isinstance(v, ast.Constant):
                    out.append(st)
            elif isinstance(n, (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal)) and d in _names_of(n):
                return []
        return out

    @staticmethod
    def _assigned(st: ast.Assign, d: str) -> Optional[ast.expr]:
        """The value ``st`` gives the name ``d`` (an element of a tuple assignment too)."""
        t, v = st.targets[0], st.value
        if isinstance(t, ast.Name):
            return v if t.id == d else None
        if isinstance(t, (ast.Tuple, ast.List)) and isinstance(v, (ast.Tuple, ast.List)) and len(t.elts) == len(v.elts):
            for te, ve in zip(t.elts, v.elts):
                if isinstance(te, ast.Name) and te.id == d:
                    return ve
        return None

    def _literal_sets(self, d: str, value: str) -> List[ast.stmt]:
        out = []
        for n in walk(self.m.tree, into_functions=True):
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and string_value(self._assigned(n, d)) == value:
                out.append(n)
        return out

    def _route_config(self, fc) -> None:
        """``fp16_type = fp16_cfg.pop("type")``: right after it the apex choice becomes the native
        one, said once; the native path's keyword groups of the same configuration
        (``GradScaler(**fp16_cfg["grad_scaler"])``), which a configuration written for apex lacks,
        default to none (``fp16_cfg.setdefault("grad_scaler", {})``)."""
        for d, sets in sorted(self.routes.items()):
            native = self.selectors[d]
            for st in sets:
                if id(st) in self.dead:
                    continue
                v = self._assigned(st, d)
                cfg = receiver(v) if isinstance(v, ast.Call) and method_call(v, "pop", "get") else (
                    v.value if isinstance(v, ast.Subscript) else None)
                lines = [f'if {d} == "apex":',
                         f'    print("{d} \'apex\' now runs native AMP (torch.amp): NVIDIA removed apex.amp")',
                         f'    {d} = "{native}"']
                if isinstance(cfg, ast.Name):
                    for key in self._kwarg_groups(cfg.id, d):
                        lines.append(f'    {cfg.id}.setdefault("{key}", {{}})')
                fc.insert_after(st, lines)

    def _kwarg_groups(self, cfg: str, d: str) -> List[str]:
        """The keys of ``cfg`` that code that stays unpacks as keyword groups (``**cfg["autocast"]``)
        under a test of ``d``; a plain read there refuses (an apex configuration may lack it)."""
        keys = []
        for n in walk(self.m.tree, into_functions=True):
            if not (isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == cfg
                    and isinstance(n.ctx, ast.Load) and string_value(n.slice) is not None) or id(n) in self.dead:
                continue
            under = any(isinstance(a, ast.If) and any(isinstance(x, ast.Name) and x.id == d for x in walk(a.test))
                        for a in self._ancestors(n))
            if not under:
                continue
            p = getattr(n, "_p", None)
            if isinstance(p, ast.keyword) and p.arg is None:
                if n.slice.value not in keys:
                    keys.append(n.slice.value)
            else:
                raise Refuse(f"line {n.lineno}: the native path reads `{self.m.src.code(n)}`, which a configuration "
                             "written for apex may lack: route the apex choice by hand")
        return keys

    @staticmethod
    def _ancestors(n):
        p = getattr(n, "_p", None)
        while p is not None:
            yield p
            p = getattr(p, "_p", None)

    def _route_cli(self, fc) -> None:
        """Right after the arguments are parsed: the apex choice becomes the native one, said once."""
        if not self.cli:
            return
        # the names the selectors read (`args` of `args.amp_impl`)
        bases = {d.split(".")[0] for d in self.selectors if "." in d} | {"args", "opt", "opts"}
        parse = None
        for n in walk(self.m.tree, into_functions=True):
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and method_call(
                    n.value, "parse_args", "parse_known_args"):
                t = n.targets[0]
                name = dotted(t.elts[0] if isinstance(t, (ast.Tuple, ast.List)) else t)
                if name in bases:
                    parse = n
                    break
        if parse is None:
            raise Refuse("the command line that chooses apex is not parsed in this module: route it by hand")
        target = parse.targets[0]
        args = dotted(target.elts[0] if isinstance(target, (ast.Tuple, ast.List)) else target)
        if not args:
            raise Refuse(f"line {parse.lineno}: cannot tell which name holds the parsed arguments")
        lines = []
        for dest, (native, kind) in sorted(self.cli.items()):
            opt = "--" + dest.replace("_", "-")
            if kind == "value":
                lines += [f'if {args}.{dest} == "apex":',
                          f'    print("{opt} apex now runs native AMP (torch.amp): NVIDIA removed apex.amp")',
                          f'    {args}.{dest} = "{native}"']
            else:
                lines += [f"if {args}.{dest}:",
                          f'    print("{opt} now runs native AMP (torch.amp): NVIDIA removed apex.amp")',
                          f"    {args}.{dest}, {args}.{native} = False, True"]
        fc.insert_after(parse, lines)

    def _drop_flags(self, fc) -> None:
        """``has_apex = True/False`` go when nothing reads the flag any more."""
        for flag in self.flags | {f for f, v in self.settled.items() if v is False}:
            reads = [n for n in walk(self.m.tree, into_functions=True) if isinstance(n, (ast.Name, ast.Attribute))
                     and isinstance(n.ctx, ast.Load) and dotted(n) == flag and id(n) not in self.dead
                     and not self._in_dead_test(n)]
            if reads:
                continue
            for n in walk(self.m.tree, into_functions=True):
                if isinstance(n, ast.Assign) and len(n.targets) == 1 and dotted(n.targets[0]) == flag and \
                        id(n) not in self.dead and id(n) not in fc.touched and not self._inside_dropped(n):
                    fc.remove(n)
            if "." not in flag:
                # `# assert not has_apex, "..."` on a line of its own: commented-out code of a flag
                # that goes could no longer be uncommented
                fc.drop_commented_code(1, self.m.src.line_count, flag, alone=True)

        # `self.use_apex = False` in __init__ (its `= True` went with the apex branch): once nothing
        # in the project reads the attribute, its stores go
        for cid, flags in self.attr_flags.items():
            for attr, value in flags.items():
                if value is not False or self.p.named_elsewhere(self.m, attr) or any(
                        isinstance(n, ast.Attribute) and n.attr == attr and isinstance(n.ctx, ast.Load)
                        and id(n) not in self.dead and not self._in_dead_test(n)
                        for n in walk(self.m.tree, into_functions=True)):
                    continue
                for n in walk(self.m.tree, into_functions=True):
                    if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Attribute) \
                            and n.targets[0].attr == attr and isinstance(n.targets[0].value, ast.Name) \
                            and n.targets[0].value.id == "self" and id(n) not in self.dead \
                            and id(n) not in fc.touched and not self._inside_dropped(n):
                        fc.remove(n)

        # `_native_amp = False` at the top, `= True` under a torch version test: once nothing
        # reads the flag (its tests folded), its stores go (the version test with them, emptied)
        for flag, value in self.settled.items():
            if value is not True or self._read_anywhere(flag):
                continue
            for n in walk(self.m.tree, into_functions=True):
                if isinstance(n, ast.Assign) and len(n.targets) == 1 and dotted(n.targets[0]) == flag and \
                        isinstance(n.value, ast.Constant) and id(n) not in self.dead and id(n) not in fc.touched \
                        and (not self._inside_dropped(n) or self._kept_whole(n)):
                    fc.remove(n)
                elif isinstance(n, ast.If) and id(n) in self.unwrapped and len(n.orelse) == 1 and \
                        isinstance(n.orelse[0], ast.Assign) and len(n.orelse[0].targets) == 1 and \
                        dotted(n.orelse[0].targets[0]) == flag and isinstance(n.orelse[0].value, ast.Constant):
                    # `if torch < 1.6: <apex> else: _use_native_amp = True`: the branch that stays
                    # is the store alone, and nothing reads the flag: the `if` goes whole
                    fc.edits.remove(self.unwrapped.pop(id(n)))
                    src = self.m.src
                    top = fc.b.first_line(n)
                    start, end = src.starts[top - 1], src.line_end(n.end_lineno)
                    # (the comment right above that speaks of apex went with the branch)
                    top = apex_comment_above(src, top) or top
                    # with the blank lines after it, where blank lines come before it too
                    after = n.end_lineno + 1
                    while after <= src.line_count and not src.line_text(after).strip() and \
                            top > 1 and not src.line_text(top - 1).strip():
                        end = src.line_end(after)
                        after += 1
                    fc.edits.append(_edit(start, end, ""))

        # `_use_native_amp = False` at the top, `= True` (now unconditional) below it: the first
        # is a store nothing reads
        for flag, value in self.settled.items():
            if value is not True:
                continue
            if any(isinstance(n, ast.Name) and n.id == flag and isinstance(n.ctx, ast.Load)
                   and self.m.function_of(n) is None for n in walk(self.m.tree, into_functions=True)):
                continue
            for n in self.m.tree.body:
                if isinstance(n, ast.Assign) and len(n.targets) == 1 and dotted(n.targets[0]) == flag and \
                        is_const(n.value, False) and id(n) not in self.dead and id(n) not in fc.touched:
                    fc.remove(n)

    def _fold_true_flags(self, fc) -> None:
        """``if self.args.fp16 and _use_native_amp:`` where the flag is now True at every call: the
        flag leaves the test (``if self.args.fp16:``), and once no read is left its stores go
        (:meth:`_drop_flags`). Only where every read the module keeps is such an operand, inside
        a function, and no other module names the flag: anything else keeps the flag whole."""
        src = self.m.src
        for flag, value in self.settled.items():
            if value is not True or flag in self.flags or self.p.named_elsewhere(self.m, flag):
                continue
            reads = [n for n in walk(self.m.tree, into_functions=True) if isinstance(n, ast.Name) and n.id == flag
                     and isinstance(n.ctx, ast.Load) and id(n) not in self.dead and not self._in_dead_test(n)]
            plan = []
            for n in reads:
                test = getattr(n, "_p", None)
                owner = getattr(test, "_p", None)
                if not (self.m.function_of(n) is not None and isinstance(test, ast.BoolOp)
                        and isinstance(test.op, ast.And) and isinstance(owner, (ast.If, ast.IfExp))
                        and owner.test is test and id(owner) not in fc.touched):
                    plan = None
                    break
                rest = [v for v in test.values if v is not n]
                if not rest or any(isinstance(v, ast.Name) and v.id == flag for v in rest):
                    plan = None
                    break
                i = next(k for k, v in enumerate(test.values) if v is n)
                if i + 1 < len(test.values):  # `flag and a`: up to where the next operand starts
                    a, b = src.span(n)[0], src.span(test.values[i + 1])[0]
                else:  # `a and flag`: from where the operand before it ends
                    a, b = src.span(test.values[i - 1])[1], src.span(n)[1]
                gap = src.text[a:b]
                if "#" in gap or "\\" in gap:
                    plan = None  # a comment or a continuation between them: left as it is
                    break
                plan.append((n, a, b))
            if not plan:
                continue
            for n, a, b in plan:
                fc.edits.append(_edit(a, b, ""))
                self.folded.add(id(n))

    def _read_anywhere(self, name: str) -> bool:
        """``name`` is read in code that stays, here or in another module of the project."""
        if any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) and id(n) not in self.dead
               and id(n) not in self.folded and not self._in_dead_test(n)
               for n in walk(self.m.tree, into_functions=True)):
            return True
        return self.p.named_elsewhere(self.m, name)

    def _in_dead_test(self, n) -> bool:
        p = getattr(n, "_p", None)
        while p is not None:
            if isinstance(p, (ast.If, ast.Assert)) and (any(p is i for i, _ in self.dead_branches) or id(p) in self.dead):
                return True
            p = getattr(p, "_p", None)
        return False


def _rebound_after(unit, name: str, t: ast.Try, h: ast.ExceptHandler) -> bool:
    """``name`` is bound in ``unit`` after the try ``t`` starts, other than by its handler ``h``
    (``scaler = None`` after the fallback would hand the step None where apex had run)."""
    inside = {id(x) for st in h.body for x in [st, *walk(st)]}
    for x in walk(unit):
        if isinstance(x, (ast.Name, ast.Attribute)) and not isinstance(x.ctx, ast.Load) and \
                dotted(x) == name and id(x) not in inside and x.lineno >= t.lineno:
            return True
    return False


def _constant(e) -> bool:
    """A test made of literals alone (``True``, ``0``, ``not False``): it says nothing of apex."""
    return all(isinstance(x, (ast.Constant, ast.BoolOp, ast.UnaryOp, ast.boolop, ast.unaryop)) for x in ast.walk(e))


def _membership(e) -> Optional[Tuple[str, Set[str]]]:
    """``x in ["apex"]`` / ``x not in ("apex", "O1")``: (x's dotted name, the strings listed), for a
    list, tuple or set of constants (``None`` among them is left out)."""
    if not (isinstance(e, ast.Compare) and len(e.ops) == 1 and isinstance(e.ops[0], (ast.In, ast.NotIn))):
        return None
    d, seq = dotted(e.left), e.comparators[0]
    if not d or not isinstance(seq, (ast.List, ast.Tuple, ast.Set)) or not seq.elts or not all(
            isinstance(x, ast.Constant) and (x.value is None or isinstance(x.value, str)) for x in seq.elts):
        return None
    return d, {x.value for x in seq.elts if isinstance(x.value, str)}


def _names_of(imp) -> Set[str]:
    if isinstance(imp, (ast.Global, ast.Nonlocal)):
        return set(imp.names)
    return {(a.asname or a.name).split(".")[0] for a in imp.names}


def _is_message(st) -> bool:
    """``msg = ("... install apex ...")``: a message put together before it is raised or logged."""
    return isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name) and (
        isinstance(st.value, ast.JoinedStr) or (isinstance(st.value, ast.Constant) and isinstance(st.value.value, str)))


def _edit(a, b, text):
    from ampfix.model.edits import Edit

    return Edit(a, b, text)
