"""apex.amp's function-level API -> autocast.

* ``with amp.disable_casts():`` -> ``with torch.autocast("cuda", enabled=False):`` (apex stopped
  casting inside; autocast off does the same).
* ``@amp.float_function`` / ``amp.float_function(f)`` (a custom kernel that needs float32
  inputs) and ``@amp.half_function`` -> a small helper, ``_float_function`` /
  ``_half_function``, that the module gets once: under autocast it runs ``f`` with autocast off
  on inputs cast to that dtype, as apex did while amp was active; otherwise it calls ``f`` as it
  is.  (``torch.amp.custom_fwd(cast_inputs=...)`` does this for autograd Functions only: it
  writes attributes onto its first argument.)
* ``amp.register_float_function(module, "name")`` and ``register_half_function``: where autocast
  already runs the op in that dtype (its own op lists), the call goes; otherwise the module
  attribute is wrapped with the same helper, the global patch apex made.
* apex's own op lists edited (``amp.lists.functional_overrides.FP32_FUNCS.remove('softmax')`` and
  ``...FP16_FUNCS.append('softmax')``, NVIDIA's Tacotron 2 and WaveGlow scripts and their copies):
  the same as registering the function in the list it ends in (``torch.nn.functional`` for
  ``functional_overrides``, ``torch`` for ``torch_overrides``); a removal alone (the op left
  uncast) has no native form and refuses.

Each module is all or nothing; apex's import goes with its last use.
"""
from __future__ import annotations

import ast
from typing import Dict, List

from ampfix.model.analysis import has_star, string_value
from ampfix.model.semantic import dotted
from ampfix.migration.groups import Group, Refuse, add_module_helper
from ampfix.migration.seeds import FUNCTION_KINDS, kind_of
from ampfix.migration.flow import stmt_of
from ampfix.migration.spell import autocast_off, bf16
from ampfix.rule import ImportSpec
from ampfix.model.apex import apex_uses

#: ops autocast (CUDA) already runs in float32 / float16 (torch/csrc/autocast's op lists; a
#: composite op such as einsum decomposes into matmul-like ops that autocast casts)
AUTOCAST_FP32 = {"softmax", "log_softmax", "layer_norm", "group_norm", "norm", "exp", "log", "log10", "log2",
                 "log1p", "pow", "cumsum", "cumprod", "sum", "prod", "mse_loss", "l1_loss", "smooth_l1_loss",
                 "cross_entropy", "nll_loss", "binary_cross_entropy_with_logits", "kl_div", "cosine_similarity",
                 "softplus", "acos", "asin", "cosh", "erfinv", "reciprocal", "rsqrt", "sinh", "tan", "cdist",
                 "dist", "pdist", "renorm", "logsumexp", "poisson_nll_loss", "margin_ranking_loss",
                 "hinge_embedding_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
                 "huber_loss", "multilabel_margin_loss", "cosine_embedding_loss", "frobenius_norm",
                 "nuclear_norm", "expm1"}
