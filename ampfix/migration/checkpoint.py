"""``ampfix convert-checkpoint OLD NEW``: a checkpoint written by an apex program, for the migrated one.

What apex wrote (read in its source):

* ``amp.state_dict()``: ``{"loss_scaler0": {"loss_scale": float, "unskipped": int}, ...}``: becomes
  GradScaler state (``scale`` = the loss scale, ``_growth_tracker`` = the steps since the last
  overflow; growth settings are GradScaler's defaults).
* ``apex.fp16_utils.FP16_Optimizer.state_dict()``: ``{"loss_scaler": <LossScaler or
  DynamicLossScaler object>, "dynamic_loss_scale", "overflow", "first_closure_call_this_step",
  "optimizer_state_dict", "fp32_from_fp16": [[master tensors] per group]}``.
* ``apex.optimizers.FP16_Optimizer.state_dict()`` (the BERT-era one): ``{"dynamic_loss_scale",
  "cur_scale", "cur_iter", ["last_overflow_iter", "scale_factor", "scale_window"],
  "optimizer_state_dict", "fp32_groups_flat": [one flat master tensor per group]}``.

An FP16_Optimizer entry becomes the plain optimizer's state; its loss scale becomes GradScaler
state under the top-level key ``scaler``; its float32 master weights replace the model's float16
copies (the model runs in float32 after the migration).  Optimizer state and master weights
follow the program's parameter groups, which the file does not record: they are mapped when that
is unambiguous (one group; masters matching the model's float16 entries by shape, in order),
otherwise the model's own weights are cast to float32 and the optimizer's moments restart.  The
report says which.

The file is read with torch's weights-only loader: tensors, containers, numbers and strings,
``argparse.Namespace``, and apex's loss-scaler classes mapped to stand-ins.  Anything else is
refused with its name, nothing of it is run.
"""
from __future__ import annotations

import argparse
from typing import Any, Dict, List, Optional, Tuple


class ConvertError(Exception):
    """A checkpoint ampfix cannot convert: the message says why."""


