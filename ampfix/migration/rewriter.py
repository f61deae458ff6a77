"""What the planners of one group share (:class:`Rewriter`: regions, hoisting, guard collapsing)
and the small helpers of the rewrites (names returned, parameters, substitution, folding)."""
from __future__ import annotations

import ast
import io
import tokenize
from typing import Dict, List, Optional, Tuple

from ampfix.model.analysis import arg, arg_node, autocast_call, autocast_dtype, autocast_enabled_literal, is_const
from ampfix.migration.groups import FileChanges, Group, Refuse
from ampfix.migration.spell import bf16
from ampfix.migration.flow import ancestors_stmts, assigned, guards, loss_call, read, same_dtype_root, stmt_of
from ampfix.model.semantic import block_of, dotted, param_defaults, walk
from ampfix.rule import ImportSpec


class Rewriter:
    """What the planners of one group share: regions, hoisting, guard collapsing."""

    def __init__(self, project, g: Group) -> None:
        self.p = project
        self.s = project.settings
        self.g = g
        self.regions: Dict[int, Tuple[object, list, list]] = {}
        self._floated: set = set()  # the ids of the `.numpy()` calls given a `.float()`

    def fc(self, module) -> FileChanges:
        return self.g.file(module)

    def _add_region(self, module, block, i: int, j: int, header: str, evaluation: bool = False) -> None:
        """Statements ``block[i..j]`` run under ``header``; ``evaluation``: they only evaluate (no
        step can run between them), so a region right after another with the same header joins it."""
        entry = self.regions.setdefault(id(block), (module, block, []))
        entry[2].append((i, j, header, evaluation))

    def _finish_regions(self) -> None:
        for module, block, ranges in self.regions.values():
            ranges = sorted(set(ranges))
            merged = []
            for i, j, h, ev in ranges:
                # `with autocast(): a = evaluate(x)` / `with autocast(): b = evaluate(y)` is one
                # region; regions that may hold a step stay apart: autocast's cache of cast weights
                # lasts until its region ends, and a step between two forwards would make it stale
                if merged and (i <= merged[-1][1] or (ev and merged[-1][3] and h == merged[-1][2]
                                                      and _only_plain_between(block, merged[-1][1], i, bf16(self.s)))):
                    pi, pj, ph, pev = merged[-1]
                    merged[-1] = (pi, max(pj, j), ph, pev and ev)
                else:
                    merged.append((i, j, h, ev))
            fc = self.fc(module)
            for i, j, h, _ in merged:
                if bf16(self.s):
                    self._numpy_of_bfloat16(module, block, i, j)
                if self._joins_autocast(module, block, i, j, h):
                    continue
                inner = self._no_grad_with(block[i]) if i == j else None
                if inner is not None and id(inner) not in fc.touched:
                    # `for batch in loader: with torch.no_grad(): ...`: autocast joins the `with`
                    # that is already there (one line, not the loop re-indented)
                    last = inner.items[-1].context_expr
                    fc.edits.append(insert_edit(module.src.offset(last.end_lineno, last.end_col_offset), f", {h}"))
                else:
                    fc.wrap(block[i], block[j], f"with {h}")

    def _numpy_of_bfloat16(self, module, block, i: int, j: int) -> None:
        """With bfloat16, the region's outputs (``logits``) are bfloat16 tensors, and numpy has no
        bfloat16: ``logits.detach().cpu().numpy()`` after the region would fail.  Refused, with the
        line, where such a call takes something the region computed through calls that keep its
        dtype (an ``argmax`` or a ``.float()`` on the way makes it another dtype: it passes).  A name
        proved floating before the call (a loss backwarded, ``return total_loss.detach().cpu().numpy()``
        after ``total_loss.backward()``; a loss's input, ``logits`` after ``loss_fct(logits, y)``)
        gets ``.float()`` before ``.numpy()``: a no-op on float32, float32 where it was bfloat16."""
        made, losses = set(), set()
        for st in [x for s in block[i:j + 1] for x in [s, *walk(s)] if isinstance(x, (ast.Assign, ast.AugAssign))]:
            got = assigned(st)
            if loss_call(st.value) or (got <= losses and read(st.value) & losses):
                losses |= got  # autocast computes losses in float32 (and `loss = loss / n` keeps it)
            else:
                made |= got
        made -= losses
        if not made:
            return
        unit = next((a for a in ancestors_stmts(block[i]) if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))),
                    module.tree)
        end = block[j].end_lineno
        rebound = []  # assignments after the region from something else
        for n in walk(unit):  # in line order: what is computed from an output joins it first
            if isinstance(n, ast.Assign) and n.lineno > end:
                if same_dtype_root(n.value) in made:
                    made |= assigned(n)
                elif not read(n.value) & made:
                    # from nothing the region made (`logits = model(x)` again, outside it); a value
                    # computed from one (`prediction = torch.sigmoid(prediction)`) may keep its dtype
                    rebound.append(n)
            elif isinstance(n, ast.Call) and n.lineno > end and isinstance(n.func, ast.Attribute) and \
                    n.func.attr == "numpy" and same_dtype_root(n.func.value) in made:
                if _rebound_before(rebound, same_dtype_root(n.func.value), n):
                    continue  # `logits = model(x)` again, outside the region, on every way here
                if _floating_before(unit, same_dtype_root(n.func.value), n):
                    if id(n) not in self._floated:
                        self._floated.add(id(n))
                        at = module.src.offset(n.func.value.end_lineno, n.func.value.end_col_offset)
                        self.fc(module).edits.append(insert_edit(at, ".float()"))
                    continue
                raise Refuse(f"with bfloat16, `{module.src.code(n)}` at line {n.lineno} hands the forward's "
                             "output to numpy, which has no bfloat16: convert it first (`.float()`) by hand, or "
                             "migrate with float16")

    def _joins_autocast(self, module, block, i: int, j: int, header: str) -> bool:
        """The region's statements already run in a native ``torch.autocast`` of their own (a
        program with both paths, ``with torch.cuda.amp.autocast(enabled=self.use_torch_amp):``): a
        region around it would be switched off inside whenever that one is off, apex's path among
        them.  Where the region is that ``with`` alone, apex's condition joins its ``enabled=`` (or
        nothing is needed: it is always on); where it lies deeper, the planner refuses."""
        fc = self.fc(module)
        sem = module.sem
        found = [(w, c) for k in range(i, j + 1) for w in [block[k], *walk(block[k])]
                 if isinstance(w, (ast.With, ast.AsyncWith)) and id(w) not in fc.touched
                 for c in (autocast_call(sem, it) for it in w.items) if c is not None]
        if not found:
            return False
        want = ("cuda", "bfloat16" if bf16(self.s) else "float16")
        for w, call in found:
            if _autocast_kind(sem, call) != want:
                raise Refuse(f"line {w.lineno} runs in a torch.autocast of another dtype or device already: "
                             "migrate it by hand")
        switched = [w for w, call in found if autocast_enabled_literal(call) is not True]
        if not (i == j and len(found) == 1 and found[0][0] is block[i] and len(block[i].items) == 1):
            # one in the other branch of an apex test (`if with_apex: <forward> else: with
            # autocast(enabled=...): <forward>`) does not run on apex's path
            switched = [w for w in switched if not _off_the_apex_path(w, block[i:j + 1], module.src.code)]
            if switched:
                raise Refuse(f"line {switched[0].lineno} runs in a torch.autocast that is off on some paths, "
                             "apex's among them: join apex's condition to its `enabled=` by hand")
            return False
        call = found[0][1]
        if not switched:
            return True  # always on already
        old = arg_node(call, "enabled")
        new = arg(ast.parse(header, mode="eval").body, "enabled")
        if not isinstance(old, ast.keyword):
            raise Refuse(f"line {found[0][0].lineno} runs in a torch.autocast whose `enabled` is not a keyword: "
                         "join apex's condition to it by hand")
        if new is not None:
            code = module.src.code
            fc.replace(old.value, f"{_paren(code(old.value))} or {_paren(ast.unparse(new))}")
        else:
            fc.edits.append(fc.b.remove_arg(call, old))
        return True

    def _imports_that_went(self) -> None:
        """An import read only by code the migration removed or rewrote (``from optimization
        import BertAdam, warmup_linear`` when the fp16 warm-up went; ``import warnings`` read only
        by the apex import's ``except``; ``get_world_size`` read only by apex DDP's options) goes
        too when nothing reads it after (the removal is conditional).  Only where dropping it
        cannot skip a module's side effects: one name among others the statement keeps, a
        standard-library module, or a project module whose top level only defines and imports."""
        for fc in list(self.g.changes.values()):
            m = fc.module
            gone = fc.touched | {id(x) for x in fc.removed}
            read = {x.id for n in walk(m.tree, into_functions=True) if id(n) in gone
                    for x in ast.walk(n) if isinstance(x, ast.Name) and isinstance(x.ctx, ast.Load)}
            if not read:
                continue
            for stmt in walk(m.tree):
                if not isinstance(stmt, (ast.Import, ast.ImportFrom)) or id(stmt) in gone:
                    continue
                base = stmt.module if isinstance(stmt, ast.ImportFrom) else None
                for alias in stmt.names:
                    bound = (alias.asname or alias.name).split(".")[0]
                    if bound not in read or alias.name == "*":
                        continue
                    full = ("." * stmt.level + (base or "")) if isinstance(stmt, ast.ImportFrom) else alias.name
                    if "apex" in full.split("."):
                        continue
                    if len(stmt.names) == 1 and not self.p.import_is_quiet(full) and \
                            not _imported_again(m.tree, stmt, full, gone):
                        continue
                    if m.path.replace("\\", "/").endswith("__init__.py") or self.p.imported_from(m, bound):
                        continue  # another module may take the name from this one
                    if isinstance(stmt, ast.ImportFrom):
                        fc.removes.append(ImportSpec(full, alias.name, alias.asname))
                    else:
                        fc.removes.append(ImportSpec(alias.name, None, alias.asname))

    @staticmethod
    def _no_grad_with(stmt):
        """The ``with torch.no_grad():`` that is all of ``stmt`` (or of the loops it is the whole
        body of), when it binds nothing; None otherwise."""
        while isinstance(stmt, (ast.For, ast.While)) and len(stmt.body) == 1 and not stmt.orelse:
            stmt = stmt.body[0]
        if isinstance(stmt, ast.With) and all(
                isinstance(it.context_expr, ast.Call) and it.optional_vars is None and not it.context_expr.args
                and (dotted(it.context_expr.func) or "").split(".")[-1] in ("no_grad", "inference_mode")
                for it in stmt.items):
            return stmt
        return None

    def _under_autocast(self, stmt) -> bool:
        from ampfix.model.analysis import enclosing_autocast

        return enclosing_autocast(self._sem_of(stmt), stmt) is not None

    def _module_of(self, node):
        for m in self.p.modules.values():
            if m.src.tree is not None and in_tree(node, m.tree):
                return m
        raise Refuse("internal: node without a module")

    def _sem_of(self, node):
        return self._module_of(node).sem

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



