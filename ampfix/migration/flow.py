"""Control and data flow inside one function, as the migration needs it.

Python code is structured, so statement order, blocks and enclosing statements answer most
questions: does this step follow a scaled backward (in the same iteration, or the next one of a
loop)?  does this statement always run before that one?  which statements before a backward
compute its loss (the forward pass that autocast must cover)?
"""
from __future__ import annotations

import ast
from typing import Iterable, List, Optional, Sequence, Set, Tuple

from ampfix.model.analysis import exclusive, method_call, scalar_assignment
from ampfix.model.semantic import DEFS, LOOPS, block_of, dotted, walk

#: calls that only prepare inputs (copies, casts, reshapes): a forward pass does not start there
PREP_METHODS = {"to", "cuda", "float", "half", "long", "int", "bool", "contiguous", "view", "reshape", "permute",
                "unsqueeze", "squeeze", "size", "cpu", "detach", "clone", "type", "items", "keys", "values", "get",
                "pin_memory", "expand", "repeat", "transpose", "flatten", "numel", "dim", "append", "split",
                "chunk", "next"}
PREP_BUILTINS = {"tuple", "list", "len", "dict", "zip", "range", "enumerate", "isinstance", "getattr", "min", "max",
                 "sum", "map", "sorted", "int", "float", "str", "next", "iter", "print", "setattr", "hasattr"}
#: torch's tensor factories: making an input (noise for a generator) is preparation, which autocast
#: does not change
TORCH_FACTORIES = {f"torch.{f}" for f in ("randn", "rand", "randint", "randn_like", "rand_like", "randperm", "zeros",
                                          "ones", "empty", "full", "zeros_like", "ones_like", "full_like", "arange",
                                          "linspace", "eye", "tensor", "normal")}


def statements_in(unit) -> List[ast.stmt]:
    """Every statement of a function (or module), nested blocks included, not nested defs."""
    body = unit.body if isinstance(unit, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)) else [unit]
    out = []
    stack = list(reversed(body))
    while stack:
        s = stack.pop()
        out.append(s)
        if isinstance(s, DEFS):
            continue
        children = []
        for field in ("body", "orelse", "finalbody"):
            seq = getattr(s, field, None)
            if isinstance(seq, list):
                children.extend(seq)
        for h in getattr(s, "handlers", ()) or ():
            children.extend(h.body)
        for c in getattr(s, "cases", ()) or ():
            children.extend(c.body)
        stack.extend(reversed(children))
    return out


def code_body(stmts) -> List[ast.stmt]:
    """The statements of a block other than its docstring (and other bare constants)."""
    return [b for b in stmts if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]


def stmt_of(node) -> Optional[ast.stmt]:
    while node is not None and not isinstance(node, ast.stmt):
        node = getattr(node, "_p", None)
    return node


def ancestors_stmts(stmt, stop=None) -> List[ast.stmt]:
    """The statements enclosing ``stmt`` (innermost first), not past ``stop``."""
    out = []
    p = getattr(stmt, "_p", None)
    while p is not None and p is not stop:
        if isinstance(p, ast.stmt):
            out.append(p)
            if isinstance(p, DEFS):
                break
        p = getattr(p, "_p", None)
    return out


def other_branch(a: ast.stmt, b: ast.stmt, unit) -> bool:
    """``a`` and ``b`` lie in different branches of one ``if`` (its body and its ``else``/``elif``)
    that no loop of ``unit`` encloses: one run of ``unit`` never runs ``b`` after ``a``
    (``analysis.exclusive`` asks about one pass: a loop around the ``if`` runs both, in turn)."""
    chain = [a, *ancestors_stmts(a, unit)]
    around_b = {id(x) for x in [b, *ancestors_stmts(b, unit)]}
    for i in range(1, len(chain)):
        x = chain[i]
        if not isinstance(x, ast.If) or any(isinstance(y, LOOPS) for y in chain[i + 1:]):
            continue
        other = x.orelse if any(chain[i - 1] is y for y in x.body) else x.body
        if any(id(y) in around_b for y in other):
            return True
    return False


def loops_around(node, stop=None) -> List[ast.AST]:
    return [s for s in ancestors_stmts(stmt_of(node), stop) if isinstance(s, LOOPS)]