AUTOCAST_FP16 = {"matmul", "mm", "bmm", "addmm", "addbmm", "baddbmm", "addmv", "addr", "mv", "linear",
                 "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                 "einsum", "chain_matmul", "prelu", "_convolution", "conv_tbc"}

HELPER = '''def _{name}(fn):
    """apex's amp.{name}: fn runs with autocast off, on {dtype} inputs."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        if not torch.is_autocast_enabled():
            return fn(*args, **kwargs)

        def cast(v):
            return v.{method}() if torch.is_tensor(v) and v.is_floating_point() else v

        with {off}:
            return fn(*map(cast, args), **{{k: cast(v) for k, v in kwargs.items()}})
    return run
'''
DTYPE = {"float_function": ("float32", "float"), "half_function": ("float16", "half")}
#: apex's override lists -> the module whose functions they patch
OVERRIDES = {"functional_overrides": "torch.nn.functional", "torch_overrides": "torch"}


class FunctionApiPlanner:
    def __init__(self, project) -> None:
        self.p = project

    def groups(self) -> List[Group]:
        out = []
        for m in list(self.p.modules.values()):
            if not m.editable or "apex" not in m.src.text:
                continue
            skip = getattr(self.p, "skip", set())
            uses = [(n, kind_of(q)) for n, q in apex_uses(m.sem, m.tree)
                    if q.startswith("apex.amp.") and kind_of(q) in FUNCTION_KINDS and id(n) not in skip]
            if not uses:
                continue
            g = Group(f"functions:{m.path}", "functions")
            for n, _ in uses:
                g.add_use(m.path, n)
            if any(kind == "lists" for _, kind in uses):
                # apex's op lists act where its amp.initialize does: they go with it, or stay
                g.follows = m.path
            try:
                self._plan(g, m, uses)
            except Refuse as exc:
                g.refusal = str(exc)
            except Exception as exc:  # a planner bug: this module is left whole
                g.refusal = f"ampfix could not plan this migration ({type(exc).__name__}: {exc}); please report it"
            out.append(g)
        return out

    def _plan(self, g: Group, m, uses) -> None:
        fc = g.file(m)
        code = m.src.code
        s = self.p.settings
        helpers: Dict[str, bool] = {}
        notes = set()
        self._op_lists(fc, m, [n for n, kind in uses if kind == "lists"], helpers, notes)
        for n, kind in uses:
            p = getattr(n, "_p", None)
            call = p if isinstance(p, ast.Call) and p.func is n else None
            if kind == "lists":
                continue
            if kind == "disable_casts":
                if call is None or call.args or call.keywords or not isinstance(getattr(call, "_p", None), ast.withitem):
                    raise Refuse(f"amp.disable_casts at line {n.lineno} is not `with amp.disable_casts():`")
                fc.replace(call, autocast_off(s))
                continue
            if kind in DTYPE:
                name = kind
                if call is None:
                    # a decorator: @amp.float_function
                    if not (isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)) and n in p.decorator_list):
                        raise Refuse(f"amp.{kind} at line {n.lineno} is used other than as a decorator or a call")
                    fc.replace(n, f"_{name}")
                else:
                    if len(call.args) != 1 or call.keywords or has_star(call):
                        raise Refuse(f"amp.{kind} at line {n.lineno} is not called with one function")
                    fc.replace(n, f"_{name}")
                helpers[name] = True
                continue
            if kind in ("register_float_function", "register_half_function"):
                if call is None or len(call.args) != 2 or call.keywords:
                    raise Refuse(f"amp.{kind} at line {n.lineno} is not called with a module and a name")
                mod, attr = call.args
                fname = string_value(attr)
                st = stmt_of(call)
                if fname is None or not fname.isidentifier() or not (isinstance(st, ast.Expr) and st.value is call):
                    raise Refuse(f"amp.{kind} at line {n.lineno}: the function is not named by a literal")
                known = AUTOCAST_FP32 if kind == "register_float_function" else AUTOCAST_FP16
                if fname in known:
                    fc.remove(st, described=True)
                    notes.add(f"{kind}(..., {fname!r}): autocast already runs {fname} in that dtype")
                    continue
                helper = "float_function" if kind == "register_float_function" else "half_function"
                helpers[helper] = True
                target = f"{code(mod)}.{fname}"
                fc.replace_statement(st, [f"{target} = _{helper}({target})"])
                notes.add(f"{kind}(..., {fname!r}): wrapped with _{helper}, the patch apex made")
                continue
            raise Refuse(f"amp.{kind} at line {n.lineno} has no automatic rewrite")
        if helpers:
            self._add_helpers(fc, m, sorted(helpers))
            fc.adds.append(ImportSpec("functools"))
        fc.adds.append(ImportSpec("torch"))
        from ampfix.migration.seeds import apex_import_specs

        fc.removes.extend(apex_import_specs(m))
        g.notes |= notes
        g.description = "apex.amp function API -> torch.autocast"

    def _op_lists(self, fc, m, nodes, helpers, notes) -> None:
        """``amp.lists.<overrides>.<FP16_FUNCS|FP32_FUNCS>.<append|remove>('name')`` statements: per
        function, the list it ends in, registered as :meth:`_plan` registers it (see the module's
        doc).  The wrapping statement goes after the helper at module level, in place in a function."""
        by_name: Dict[tuple, list] = {}
        for n in nodes:
            parts = (dotted(n) or "").split(".")
            call = getattr(n, "_p", None)
            st = stmt_of(n)
            if "lists" not in parts or not (isinstance(call, ast.Call) and call.func is n and len(call.args) == 1
                                            and not call.keywords and isinstance(st, ast.Expr) and st.value is call):
                raise Refuse(f"apex.amp.lists at line {n.lineno} is not a call that adds or removes one function")
            tail = parts[parts.index("lists") + 1:]
            name = string_value(call.args[0])
            if len(tail) != 3 or tail[0] not in OVERRIDES or tail[1] not in ("FP16_FUNCS", "FP32_FUNCS") or \
                    tail[2] not in ("append", "remove") or name is None or not name.isidentifier():
                raise Refuse(f"apex.amp.lists at line {n.lineno} has no automatic rewrite")
            by_name.setdefault((tail[0], name), []).append((tail[1], tail[2], st))
        for (over, name), ops in sorted(by_name.items(), key=lambda kv: kv[1][0][2].lineno):
            added = {lst for lst, how, _ in ops if how == "append"}
            removed = {lst for lst, how, _ in ops if how == "remove"}
            if len(added) != 1 or not removed <= {"FP16_FUNCS", "FP32_FUNCS"} - added:
                raise Refuse(f"apex.amp.lists at line {ops[0][2].lineno}: `{name}` is only removed from apex's list, "
                             "left uncast; autocast has no such list: migrate it by hand")
            half = added == {"FP16_FUNCS"}
            target = f"{OVERRIDES[over]}.{name}"
            stmts = [st for _, _, st in ops]
            if name in (AUTOCAST_FP16 if half else AUTOCAST_FP32):
                for st in stmts:
                    fc.remove(st, described=True)
                notes.add(f"apex's {'float16' if half else 'float32'} list took {name!r}: autocast already runs it so")
                continue
            helper = "half_function" if half else "float_function"
            helpers[helper] = True
            line = f"{target} = _{helper}({target})"
            if all(isinstance(getattr(st, "_p", None), ast.Module) for st in stmts):
                for st in stmts:
                    fc.remove(st, described=True)
                self._add_helpers(fc, m, [helper])
                add_module_helper(fc, m, line, f"patch:{target}")
            else:
                fc.replace_statement(stmts[0], [line])
                for st in stmts[1:]:
                    fc.remove(st, described=True)
            notes.add(f"apex's {'float16' if half else 'float32'} list took {name!r}: {target} wrapped with "
                      f"_{helper}, the patch apex made")

    def _add_helpers(self, fc, m, names) -> None:
        s = self.p.settings
        for n in names:
            dtype, method = DTYPE[n]
            if n == "half_function" and bf16(s):
                # with --dtype bfloat16 the reduced precision apex asked for is bfloat16: float16
                # there would bring back the range bfloat16 was chosen to avoid
                dtype, method = "bfloat16", "bfloat16"
            add_module_helper(fc, m, HELPER.format(name=n, dtype=dtype, method=method, off=autocast_off(s)), n)


