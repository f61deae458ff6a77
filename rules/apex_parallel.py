import ast

from typing import Optional

from ampfix.engine.noqa import comment_of
from ampfix.migration.parallel import KEPT_KEYWORDS, apex_ddp_comment, ddp_uses, decide, plan as ddp_plan
from ampfix.model.analysis import has_star, import_spec, kwargs, number_value
from ampfix.model.apex import APEX_DDP as DDP, apex_ddp_call_changes, maybe_not_apex
from ampfix.model.semantic import block_of, statement_of
from ampfix.rule import Fix, Invalid, Valid
from ampfix.rules._apex import ApexRule

#: apex DDP keyword -> what happens to it
DDP_KEEP = {"delay_allreduce": "dropped: torch DDP overlaps all-reduce in buckets and gives the same gradients",
            "gradient_average": "dropped: torch DDP always averages",
            "gradient_predivide_factor": ("dropped: it only split apex's averaging around the all-reduce, against "
                                          "float16 overflow; torch DDP averages the gradients itself")}


class ApexParallel(ApexRule):
    """
    ## What it does
    Reports `apex.parallel`: `DistributedDataParallel`, `convert_syncbn_model`,
    `SyncBatchNorm`, and rewrites them to `torch.nn.parallel.DistributedDataParallel`,
    `torch.nn.SyncBatchNorm.convert_sync_batchnorm` and `torch.nn.SyncBatchNorm`.

    Arguments: `delay_allreduce` and `gradient_average=True` are dropped (torch DDP averages and
    its bucketed overlap gives the same gradients); `message_size` (elements) becomes
    `bucket_cap_mb` (4 bytes an element); `process_group` is kept.  Any other argument
    (`allreduce_always_fp32`, `gradient_predivide_factor`, `channel_last`, `fuse_relu`...) has
    no torch equivalent: the call is reported and left for a person.

    The wrapper's type changes, so a project is fixed as a whole (a module on its own when it is
    checked alone): `isinstance(m, DDP)` (and any other reference to apex's class, in any module)
    becomes torch's class with the calls, and nothing is fixed when one call cannot be, or when a
    method only apex's DDP has is called (`disable_allreduce()` / `enable_allreduce()` around
    gradient accumulation: torch's DDP skips the all-reduce with `with model.no_sync():`
    instead).

    ## Why is this bad?
    apex's DDP predates torch's and is unmaintained; torch's overlaps communication with
    backward, supports `no_sync()`, static graphs and gradient-as-bucket views.

    ## Example
    ```python
    from apex.parallel import DistributedDataParallel as DDP, convert_syncbn_model
    model = convert_syncbn_model(model)
    model = DDP(model, delay_allreduce=True)
    ```

    ## Use instead
    ```python
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    ```
    """

    code = "AMP103"
    name = "apex-parallel"
    summary = "apex.parallel (DDP, SyncBatchNorm): use torch.nn.parallel / torch.nn.SyncBatchNorm"
    fix_kind = "safe"
    since = "1.1"
    prefix = "apex.parallel"
    planner = staticmethod(ddp_plan)

    VALID = [Valid("import torch\nm = torch.nn.parallel.DistributedDataParallel(m)\n")]
    INVALID = [
        Invalid(
            # a star import: the names it binds are found, and it goes with the last of them
            """
            import torch
            from apex.parallel import *

            model = DistributedDataParallel(model)
            """,
            expected="""
            import torch

            model = torch.nn.parallel.DistributedDataParallel(model)
            """,
        ),
        Invalid(
            """
            import torch
            from apex.parallel import DistributedDataParallel as DDP, convert_syncbn_model

            model = convert_syncbn_model(model)
            model = DDP(model, delay_allreduce=True)
            """,
            count=2,
            expected="""
            import torch

            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
            model = torch.nn.parallel.DistributedDataParallel(model)
            """,
        ),
        Invalid(
            """
            import apex
            bn = apex.parallel.SyncBatchNorm(64, eps=1e-3)
            m = apex.parallel.DistributedDataParallel(m, message_size=2500000)
            """,
            count=2,
            expected="""
            import torch

            bn = torch.nn.SyncBatchNorm(64, eps=1e-3)
            m = torch.nn.parallel.DistributedDataParallel(m, bucket_cap_mb=9.5367431640625)
            """,
        ),
        Invalid(
            # ViT-pytorch's call
            """
            import torch
            from apex.parallel import DistributedDataParallel as DDP
            model = DDP(model, message_size=250000000, gradient_predivide_factor=get_world_size())
            """,
            expected="""
            import torch
            model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=953.67431640625)
            """,
        ),
        Invalid(
            # the dropped argument's own local goes with it (imaginaire's trainer utils)
            """
            import torch
            import apex
            def wrap(model, cfg):
                delay_allreduce = cfg.delay_allreduce
                return apex.parallel.DistributedDataParallel(model, delay_allreduce=delay_allreduce)
            """,
            expected="""
            import torch
            def wrap(model, cfg):
                return torch.nn.parallel.DistributedDataParallel(model)
            """,
        ),
        Invalid(
            # the comment that described apex's wrapper goes with it (apex's imagenet example and
            # its copies); the one above it, about something else, stays
            """
            import torch
            import apex
            if distributed:
                # wrap the model for distributed training
                model.cuda()
                # By default, apex.parallel.DistributedDataParallel overlaps communication with
                # computation in the backward pass.
                # delay_allreduce delays all communication to the end of the backward pass.
                model = apex.parallel.DistributedDataParallel(model, delay_allreduce=True)
            """,
            expected="""
            import torch
            if distributed:
                # wrap the model for distributed training
                model.cuda()
                model = torch.nn.parallel.DistributedDataParallel(model)
            """,
        ),
        Invalid("from apex.parallel import DistributedDataParallel as DDP\nisinstance(m, DDP)\n",
                message="a reference, not a call"),
        Invalid(
            # the wrapper is tested by type in the module that makes it: both change together
            """
            import torch
            from apex.parallel import DistributedDataParallel as DDP
            model = DDP(model)
            if isinstance(model, DDP):
                inner = model.module
            """,
            count=2,
            expected="""
            import torch
            model = torch.nn.parallel.DistributedDataParallel(model)
            if isinstance(model, torch.nn.parallel.DistributedDataParallel):
                inner = model.module
            """,
        ),
        Invalid(
            # apex DDP's own switch for gradient accumulation: torch's DDP has none
            """
            from apex.parallel import DistributedDataParallel as DDP
            model = DDP(model)
            for step, batch in enumerate(loader):
                model.disable_allreduce()
                if (step + 1) % 4 == 0:
                    model.enable_allreduce()
                model(batch).backward()
            """,
            message="`model.disable_allreduce()` at example.py line 4 is apex's DistributedDataParallel's own",
            expected="""
            from apex.parallel import DistributedDataParallel as DDP
            model = DDP(model)
            for step, batch in enumerate(loader):
                model.disable_allreduce()
                if (step + 1) % 4 == 0:
                    model.enable_allreduce()
                model(batch).backward()
            """,
        ),
        Invalid(
            # a subclass of apex's DDP is made with apex's arguments: it keeps its base
            """
            from apex.parallel import DistributedDataParallel as DDP

            class Wrapper(DDP):
                pass

            model = DDP(model)
            """,
            count=2,
            message="`Wrapper` subclasses apex's DistributedDataParallel",
            expected="""
            from apex.parallel import DistributedDataParallel as DDP

            class Wrapper(DDP):
                pass

            model = DDP(model)
            """,
        ),
        Invalid(
            # one call that cannot change keeps the module's reference to apex's class
            """
            import apex
            from apex.parallel import DistributedDataParallel as DDP
            a = DDP(a)
            b = apex.parallel.DistributedDataParallel(b, allreduce_always_fp32=True)
            ok = isinstance(a, DDP)
            """,
            count=3,
            message="left with",
            expected="""
            import apex
            from apex.parallel import DistributedDataParallel as DDP
            a = DDP(a)
            b = apex.parallel.DistributedDataParallel(b, allreduce_always_fp32=True)
            ok = isinstance(a, DDP)
            """,
        ),
        Invalid("import apex\nm = apex.parallel.DistributedDataParallel(m, allreduce_always_fp32=True)\n",
                message="`allreduce_always_fp32` has no torch equivalent",
                expected="import apex\nm = apex.parallel.DistributedDataParallel(m, allreduce_always_fp32=True)\n"),
    ]

    def message(self, qname, fix, call=None):
        text = super().message(qname, fix, call)
        own = call is not None and self._fix_call(call.func, call, qname) is None
        why = self._module_refusal() if qname == DDP and fix is None and not own else None
        if why:
            text += f" ({why})"
        elif call is None and fix is None:
            text += " (a reference, not a call: rename it by hand)"
        elif fix is None and qname.split(".")[-1] in ("DistributedDataParallel", "SyncBatchNorm", "convert_syncbn_model"):
            known = {*DDP_KEEP, "message_size", "module", "process_group", "gradient_average"}
            odd = [k.arg for k in call.keywords if k.arg is not None and k.arg not in known]
            what = f"`{odd[0]}` has" if odd else "an argument has"
            text += f" ({what} no torch equivalent: left for a person)"
        return text

    def _fact(self) -> Optional[str]:
        """``keep <why>``, ``rename`` or None for this file's apex DDP: the project's plan decides
        (ampfix.migration.parallel); a file checked on its own decides alone, the same way."""
        plan = self.ctx.plan
        if plan and "apex-ddp" in plan.facts:
            return plan.facts["apex-ddp"]
        key = ("apex-ddp", id(self.module))
        if key not in self.ctx._cache:
            self.ctx._cache[key] = decide(ddp_uses(self.src.path, self.sem, self.module, self.src.code))
        return self.ctx._cache[key]

    def _module_refusal(self) -> Optional[str]:
        fact = self._fact()
        return fact[len("keep "):] if fact and fact.startswith("keep ") else None

    def fix_for(self, node, call, qname):
        if qname == DDP and self._module_refusal():
            return None
        if call is None and qname == DDP:
            if maybe_not_apex(self.sem, node):
                return None
            # a type test of the wrapper the project makes: torch's class, with the calls
            if self._fact() != "rename":
                return None
            add, remove = self.import_edits(node)
            func = "torch.nn.parallel.DistributedDataParallel"
            return Fix(f"apex.parallel.DistributedDataParallel -> {func} (the wrappers are torch's now)",
                       [self.edits.replace(node, func)], add_imports=add, remove_imports=remove)
        return self._fix_call(node, call, qname)

    def _dropped_locals(self, call, values) -> list:
        """``delay_allreduce = cfg.trainer.delay_allreduce`` just before the call, read by the
        dropped argument alone (imaginaire's trainer utils): the assignment goes with it."""
        out = []
        st = next((a for a in self.ancestors(call) if isinstance(a, ast.stmt)), None)
        _, _, block = block_of(st) if st is not None else (None, None, [])
        i = next((k for k, x in enumerate(block) if x is st), 0)
        prev = block[i - 1] if i > 0 else None
        for v in values:
            if not (isinstance(v, ast.Name) and isinstance(prev, ast.Assign) and len(prev.targets) == 1
                    and isinstance(prev.targets[0], ast.Name) and prev.targets[0].id == v.id
                    and isinstance(prev.value, (ast.Name, ast.Attribute, ast.Constant))):
                continue
            binds = self.sem.bindings_of(v)
            reads = [n for n in ast.walk(self.module) if isinstance(n, ast.Name) and n.id == v.id
                     and isinstance(n.ctx, ast.Load) and any(b in self.sem.bindings_of(n) for b in binds)]
            if len(binds) == 1 and reads == [v]:
                out.append(self.edits.remove_statement(prev))
        return out

    def _dropped_imports(self, call) -> list:
        """ImportSpecs of project names read only by the arguments the rewrite drops, that the
        project's plan says no other module imports from this one (its fact
        ``apex-ddp-dropped-imports``); they go where nothing reads them after the fix."""
        plan = self.ctx.plan
        may = set((plan.facts.get("apex-ddp-dropped-imports") or "").split(",")) if plan else set()
        out = []
        for kw in call.keywords:
            if kw.arg is None or kw.arg in KEPT_KEYWORDS:
                continue
            for n in ast.walk(kw.value):
                if isinstance(n, ast.Name) and n.id in may:
                    spec = import_spec(self.sem, n)
                    if spec is not None and spec.obj is not None:
                        out.append(spec)
        return out

    def _comment_on_apex_ddp(self, call) -> list:
        """The comment block right above the statement that wraps the model, when it describes
        apex's DDP (its overlap, ``delay_allreduce``): it goes with the wrapper."""
        st = statement_of(call)
        if st is None:
            return []
        described = [st]
        # apex's imagenet example and its copies: `# For distributed training, wrap the model with
        # apex.parallel.DistributedDataParallel. This must be done AFTER the call to amp.initialize ...`
        # above `if args.distributed:`, whose body is the wrapping
        owner = getattr(st, "_p", None)
        if isinstance(owner, ast.If) and owner.body and owner.body[0] is st and \
                self.src.line_text(owner.lineno).lstrip().startswith("if"):
            described.append(owner)
        out = []
        for x in described:
            span = apex_ddp_comment(self.src, x)
            if span is not None:
                first, last = span
                out.append(self.edits.replace_range(self.src.starts[first - 1], self.src.line_end(last), ""))
        return out

    def _trailing_apex_comment(self, call) -> list:
        """``model = apex.parallel.convert_syncbn_model(model)  # apex's SyncBatchNorm``: once the
        call is torch's, the comment at the end of its line speaks of what is gone."""
        st = statement_of(call)
        if st is None:
            return []
        no = st.end_lineno
        line = self.src.line_text(no)
        comment = comment_of(line, False)
        if comment is None or "apex" not in comment.lower() or "noqa" in comment.lower():
            return []
        cut = len(line) - len(comment)
        cut -= len(line[:cut]) - len(line[:cut].rstrip())
        at = self.src.starts[no - 1]
        return [self.edits.replace_range(at + cut, at + len(line), "")]

    def _fix_call(self, node, call, qname):
        if call is None or has_star(call):
            return None
        kind = qname.split(".")[-1]
        add, remove = self.import_edits(node)
        kws = kwargs(call)
        pos = call.args
        notes = []
        if kind == "DistributedDataParallel":
            if not apex_ddp_call_changes(call):
                return None
            args = [self.code_of(pos[0] if pos else kws["module"])]
            if "message_size" in kws:
                ms = number_value(kws["message_size"])
                args.append(f"bucket_cap_mb={float(ms) * 4 / 2 ** 20!r}")
            notes = [f"{k} {v}" for k, v in DDP_KEEP.items() if k in kws]
            func = "torch.nn.parallel.DistributedDataParallel"
        elif kind == "convert_syncbn_model":
            if len(pos) != 1 or set(kws) - {"process_group"}:
                return None
            args = None
            func = "torch.nn.SyncBatchNorm.convert_sync_batchnorm"
        elif kind == "SyncBatchNorm":
            if set(kws) & {"channel_last", "fuse_relu"} or len(pos) > 6:
                return None
            args = None
            func = "torch.nn.SyncBatchNorm"
        else:
            return None
        if args is None:
            edits = [self.edits.replace(call.func, func)]
        else:
            edits = [self.edits.replace(call, f"{func}({', '.join(args)})")]
            edits += self._dropped_locals(call, [v for k, v in kws.items() if k in DDP_KEEP])
            remove = [*remove, *self._dropped_imports(call)]
            edits += self._comment_on_apex_ddp(call)
        edits += self._trailing_apex_comment(call)
        desc = f"apex.parallel.{kind} -> {func}" + (f" ({'; '.join(notes)})" if notes else "")
        return Fix(desc, edits, add_imports=add, remove_imports=remove)