def in_body(node, owner) -> bool:
    """Whether node lies in owner's body (not its else/handlers/test)."""
    child = node
    p = getattr(node, "_p", None)
    while p is not None:
        if p is owner:
            return any(child is s for s in getattr(owner, "body", ()))
        child = p
        p = getattr(p, "_p", None)
    return False


def follows(late, earlies: Iterable, unit) -> bool:
    """Whether ``late`` can run after one of ``earlies`` in the same call of ``unit``: it comes
    later in the text (on a path that is not another branch of the same ``if``), or both sit in
    one loop (the next iteration)."""
    for e in earlies:
        common = [l for l in loops_around(late, unit) if any(l is x for x in loops_around(e, unit))]
        if common and any(in_body(late, l) and in_body(e, l) for l in common):
            return True
        if (e.lineno, e.col_offset) < (late.lineno, late.col_offset) and not exclusive(e, late, unit):
            return True
    return False


def dominates(a: ast.stmt, b) -> bool:
    """Statement ``a`` always runs before ``b`` (same block as one of b's enclosing statements,
    earlier in it)."""
    owner, field, block = block_of(a)
    idx = next((i for i, s in enumerate(block) if s is a), None)
    if idx is None:
        return False
    x = stmt_of(b)
    while x is not None:
        o, f, blk = block_of(x)
        if blk is block:
            j = next((i for i, s in enumerate(blk) if s is x), -1)
            return j > idx
        x = stmt_of(getattr(x, "_p", None))
    return False


def guards(stmt, stop) -> List[ast.If]:
    """The ``if`` statements whose body holds ``stmt`` (innermost first), up to ``stop``."""
    out = []
    child = stmt
    p = getattr(stmt, "_p", None)
    while p is not None and p is not stop and not isinstance(p, DEFS):
        if isinstance(p, ast.If) and any(child is s for s in p.body):
            out.append(p)
        child = p
        p = getattr(p, "_p", None)
    return out


def is_main_guard(stmt) -> bool:
    """``if __name__ == "__main__":``"""
    if not (isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Compare) and len(stmt.test.ops) == 1
            and isinstance(stmt.test.ops[0], ast.Eq)):
        return False
    sides = [stmt.test.left, stmt.test.comparators[0]]
    return any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides) and \
        any(isinstance(x, ast.Constant) and x.value == "__main__" for x in sides)


#: torch.optim's optimizers (an optimizer made only to be handed to amp.initialize goes with it;
#: a name bound only to one of them is not None)
OPTIMIZERS = frozenset({"SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax", "RMSprop", "Rprop", "ASGD",
                        "NAdam", "RAdam", "LBFGS", "SparseAdam"})


# ------------------------------------------------------------------------------ data flow
def assigned(stmt) -> Set[str]:
    """Names (and dotted targets) a statement binds, nested statements included."""
    out: Set[str] = set()
    for n in [stmt, *walk(stmt)]:
        targets = []
        if isinstance(n, ast.Assign):
            targets = n.targets
        elif isinstance(n, (ast.AugAssign, ast.AnnAssign)):
            targets = [n.target]
        elif isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)):
            targets = [n.target]
        elif isinstance(n, ast.withitem) and n.optional_vars is not None:
            targets = [n.optional_vars]
        elif isinstance(n, ast.NamedExpr):
            targets = [n.target]
        for t in targets:
            for e in _flatten(t):
                d = dotted(e)
                if d:
                    out.add(d)
                    out.add(d.split(".")[0] if not d.startswith("self.") else d)
    return out


#: list methods that put a value in the list they are called on
_FILLING = {"append", "extend", "insert"}


def filled(stmt) -> Set[str]:
    """Containers a statement puts computed values in without binding them: ``logits.append(out)``
    (a forward pass in a loop that collects its outputs, the loss made from the list after it),
    ``batch["encoding"] = encoder(**inputs)[0]`` (HGN: an encoder's output handed to the model in
    the batch).  A key set to what only prepares inputs (``inputs["threshold"] = t``,
    ``batch["mask"] = batch["mask"].float()``) is not one: following it would pull the inputs'
    preparation into the region."""
    out: Set[str] = set()
    for n in [stmt, *walk(stmt)]:
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _FILLING \
                and isinstance(n.func.value, ast.Name):
            out.add(n.func.value.id)
        elif isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Subscript) \
                and isinstance(n.targets[0].value, ast.Name) and not is_prep(n, set()):
            out.add(n.targets[0].value.id)
    return out


