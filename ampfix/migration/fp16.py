"""FP16_Optimizer -> GradScaler, with the model kept float32 under autocast.

Three FP16_Optimizers existed: ``apex.fp16_utils`` (with ``network_to_half``/``FP16Model``),
``apex.optimizers`` (the cut-down one the BERT-era scripts use, with ``FusedAdam``) and
``apex.contrib.optimizers``.  All wrap an optimizer, keep float32 master weights of a
``.half()`` model and scale the loss in ``optimizer.backward(loss)``.  Natively the model stays
float32, autocast casts per op, and a GradScaler scales:

* ``opt = FP16_Optimizer(inner, static_loss_scale=S, dynamic_loss_scale=D, dynamic_loss_args=...)``
  becomes ``scaler = torch.amp.GradScaler("cuda", ...)``; ``opt = inner`` stays when the inner
  optimizer was built inline.  Two constructors in ``if c: dynamic / else: static`` give one
  scaler whose scale follows ``c``.
* The BERT-era recipe ``if args.fp16: <import apex>; opt = FusedAdam(...); opt = FP16_Optimizer(opt)
  else: opt = BertAdam(...)`` keeps the fp32 path's optimizer for both: native AMP needs no
  other optimizer, so ``--fp16`` now differs from the fp32 run by precision alone.  A warm-up
  written into ``param_groups`` under ``if args.fp16:`` goes when that optimizer schedules
  itself (``warmup=``/``t_total=``): kept, it would apply the warm-up twice.
* ``model.half()``, ``network_to_half(model)``, ``BN_convert_float``, ``FP16Model`` and the
  ``.half()`` casts of inputs and labels under the fp16 flag or in the forward pass go.
* ``opt.backward(loss)`` -> ``scaler.scale(loss).backward()`` (and the ``else: loss.backward()``
  twin goes); ``opt.step()`` -> ``scaler.step(opt)`` + ``scaler.update()``;
  ``clip_master_grads(n)`` -> ``scaler.unscale_(opt)`` + ``clip_grad_norm_`` of its parameters;
  ``update_master_grads()`` goes; ``zero_grad(set_grads_to_None=)`` -> ``set_to_none=``;
  ``opt.loss_scale`` -> ``scaler.get_scale()``; ``opt.optimizer`` -> ``opt``.
"""
from __future__ import annotations

import ast
import re
from typing import Dict, List, Optional, Set, Tuple

from ampfix.model.analysis import (arg, casts_one_of, has_star, is_const, is_log_call, kwargs, method_call, receiver,
                                   string_value)
from ampfix.engine.tidy import pure
from ampfix.migration.groups import Group, Refuse
from ampfix.migration.evaluation import EvaluationRewrites
from ampfix.migration.rewriter import Rewriter
from ampfix.migration.seeds import apex_import_specs
from ampfix.migration.flow import ancestors_stmts, follows, forward_region, guards, is_main_guard, other_branch, stmt_of
from ampfix.migration.fp16_holders import Holder, holder_of, instance_reads, name_in
from ampfix.migration.handoff import reads_plain_optimizer, schedule_class
from ampfix.migration.spell import STATIC_NOTE, as_bool, autocast_call, bf16, conj, description, scaler_call
from ampfix.rule import ImportSpec
from ampfix.model.apex import apex_uses
from ampfix.model.semantic import block_of, dotted, walk

CTORS = {"apex.fp16_utils.FP16_Optimizer", "apex.optimizers.FP16_Optimizer", "apex.contrib.optimizers.FP16_Optimizer",
         "apex.contrib.optimizers.fp16_optimizer.FP16_Optimizer"}
CONVERTERS = {"apex.fp16_utils.network_to_half", "apex.fp16_utils.BN_convert_float", "apex.fp16_utils.FP16Model"}
#: fp16_utils helpers that stand alone (rewritten where they are, by the rule)
STANDALONE = {"apex.fp16_utils.to_python_float", "apex.fp16_utils.clip_grad_norm"}
METHODS = {"backward", "step", "zero_grad", "state_dict", "load_state_dict", "param_groups", "state",
           "clip_master_grads", "update_master_grads", "loss_scale", "optimizer", "add_param_group"}
#: what FP16_Optimizer itself has (apex.fp16_utils' and apex.optimizers' classes): an attribute read
#: outside these was never FP16_Optimizer's (it raised AttributeError there, as it does on the plain
#: optimizer), so it is the fp32 twin's where the name holds one (``optimizer.get_lr()`` of
#: pytorch-pretrained-bert's BertAdam), and is left as it is
FP16_OWN = {
    "all_fp16_params", "all_fp32_from_fp16_params", "all_fp32_from_fp32_params", "backward", "clip_grad_norm",
    "clip_master_grads", "cur_iter", "cur_scale", "dynamic_loss_scale", "first_closure_call_this_step",
    "fp16_groups", "fp16_groups_flat", "fp32_from_fp16_groups", "fp32_from_fp32_groups", "fp32_groups_flat",
    "grads_groups_flat", "inspect_master_grad_data", "last_overflow_iter", "load_state_dict", "loss_scale",
    "loss_scaler", "maybe_print", "multi_tensor_scale", "norm_groups", "optimizer", "overflow", "param_groups",
    "scale_factor", "scale_window", "skip", "state", "state_dict", "step", "update_master_grads", "verbose",
    "wrapped_closure", "zero_grad", "updated_params", "_update_scale", "_compute_grad_norm", "_get_loss_scale",
    "_set_loss_scale", "_master_params_to_model_params", "_step_with_closure", "_dummy_overflow_buf",
    "_get_param_groups", "_set_param_groups", "_get_state", "_set_state", "__getstate__", "__setstate__"}
HALF_TYPES = {"torch.cuda.HalfTensor", "torch.HalfTensor"}
#: what a schedule made of the optimizer is called: torch's ``*LR`` classes (``LambdaLR``, ``OneCycleLR``,
#: ``ReduceLROnPlateau``), pytorch-transformers' ``WarmupLinearSchedule``, ``get_*_schedule_with_warmup``
SCHEDULE_NAME = re.compile(r"(?i:sched|warmup)|LR(?:[A-Z]|$)")
SCHEDULE_KW = {"warmup", "t_total", "schedule", "num_warmup_steps", "num_training_steps"}
CHECKPOINT_NOTE = ("optimizer.state_dict() is now the plain optimizer's: checkpoints that FP16_Optimizer wrote load "
                   "after `ampfix convert-checkpoint`; save scaler.state_dict() beside it")
CHECKPOINT_NOTE_BF16 = ("optimizer.state_dict() is now the plain optimizer's: checkpoints that FP16_Optimizer wrote "
                        "load after `ampfix convert-checkpoint`; bfloat16 needs no loss scaling: apex's loss scale "
                        "has no counterpart")
DEFAULTS_NOTE = ("dynamic loss scale: GradScaler starts at 2**16 and grows every 2000 steps (apex's "
                 "DynamicLossScaler: 2**32, every 1000)")


class Fp16Planner:
    def __init__(self, project) -> None:
        self.p = project

    def groups(self) -> List[Group]:
        out = []
        for m in list(self.p.modules.values()):
            if "apex" not in m.src.text or "FP16" not in m.src.text and "half" not in m.src.text:
                continue
            skip = getattr(self.p, "skip", set())
            uses = [(n, q) for n, q in apex_uses(m.sem, m.tree) if id(n) not in skip and (
                q in CTORS or q in CONVERTERS or (q.startswith("apex.fp16_utils") and q not in STANDALONE))]
            if not any(q in CTORS or q in CONVERTERS for _, q in uses):
                if uses:
                    out.append(self._parts_only(m, uses))
                continue
            g = Group(f"fp16:{m.path}", "fp16")
            for n, _ in uses:
                g.add_use(m.path, n)
            try:
                Fp16Plan(self.p, g, m, uses).plan()
            except Refuse as exc:
                g.refusal = str(exc)
            except Exception as exc:  # a planner bug: this module is left whole, the others go on
                g.refusal = f"ampfix could not plan this migration ({type(exc).__name__}: {exc}); please report it"
            out.append(g)
        return out

    @staticmethod
    def _parts_only(m, uses) -> Group:
        """A module that builds on apex's FP16_Optimizer parts (``DynamicLossScaler``,
        ``model_grads_to_master_grads``) without making one: the project's own mixed-precision
        optimizer, a port of apex's (Megatron's ``fp16.py``).  Nothing native maps part by part:
        refused, saying so."""
        g = Group(f"fp16:{m.path}", "fp16")
        for n, _ in uses:
            g.add_use(m.path, n)
        n, q = min(uses, key=lambda u: (u[0].lineno, u[0].col_offset))
        g.refusal = (f"`{q}` at line {n.lineno} is a part of apex's FP16_Optimizer, used here to build a "
                     "mixed-precision optimizer of the module's own: no automatic rewrite; where the project "
                     "uses that optimizer, a torch.amp.GradScaler and torch.autocast replace it, by hand")
        return g