def returns_in(node) -> List[ast.Return]:
    """The returns of ``node``'s own function (not of a def or lambda nested in it)."""
    return [n for n in (node, *walk(node)) if isinstance(n, ast.Return)]


def returns_after(f, stmt) -> List[ast.Return]:
    """The returns a path through ``stmt`` can reach: those after it in its block and in the
    blocks around it, up to the first that ends every path (a return of the block itself).  A
    return only the paths without ``stmt`` reach (``return model`` after an ``if`` whose body
    returned) is not one.  Where a path from ``stmt`` may fall off the function's end, every
    return of the function."""
    found: List[ast.Return] = []
    cur = stmt
    while cur is not None and cur is not f.node:
        owner, field, seq = block_of(cur)
        if owner is None or not field:
            break
        if isinstance(owner, (ast.For, ast.AsyncFor, ast.While)):
            # the loop runs its body again after stmt: every return in it is reachable
            found.extend(returns_in(owner))
        else:
            if isinstance(owner, ast.Try) or type(owner).__name__ == "TryStar":
                # an exception after stmt goes to a handler; else and finally run after it too
                for x in list(owner.handlers) + list(owner.orelse) + list(owner.finalbody):
                    if x is not cur:
                        found.extend(returns_in(x))
            i = next(j for j, x in enumerate(seq) if x is cur)
            for later in seq[i + 1:]:
                if not isinstance(later, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    found.extend(returns_in(later))
                if isinstance(later, (ast.Return, ast.Raise)):
                    return found
        if owner is f.node:
            break
        cur = owner
    return returns_in(f.node)


def _imported_again(tree, stmt, full: str, gone) -> bool:
    """Another import statement of the module that stays, at module level, imports ``full`` (or a
    module inside it: ``from transformers import GPT2LMHeadModel`` beside ``import transformers``):
    it is imported anyway, so dropping ``stmt`` skips nothing it does."""
    if full.startswith("."):
        return False

    def covers(name: str) -> bool:  # importing `name` imports `full` (and its parents) too
        return name == full or name.startswith(full + ".")

    for x in tree.body:
        if x is stmt or id(x) in gone:
            continue
        if isinstance(x, ast.ImportFrom) and not x.level and covers(x.module or ""):
            return True
        if isinstance(x, ast.Import) and any(covers(a.name) for a in x.names):
            return True
    return False


def returned_after(f, stmt) -> List[str]:
    """The names that the returns a path through ``stmt`` can reach (:func:`returns_after`) give
    back, the same at each (``return model, flow_net, optimizers`` at the end of the ``if`` that
    holds the seed); [] where they differ or one is not a name."""
    names: Optional[List[str]] = None
    for r in returns_after(f, stmt):
        v = r.value
        got = [dotted(e) for e in (v.elts if isinstance(v, (ast.Tuple, ast.List)) else [v])] if v is not None else []
        if None in got or (names is not None and got != names):
            return []
        names = got
    return names or []


def none_tests(stmt, f) -> List[Tuple[ast.If, str, bool]]:
    """The ``if`` statements around ``stmt`` in ``f`` that test a parameter against None
    (``if optimizer is None:``), each with the parameter and whether ``stmt`` runs where it is
    None."""
    params = set(f.positional) | set(f.kwonly)
    out = []
    for a in ancestors_stmts(stmt, f.node):
        if not (isinstance(a, ast.If) and isinstance(a.test, ast.Compare) and len(a.test.ops) == 1
                and isinstance(a.test.ops[0], (ast.Is, ast.IsNot)) and isinstance(a.test.left, ast.Name)
                and a.test.left.id in params and is_const(a.test.comparators[0], None)):
            continue
        in_body = any(x is stmt or any(y is stmt for y in walk(x)) for x in a.body)
        out.append((a, a.test.left.id, in_body == isinstance(a.test.ops[0], ast.Is)))
    return out


def param_of(s, f, keyword: str, position: int) -> Optional[str]:
    """The parameter of ``f`` that the seed's argument ``keyword``/``position`` reads, if it is one."""
    a = arg(s.call, keyword, position)
    if isinstance(a, ast.Name) and (a.id in f.positional or a.id in f.kwonly):
        return a.id
    return None


def _same_global(name: str, orig, cs) -> bool:
    """``name``, read in the seed's function, is a global of its module, and the call site, in
    that module, reads the same global (``if cfg.amp:`` around the seed, ``cfg`` imported at the
    module's top): the caller can say it as written."""
    if cs.module is not orig.module:
        return False
    sem = orig.module.sem
    inner = sem.scope_for(orig.func.node)
    if inner is None or sem.resolve(name, inner) is not sem.module_scope:
        return False
    at = sem.scope_for(cs.caller.node) if cs.caller is not None else sem.module_scope
    return at is not None and sem.resolve(name, at) is sem.module_scope


def constant_local(f, name: str, before: ast.stmt) -> Optional[ast.Constant]:
    """``fp16_opt_level = 'O1'`` in ``f`` before ``before``, in its block or a block around it: the
    constant a local name is bound to, where that one plain assignment is the only binding of the
    name in ``f`` (not a parameter, not global or nonlocal, not imported)."""
    if name in f.positional or name in f.kwonly or name in (f.node.args.vararg and f.node.args.vararg.arg,
                                                            f.node.args.kwarg and f.node.args.kwarg.arg):
        return None
    stores = []
    for n in walk(f.node, into_functions=True):
        if isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load):
            stores.append(n)
        elif isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names:
            return None
        elif isinstance(n, (ast.Import, ast.ImportFrom)) and name in {
                (a.asname or a.name).split(".")[0] for a in n.names}:
            return None
    if len(stores) != 1:
        return None
    st = getattr(stores[0], "_p", None)
    if not (isinstance(st, ast.Assign) and st.targets == [stores[0]] and isinstance(st.value, ast.Constant)
            and isinstance(st.value.value, (str, int, float, bool)) and st.lineno < before.lineno):
        return None
    _, _, block = block_of(st)
    if not any(x is before or any(x is a for a in ancestors_stmts(before, f.node)) for x in block):
        return None
    return st.value