def assigned_in(stmts: Iterable[ast.stmt], skip: Optional[ast.stmt] = None) -> Set[str]:
    """What the statements bind (nested ones included), leaving out the statement ``skip``."""
    out: Set[str] = set()
    for x in stmts:
        if x is skip:
            continue
        if skip is not None and any(y is skip for y in walk(x)):
            for field in ("body", "orelse", "finalbody"):
                out |= assigned_in(getattr(x, field, []) or [], skip)
            for h in getattr(x, "handlers", []) or []:
                out |= assigned_in(h.body, skip)
            if isinstance(x, (ast.For, ast.AsyncFor)):
                out |= {d for d in map(dotted, _flatten(x.target)) if d}
            for item in getattr(x, "items", []) or []:
                if item.optional_vars is not None:
                    out |= {d for d in map(dotted, _flatten(item.optional_vars)) if d}
            continue
        out |= assigned(x)
    return out


def terminates(stmts: Sequence[ast.stmt]) -> bool:
    """A block that never falls through: it ends in ``raise`` or ``sys.exit()`` (or an ``if``
    whose branches both do)."""
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, ast.Raise):
        return True
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
        return dotted(last.value.func) in ("sys.exit", "exit", "quit", "os._exit")
    if isinstance(last, ast.If):
        return terminates(last.body) and terminates(last.orelse)
    return False


def _flatten(t):
    if isinstance(t, (ast.Tuple, ast.List)):
        for e in t.elts:
            yield from _flatten(e)
    elif isinstance(t, ast.Starred):
        yield from _flatten(t.value)
    else:
        yield t


def read(node) -> Set[str]:
    """Names and dotted names read in an expression or statement."""
    out: Set[str] = set()
    for n in [node, *walk(node)]:
        if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load):
            d = dotted(n)
            if d:
                out.add(d)
                if not d.startswith("self."):
                    out.add(d.split(".")[0])
    return out


#: torch functions that arrange inputs (a batch joined or counted across devices)
TORCH_PREP = {"torch.cat", "torch.stack", "torch.cuda.device_count", "torch.is_tensor", "torch.Size"}


def is_prep(stmt, models: Set[str], prep_calls: Set[str] = frozenset()) -> bool:
    """A statement that only moves, casts or unpacks inputs (no model, no other calls);
    ``prep_calls``: functions known to do only that (``self._parse_data``, a local ``reshape``)."""
    r = read(stmt)
    if models and r & models:
        return False
    for n in [stmt, *walk(stmt)]:
        if isinstance(n, ast.Call):
            if isinstance(n.func, ast.Attribute) and n.func.attr in PREP_METHODS:
                continue
            if isinstance(n.func, ast.Name) and n.func.id in PREP_BUILTINS:
                continue
            if dotted(n.func) in TORCH_FACTORIES or dotted(n.func) in TORCH_PREP or dotted(n.func) in prep_calls:
                continue
            return False
    return True


def prep_function(f) -> bool:
    """A function whose body only unpacks, moves or reshapes its inputs and returns them."""
    body = [x for x in f.body if not (isinstance(x, ast.Expr) and isinstance(x.value, ast.Constant))]
    return bool(body) and all(isinstance(x, (ast.Assign, ast.AnnAssign, ast.Return)) and is_prep(x, set())
                              for x in body)


def loss_from(st, made: Set[str]) -> bool:
    """``st`` computes from ``made`` (a forward's output) by calling a function on it
    (``loss = criterion(out, y)``), not a method of it, and hands nothing to the host: it belongs
    in the forward's autocast region (losses run in float32 there)."""
    if not isinstance(st, ast.Assign) or not read(st.value) & made:
        return False
    calls = [x for x in [st.value, *walk(st.value)] if isinstance(x, ast.Call)]
    if any(method_call(x, "item", "cpu", "numpy", "tolist") for x in calls):
        return False
    return any(isinstance(x.func, ast.Name) or (isinstance(x.func, ast.Attribute) and
               (dotted(x.func.value) or "").split(".")[0] not in made) for x in calls)