class _ApexLossScaler:
    """Stand-in for apex.fp16_utils.loss_scaler.LossScaler / DynamicLossScaler: keeps its state."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __setstate__(self, state) -> None:
        self.__dict__.update(state if isinstance(state, dict) else {})


class LossScaler(_ApexLossScaler):
    pass


class DynamicLossScaler(_ApexLossScaler):
    pass


APEX_STANDINS = [
    (LossScaler, "apex.fp16_utils.loss_scaler.LossScaler"),
    (DynamicLossScaler, "apex.fp16_utils.loss_scaler.DynamicLossScaler"),
    (LossScaler, "apex.amp.scaler.LossScaler"),
]


def load_old(path: str):
    """Read a checkpoint without apex and without running pickled code."""
    try:
        import torch
    except ImportError:
        raise ConvertError("convert-checkpoint needs torch: pip install 'ampfix[verify]'") from None
    if not hasattr(torch.serialization, "safe_globals"):
        raise ConvertError(f"convert-checkpoint needs torch >= 2.5 (its weights-only loader); this is {torch.__version__}")
    allowed = [*APEX_STANDINS, argparse.Namespace]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ConvertError(f"{path}: no such file") from None
    except Exception as exc:  # the weights-only loader names what it refused
        msg = str(exc)
        name = None
        for marker in ("GLOBAL ", "Unsupported global: "):
            if marker in msg:
                name = msg.split(marker, 1)[1].split()[0].rstrip(".,:")
                break
        if name:
            raise ConvertError(f"{path}: the checkpoint holds `{name}`, which is neither a tensor, a container nor an "
                               "apex loss scaler; ampfix does not run it (if you trust the file, load it with "
                               "torch.load(..., weights_only=False) and convert that object)") from None
        raise ConvertError(f"{path}: cannot read it as a torch checkpoint: {msg.splitlines()[0] if msg else exc}") from None


def _scaler_state(scale: float, tracker: int) -> Dict[str, Any]:
    return {"scale": float(scale), "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
            "_growth_tracker": int(tracker)}


def _is_amp_state(d) -> bool:
    return isinstance(d, dict) and d and all(isinstance(k, str) and k.startswith("loss_scaler") for k in d) and all(
        isinstance(v, dict) and "loss_scale" in v for v in d.values())


def _is_fp16_utils(d) -> bool:
    return isinstance(d, dict) and "optimizer_state_dict" in d and "fp32_from_fp16" in d


def _is_fp16_flat(d) -> bool:
    return isinstance(d, dict) and "optimizer_state_dict" in d and "fp32_groups_flat" in d


class Converter:
    def __init__(self, model_key: Optional[str] = None) -> None:
        self.model_key = model_key
        self.report: List[str] = []
        self.scaler: Optional[Dict[str, Any]] = None
        self.masters: Optional[List] = None  # flat list of fp32 masters, in group order
        self.flat: Optional[List] = None  # apex.optimizers: one flat master per group
        self.optimizers: List[Tuple[dict, str, Any]] = []  # (container, key, FP16_Optimizer state)

    # -- the walk ------------------------------------------------------------------------------
    def convert(self, obj):
        obj = self._walk(obj, "")
        if self.masters is not None or self.flat is not None:
            self._weights(obj)
        if isinstance(obj, dict):
            for d, k, old in self.optimizers:
                d[k] = self._optimizer_state(old, obj)
        if self.scaler is not None:
            if isinstance(obj, dict) and "scaler" not in obj:
                obj["scaler"] = self.scaler
                self.report.append("loss scale -> GradScaler state at key 'scaler' (load it with "
                                   "scaler.load_state_dict(ckpt['scaler']))")
            else:
                self.report.append("loss scale found, but the checkpoint has no free top-level key 'scaler': not kept")
        return obj

    def _walk(self, obj, where: str):
        if _is_amp_state(obj):
            first = obj[sorted(obj)[0]]
            self.report.append(f"{where or 'checkpoint'}: apex.amp loss-scaler state -> GradScaler state "
                               f"(scale {first['loss_scale']:g}, {first.get('unskipped', 0)} steps since an overflow)")
            if len(obj) > 1:
                self.report.append(f"{where}: {len(obj)} apex loss scalers (num_losses > 1): the first one is kept, "
                                   "one GradScaler serves every loss")
            return _scaler_state(first["loss_scale"], first.get("unskipped", 0))
        if isinstance(obj, dict):
            out = {}
            for k, v in obj.items():
                key = f"{where}.{k}" if where else str(k)
                if _is_fp16_utils(v) or _is_fp16_flat(v):
                    self._fp16_optimizer(v, key)
                    out[k] = v  # replaced once the model's weights are known
                    self.optimizers.append((out, k, v))
                else:
                    out[k] = self._walk(v, key)
            return type(obj)(out) if type(obj) is not dict else out
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._walk(v, f"{where}[{i}]") for i, v in enumerate(obj))
        return obj

    def _fp16_optimizer(self, state, where: str) -> None:
        if _is_fp16_utils(state):
            ls = state.get("loss_scaler")
            scale = getattr(ls, "cur_scale", None)
            tracker = 0
            if scale is not None and hasattr(ls, "cur_iter"):
                tracker = max(0, int(ls.cur_iter) - int(getattr(ls, "last_overflow_iter", -1)) - 1)
            self.masters = [t for group in state["fp32_from_fp16"] for t in group]
            self.groups = len(state["fp32_from_fp16"])
            kind = "apex.fp16_utils.FP16_Optimizer"
        else:
            scale = state.get("cur_scale")
            tracker = max(0, int(state.get("cur_iter", 0)) - int(state.get("last_overflow_iter", -1)) - 1)
            self.flat = list(state["fp32_groups_flat"])
            self.groups = len(self.flat)
            kind = "apex.optimizers.FP16_Optimizer"
        if scale is not None:
            self.scaler = _scaler_state(scale, tracker)
        self.report.append(f"{where}: {kind} state -> the plain optimizer's state")

    # -- weights ---------------------------------------------------------------------------------
    def _model_state(self, obj) -> Tuple[Optional[str], Optional[dict]]:
        import torch

        def is_sd(d):
            return isinstance(d, dict) and d and all(isinstance(k, str) for k in d) and all(
                torch.is_tensor(v) for v in d.values()) and any(v.dtype == torch.float16 for v in d.values())

        if self.model_key is not None:
            d = obj.get(self.model_key) if isinstance(obj, dict) else None
            if not is_sd(d):
                raise ConvertError(f"--model-key {self.model_key!r}: no state dict of float16 tensors there")
            return self.model_key, d
        found = [(k, v) for k, v in obj.items() if is_sd(v)] if isinstance(obj, dict) else []
        if is_sd(obj):
            return "", obj
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise ConvertError("several state dicts hold float16 tensors (" + ", ".join(k for k, _ in found) +
                               "): say which is the model's with --model-key")
        return None, None

    def _weights(self, obj) -> None:
        import torch

        try:
            key, sd = self._model_state(obj)
        except ConvertError:
            raise
        if sd is None:
            self.report.append("no model state dict of float16 tensors found: master weights not placed")
            self.mapped = False
            return
        halves = [k for k, v in sd.items() if v.dtype == torch.float16]
        self.half_shapes = [sd[k].shape for k in halves]
        where = f"'{key}'" if key else "the checkpoint"
        masters = self.masters
        if masters is None and self.flat is not None and len(self.flat) == 1:
            total = sum(sd[k].numel() for k in halves)
            if self.flat[0].numel() == total:
                masters, off = [], 0
                for k in halves:
                    n = sd[k].numel()
                    masters.append(self.flat[0][off:off + n].view_as(sd[k]))
                    off += n
        self.mapped = masters is not None and len(masters) == len(halves) and all(
            m.shape == sd[k].shape for m, k in zip(masters, halves))
        if self.mapped:
            for m, k in zip(masters, halves):
                sd[k] = m.detach().clone().float()
            self.report.append(f"{where}: {len(halves)} float16 weights -> their float32 master copies")
        else:
            for k in halves:
                sd[k] = sd[k].float()
            why = ("the master weights follow the program's parameter groups, which the file does not record"
                   if masters is None or len(masters) != len(halves) else "the master weights do not match by shape")
            self.report.append(f"{where}: {len(halves)} float16 weights cast to float32 ({why}; the float32 "
                               "masters are not used)")

    def _optimizer_state(self, old, top):
        import torch

        inner = old["optimizer_state_dict"]
        groups = inner.get("param_groups", [])
        if getattr(self, "mapped", False) and len(groups) == 1:
            if _is_fp16_utils(old):
                return inner  # one group of masters in the model's order: the plain optimizer's state
            # apex.optimizers: moments of one flat tensor -> per parameter
            shapes = self.half_shapes
            flat_state = inner.get("state", {})
            if len(flat_state) == 1:
                (pid, st), = flat_state.items()
                new_state, off = {}, 0
                for i, shape in enumerate(shapes):
                    n = int(torch.Size(shape).numel())
                    new_state[i] = {k: (v[off:off + n].view(shape).clone() if torch.is_tensor(v) and v.dim() == 1
                                        and v.numel() > 1 else v) for k, v in st.items()}
                    off += n
                group = dict(groups[0])
                group["params"] = list(range(len(shapes)))
                self.report.append("optimizer moments of the flat master tensor -> per parameter")
                return {"state": new_state, "param_groups": [group]}
        self.report.append("optimizer state dropped: it follows the program's parameter groups, which the file does "
                           "not record; the optimizer's moments restart (the weights are kept)")
        return {"state": {}, "param_groups": groups}


def convert_file(old: str, new: str, model_key: Optional[str] = None) -> List[str]:
    """Read OLD, convert, write NEW; every failure is a ConvertError with one line to show."""
    import os

    folder = os.path.dirname(os.path.abspath(new))
    if not os.path.isdir(folder):
        raise ConvertError(f"{new}: the folder {folder} does not exist")
    obj = load_old(old)  # says so when torch is missing
    import torch

    conv = Converter(model_key)
    out = conv.convert(obj)
    if not conv.report:
        raise ConvertError(f"{old}: no apex state found (no amp loss scaler, no FP16_Optimizer): nothing to convert")
    tmp = f"{new}.ampfix-tmp"
    try:
        torch.save(out, tmp)
        os.replace(tmp, new)
    except (OSError, RuntimeError) as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise ConvertError(f"{new}: cannot write: {exc}") from None
    return conv.report