#: calls a value chosen by a branch may make: they read their argument and nothing else
_PURE_CALLS = frozenset({"float", "int", "str", "bool"})


def branch_local(f, name: str, before: ast.stmt) -> Optional[Tuple[ast.IfExp, ast.If]]:
    """``if opt.loss_scale != 'dynamic': ls = float(opt.loss_scale) else: ls = 'dynamic'`` in ``f``
    before ``before``, in its block or a block around it, the name's only two bindings: the
    value as one expression (``float(opt.loss_scale) if opt.loss_scale != 'dynamic' else
    'dynamic'``), with the ``if``.  The test and both values read only names ``f`` never binds
    (its parameters as given, globals) and call only ``float``/``int``/``str``/``bool``: said at
    a caller, they mean there what they meant here."""
    if name in f.positional or name in f.kwonly:
        return None
    stores, bound = [], set()
    for n in walk(f.node, into_functions=True):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            bound.add(n.id)
            if n.id == name:
                stores.append(n)
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            bound.update(n.names)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in n.names)
    if len(stores) != 2:
        return None
    sts = [getattr(x, "_p", None) for x in stores]
    if not all(isinstance(st, ast.Assign) and st.targets == [x] for st, x in zip(sts, stores)):
        return None
    top = getattr(sts[0], "_p", None)
    if not (isinstance(top, ast.If) and top.body == [sts[0]] and top.orelse == [sts[1]]
            and top.end_lineno < before.lineno):
        return None
    _, _, block = block_of(top)
    if not any(x is before or any(x is a for a in ancestors_stmts(before, f.node)) for x in block):
        return None
    parts = (top.test, sts[0].value, sts[1].value)
    for e in parts:
        for n in ast.walk(e):
            if isinstance(n, ast.Call) and not (isinstance(n.func, ast.Name) and n.func.id in _PURE_CALLS):
                return None
            if isinstance(n, (ast.NamedExpr, ast.Await, ast.Lambda, ast.comprehension)):
                return None
            if isinstance(n, ast.Name) and n.id in bound:
                return None
    return ast.copy_location(ast.IfExp(test=top.test, body=sts[0].value, orelse=sts[1].value), top), top