def mover_function(f) -> bool:
    """``move_to_cuda(sample)``: a function that only walks its input (dicts, lists, tuples) and
    moves or casts the tensors in it, calling nothing but those methods, builtins that look and
    build, and itself or the functions nested in it.  It reads no global but torch."""
    defs = [x for x in [f, *walk(f, into_functions=True)] if isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef))]
    own = {x.name for x in defs}
    local = own | {a.arg for x in defs for a in [*x.args.posonlyargs, *x.args.args, *x.args.kwonlyargs]}
    for n in walk(f, into_functions=True):
        if isinstance(n, (ast.Global, ast.Nonlocal, ast.Yield, ast.YieldFrom, ast.Await, ast.Lambda)):
            return False
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            local.add(n.id)
    for n in walk(f, into_functions=True):
        if isinstance(n, ast.Call):
            if isinstance(n.func, ast.Attribute) and n.func.attr in PREP_METHODS and dotted(n.func.value) != "torch":
                continue
            if isinstance(n.func, ast.Name) and (n.func.id in PREP_BUILTINS or n.func.id in own):
                continue
            if dotted(n.func) in TORCH_PREP:
                continue
            return False
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in local and \
                n.id not in PREP_BUILTINS and n.id not in ("torch", "dict", "list", "tuple", "None", "True", "False"):
            return False
    return True


class Region:
    """Statements ``first``..``last`` of one block: the forward pass that computes a loss."""

    def __init__(self, block: List[ast.stmt], first: int, last: int) -> None:
        self.block = block
        self.first = first
        self.last = last

    @property
    def stmts(self) -> List[ast.stmt]:
        return self.block[self.first:self.last + 1]

    def __repr__(self) -> str:  # pragma: no cover
        return f"Region(lines {self.block[self.first].lineno}-{self.block[self.last].end_lineno})"


def _model_feeds(stmt: ast.stmt, names: Set[str], models: Set[str]) -> bool:
    """A model is read on the way to ``names`` in ``stmt``: in a compound statement, back through
    what it assigns (``try: batch = next(it) except StopIteration: evaluate(model); batch = ...``
    feeds the loss its batch only; the model it reads there computes nothing the loss needs)."""
    def compound(x) -> bool:
        return isinstance(x, (ast.If, ast.Try, ast.With, ast.AsyncWith, *LOOPS)) or type(x).__name__ == "TryStar"

    if not compound(stmt):
        return True
    inner = [x for x in walk(stmt) if isinstance(x, ast.stmt) and not compound(x) and not isinstance(x, DEFS)]
    tests = [x for x in [stmt, *walk(stmt)] if isinstance(x, (ast.If, ast.While))]
    if any(read(t.test) & models for t in tests):
        return True  # a branch chosen by the model's output (or its mode): it is part of the forward
    wanted = set(names)
    for x in reversed(inner):
        got = assigned(x)
        # (an expression statement feeds a name it calls a method of: `inputs.append(model(x))`)
        mutates = isinstance(x, ast.Expr) and isinstance(x.value, ast.Call) and isinstance(x.value.func, ast.Attribute) \
            and (dotted(x.value.func.value) or "").split(".")[0] in wanted
        if got & wanted or mutates:
            if read(x) & models:
                return True
            wanted |= read(x)
    return False


#: statements with blocks of their own: one uses a model when something in it calls one (a warm-up
#: block that sets ``model.gr`` and prints the model's biases is not the forward pass)
COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try)


def _mode_switch(stmt, models: Set[str]) -> bool:
    """``model.train()`` / ``model.eval()`` / ``model.zero_grad()`` alone: the model's mode, not
    its forward pass (a region starting there would take in the batch preparation after it)."""
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and \
        method_call(stmt.value, "train", "eval", "zero_grad", "requires_grad_") and \
        dotted(stmt.value.func.value) in models