class Fp16Plan(EvaluationRewrites, Rewriter):
    def __init__(self, project, g: Group, module, uses) -> None:
        super().__init__(project, g)
        self.m = module
        self.uses = uses
        #: modules the optimizer is handed into (``from engine import train``), by the id of their tree
        self.trees: Dict[int, object] = {id(module.tree): module}
        self.code = lambda node: self._mod(node).src.code(node)
        self.notes = g.notes
        self.removed: Set[int] = set()
        #: the float16 casts the plan removes (``model.half()``), in the order it found them
        self.removed_casts: List[ast.Call] = []
        self._half_before: Dict[int, tuple] = {}
        self.callees: Dict[int, Tuple[object, str]] = {}
        #: classes the optimizer is handed to, which keep it on self: {id(ClassDef): Holder}
        self.holders: Dict[int, Holder] = {}
        self.backward_calls: List[ast.Call] = []

    def _mod(self, node):
        """The module a node of this plan is in: the FP16_Optimizer's, or one it is handed into."""
        p = node
        while p is not None and not isinstance(p, ast.Module):
            p = getattr(p, "_p", None)
        return self.trees.get(id(p), self.m)

    def _units(self):
        """(module, tree or function node) to search for the optimizer's uses and the fp16 flag's
        casts: the FP16_Optimizer's module, and in the modules it is handed into, the functions
        that receive it and the others its maker calls (an evaluation handed the model)."""
        out = [(self.m, self.m.tree)]
        out += [(h.module, h.cls) for h in self.holders.values() if h.module is not self.m]
        seen = set()
        for n in walk(self.unit):
            if not isinstance(n, ast.Call):
                continue
            f, _ = self.p.resolve(self.m, n.func)
            if f is None or f.module is self.m or id(f.node) in seen:
                continue
            if id(f.module.tree) not in self.trees:
                if not self._flag_handed(f):
                    continue
                self.trees[id(f.module.tree)] = f.module
            seen.add(id(f.node))
            out.append((f.module, f.node))
        return out

    def _flag_handed(self, f) -> bool:
        """``f`` (a plain function of another module the maker calls, ``load_model(model, ckpt,
        args)``) reads the fp16 flag as the maker does: every call of it is the maker's and hands
        the flag's object to the parameter of the same name.  Its casts under the flag then made
        the model float16 for the FP16_Optimizer, and go with it; another caller (an inference
        script) would lose its float16 model, so then they stay (and the plan is refused)."""
        flag = self._flag()
        root = (flag or "").split(".")[0]
        if not root or not root.isidentifier() or not f.module.editable or f.cls is not None or \
                f.outer is not None or self.p.references(f) or root not in f.positional:
            return False
        sites = self.p.callers(f)
        return bool(sites) and all(cs.caller is self.func and cs.module is self.m
                                   and dotted(cs.argument(root)) == root for cs in sites)

    # -- the whole module ----------------------------------------------------------------------
    def plan(self) -> None:
        m = self.m
        ctors = [(n, q) for n, q in self.uses if q in CTORS]
        convs = [(n, q) for n, q in self.uses if q in CONVERTERS]
        other = [(n, q) for n, q in self.uses if q not in CTORS and q not in CONVERTERS]
        if other:
            n, q = other[0]
            raise Refuse(f"`{q}` at line {n.lineno} has no automatic rewrite")
        if not ctors:
            raise Refuse("no FP16_Optimizer in this module: a float16 model without one is pure float16 training; "
                         "keep the model float32 and add torch.autocast by hand")
        if any(q.startswith("apex.amp") for _, q in apex_uses(m.sem, m.tree)):
            raise Refuse("the module also uses apex.amp: migrate them one at a time")
        calls = []
        for n, q in ctors:
            c = getattr(n, "_p", None)
            if not (isinstance(c, ast.Call) and c.func is n):
                raise Refuse(f"`{q}` at line {n.lineno} is used other than by calling it")
            calls.append(c)
        stmts = [stmt_of(c) for c in calls]
        targets = set()
        for c, st in zip(calls, stmts):
            if not (isinstance(st, ast.Assign) and st.value is c and len(st.targets) == 1 and dotted(st.targets[0])):
                raise Refuse(f"FP16_Optimizer at line {c.lineno} is not assigned to a name")
            targets.add(dotted(st.targets[0]))
        if len(targets) != 1:
            raise Refuse("FP16_Optimizer is assigned to several names: migrate it by hand")
        self.opt = targets.pop()
        self.ctor_line = calls[0].lineno
        self.ctor_stmt = stmts[-1]
        func = m.function_of(calls[0])
        if any(m.function_of(c) is not func for c in calls):
            raise Refuse("the FP16_Optimizers of this module are made in different functions")
        self.func = func
        self.unit = func.node if func is not None else m.tree
        scaler_args, notes, anchor = self._scaler_args(calls, stmts)
        if bf16(self.s):
            self.notes.add(CHECKPOINT_NOTE_BF16)
        else:
            self.notes |= notes
            self.notes.add(CHECKPOINT_NOTE)
        self.scaler = self._scaler_name()
        self.g.description = "FP16_Optimizer -> " + description(self.s)
        #: functions of this module the optimizer is handed to: {id(def): (function, its parameter)}
        self.callees = self._callees()

        # the fp16 path: where the scaler goes, what the guard's else keeps
        enabled = self._place(calls, stmts, anchor, scaler_args)
        self.enabled = enabled
        for h in self.holders.values():
            flags = {name_in(h, cs.node, self.enabled_source) for cs in self.p.callers(h.init)}
            h.flag = flags.pop() if len(flags) == 1 else None
        # the model stays float32, its inputs too
        self.models = self._unhalf_models(convs)
        for h in self.holders.values():
            sites = self.p.callers(h.init)
            h.models = {x for x in (name_in(h, cs.node, m) for cs in sites for m in self.models) if x}
        # every use of the optimizer
        self._uses_of_opt(calls)
        self._hand_scaler()
        self._evaluation_regions()
        self._finish_regions()
        self._imports_that_went()
        fc = self.fc(m)
        fc.adds.append(ImportSpec("torch"))
        fc.removes.extend(apex_import_specs(m))
        for other in self.trees.values():
            if other is not m and other.path in self.g.changes:
                self.fc(other).adds.append(ImportSpec("torch"))

    def _callees(self) -> Dict[int, Tuple[object, str]]:
        """``train(args, model, loader, optimizer, epoch)`` called where the FP16_Optimizer is made:
        the functions of this module that receive it, each with the parameter that does.  Each must
        be called only from there, always with the optimizer, so that the scaler can go with it."""
        out: Dict[int, Tuple[object, str]] = {}
        if self.opt.startswith("self."):
            return out
        m = self.m
        for n in walk(self.unit):
            if not isinstance(n, ast.Call) or not any(
                    dotted(a) == self.opt for a in [*n.args, *(k.value for k in n.keywords)]):
                continue
            f, bound = self.p.resolve(m, n.func)
            if f is None or f is self.func or schedule_class(f):
                # (a schedule of the project, `WarmupLinearSchedule(optimizer, ...)`: it takes the
                # plain optimizer as it took the FP16_Optimizer, and trains nothing)
                continue
            params = self._params_given(n, f, bound, self.opt)
            if len(params) == 1 and reads_plain_optimizer(f, params[0]):
                continue  # `set_lr(optimizer, ...)`: only its learning rates
            if len(params) != 1:
                raise Refuse(f"`{self.opt}` is handed to `{f.qualname}` (line {n.lineno}) in a way that names no "
                             "one parameter: pass the scaler there by hand")
            prev = out.get(id(f.node))
            if prev is not None and prev[1] != params[0]:
                raise Refuse(f"`{f.qualname}` receives `{self.opt}` as different parameters: pass the scaler by hand")
            out[id(f.node)] = (f, params[0])
        for f, param in out.values():
            ctor = f.node.name == "__init__" and f.cls is not None and f.outer is None
            if not ctor and (f.is_method or f.outer is not None or f.cls is not None):
                raise Refuse(f"`{self.opt}` is handed to `{f.qualname}`, which is not a plain function of the "
                             "module: pass the scaler there by hand")
            refs = self.p.references(f)
            if refs:
                raise Refuse(f"`{f.qualname}` is used other than by a call (line {refs[0].lineno}): pass the scaler "
                             "there by hand")
            if f.module is not m:
                # `from engine import train`: the optimizer is handed into another module
                if not f.module.editable:
                    raise Refuse(f"`{self.opt}` is handed to `{f.qualname}` in {f.module.path}, which was not given: "
                                 "run ampfix on the whole project")
                self.trees[id(f.module.tree)] = f.module
            for cs in self.p.callers(f):
                if cs.caller is not self.func or cs.module is not m or dotted(cs.argument(param)) != self.opt:
                    where = f"`{cs.caller.qualname}`" if cs.caller else "module level"
                    raise Refuse(f"`{f.qualname}` is also called from {where} ({cs.module.path} line "
                                 f"{cs.node.lineno}) without this FP16_Optimizer: pass the scaler there by hand")
                if cs.node.lineno < self.ctor_line:
                    # the scaler is made where the FP16_Optimizer was: it would not exist yet
                    raise Refuse(f"`{f.qualname}` is called at line {cs.node.lineno}, before the FP16_Optimizer "
                                 f"at line {self.ctor_line} is made: pass the scaler there by hand")
            if ctor:
                # a class keeps it on self (a trainer): the scaler goes beside it
                names = (("use_amp", "amp_enabled", "use_bf16", "bf16_autocast") if bf16(self.s) else
                         ("scaler", "grad_scaler", "amp_scaler"))
                h = holder_of(self.p, f, param, {self.scaler}, names)
                reads = instance_reads(h, self.p.callers(f))
                if reads:
                    raise Refuse(f"`{self.code(reads[0])}` (line {reads[0].lineno}) reads the optimizer around "
                                 f"`{f.cls.name}`: pass the scaler there by hand")
                self.holders[id(f.cls)] = h
                continue
            if self.scaler in f.positional or self.scaler in f.kwonly or any(
                    isinstance(x, ast.Name) and x.id == self.scaler for x in walk(f.node)):
                raise Refuse(f"`{f.qualname}` already has a `{self.scaler}`: pass the scaler there by hand")
        return out

    @staticmethod
    def _params_given(call, f, bound, opt: str) -> List[str]:
        """The parameters of ``f`` that ``call`` gives the optimizer ``opt``."""
        out = [k.arg for k in call.keywords if k.arg and dotted(k.value) == opt]
        pos = f.positional[1:] if bound else f.positional
        for i, a in enumerate(call.args):
            if isinstance(a, ast.Starred):
                return []
            if dotted(a) == opt:
                if i >= len(pos):
                    return []
                out.append(pos[i])
        return out

    def _hand_scaler(self) -> None:
        """Each function the optimizer is handed to takes the scaler too (keyword-only, last), and
        every call passes it."""
        from ampfix.migration.placement import add_keyword_param

        for f, param in self.callees.values():
            fc = self.fc(f.module)
            add_keyword_param(fc, f, self.scaler)
            if f.module is not self.m:
                # no apex name there: the report of its part is at the parameter that takes the optimizer
                a = f.node.args
                at = next((x for x in [*a.posonlyargs, *a.args, *a.kwonlyargs] if x.arg == param), f.node)
                self.g.anchors.setdefault(f.module.path, []).append(
                    (at, f"`{f.qualname}` receives the FP16_Optimizer made in {self.m.path} (line {self.ctor_line}): "
                         f"it takes the GradScaler too"))
            for cs in self.p.callers(f):
                cfc = self.fc(cs.module)
                cfc.edits.append(cfc.b.insert_arg(cs.node, f"{self.scaler}={self.scaler}"))
            what = "whether AMP is on" if bf16(self.s) else "the GradScaler"
            h = self.holders.get(id(f.cls)) if f.cls is not None else None
            if h is not None and h.init is f:
                fc.insert_after(h.store, [f"self.{h.scaler} = {self.scaler}"])
                self.notes.add(f"`{f.cls.name}` is handed the optimizer and keeps it: it takes {what} too, as "
                               f"`{self.scaler}=`, and keeps it as `self.{h.scaler}` for its methods")
                continue
            self.notes.add(f"`{f.qualname}` receives the optimizer: it takes {what} too, as `{self.scaler}=`")

    def _scaler_name(self) -> str:
        taken = {n.id for n in walk(self.m.tree, into_functions=True) if isinstance(n, ast.Name)}
        if bf16(self.s) and not self.opt.startswith("self."):
            return next(x for x in ("use_amp", "amp_enabled", "use_bf16", "bf16_autocast") if x not in taken)
        if bf16(self.s):
            # the other methods read it on self, as they read the optimizer (uclanlp/visualbert)
            attrs = {n.attr for n in walk(self.m.tree, into_functions=True) if isinstance(n, ast.Attribute)}
            return "self." + next(x for x in ("use_amp", "amp_enabled", "use_bf16", "bf16_autocast") if x not in attrs)
        if self.opt.startswith("self."):
            attrs = {n.attr for n in walk(self.m.tree, into_functions=True) if isinstance(n, ast.Attribute)}
            return "self." + next(x for x in ("scaler", "grad_scaler", "amp_scaler") if x not in attrs)
        return next(x for x in ("scaler", "grad_scaler", "amp_scaler") if x not in taken)

    # -- the scaler ----------------------------------------------------------------------------
    def _scaler_args(self, calls, stmts):
        """GradScaler arguments for the constructor(s); two constructors in ``if c: ... else:``
        (one dynamic, one static) give a scale that follows ``c``.  Returns (args, notes, the
        statement the pair or the constructor is)."""
        if len(calls) == 1:
            args, notes = self._one(calls[0])
            return args, notes, stmts[0]
        if len(calls) == 2:
            a, b = stmts
            pair = getattr(a, "_p", None)
            if isinstance(pair, ast.If) and pair.body == [a] and pair.orelse == [b]:
                dyn = [self._is_dynamic(c) for c in calls]
                if dyn == [True, False] or dyn == [False, True]:
                    static = calls[dyn.index(False)]
                    s_args, notes = self._one(static)
                    init = next((x.split("=", 1)[1] for x in s_args if x.startswith("init_scale=")), "1.0")
                    cond = as_bool(self.code(pair.test), pair.test)
                    cond = cond[len("bool("):-1] if cond.startswith("bool(") else cond
                    if dyn == [False, True]:
                        from ampfix.engine.tidy import negate

                        cond = negate(self.m.src, pair.test)
                    return ([f"init_scale=2.0**16 if {cond} else {init}",
                             f"growth_interval=2000 if {cond} else 2**31 - 1"],
                            notes | {"loss scale: dynamic when the `if` chose it, else static"}, pair)
        raise Refuse("FP16_Optimizer is made several times in this module: migrate it by hand")

    def _is_dynamic(self, call) -> bool:
        return is_const(kwargs(call).get("dynamic_loss_scale"), True)

    def _one(self, call):
        if has_star(call) or len(call.args) > 1:
            raise Refuse("FP16_Optimizer has arguments that cannot be read")
        kws = kwargs(call)
        for k in kws:
            if k not in ("init_optimizer", "static_loss_scale", "dynamic_loss_scale", "dynamic_loss_args", "verbose"):
                raise Refuse(f"FP16_Optimizer argument {k!r} has no native mapping")
        notes: Set[str] = set()
        static = kws.get("static_loss_scale")
        static_code = self.code(static) if static is not None else "1.0"
        dynamic = kws.get("dynamic_loss_scale")
        dyn_args = self._dynamic_args(kws.get("dynamic_loss_args"))
        if dyn_args is None:
            notes.add(DEFAULTS_NOTE)
            dyn_args = {}
        static_args = [f"init_scale={static_code}", "growth_interval=2**31 - 1"]
        if dynamic is None or is_const(dynamic, False):
            notes.add(STATIC_NOTE)
            return static_args, notes
        if is_const(dynamic, True):
            return [f"{k}={v}" for k, v in dyn_args.items()], notes
        cond = as_bool(self.code(dynamic), dynamic)
        cond = cond[len("bool("):-1] if cond.startswith("bool(") else cond
        notes.add(STATIC_NOTE)
        out = [f"init_scale={dyn_args.get('init_scale', '2.0**16')} if {cond} else {static_code}",
               f"growth_interval={dyn_args.get('growth_interval', '2000')} if {cond} else 2**31 - 1"]
        out += [f"{k}={v}" for k, v in dyn_args.items() if k not in ("init_scale", "growth_interval")]
        return out, notes

    def _dynamic_args(self, node) -> Optional[Dict[str, str]]:
        if node is None:
            return None
        if not isinstance(node, ast.Dict) or not all(string_value(k) is not None for k in node.keys):
            raise Refuse("dynamic_loss_args is not a literal dict")
        out = {}
        for k, v in zip(node.keys, node.values):
            k, v = string_value(k), self.code(v)
            if k == "init_scale":
                out["init_scale"] = v
            elif k == "scale_window":
                out["growth_interval"] = v
            elif k == "scale_factor":
                out["growth_factor"] = v
                out["backoff_factor"] = f"1 / {v}"
            else:
                raise Refuse(f"dynamic_loss_args key {k!r} has no native mapping")
        return out

    def _place(self, calls, stmts, anchor, scaler_args) -> str:
        """Replace the constructor(s) by the scaler; returns autocast's enabled expression."""
        fc = self.fc(self.m)
        # a script's `if __name__ == "__main__":` is its main body (the flag is parsed inside it),
        # not a condition of AMP's: the scaler is made in it
        unit = next((a for a in ancestors_stmts(anchor, self.unit) if is_main_guard(a)), self.unit)
        gs = guards(anchor, unit)
        #: the source of the fp16 flag (the outermost guard's test), when there is a guard
        self.enabled_source = self.code(gs[-1].test) if gs else None
        cond = "True"
        for gd in reversed(gs):
            cond = conj(as_bool(self.code(gd.test), gd.test), cond)
        args = [*scaler_args, *([f"enabled={cond}"] if cond != "True" else [])]
        inner = arg(calls[0], "init_optimizer", 0)
        self.inner_params = self._params_of(inner)
        if inner is None:
            raise Refuse("FP16_Optimizer has no optimizer argument")
        inner_code = self.code(inner)
        keep_inner = [] if inner_code == self.opt else [f"{self.opt} = {inner_code}"]
        outer = gs[-1] if gs else None
        if outer is not None and outer.orelse and self._apex_only(outer.body, anchor):
            # if fp16: <apex optimizer> else: <fp32 optimizer>  ->  the fp32 optimizer, and the scaler
            if self._is_elif(outer):
                raise Refuse(f"the fp16 path at line {outer.lineno} is one branch of an elif chain")
            made = self._made(args, cond, self._col(outer))
            fc.unwrap(outer, outer.orelse)
            fc.touched.add(id(outer))
            fc.insert_after(outer.orelse[-1], made, indent=self.m.src.indent_of(outer.orelse[0].lineno)[
                :len(self.m.src.indent_of(outer.lineno))])
            # every optimizer the fp32 path builds (`if args.from_pretrained: BertAdam(...) else: ...`)
            self.fp32_optimizer = [s for b in outer.orelse for s in [b, *walk(b)] if isinstance(s, ast.Assign) and
                                   dotted(s.targets[0]) == self.opt and isinstance(s.value, ast.Call)]
            #: schedules the fp32 path builds from it (`scheduler = WarmupLinearSchedule(optimizer, ...)`)
            self.fp32_schedules = [s for b in outer.orelse for s in [b, *walk(b)] if self._schedules(s)]
            self._defaults_go(outer)
            self.notes.add("the fp16 path's apex optimizer goes: native AMP keeps the fp32 path's optimizer, so "
                           "--fp16 differs from the fp32 run by precision alone")
            self.gone_block = outer
            return cond
        self.fp32_optimizer = []
        self.fp32_schedules = []
        self.gone_block = None
        made = self._made(args, cond, self._col(outer or anchor))
        if outer is None:
            if keep_inner or made:
                fc.replace_statement(anchor, [*keep_inner, *made])
            else:
                fc.remove(anchor)
        else:
            if made:
                fc.insert_before(outer, made)
            if keep_inner:
                fc.replace_statement(anchor, keep_inner)
            else:
                fc.remove(anchor)
        return cond

    def _made(self, args: List[str], cond: str, col: int) -> List[str]:
        """The scaler's statement; with bfloat16 the flag that says whether AMP is on, only where a
        function the optimizer is handed to reads it."""
        if bf16(self.s):
            # read by the functions it is handed to, or, made at module level, by the functions
            # that use the optimizer as a global (kimiyoung/transformer-xl: `use_amp` was read there
            # and never bound)
            return [f"{self.scaler} = {cond}"] if self.callees or self.func is None or self.scaler.startswith("self.") \
                else []
        return [f"{self.scaler} = {scaler_call(self.s, args, col, self.scaler + ' = ')}"]

    def _params_of(self, inner) -> Optional[str]:
        """``model.parameters()`` where the wrapped optimizer was built from it (inline, or assigned
        once in the same function) and ``model`` is bound nowhere else there but by a cast or a
        converter the migration removes: the name the code has, for a clip."""
        built = inner
        if isinstance(inner, ast.Name):
            made = [n for n in walk(self.unit) if isinstance(n, ast.Assign) and len(n.targets) == 1
                    and isinstance(n.targets[0], ast.Name) and n.targets[0].id == inner.id
                    and isinstance(n.value, ast.Call) and not (self.m.sem.qnames(n.value) & CTORS)]
            if len(made) != 1:
                return None
            built = made[0].value
        if not (isinstance(built, ast.Call) and built.args and method_call(built.args[0], "parameters")
                and not built.args[0].args and isinstance(receiver(built.args[0]), ast.Name)):
            return None
        name = receiver(built.args[0]).id
        for n in walk(self.unit):
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets):
                v = n.value
                ok = isinstance(v, ast.Call) and (self._is_half(v) or self.m.sem.qnames(v) & CONVERTERS or (
                    isinstance(v.func, ast.Attribute) and v.func.attr in ("to", "cuda")))
                if n.lineno > built.lineno and not ok:
                    return None
        return f"{name}.parameters()"

    def _col(self, stmt) -> int:
        return self.m.src.char_col(stmt.lineno, stmt.col_offset)

    def _is_elif(self, node) -> bool:
        p = getattr(node, "_p", None)
        return isinstance(p, ast.If) and p.orelse == [node] and \
            self.m.src.line_text(node.lineno).lstrip().startswith("elif")

    def _apex_only(self, body, anchor) -> bool:
        """The fp16 branch holds only apex imports, the optimizer's construction and the
        FP16_Optimizer itself."""
        for s in body:
            if s is anchor or any(x is anchor for x in walk(s)):
                continue
            if isinstance(s, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(s, ast.Try) and all(isinstance(x, (ast.Import, ast.ImportFrom)) for x in s.body):
                continue
            if isinstance(s, ast.Assign) and len(s.targets) == 1 and dotted(s.targets[0]) == self.opt:
                continue
            return False
        return True

    # -- float16 models and inputs ---------------------------------------------------------------
    def _is_half(self, call) -> bool:
        if method_call(call, "half") and not call.args and not call.keywords:
            return True
        return method_call(call, "type") and len(call.args) == 1 and (dotted(call.args[0]) or "") in HALF_TYPES

    def _peel(self, expr):
        """``network_to_half(m.half())`` -> ``m``: the converters and .half() calls around it."""
        while isinstance(expr, ast.Call):
            if self._is_half(expr):
                expr = receiver(expr)
            elif self.m.sem.qnames(expr) & {c for c in CONVERTERS} or any(
                    q.startswith("apex.fp16_utils") for q in self.m.sem.qnames(expr)):
                a = arg(expr, None, 0)
                if a is None:
                    raise Refuse(f"`{self.code(expr)}` at line {expr.lineno} cannot be read")
                expr = a
            else:
                break
        return expr

    def _unhalf_models(self, convs) -> Set[str]:
        models: Set[str] = set()
        for n, _ in convs:
            call = getattr(n, "_p", None)
            if not isinstance(call, ast.Call) or len(call.args) != 1:
                raise Refuse(f"`{self.code(n)}` at line {n.lineno} cannot be read")
            st = stmt_of(call)
            if isinstance(st, ast.Assign) and dotted(st.targets[0]):
                models.add(dotted(st.targets[0]))
            m = self._peel(call.args[0])
            if dotted(m):
                models.add(dotted(m))
        for n in walk(self.m.tree, into_functions=True):
            if method_call(n, "parameters", "named_parameters") and dotted(receiver(n)):
                models.add(dotted(receiver(n)))
        models.discard(None)
        # converters: f(model) -> model
        for n, _ in convs:
            call = n._p
            outer = call
            while isinstance(getattr(outer, "_p", None), ast.Call) and outer._p.args and outer._p.args[0] is outer and \
                    self.m.sem.qnames(outer._p) & CONVERTERS:
                outer = outer._p
            if outer is call:
                self._unwrap(call)
        # .half() of a model (also in a chain: Net().cuda().half())
        for n in walk(self.m.tree, into_functions=True):
            if not (isinstance(n, ast.Call) and self._is_half(n)):
                continue
            if casts_one_of(n, models):
                self._unwrap(n)
        # casts guarded by the fp16 flag, wherever the flag is tested: the functions the model is
        # handed to made their inputs float16 for it too (evaluation among them)
        flag = self._flag()
        if flag is not None:
            for m, unit in self._units():
                for n in walk(unit, into_functions=True):
                    if not (isinstance(n, ast.Call) and self._is_half(n) and id(n) not in self.removed):
                        continue
                    st = stmt_of(n)
                    f = m.function_of(n)
                    gds = [gd for gd in guards(st, f.node if f is not None else m.tree)
                           if self.code(gd.test) in self._flags_at(n)]
                    if gds:
                        self._unwrap(n)
                        if f is not None and f is not self.func and id(f.node) not in self.callees:
                            self._half_before.setdefault(id(f.node), (f, gds[-1]))
                        continue
                    # `x.half() if args.fp16 else x`: the cast chosen by the flag in one expression
                    ie = getattr(n, "_p", None)
                    if isinstance(ie, ast.IfExp) and ie.body is n and self.code(ie.test) in self._flags_at(n) \
                            and self.code(ie.orelse) == self.code(receiver(n)) and f is self.func:
                        self.removed.add(id(n))
                        self.fc(m).replace(ie, self.code(ie.orelse))
        self._no_half_made_elsewhere(models)
        return models

    def _no_half_made_elsewhere(self, models: Set[str]) -> None:
        """A model made float16 by a function of the project (``model = network_to_half(model)``,
        a copy of apex's helper in the project's own ``Models.py``) stays float16 once the
        FP16_Optimizer is gone, and ``GradScaler`` cannot unscale float16 gradients: refused,
        naming the call (unwrapping it would also change the module tree its checkpoints load into)."""
        for n in walk(self.unit, into_functions=True):
            if not (isinstance(n, ast.Assign) and len(n.targets) == 1 and dotted(n.targets[0]) in models
                    and isinstance(n.value, ast.Call) and id(n.value) not in self.removed):
                continue
            f, _ = self.p.resolve(self.m, n.value.func)
            name = (dotted(n.value.func) or "").rsplit(".", 1)[-1]
            if f is None and re.search(r"(?i)half|fp16", name) and not self.m.sem.qnames(n.value):
                # not followed (`from utils import *` that passes on `from Models import *`): by its name
                raise Refuse(f"`{self.code(n.value)}` at line {n.lineno} may make the model float16 (`{name}` "
                             "cannot be followed): GradScaler cannot unscale float16 gradients; keep the model "
                             "float32 by hand")
            if f is None or not any(isinstance(x, ast.Call) and self._is_half(x) and id(x) not in self.removed
                                    for x in walk(f.node, into_functions=True)):
                continue
            raise Refuse(f"`{self.code(n.value)}` at line {n.lineno} makes the model float16 ({f.module.path} line "
                         f"{f.node.lineno}, `{f.qualname}`): GradScaler cannot unscale float16 gradients; keep the "
                         "model float32 by hand")

    def _evaluation_regions(self) -> None:
        """A function that fed the float16 model float16 inputs under the flag (evaluation, mostly)
        ran it in half precision: its calls of the model run under autocast, enabled by that flag."""
        trained = {id(self._mod(c).function_of(c).node) for c in self.backward_calls
                   if self._mod(c).function_of(c) is not None}
        for f, gd in self._half_before.values():
            if id(f.node) in trained:
                continue  # its forward pass is the training one, under the scaler's autocast
            header = autocast_call(self.s, as_bool(self.code(gd.test), gd.test))
            for n in walk(f.node):
                if not (isinstance(n, ast.Call) and dotted(n.func) in self._models_at(n)):
                    continue
                st = stmt_of(n)
                if self._under_autocast(st) or any(method_call(x, "backward") for x in walk(st)):
                    continue
                owner, field, block = block_of(st)
                i = next(k for k, x in enumerate(block) if x is st)
                self._add_region(f.module, block, i, i, header)
                self.notes.add(f"`{f.qualname}` ran the float16 model: its forward runs under autocast")
        # a function the maker hands the model to that only evaluates it (`eval_model_loss(model,
        # loader, args)`, integer inputs, so no cast told): it ran the float16 model too
        models = {x for x in self.models if "." not in x}
        if models and self.enabled not in (None, "False"):
            self._wrap_evaluations(self.m, self.func, self.unit, models | self._aliases(self.unit, models),
                                   self.enabled, self.ctor_stmt)

    def _covered_inside(self, f) -> bool:
        return id(f.node) in self._half_before

    def _evaluation_cond(self, module, unit, st, models: Set[str], cond: str) -> str:
        """An evaluation of a model whose ``.half()`` the plan removed: it ran in half precision
        under that cast's own condition (``if args.fp16: model.half()`` before an evaluation-only
        run, where the FP16_Optimizer is made only when training), not the scaler's.  The last such
        cast before ``st`` in its unit, on its way, under tests ``st`` is not under itself: those
        tests (pure ones); else the scaler's condition."""
        casts = [c for c in self.removed_casts if self._mod(c) is module and c.lineno < st.lineno
                 and casts_one_of(c, models) and any(c is x for x in walk(unit))
                 and not other_branch(stmt_of(c), st, unit)]
        if not casts:
            return cond
        cast = max(casts, key=lambda c: (c.lineno, c.col_offset))
        around = {id(g) for g in guards(st, unit)}
        tests = [g.test for g in reversed(guards(stmt_of(cast), unit)) if id(g) not in around]
        if not tests or not all(pure(t) for t in tests):
            return cond
        out = "True"
        for t in tests:
            out = conj(out, as_bool(self.code(t), t))
        return out

    def _holder_at(self, node) -> Optional[Holder]:
        """The class that keeps the optimizer, where ``node`` is in one of its methods."""
        return next((h for h in self.holders.values() if h.module is self._mod(node) and h.method_of(node)), None)

    def _flags_at(self, node) -> Set[str]:
        """The fp16 flag as the code at ``node`` reads it."""
        h = self._holder_at(node)
        return {x for x in (self.enabled_source, h.flag if h else None) if x}

    def _models_at(self, node) -> Set[str]:
        """The model names as the code at ``node`` reads them (``self.model`` in a holder)."""
        h = self._holder_at(node)
        return self.models | (h.models if h is not None else set())

    def _scaler_at(self, node) -> str:
        """The scaler (or, with bfloat16, the switch) as the code at ``node`` reaches it."""
        h = self._holder_at(node)
        return "self." + h.scaler if h is not None else self.scaler

    def _flag(self) -> Optional[str]:
        """The test of the ``if`` that guards the FP16_Optimizer (``args.fp16``), if any."""
        return self.enabled_source

    def _unwrap(self, call) -> None:
        """Replace ``call`` by what it converts; a statement that becomes ``x = x`` or a bare name goes."""
        if id(call) in self.removed:
            return
        inner = self._peel(call)
        st = stmt_of(call)
        fc = self.fc(self._mod(call))
        self.removed.add(id(call))
        self.removed_casts.append(call)
        if self._inside_gone(st):
            return
        if isinstance(st, ast.Expr) and st.value is call and dotted(inner):
            fc.remove(st)
            for say in _says_half(st):
                fc.remove(say)  # `logger.info("model.half() activated")` beside it says what went
        elif isinstance(st, ast.Assign) and st.value is call and len(st.targets) == 1 and \
                self.code(st.targets[0]) == self.code(inner):
            fc.remove(st)
        else:
            fc.replace(call, self.code(inner))

    def _inside_gone(self, st) -> bool:
        gone = getattr(self, "gone_block", None)
        if gone is None:
            return False
        p = st
        while p is not None:
            if p is gone:
                return any(x is st or any(y is st for y in walk(x)) for x in gone.body)
            p = getattr(p, "_p", None)
        return False

    # -- uses of the optimizer -------------------------------------------------------------------
    def _uses_of_opt(self, calls) -> None:
        opt = self.opt
        in_ctor = {id(x) for c in calls for x in [stmt_of(c), *walk(stmt_of(c))]}
        backwards, clips, updates, scales, inners, zero_grads, steps = [], [], [], [], [], [], []
        #: the name the optimizer has where each use is (a parameter in the functions it is handed to)
        self.opt_at: Dict[int, str] = {}
        given = {p for _, p in self.callees.values()}
        held = {h.opt for h in self.holders.values()}
        units = [(self.m, self.m.tree)]
        units += [(f.module, f.node) for f, _ in self.callees.values() if f.module is not self.m]
        units += [(h.module, h.cls) for h in self.holders.values() if h.module is not self.m]
        seen: Set[int] = set()
        for n in (x for _, unit in units for x in walk(unit, into_functions=True)):
            if not isinstance(n, (ast.Name, ast.Attribute)) or id(n) in in_ctor or id(n) in seen:
                continue
            seen.add(id(n))
            d = dotted(n)
            if d != opt and d not in given and d not in held:
                continue
            if not isinstance(n.ctx, ast.Load):
                continue
            if self._inside_gone(stmt_of(n)):
                continue
            f = self._mod(n).function_of(n)
            callee = self.callees.get(id(f.node)) if f is not None else None
            holder = self._holder_at(n) if d in held else None
            if holder is not None and d == holder.opt:
                self.opt_at[id(n)] = d
            elif d in held and d != opt:
                continue
            elif callee is not None and d == callee[1]:
                self.opt_at[id(n)] = d
            elif d != opt:
                continue
            elif f is not self.func and not (self.func is None or opt.startswith("self.")):
                raise Refuse(f"`{opt}` is used in `{f.qualname if f else 'module level'}` (line {n.lineno}): pass "
                             "the scaler there by hand")
            else:
                self.opt_at[id(n)] = opt
            parent = getattr(n, "_p", None)
            if isinstance(parent, ast.Attribute) and parent.value is n:
                attr = parent.attr
                call = getattr(parent, "_p", None)
                call = call if isinstance(call, ast.Call) and call.func is parent else None
                if attr not in METHODS and attr not in FP16_OWN and not attr.startswith("__"):
                    self.notes.add(f"`{opt}.{attr}` (line {n.lineno}) was never FP16_Optimizer's: it stays as it was "
                                   "(the fp32 optimizer's where it has one)")
                    continue
                if attr not in METHODS:
                    raise Refuse(f"`{opt}.{attr}` (line {n.lineno}) has no native counterpart")
                if attr == "backward" and call is not None:
                    backwards.append(call)
                elif attr == "clip_master_grads" and call is not None:
                    clips.append(call)
                elif attr == "update_master_grads" and call is not None:
                    updates.append(call)
                elif attr == "zero_grad" and call is not None and (call.args or call.keywords):
                    zero_grads.append(call)
                elif attr == "loss_scale" and call is None:
                    scales.append(parent)
                elif attr == "optimizer" and call is None:
                    inners.append(parent)
                elif attr == "step" and call is not None:
                    if call.args or call.keywords:
                        raise Refuse(f"`{opt}.step(closure)` at line {n.lineno} has no automatic rewrite")
                    steps.append(call)
                elif attr in ("backward", "clip_master_grads", "update_master_grads", "loss_scale", "optimizer"):
                    raise Refuse(f"`{opt}.{attr}` at line {n.lineno} is not used as FP16_Optimizer's")
        if not backwards:
            raise Refuse(f"`{opt}.backward(loss)` is not in this module nor in a function it hands `{opt}` to")
        self.backward_calls = backwards
        sites = []
        for call in backwards:
            m = self._mod(call)
            fc = self.fc(m)
            st = stmt_of(call)
            if m is not self.m:
                # no apex name in this module: the report of its rewrite is here
                self.g.anchors.setdefault(m.path, []).append(
                    (call, f"`{self.code(call)}` is the backward of the FP16_Optimizer made in {self.m.path} "
                           f"(line {self.ctor_line}): the GradScaler scales the loss now"))
            loss = arg(call, "loss", 0)
            if loss is None or not (isinstance(st, ast.Expr) and st.value is call):
                raise Refuse(f"`{self.code(call)}` at line {call.lineno} is not a statement of its own")
            extra = [f"retain_graph={self.code(k.value)}" for k in call.keywords if k.arg == "retain_graph"]
            for k in call.keywords:
                if k.arg not in ("loss", "retain_graph", "update_master_grads"):
                    raise Refuse(f"`{self.code(call)}` at line {call.lineno}: unknown argument {k.arg!r}")
            if bf16(self.s):
                lc = self.code(loss)
                lc = f"({lc})" if isinstance(loss, (ast.BinOp, ast.BoolOp, ast.IfExp, ast.NamedExpr)) else lc
                fc.replace(call, f"{lc}.backward({', '.join(extra)})")
            else:
                fc.replace(call, f"{self._scaler_at(call)}.scale({self.code(loss)}).backward({', '.join(extra)})")
            fc.drop_stale_comment(st, ("master", "fp16_optimizer"))
            site = self._collapse_twin(st, loss)
            sites.append(site)
            unit = m.function_of(call)
            unit = unit.node if unit is not None else m.tree
            at = self._scaler_at(call)
            header = autocast_call(self.s, self.enabled if (m.function_of(call) is self.func) else
                                   (at if bf16(self.s) else f"{at}.is_enabled()"))
            region, missing = forward_region(site, loss, unit, [], self._models_at(call))
            if region is None:
                raise Refuse(f"the loss `{self.code(loss)}` is not computed before `{self.code(call)}` (line "
                             f"{call.lineno}): wrap its forward pass in autocast by hand")
            if not any(self._under_autocast(x) for x in region.stmts):
                self._add_region(m, region.block, region.first, region.last, header)
                for x in region.stmts:
                    for n in walk(x):
                        if isinstance(n, ast.Call) and self._is_half(n):
                            self._unwrap(n)
        # steps that follow a scaled backward, then one update (in each function that steps)
        def unit_of(node):
            f = self._mod(node).function_of(node)
            return f.node if f is not None else self._mod(node).tree

        # a step converts where it follows a scaled backward in the same function
        conv = [s for s in steps if follows(stmt_of(s), [x for x in sites if unit_of(x) is unit_of(s)], unit_of(s))]
        if bf16(self.s):
            conv = []  # no scaler: the optimizer steps itself
        else:
            stray = [s for s in steps if s not in conv]
            if stray:
                # FP16_Optimizer's step unscaled the master gradients; the plain optimizer's would
                # apply the scaled ones: only a step the scaler runs may stay
                raise Refuse(f"`{self.code(stray[0])}` at line {stray[0].lineno} does not follow the scaled backward "
                             "in its function: the plain optimizer would step on scaled gradients; migrate the step "
                             "by hand")
        for s in conv:
            self.fc(self._mod(s)).replace(s, f"{self._scaler_at(s)}.step({self._opt_of(s)})")
        last_in: Dict[int, ast.Call] = {}
        for s in conv:
            f = self._mod(s).function_of(s)
            k = id(f.node) if f is not None else 0
            if k not in last_in or (s.lineno, s.col_offset) > (last_in[k].lineno, last_in[k].col_offset):
                last_in[k] = s
        for last in last_in.values():
            self.fc(self._mod(last)).insert_after(stmt_of(last), [f"{self._scaler_at(last)}.update()"])
        if not bf16(self.s):
            self._model_clips_unscaled(conv, sites, clips)
        for call in clips:
            st = stmt_of(call)
            if not (isinstance(st, (ast.Expr, ast.Assign)) and st.value is call):
                raise Refuse(f"`{self.code(call)}` at line {call.lineno} is not a statement of its own")
            o = self._opt_of(call)
            # the model's name is the maker's: in a function the optimizer is handed to, the
            # optimizer's own groups say which parameters it steps
            here = self._mod(call) is self.m and self.m.function_of(call) is self.func
            params = (self.inner_params if o == self.opt and self.inner_params and here else
                      f'(p for group in {o}.param_groups for p in group["params"])')
            rest = [self.code(a) for a in call.args] + [f"{k.arg}={self.code(k.value)}" for k in call.keywords]
            params = self._fp32_clip_params(st, rest) or params
            fc = self.fc(self._mod(call))
            fc.replace(call, f"torch.nn.utils.clip_grad_norm_({', '.join([params, *rest])})")
            if not bf16(self.s):
                fc.insert_before(st, [f"{self._scaler_at(call)}.unscale_({o})"])
            self._collapse_clip(st)
        for call in updates:
            st = stmt_of(call)
            if not (isinstance(st, ast.Expr) and st.value is call):
                raise Refuse(f"`{self.code(call)}` at line {call.lineno} is not a statement of its own")
            self.fc(self._mod(call)).remove(st)
        for call in zero_grads:
            for k in call.keywords:
                if k.arg != "set_grads_to_None":
                    raise Refuse(f"`{self.code(call)}` at line {call.lineno}: unknown argument")
                self.fc(self._mod(call)).replace(k, f"set_to_none={self.code(k.value)}")
            if call.args:
                raise Refuse(f"`{self.code(call)}` at line {call.lineno}: unknown argument")
        for node in scales:
            if bf16(self.s):
                raise Refuse(f"`{self.opt}.loss_scale` at line {node.lineno}: bfloat16 has no loss scale")
            self.fc(self._mod(node)).replace(node, f"{self._scaler_at(node)}.get_scale()")
        for node in inners:
            self.fc(self._mod(node)).replace(node, self.opt_at[id(node.value)])
        self._fp16_only_warmup()

    #: clips of gradients a plain call makes (not FP16_Optimizer's own clip_master_grads)
    _CLIPS = ("clip_grad_norm_", "clip_grad_norm", "clip_grad_value_")

    def _model_clips_unscaled(self, conv, sites, clips) -> None:
        """``optimizer.backward(loss)`` then ``clip_grad_norm_(model.parameters(), c)`` then
        ``optimizer.step()``: FP16_Optimizer's backward had already copied the scaled float16
        gradients to its float32 master copies and unscaled those, so the clip changed gradients
        its step never read (a no-op on the float16 path; the float32 path clipped).  After the
        migration the clip would see scaled gradients: ``scaler.unscale_`` goes before it, and the
        fix is unsafe (the float16 path now clips, as the float32 path did)."""
        for s in conv:
            step = stmt_of(s)
            _, _, block = block_of(step)
            i = next((k for k, x in enumerate(block) if x is step), None)
            if i is None:
                continue
            before = [x for x in sites if any(x is y for y in block[:i])]
            if not before:
                continue
            start = next(k for k, x in enumerate(block) if x is before[-1])
            for x in block[start + 1:i]:
                inside = list(walk(x))
                if any(n is c for c in clips for n in inside):
                    continue  # `if fp16: optimizer.clip_master_grads(c) else: clip(...)`: mapped as one clip
                calls = [n for n in inside if isinstance(n, ast.Call)
                         and (dotted(n.func) or "").split(".")[-1] in self._CLIPS]
                if not (calls and isinstance(x, ast.Expr) and x.value is calls[0] and len(calls) == 1):
                    continue  # (a clip inside another statement: the self-check refuses what it would leave)
                o = self._opt_of(s)
                self.fc(self._mod(s)).insert_before(x, [f"{self._scaler_at(s)}.unscale_({o})"])
                why = (f"the clip at line {x.lineno} clipped the float16 model's gradients after FP16_Optimizer's "
                       "backward had copied them to its float32 master gradients, which its step used: it did not "
                       "clip on the float16 path; the migration clips the gradients the step uses, as the float32 "
                       "path did: the numbers change")
                self.g.unsafe = f"{self.g.unsafe}; {why}" if self.g.unsafe else why

    def _fp32_clip_params(self, st, rest: List[str]) -> Optional[str]:
        """``if args.fp16: optimizer.clip_master_grads(c) else: clip_grad_norm_(model.parameters(),
        c)``: the parameters the fp32 path clipped, said as the code says them (the two branches
        become one clip)."""
        owner = getattr(st, "_p", None)
        if not isinstance(owner, ast.If) or len(owner.body) != 1 or len(owner.orelse) != 1:
            return None
        other = owner.orelse[0] if owner.body[0] is st else owner.body[0] if owner.orelse[0] is st else None
        call = getattr(other, "value", None)
        if not isinstance(other, (ast.Expr, ast.Assign)) or not isinstance(call, ast.Call) or not call.args or \
                not (dotted(call.func) or "").endswith("clip_grad_norm_"):
            return None
        theirs = [self.code(a) for a in call.args[1:]] + [f"{k.arg}={self.code(k.value)}" for k in call.keywords]
        if theirs != rest or isinstance(other, ast.Assign) != isinstance(st, ast.Assign) or (
                isinstance(st, ast.Assign) and self.code(st.targets[0]) != self.code(other.targets[0])):
            return None
        return self.code(call.args[0])

    def _counters_go(self, block) -> None:
        """A counter that only the removed warm-up read (``global_step = 0`` / ``global_step += 1``)
        goes with it: nothing reads it any more."""
        unit = self.unit
        inside = {id(n) for n in walk(block)}
        reads = {n.id for n in walk(block) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        every = list(walk(unit, into_functions=True))
        if any(isinstance(n, (ast.Global, ast.Nonlocal)) for n in every):
            return
        for name in sorted(reads):
            nodes = [n for n in every if isinstance(n, ast.Name) and n.id == name and id(n) not in inside]
            if not nodes or any(not isinstance(n.ctx, ast.Store) for n in nodes):
                continue
            stmts = [stmt_of(n) for n in nodes]
            if not all((isinstance(st, ast.Assign) and len(st.targets) == 1 and st.targets[0] is n
                        and isinstance(st.value, ast.Constant)) or
                       (isinstance(st, ast.AugAssign) and st.target is n and isinstance(st.value, ast.Constant))
                       for st, n in zip(stmts, nodes)):
                continue
            if isinstance(unit, ast.Module) and self.p.mentioned_elsewhere(name):
                continue
            for st in stmts:
                self.fc(self.m).remove(st)
            self.notes.add(f"`{name}`, which only that warm-up read, goes too")

    def _helpers_go(self, block, m) -> None:
        """A module-level function that only the removed warm-up called (``warmup_linear``) goes
        too, when nothing else in the project names it."""
        called = {n.func.id for n in walk(block) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        inside = {id(n) for n in walk(block)}
        for name in sorted(called):
            defs = [d for d in m.tree.body if isinstance(d, ast.FunctionDef) and d.name == name]
            if len(defs) != 1:
                continue
            d = defs[0]
            within = {id(n) for n in walk(d, into_functions=True)}
            used = [n for n in walk(m.tree, into_functions=True) if isinstance(n, ast.Name) and n.id == name
                    and id(n) not in inside and id(n) not in within]
            if used or self.p.named_elsewhere(m, name) or id(d) in self.fc(m).touched:
                continue
            self.fc(m).remove(d, obsolete=True)
            self.notes.add(f"`{name}`, which only that warm-up called, goes too")

    def _opt_of(self, call) -> str:
        """The optimizer's name at ``opt.method(...)``."""
        return self.opt_at.get(id(receiver(call)), self.opt)

    def _collapse_twin(self, st, loss):
        """``if f: opt.backward(loss) else: loss.backward()`` -> the scaled backward alone."""
        gd = getattr(st, "_p", None)
        if isinstance(gd, ast.If) and gd.body == [st] and len(gd.orelse) == 1:
            e = gd.orelse[0]
            if isinstance(e, ast.Expr) and method_call(e.value, "backward") and \
                    self.code(receiver(e.value)) == self.code(loss):
                fc = self.fc(self._mod(st))
                fc.unwrap(gd, gd.body)
                fc.touched.add(id(gd))
                return gd
        return st

    def _collapse_clip(self, st) -> None:
        gd = getattr(st, "_p", None)
        if isinstance(gd, ast.If) and gd.body == [st] and len(gd.orelse) == 1:
            e = gd.orelse[0]
            if isinstance(e, (ast.Expr, ast.Assign)) and isinstance(e.value, ast.Call) and \
                    "clip_grad" in (dotted(e.value.func) or ""):
                fc = self.fc(self._mod(st))
                fc.unwrap(gd, gd.body)
                fc.touched.add(id(gd))

    def _fp16_only_warmup(self) -> None:
        """``if args.fp16: lr = ...; for g in opt.param_groups: g['lr'] = lr`` goes when the optimizer
        both paths now share schedules itself (BertAdam(warmup=, t_total=)): kept, the warm-up
        would apply twice."""
        flag = self.enabled_source
        if flag is None or not self.fp32_optimizer:
            return
        scheduled = [any(k.arg in SCHEDULE_KW for k in s.value.keywords) for s in self.fp32_optimizer]
        if self.fp32_schedules:
            # a schedule object of the optimizer's own: every fp32 optimizer is scheduled when it is
            # made beside all of them, in the fp32 path's own block
            top = [s for s in self.fp32_schedules if s in self.gone_block.orelse]
            if len(top) != len(self.fp32_schedules):
                raise Refuse(f"the fp32 path builds a schedule for `{self.opt}` at line "
                             f"{self.fp32_schedules[0].lineno} under a condition of its own: whether the fp16 path's "
                             "own warm-up must stay depends on it; migrate it by hand")
            scheduled = [True] * len(scheduled)
        if not any(scheduled):
            return  # the fp16 path's warm-up drives the kept optimizer as it drove apex's
        if not all(scheduled):
            raise Refuse(f"the fp32 path builds `{self.opt}` with a schedule at line "
                         f"{self.fp32_optimizer[scheduled.index(True)].lineno} and without one at line "
                         f"{self.fp32_optimizer[scheduled.index(False)].lineno}: whether the fp16 path's own warm-up "
                         "must stay differs between them; migrate it by hand")
        # where the warm-up may be: the maker, the functions handed the optimizer, the classes that keep it
        units = [(self.m, self.unit, {flag}, self.opt)]
        units += [(f.module, f.node, {flag}, param) for f, param in self.callees.values()
                  if id(f.cls) not in self.holders]
        units += [(h.module, h.cls, {flag, h.flag} - {None}, h.opt) for h in self.holders.values()]
        for m, unit, flags, opt in units:
            self._warmup_in(m, unit, flags, opt)

    def _defaults_go(self, outer) -> None:
        """``scheduler = None`` right above ``if fp16: ... else: scheduler = LambdaLR(...)``: the else
        now runs on both paths and sets it again at once, so the default is dead and goes."""
        sets = {dotted(t) for s in outer.orelse if isinstance(s, ast.Assign) for t in s.targets} - {None}
        _, _, block = block_of(outer)
        at = next(i for i, s in enumerate(block) if s is outer)
        for st in reversed(block[:at]):
            if not (isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name)
                    and isinstance(st.value, ast.Constant)):
                return
            name = st.targets[0].id
            if name not in sets:
                return
            first = next(s for s in outer.orelse if isinstance(s, ast.Assign) and
                         any(dotted(t) == name for t in s.targets))
            upto = outer.orelse[:outer.orelse.index(first) + 1]
            if any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
                   for s in upto for n in ast.walk(s)):
                return  # the else reads the default before it sets it
            self.fc(self.m).remove(st)
            sets.discard(name)

    def _schedules(self, st) -> bool:
        """``scheduler = WarmupLinearSchedule(optimizer, ...)``, ``LambdaLR(optimizer, ...)``,
        ``get_linear_schedule_with_warmup(optimizer, ...)``: a schedule object made of the optimizer."""
        if not (isinstance(st, ast.Assign) and isinstance(st.value, ast.Call)) or \
                any(dotted(t) == self.opt for t in st.targets):
            return False
        call = st.value
        first = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "optimizer"), None)
        name = (dotted(call.func) or "").rsplit(".", 1)[-1]
        return dotted(first) == self.opt and bool(SCHEDULE_NAME.search(name))

    def _warmup_in(self, m, unit, flags: Set[str], opt: str) -> None:
        for n in walk(unit, into_functions=unit is not self.unit):
            if not (isinstance(n, ast.If) and m.src.code(n.test) in flags):
                continue
            writes = [x for x in walk(n) if isinstance(x, ast.Subscript) and isinstance(x.ctx, ast.Store)
                      and string_value(x.slice) == "lr"]
            if not writes:
                continue
            loops = [x for x in n.body if isinstance(x, ast.For) and dotted(x.iter) == f"{opt}.param_groups"]
            made = {t.id for x in n.body if isinstance(x, ast.Assign) for t in x.targets if isinstance(t, ast.Name)}
            others = [x for x in n.body if not isinstance(x, (ast.For, ast.Assign)) and not _of_the_warmup(x, made)]
            if loops and not others and not n.orelse:
                self.fc(m).remove(n, obsolete=True)
                self.notes.add("the warm-up the fp16 path wrote into param_groups goes: the optimizer both paths "
                               "use now schedules itself")
                self._helpers_go(n, m)
                if unit is self.unit:
                    self._counters_go(n)
                continue
            # a warm-up the plan cannot take out would run on top of the kept optimizer's own
            raise Refuse(f"the fp16 path sets the learning rate at line {writes[0].lineno} and the fp32 optimizer "
                         "it now uses schedules itself: the warm-up would apply twice; migrate it by hand")