def _tests_cuda(e) -> Optional[str]:
    """``'cuda' in device`` / ``device == 'cuda'`` / ``device.type == 'cuda'`` /
    ``str(device).startswith('cuda')``: the name whose device it tests, else None."""
    def name_of(x):
        if isinstance(x, ast.Attribute) and x.attr == "type":
            x = x.value
        if isinstance(x, ast.Call) and isinstance(x.func, ast.Name) and x.func.id == "str" and len(x.args) == 1:
            x = x.args[0]
        return x.id if isinstance(x, ast.Name) else None

    if isinstance(e, ast.Compare) and len(e.ops) == 1:
        left, right, op = e.left, e.comparators[0], e.ops[0]
        if isinstance(op, ast.In) and isinstance(left, ast.Constant) and left.value == "cuda":
            return name_of(right)
        if isinstance(op, ast.Eq):
            for a, b in ((left, right), (right, left)):
                if isinstance(b, ast.Constant) and b.value == "cuda":
                    return name_of(a)
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "startswith" and \
            len(e.args) == 1 and isinstance(e.args[0], ast.Constant) and e.args[0].value == "cuda":
        return name_of(e.func.value)
    return None


def _without_device_tests(body, f, orig, cs):
    """``fp16 and 'cuda' in device`` where ``device`` is a local of the setup its callers cannot
    see: a test that the device is CUDA, one of the conjuncts, says nothing to
    ``autocast("cuda")`` (CUDA's autocast leaves the CPU's operations as they are) nor to
    ``GradScaler("cuda")`` (it disables itself without CUDA): it goes."""
    def hidden(e) -> bool:
        name = _tests_cuda(e)
        return name is not None and name not in f.positional and name not in f.kwonly and \
            not _same_global(name, orig, cs)

    if isinstance(body, ast.Call) and isinstance(body.func, ast.Name) and body.func.id == "bool" and \
            len(body.args) == 1 and not body.keywords:
        body.args[0] = _without_device_tests(body.args[0], f, orig, cs)
        return body
    if hidden(body):
        return ast.copy_location(ast.Constant(True), body)
    if isinstance(body, ast.BoolOp) and isinstance(body.op, ast.And) and any(hidden(v) for v in body.values):
        vals = [v for v in body.values if not hidden(v)]
        return vals[0] if len(vals) == 1 else ast.copy_location(ast.BoolOp(op=ast.And(), values=vals), body)
    return body