def _calls_a_model(stmt, models: Set[str]) -> bool:
    """Something in ``stmt`` calls a model, or assigns what a call handed a model returns (a
    forward helper: ``loss = fwd_pass(args, model, batch)``; not ``print_biases(model)``)."""
    for n in walk(stmt):
        if isinstance(n, ast.Call) and (dotted(n.func) in models or (
                isinstance(n.func, ast.Attribute) and dotted(n.func.value) in models)):
            return True
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and isinstance(n.value, ast.Call) and any(
                dotted(a) in models for a in [*n.value.args, *(k.value for k in n.value.keywords)]):
            return True
    return False


def _rescales_only(stmt: ast.stmt, names: Set[str]) -> bool:
    """``loss = loss / n``, ``loss /= n``, ``if n > 1: loss = loss.mean()``: the statement only
    rescales the names it assigns of ``names`` (each assignment reads what it writes, and calls
    nothing but their own methods): no forward pass is there."""
    if isinstance(stmt, ast.If):
        return all(_rescales_only(s, names) for s in [*stmt.body, *stmt.orelse]) and not any(
            isinstance(n, ast.Call) for n in [stmt.test, *walk(stmt.test)])
    if isinstance(stmt, ast.AugAssign):
        targets, value = {dotted(stmt.target)}, stmt.value
    elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        targets, value = {stmt.targets[0].id}, stmt.value
    else:
        return False
    if not targets <= names or (isinstance(stmt, ast.Assign) and not targets <= read(value)):
        return False
    return all(not isinstance(n, ast.Call) or (isinstance(n.func, ast.Attribute) and dotted(n.func.value) in targets)
               or (isinstance(n.func, ast.Name) and n.func.id in _NUMBER_BUILTINS and not targets & read(n))
               for n in [value, *walk(value)])


#: builtins a rescale may call on what is not the loss (``loss = loss / len(batches)``)
_NUMBER_BUILTINS = {"len", "float", "int", "max", "min", "abs"}


def _reads_any(node, names: Set[str]) -> bool:
    """``node`` reads one of ``names`` (or a part of one, or a whole one of which it reads a part)."""
    for r in read(node):
        if any(r == a or r.startswith(a + ".") or a.startswith(r + ".") for a in names):
            return True
    return False


