"""What the apex rules share: finding apex uses by qualified name, and the import bookkeeping.

Not a rule itself (no registry line): each apex area is its own rule, built on ApexRule.
"""
from __future__ import annotations

import ast
from typing import Optional, Tuple

from ampfix.engine.tidy import Remover
from ampfix.model.analysis import STAR_EXPORTS, import_spec
from ampfix.model.apex import MARKERS, apex_name_of, replacement_for
from ampfix.model.semantic import base_name, walk
from ampfix.rule import Fix, ImportSpec, Rule


class ApexRule(Rule):
    """Reports each use of apex under ``prefix`` (the outermost name of a dotted chain, outside
    import statements); subclasses may offer a fix through :meth:`fix_for`."""

    prefix: str = "apex"
    #: prefixes handled by a more specific apex rule (for the catch-all)
    others: Tuple[str, ...] = ()
    triggers = MARKERS

    def apex_name(self, node) -> Optional[str]:
        q = apex_name_of(self.sem, self.sem.tree, node)
        if q is None or not (q == self.prefix or q.startswith(self.prefix + ".")):
            return None
        if any(q == o or q.startswith(o + ".") for o in self.others):
            return None
        return q

    def _check(self, node) -> None:
        if not isinstance(node.ctx, ast.Load):
            return
        parent = self.parent(node)
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return  # the outer attribute reports
        q = self.apex_name(node)
        if q is None:
            return
        call = parent if isinstance(parent, ast.Call) and parent.func is node else None
        plan = self.ctx.plan
        fix = plan.fix_at(node) if plan else None
        if fix is None:
            fix = self.fix_for(node, call, q)
        note = plan.note_at(node) if plan else None
        text = self.message(q, fix, call)
        if note and note.startswith("inference") and q == "apex.amp.initialize":
            text = f"`{q}` is NVIDIA apex; use " + self.spelled("a torch.autocast('cuda') region around what runs the model")
        if note:
            text += f" ({note})"
        self.report(node, text, fix)

    def message(self, qname: str, fix: Optional[Fix], call=None) -> str:
        return f"`{qname}` is NVIDIA apex; use {self.spelled(replacement_for(qname))}"

    def spelled(self, advice: str) -> str:
        """The advice in the spelling the fixes write: torch.cuda.amp below torch 2.3."""
        if self.settings.target != "torch.cuda.amp":
            return advice
        for new, old in (("torch.amp.GradScaler('cuda')", "torch.cuda.amp.GradScaler()"),
                         ("torch.autocast('cuda')", "torch.cuda.amp.autocast()"),
                         ("torch.amp.GradScaler", "torch.cuda.amp.GradScaler"), ("torch.amp", "torch.cuda.amp")):
            advice = advice.replace(new, old)
        return advice

    def fix_for(self, node, call, qname: str) -> Optional[Fix]:
        return None

    def import_edits(self, node):
        """(add, remove) ImportSpecs: add ``import torch``, drop the apex import if it ends unused."""
        base = base_name(node)
        spec = import_spec(self.sem, base) if base is not None else None
        removes = [spec] if spec is not None and spec.module.split(".")[0] == "apex" else []
        plan = self.ctx.plan
        exported = set((plan.facts.get("apex-exported") or "").split(",")) if plan else set()
        if base is not None and base.id in exported:
            removes = []  # another module imports the name from this one: its binding stays
        return [ImportSpec("torch")], removes

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        """``from apex.X import *`` that nothing uses any more (its uses were rewritten) goes:
        left behind it would fail where apex is not installed."""
        if not any(a.name == "*" for a in node.names) or node.level or node.module != self.prefix:
            return
        exports = STAR_EXPORTS.get(self.prefix, ())
        if not exports:
            return
        for n in walk(self.module, into_functions=True):
            if isinstance(n, ast.Name) and n.id in exports and isinstance(n.ctx, ast.Load):
                if any(b.node is node for b in self.sem.bindings_of(n)):
                    return
        self.report(node, f"`from {self.prefix} import *` is NVIDIA apex, and nothing in this module uses it",
                    Fix(f"remove the unused `from {self.prefix} import *`",
                        Remover(self.src, self.sem, self.edits).remove([node])))

    def visit_Module(self, node: ast.Module) -> None:
        """Reports the migration planner makes itself (a file it edits where apex is not used:
        a caller that now passes the scaler); the apex rule of the migration's kind says them
        (``says_plan_reports``: the kinds it says), so selecting it alone carries its migration."""
        plan = self.ctx.plan
        kinds = getattr(type(self), "says_plan_reports", ())
        if plan and kinds:
            # several rules of a kind may run on the file: the first says each report
            said = self.ctx.cached("apex: planner reports said", set)
            for i, r in enumerate(plan.reports):
                if r.kind in kinds and i not in said:
                    said.add(i)
                    self.report_at(r.line, r.col, r.end_line, r.end_col, r.message, r.fix)

    def visit_Name(self, node: ast.Name) -> None:
        self._check(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._check(node)