def substitute(text: str, orig, cs) -> str:
    """An expression over the parameters of the seed's function, said with the call's arguments
    (or the parameters' defaults); a name that is neither refuses.  What nothing folds keeps the
    text as written, each parameter replaced by its argument's source (quotes and spacing kept)."""
    f = orig.func
    tree = ast.parse(text, mode="eval")
    tree.body = _without_device_tests(tree.body, f, orig, cs)
    defaults = {k: orig.module.src.code(d) for k, d in param_defaults(f.node.args).items()}
    said: Dict[str, str] = {}

    class Sub(ast.NodeTransformer):
        def visit_Name(self, node):
            if node.id in ("True", "False", "None", "bool", "float", "int", "str"):
                return node
            if node.id in f.positional or node.id in f.kwonly:
                argv = cs.argument(node.id)
                src = cs.module.src.code(argv) if argv is not None else defaults.get(node.id)
                if src is None:
                    raise Refuse(f"`{f.qualname}` at {cs.module.path} line {cs.node.lineno} does not pass `{node.id}`")
                said[node.id] = src
                return ast.parse(src, mode="eval").body
            if _same_global(node.id, orig, cs):
                return node
            const = constant_local(f, node.id, orig.stmt)
            if const is not None:
                return ast.copy_location(ast.Constant(const.value), node)
            chosen = branch_local(f, node.id, orig.stmt)
            if chosen is not None:
                return self.visit(ast.parse(ast.unparse(chosen[0]), mode="eval").body)
            raise Refuse(f"amp.initialize in `{f.qualname}` depends on `{node.id}`, which its callers cannot see")

    new = Sub().visit(tree)
    plain = ast.dump(ast.parse(ast.unparse(new), mode="eval"))
    folded = fold(new)
    if "\n" not in text and ast.dump(folded) == plain:
        out = text
        for n in sorted((n for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Name) and n.id in said),
                        key=lambda x: -x.col_offset):
            src = said[n.id]
            if "\n" in src:
                break
            if not isinstance(ast.parse(src, mode="eval").body, (ast.Name, ast.Attribute, ast.Call, ast.Subscript,
                                                                  ast.Constant)):
                src = f"({src})"
            out = out[:n.col_offset] + src + out[n.end_col_offset:]
        else:
            if ast.dump(ast.parse(out, mode="eval")) == plain:
                return out
    return quoted_as(text, ast.unparse(folded))