def forward_region(site: ast.stmt, loss, unit, barriers: Sequence[ast.AST] = (), models: Set[str] = frozenset(),
                   is_barrier=None, prep_calls: Set[str] = frozenset()) -> Tuple[Optional[Region], Set[str]]:
    """The statements before ``site`` that compute ``loss`` (an expression), by data flow back
    from it in the site's block, and in the blocks around it when the site sits in an ``if``
    (``if fp16: <scaled backward> else: loss.backward()``).  It stops at an earlier backward,
    optimizer step or one of ``barriers``; it starts at the first statement that uses a model
    (or calls more than input preparation).  Returns (region or None, the names still unknown:
    those not computed in this function, e.g. its parameters)."""
    needed = read(loss)
    barrier_ids = {id(b) for b in barriers}
    cur = site
    while True:
        owner, field, block = block_of(cur)
        idx = next((i for i, s in enumerate(block) if s is cur), None)
        if idx is None:
            return None, needed
        entry = set(needed)
        first = last = None
        contrib = set()
        feeds: dict = {}  # contributing statement -> the names the loss needed from it
        for j in range(idx - 1, -1, -1):
            s = block[j]
            if id(s) in barrier_ids or isinstance(s, (ast.ClassDef, ast.Return)):
                break
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name not in needed:
                # a helper defined in the loop between the forward and the loss (MMT's `debatch`)
                # only binds its name: the forward above it still makes the loss
                continue
            if any(method_call(n, "backward", "step") for n in [s, *walk(s)]) or (is_barrier and is_barrier(s)):
                if last is not None:
                    break  # the region must not hold a backward
                continue  # nothing found yet: the loss may come from before (a GAN's two losses)
            got = assigned(s) | filled(s)
            if got & needed:
                feeds[j] = got & needed
                needed |= read(s)
                contrib.add(j)
                first = j
                last = last if last is not None else j
        if first is not None and isinstance(owner, (ast.If, ast.With, ast.AsyncWith, ast.Try)) and \
                owner is not unit and all(_rescales_only(block[j], feeds[j]) for j in contrib):
            # `if accumulating: loss = loss / n` in a branch: the loss itself comes from further out
            cur, needed = owner, entry
            continue
        if first is not None:
            start = first
            if models:
                # from the first statement that uses a model (if one does)
                using = [j for j in range(first, last + 1) if read(block[j]) & models
                         and (j not in feeds or _model_feeds(block[j], feeds[j], models))
                         and (not isinstance(block[j], COMPOUND) or _calls_a_model(block[j], models))
                         and not _mode_switch(block[j], models)]
                start = using[0] if using else first
            # nor input preparation, nor what the loss does not come from (a progress bar, a
            # `continue` for a short batch, zero_grad) at the start
            preps = set(prep_calls) | {x.name for x in block if isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef))
                                       and prep_function(x)}
            while start < last and (is_prep(block[start], set(models), preps) or start not in contrib):
                start += 1
            resolved = set()
            for s in block[first:last + 1]:
                resolved |= assigned(s)
            # `alpha = min(1, step / warmup)` last, on nothing the region computed: arithmetic on
            # numbers, the same outside autocast; the region ends with the forward pass
            while last > start and scalar_assignment(block[last]) and not _reads_any(
                    block[last].value, assigned_in(block[start:last])):
                last -= 1
            # `loss, logits = model(x, y)`, bookkeeping on the logits (argmax, `.cpu().numpy()`
            # into lists), then `if accumulating: loss = loss / n`: the region ends with the
            # forward pass rather than wrap what the loss does not come from; a rescale of the loss
            # is the same outside autocast
            tail = last
            while tail in contrib and _rescales_only(block[tail], feeds[tail]):
                prev = max((j for j in contrib if j < tail), default=None)
                if prev is None or prev < start:
                    break
                tail = prev
            if tail < last and any(j not in contrib for j in range(tail + 1, last + 1)):
                last = tail
            return Region(block, start, last), needed - resolved
        if isinstance(owner, (ast.If, ast.With, ast.AsyncWith, ast.Try)) and owner is not unit:
            cur = owner
            continue
        return None, needed


#: tensor methods whose result has the dtype of the tensor they are called on
SAME_DTYPE = frozenset({"detach", "cpu", "cuda", "view", "reshape", "squeeze", "unsqueeze", "contiguous", "clone",
                        "permute", "transpose", "flatten", "t", "expand", "narrow", "select", "view_as",
                        "reshape_as", "index_select", "masked_select", "gather", "flip", "roll", "repeat"})


def same_dtype_root(expr) -> Optional[str]:
    """The name at the root of ``expr`` when every step from it keeps its dtype (subscripts,
    ``.data``, the methods of :data:`SAME_DTYPE`, ``.to(device)``); None otherwise."""
    while True:
        if isinstance(expr, ast.Name):
            return expr.id
        if isinstance(expr, ast.Subscript) or (isinstance(expr, ast.Attribute) and expr.attr == "data"):
            expr = expr.value
        elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and (
                expr.func.attr in SAME_DTYPE or (expr.func.attr == "to" and not any(
                    k.arg == "dtype" for k in expr.keywords) and not any(
                    "float" in (dotted(a) or "") or "double" in (dotted(a) or "") or "half" in (dotted(a) or "")
                    or "bfloat" in (dotted(a) or "") for a in expr.args))):
            expr = expr.func.value
        else:
            return None


#: autocast runs these in float32 (torch.amp's list of ops that autocast to float32)
FLOAT32_OPS = frozenset({"cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "kl_div",
                         "binary_cross_entropy_with_logits", "log_softmax", "softmax", "sum", "norm", "cdist",
                         "cosine_similarity", "layer_norm", "group_norm", "exp", "log", "pow", "prod", "cumsum"})


def loss_call(value) -> bool:
    """``criterion(out, y)``, ``F.cross_entropy(...)``, ``self.loss_fn(...)``: a loss, which autocast
    computes in float32."""
    if not isinstance(value, ast.Call):
        return False
    last = (dotted(value.func) or "").split(".")[-1].lower()
    return "loss" in last or "crit" in last or last in FLOAT32_OPS
