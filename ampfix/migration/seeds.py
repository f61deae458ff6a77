"""What the apex.amp migration starts from: the uses of apex.amp in a project (:class:`Use`),
the ``amp.initialize`` calls that make a scaler (:class:`Seed`), and how a use reaches that
scaler (:class:`Carrier`: a local, a closure, a module global, ``self.scaler``, a parameter)."""
from __future__ import annotations

import ast
from typing import List, Optional, Set

from ampfix.migration.flow import (
    stmt_of,
)
from ampfix.model.apex import installed_test, stand_in_imports
from ampfix.rule import ImportSpec
from ampfix.model.semantic import dotted, walk


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
FUNCTION_KINDS = {"lists", "float_function", "half_function", "promote_function", "register_float_function",
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
    """A checkpoint's GradScaler state, or apex.amp's from before the migration."""
    if "loss_scaler0" in state:  # apex: {"loss_scaler0": {"loss_scale", "unskipped"}}
        old = state["loss_scaler0"]
        scale, tracker = float(old["loss_scale"]), int(old["unskipped"])
        return {**scaler.state_dict(), "scale": scale, "_growth_tracker": tracker}
    return state
'''


#: a clip on every micro-batch of an accumulation, while the gradients are still scaled: the
#: norm is divided by the scale on the device (``scaler.scale`` of a one), so nothing is copied to
#: the host; a disabled scaler scales by one, so the fp32 path clips as ``clip_grad_norm_`` does
CLIP_SCALED_HELPER = '''def _clip_scaled_grad_norm_(scaler, parameters, max_norm, norm_type=2.0):
    """clip_grad_norm_ of gradients that the GradScaler has not unscaled yet, without
    copying the scale to the host."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    device = grads[0].device
    norms = [torch.linalg.vector_norm(g, norm_type).to(device) for g in grads]
    norm = torch.linalg.vector_norm(torch.stack(norms).float(), norm_type)
    norm = norm / scaler.scale(torch.ones_like(norm))
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.to(g.device))
    return norm
'''


#: a use of the gradients on every micro-batch (a norm logged, a hand-written clip), while they are
#: still scaled: they are divided by the scale for the block and multiplied back after it; the
#: dynamic scale is a power of two, so both products are exact, and it stays on the device
UNSCALED_GRADS_HELPER = '''@contextlib.contextmanager
def _unscaled_grads(scaler, optimizer):
    """The optimizer's gradients divided by the GradScaler's scale (as apex left them after each
    backward) while the block reads them, then scaled again; nothing is copied to the host."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grads = [p.grad for p in params if p.grad is not None]
    if not scaler.is_enabled() or not grads:
        yield
        return
    scale = scaler.scale(torch.ones((), device=grads[0].device))
    for g in grads:
        g.div_(scale.to(g.device))
    try:
        yield
    finally:
        for p in params:  # the gradients as they are now (a clip may have replaced some)
            if p.grad is not None:
                p.grad.mul_(scale.to(p.grad.device))
'''


def kind_of(qname: str) -> str:
    return qname[len("apex.amp."):].split(".")[0] if qname.startswith("apex.amp.") else ""


#: methods of a model that do not run its forward pass
NOT_FORWARD = frozenset({
    "eval", "train", "to", "cuda", "cpu", "half", "float", "double", "bfloat16", "requires_grad_", "parameters",
    "named_parameters", "buffers", "named_buffers", "modules", "named_modules", "children", "named_children",
    "state_dict", "load_state_dict", "zero_grad", "apply", "register_forward_hook", "register_forward_pre_hook",
    "register_full_backward_hook", "register_buffer", "register_parameter", "add_module", "share_memory",
    "type", "get_submodule", "get_parameter", "extra_repr", "__repr__"})


def calls_model(node, names: Set[str]) -> bool:
    """``node`` is a call of one of ``names`` (a model) or of one of its methods that computes
    (``encoder.c(x)``, ``model.generate(x)``; not ``model.eval()``)."""
    return isinstance(node, ast.Call) and (dotted(node.func) in names or (
        isinstance(node.func, ast.Attribute) and dotted(node.func.value) in names and node.func.attr not in NOT_FORWARD))


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
        elif self.kind in ("", "__dict__") and installed_test(module.sem, node) is not None:
            # `amp is not None` where amp is None without apex, `'state_dict' in amp.__dict__`:
            # folds, needs no scaler
            self.kind = "installed"

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
        #: ``inits = amp.initialize(m, o)`` unpacked by the statement right after it
        #: (``m, o = inits`` or ``m, o = inits if test else (inits, None)``): that statement
        self.unpack: Optional[ast.Assign] = None
        #: ``amp_args = dict(...)`` (and its stores) that ``**amp_args`` of the call came from: they go with it
        self.spread: List[ast.stmt] = []
        #: the optimizer handed in is a parameter that is None where the seed runs
        #: (``if optimizer is None: model = amp.initialize(model, optimizer)``): it returns the model alone
        self.optimizer_none = False
        #: (a seed exported to a caller) ids of the ``if P is None`` tests around the original that
        #: this call settles: it hands P an optimizer torch made, so the seed's `else` side holds
        self.none_held: Set[int] = set()

    @property
    def unit(self):
        return self.func.node if self.func is not None else self.module.tree

    @property
    def model_names(self) -> Set[str]:
        """The models handed to ``amp.initialize``, as dotted names (those that are names)."""
        models = self.models.elts if isinstance(self.models, (ast.List, ast.Tuple)) else [self.models]
        return {d for d in (dotted(e) for e in models) if d}

    @property
    def target_names(self) -> List[Optional[str]]:
        """What ``model, optimizer = amp.initialize(...)`` assigns, as dotted names (None for a
        target that is not a name or attribute); empty when the seed is not an assignment."""
        if not isinstance(self.stmt, ast.Assign):
            return []
        t = (self.unpack or self.stmt).targets[0]
        return [dotted(e) for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])]


class Carrier:
    """How a function gets the scaler: ``expr`` is what it writes (``scaler``, ``self.scaler``)."""

    def __init__(self, kind: str, seeds: Set[int], expr: str, sites=()) -> None:
        self.kind = kind
        self.seeds = seeds
        self.expr = expr
        self.sites = list(sites)
        #: a closure handed on as a value: the carrier of the factory that defines it, whose
        #: parameter (or ``self``) the closure reads
        self.outer: Optional["Carrier"] = None

    @property
    def sees_seed(self) -> bool:
        """The function sees the names of the seed's own function (it is that function, or a
        closure of it), so it can read the seed's condition."""
        return self.kind in ("local", "closure") and self.outer is None




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
    return out + stand_in_imports(module.sem)