def quoted_as(text: str, out: str) -> str:
    """``out`` (from ast.unparse, which quotes with ``'``) with its plain string literals in
    double quotes where ``text`` wrote its strings so (``opt.amp != "O0"``)."""
    if '"' not in text or "'" in text:
        return out
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(out).readline))
    except (tokenize.TokenError, SyntaxError):
        return out
    pieces, line_starts = [], [0]
    for ln in out.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(ln))
    # whole literals: (start, end) offsets; an f-string is one STRING token before Python 3.12,
    # FSTRING_START ... FSTRING_END from 3.12 on
    spans, opened = [], []
    fstart, fend = getattr(tokenize, "FSTRING_START", None), getattr(tokenize, "FSTRING_END", None)
    for t in toks:
        a = line_starts[t.start[0] - 1] + t.start[1]
        b = line_starts[t.end[0] - 1] + t.end[1]
        if t.type == tokenize.STRING and not opened:  # (not a string inside an f-string's braces)
            spans.append((a, b))
        elif fstart is not None and t.type == fstart:
            opened.append(a)
        elif fend is not None and t.type == fend and opened:
            first = opened.pop()
            if not opened:
                spans.append((first, b))
    last = 0
    for a, b in spans:
        lit = out[a:b]
        prefix = lit[:len(lit) - len(lit.lstrip("rRbBuUfF"))]
        body = lit[len(prefix):]
        if not body.startswith("'") or body.startswith("'" * 3) or '"' in body or "\\" in body:
            continue
        pieces.append(out[last:a] + prefix + '"' + body[1:-1] + '"')
        last = b
    return "".join(pieces) + out[last:]