def _of_the_warmup(st, made: Set[str]) -> bool:
    """A statement of the fp16 path's warm-up block that goes with it: a guard on the rate it
    computed (``if lr_this_step < 0: lr_this_step = 1e-8``), or a log of that rate
    (``tb_logger.add_scalar('lr', lr_this_step, step)``, ``logger.info(...)``)."""
    if isinstance(st, ast.If) and not st.orelse and all(
            isinstance(n, ast.Constant) or (isinstance(n, ast.Name) and n.id in made) or not isinstance(n, (
                ast.Name, ast.Call, ast.Attribute, ast.Subscript)) for n in ast.walk(st.test)):
        return all(isinstance(x, ast.Assign) and all(isinstance(t, ast.Name) and t.id in made for t in x.targets)
                   and all(not isinstance(v, (ast.Call, ast.Attribute, ast.Subscript)) for v in ast.walk(x.value))
                   for x in st.body)
    if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
        f = dotted(st.value.func) or ""
        last = f.rsplit(".", 1)[-1]
        logs = last in ("add_scalar", "log", "info", "debug", "print") or f == "print"
        reads = {n.id for a in [*st.value.args, *(k.value for k in st.value.keywords)] for n in ast.walk(a)
                 if isinstance(n, ast.Name)}
        return logs and bool(reads & made) and not any(isinstance(n, ast.Call) for a in st.value.args
                                                        for n in ast.walk(a))
    return False


def _says_half(st) -> List[ast.stmt]:
    """The statements beside ``st`` (a ``model.half()`` that goes) that only log that the model
    was made half (``logger.info('in fp16, model.half() activated')``): stale once it is not."""
    _, _, block = block_of(st)
    out = []
    for x in block:
        if x is st or not is_log_call(x):
            continue
        texts = [c.value for a in x.value.args for c in ast.walk(a)
                 if isinstance(c, ast.Constant) and isinstance(c.value, str)]
        if texts and re.search(r"\bhalf\(\)|\.half\b", " ".join(texts)):
            out.append(x)
    return out