def fold(tree):
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


def runs_as_often(a, b, unit) -> bool:
    """Whether every ``if`` that guards ``b`` (below the loops they share) guards ``a`` too: then
    ``a`` never runs on an iteration where ``b`` does not."""
    from ampfix.migration.flow import loops_around

    la = loops_around(a, unit)
    common = next((l for l in loops_around(b, unit) if any(l is x for x in la)), unit)
    ga = {id(x) for x in guards(a, common)}
    return all(id(x) in ga for x in guards(b, common))


def _rebound_before(rebound, name: Optional[str], call) -> bool:
    """One of the assignments ``rebound`` binds ``name`` before ``call`` on every way to it: it lies
    in a block that holds ``call``'s statement or one enclosing it, before that one."""
    stmt = call
    while stmt is not None and not isinstance(stmt, ast.stmt):
        stmt = getattr(stmt, "_p", None)
    if stmt is None:
        return False
    chain = [stmt, *ancestors_stmts(stmt)]
    for a in rebound:
        if a.lineno >= call.lineno or name not in assigned(a):
            continue
        while isinstance(getattr(a, "_p", None), (ast.With, ast.AsyncWith)):
            a = a._p  # a `with` body runs whenever the `with` does
        seq = block_of(a)[2]
        k = next((k for k, x in enumerate(seq) if x is a), None)
        if k is not None and any(x is c for x in seq[k + 1:] for c in chain):
            return True
    return False


def _floating_before(unit, name: Optional[str], call) -> bool:
    """``name`` holds a floating tensor at ``call``: on a line before it in ``unit`` it is backwarded
    (``name.backward()``, ``amp.scale_loss(name, ...)``) or is the input of a loss
    (``loss_fct(logits.view(-1, n), labels)``: a loss's first argument is its prediction; the
    target, an integer tensor for a classification, comes after), and is not assigned between."""
    if name is None:
        return False
    if _floated_by_its_binding(unit, name, call):
        return True
    last = None
    for n in walk(unit):
        if not isinstance(n, ast.Call) or n.lineno >= call.lineno:
            continue
        last_part = (dotted(n.func) or "").split(".")[-1].lower()
        if (isinstance(n.func, ast.Attribute) and (
                (n.func.attr == "backward" and isinstance(n.func.value, ast.Name) and n.func.value.id == name)
                or (n.func.attr == "scale_loss" and n.args and isinstance(n.args[0], ast.Name)
                    and n.args[0].id == name))) or (
                ("loss" in last_part or "crit" in last_part) and n.args
                and not isinstance(n.args[0], ast.Starred) and same_dtype_root(n.args[0]) == name):
            last = max(last or 0, n.lineno)
    if last is None:
        return False
    return not any(isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and last < n.lineno <= call.lineno
                   and name in assigned(n) for n in walk(unit))


#: functions whose result is a floating tensor whatever they are given (an integer input comes back
#: in the default float dtype): ``prediction = torch.sigmoid(prediction)``
FLOATING_RESULTS = frozenset({"sigmoid", "softmax", "log_softmax", "tanh"})


def _floated_by_its_binding(unit, name: str, call) -> bool:
    """The last binding of ``name`` before ``call`` in ``unit`` is ``name = torch.sigmoid(...)`` (a
    function of :data:`FLOATING_RESULTS`, as ``torch.``/``F.`` function or method), and it lies on
    every way to the call: whatever reaches the call is floating."""
    binds = [n for n in walk(unit) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For,
                                                      ast.AsyncFor, ast.With, ast.AsyncWith, ast.NamedExpr))
             and n.lineno < call.lineno and name in _bound_names(n)]
    if not binds:
        return False
    last = max(binds, key=lambda n: (n.lineno, n.col_offset))
    if not (isinstance(last, ast.Assign) and len(last.targets) == 1 and isinstance(last.targets[0], ast.Name)
            and isinstance(last.value, ast.Call)
            and (dotted(last.value.func) or "").split(".")[-1] in FLOATING_RESULTS):
        return False
    # a loop around the call (and not around that binding) that binds the name after the call
    # brings another value round to it
    inside_last = {id(a) for a in ancestors_stmts(last)}
    for loop in ancestors_stmts(stmt_of(call)):
        if isinstance(loop, (ast.For, ast.AsyncFor, ast.While)) and id(loop) not in inside_last and any(
                b.lineno > call.lineno and name in _bound_names(b) for b in walk(loop)
                if isinstance(b, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor, ast.With,
                                  ast.AsyncWith, ast.NamedExpr))):
            return False
    return _rebound_before([last], name, call)


def _bound_names(n) -> set:
    if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        return assigned(n)
    if isinstance(n, ast.NamedExpr):
        return {n.target.id}
    targets = [n.target] if isinstance(n, (ast.For, ast.AsyncFor)) else [i.optional_vars for i in n.items]
    return {x.id for t in targets if t is not None for x in ast.walk(t) if isinstance(x, ast.Name)}


def insert_edit(at: int, text: str):
    from ampfix.model.edits import Edit

    return Edit(at, at, text)


def in_tree(node, tree) -> bool:
    p = node
    while getattr(p, "_p", None) is not None:
        p = p._p
    return p is tree


def _paren(text: str) -> str:
    """``text`` as an operand of ``or``: parenthesised unless it is a name, attribute or call."""
    try:
        e = ast.parse(text, mode="eval").body
    except SyntaxError:
        return f"({text})"
    return text if isinstance(e, (ast.Name, ast.Attribute, ast.Call, ast.Constant, ast.Compare, ast.UnaryOp)) \
        else f"({text})"


def _autocast_kind(sem, call: ast.Call) -> Optional[Tuple[str, str]]:
    """(device, dtype) an autocast call runs in: ``torch.cuda.amp.autocast()`` is ("cuda",
    "float16"); None where the source does not say it in constants."""
    q = sem.qnames(call.func)
    if any(x.startswith("torch.cuda.amp") for x in q):
        device = "cuda"
    elif any(x.startswith("torch.cpu.amp") for x in q):
        device = "cpu"
    else:
        first = arg(call, "device_type", 0)
        device = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
    if device is None:
        return None
    dtype = autocast_dtype(sem, call) or ("float16" if device == "cuda" else "bfloat16")
    return (device, dtype) if dtype != "other" else None


def _off_the_apex_path(node, region, code) -> bool:
    """``node`` lies in the branch of an ``if`` (inside ``region``) that runs when apex is not
    chosen: the ``else`` of ``if with_apex:``, the body of ``if not use_apex:``."""
    inside = {id(x) for st in region for x in [st, *walk(st)]}
    child, p = node, getattr(node, "_p", None)
    while p is not None and id(p) in inside:
        if isinstance(p, ast.If):
            negated = isinstance(p.test, ast.UnaryOp) and isinstance(p.test.op, ast.Not)
            test = p.test.operand if negated else p.test
            if "apex" in code(test).lower() and not isinstance(test, (ast.BoolOp, ast.Compare)) and \
                    any(child is x for x in p.orelse) != negated:
                return True
        child, p = p, getattr(p, "_p", None)
    return False


def _only_plain_between(block, j: int, i: int, bfloat16: bool) -> bool:
    """Two evaluation regions of a block, the first ending at ``j`` and the next starting at ``i``,
    with nothing between them, or at most two assignments (no control flow, no statement that
    only calls, such as a ``torch.save`` or a ``print``: ``pred = torch.sigmoid(logit).cpu().numpy()``
    between the forward and the loss):
    one region reads better than two a line apart, and the statements between ran in half
    precision under apex too.  With bfloat16 only regions that touch join (a statement between
    may hand a tensor to numpy, which has no bfloat16)."""
    between = block[j + 1:i]
    if bfloat16 and between:
        return False
    return i > j and len(between) <= 2 and all(
        isinstance(x, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and not any(
            isinstance(y, (ast.Yield, ast.YieldFrom, ast.Await, ast.Lambda)) for y in ast.walk(x)) for x in between)
