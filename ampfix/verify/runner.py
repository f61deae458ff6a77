"""The child side of ``ampfix verify``: run a training script under instrumentation.

    python -m ampfix.verify.runner --mode amp|fp32 --steps N --out FILE -- SCRIPT [ARGS...]

Nothing here changes what the script computes, except in ``fp32`` mode, where every autocast
region and GradScaler is forced off (the reference run).  Measurements avoid host-device syncs
of their own: losses and scales are kept as device tensors and read once at the end; step
times come from CUDA events recorded at each optimizer step.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import runpy
import sys
import time
import traceback
import warnings

#: torch.profiler._pattern_matcher pattern -> the static rule that finds the same thing
PATTERN_RULES = {
    "ExtraCUDACopyPattern": "AMP302",
    "GradNotSetToNonePattern": "AMP301",
    "Conv2dBiasFollowedByBatchNorm2dPattern": "AMP311",
    "MatMulDimInFP16Pattern": "AMP312",
    "SynchronizedDataLoaderPattern": "AMP306",
    "FP32MatMulPattern": None,
    "OptimizerSingleTensorPattern": None,
}
SYNC_WINDOW = 5  # steps after warm-up during which syncs are counted (sync debug mode slows steps)
FLOP_WINDOW = 3  # steps during which matmul/convolution FLOPs are counted by dtype
HALF = ("torch.float16", "torch.bfloat16")


class FlopsByDtype:
    """A TorchDispatchMode that adds up the FLOPs of matmuls, convolutions and attention (torch's
    own flop formulas) by the dtype they ran in.  Shapes and dtypes are host metadata: no sync."""

    def __new__(cls, counts):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils.flop_counter import flop_registry

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                formula = flop_registry.get(func._overloadpacket)
                if formula is not None:
                    try:
                        flops = formula(*args, **kwargs, out_val=out)
                        dtype = next((str(a.dtype) for a in args if hasattr(a, "dtype")), "?")
                        counts[dtype] = counts.get(dtype, 0) + int(flops)
                    except Exception:  # a formula that does not know this call: not counted
                        counts["uncounted_calls"] = counts.get("uncounted_calls", 0) + 1
                return out

        return Mode()


class StopTraining(BaseException):
    """Raised from the optimizer-step hook once enough steps ran (a BaseException so that a
    script's ``except Exception`` does not swallow it)."""


class Recorder:
    def __init__(self, opts) -> None:
        import torch

        self.torch = torch
        self.opts = opts
        self.cuda = torch.cuda.is_available() and opts.device != "cpu"
        self.primary = None  # the first optimizer that steps: its steps are the training steps
        self.steps = 0
        self.marks = []  # per step: CUDA event or perf_counter value
        self.pending_losses = []
        self.losses = []  # per step: list of loss tensors
        self.scales = []
        self.unscaled = {}
        self.sync_counts = []
        self._syncs = 0
        self.profiler = None
        self.patterns = None
        self.peak = None
        self.replica_dtypes = set()
        self.flops = {}  # dtype -> FLOPs in the measured steps
        self.flop_mode = None
        self.flop_start = min(opts.warmup, max(0, opts.steps - FLOP_WINDOW))
        self.flop_steps = 0
        # what mixed precision did: autocast regions entered (enabled), GradScaler calls
        self.amp_counts = {"autocast_entered": 0, "autocast_enabled": 0, "scalers_enabled": 0, "scale_calls": 0,
                           "scaler_steps": 0, "scaler_updates": 0}
        self.initial_scale = None

    # -- hooks -------------------------------------------------------------------------------
    def install(self) -> None:
        torch = self.torch
        from torch.amp import autocast_mode, grad_scaler

        rec = self
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(self._after_step)

        orig_backward = torch.Tensor.backward

        def backward(t, *a, **k):
            if t.numel() == 1:
                src = rec.unscaled.pop(id(t), t)
                rec.pending_losses.append(src.detach().float().reshape(()).clone())
            return orig_backward(t, *a, **k)

        torch.Tensor.backward = backward

        GS = grad_scaler.GradScaler
        orig_scale, orig_step, orig_update = GS.scale, GS.step, GS.update

        def scale(self, outputs):
            out = orig_scale(self, outputs)
            if isinstance(outputs, torch.Tensor):
                rec.unscaled[id(out)] = outputs
            if self.is_enabled():
                rec.amp_counts["scale_calls"] += 1
                if rec.initial_scale is None and getattr(self, "_scale", None) is not None:
                    rec.initial_scale = self._scale.detach().clone().reshape(())
            return out

        def step(self, optimizer, *a, **k):
            if self.is_enabled():
                rec.amp_counts["scaler_steps"] += 1
            before = rec.steps
            try:
                return orig_step(self, optimizer, *a, **k)
            finally:
                if rec.steps == before and (rec.primary is None or optimizer is rec.primary):
                    rec.primary = optimizer  # the scaler skipped the step: it still counts
                    rec._count()

        def update(self, *a, **k):
            if self.is_enabled():
                rec.amp_counts["scaler_updates"] += 1
            r = orig_update(self, *a, **k)
            if self.is_enabled() and self._scale is not None:
                rec.scales.append(self._scale.detach().clone().reshape(()))
            return r

        GS.scale, GS.step, GS.update = scale, step, update

        AC = autocast_mode.autocast
        orig_enter = AC.__enter__

        def ac_enter(self):
            rec.amp_counts["autocast_entered"] += 1
            if getattr(self, "_enabled", False):
                rec.amp_counts["autocast_enabled"] += 1
            return orig_enter(self)

        AC.__enter__ = ac_enter
        orig_gs_init = GS.__init__

        def gs_count(self, *a, **k):
            orig_gs_init(self, *a, **k)
            if self.is_enabled():
                rec.amp_counts["scalers_enabled"] += 1

        GS.__init__ = gs_count
        if self.flop_start == 0:
            self._start_flops()

        if self.opts.mode == "fp32":
            AC = autocast_mode.autocast
            orig_ac = AC.__init__

            def ac_init(self, *a, **k):
                a = list(a)
                if len(a) >= 3:
                    a[2] = False
                else:
                    k["enabled"] = False
                orig_ac(self, *a, **k)

            AC.__init__ = ac_init
            orig_gs = GS.__init__

            def gs_init(self, *a, **k):
                a = list(a)
                if len(a) >= 6:
                    a[5] = False
                else:
                    k["enabled"] = False
                orig_gs(self, *a, **k)

            GS.__init__ = gs_init

        if self.cuda:
            orig_show = warnings.showwarning

            def show(message, category, *a, **k):
                if "synchroniz" in str(message):
                    rec._syncs += 1
                    return
                return orig_show(message, category, *a, **k)

            warnings.showwarning = show

        if self.opts.watch_dtypes:
            orig_linear = torch.nn.Linear.forward

            def linear_forward(mod, x):
                out = orig_linear(mod, x)
                rec.replica_dtypes.add(str(out.dtype))
                return out

            torch.nn.Linear.forward = linear_forward

    def _after_step(self, optimizer, args, kwargs) -> None:
        if self.primary is None:
            self.primary = optimizer
        if optimizer is self.primary:
            self._count()

    def _count(self) -> None:
        torch = self.torch
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append(ev)
        else:
            self.marks.append(time.perf_counter())
        self.losses.append(self.pending_losses)
        self.pending_losses = []
        self.unscaled.clear()
        self.steps += 1
        w = self.opts.warmup
        if self.cuda:
            if self.steps == w:
                torch.cuda.reset_peak_memory_stats()
                self._syncs = 0
                # every sync warning, not once per place (the default filter would hide repeats)
                warnings.filterwarnings("always", message=".*synchroniz.*")
                torch.cuda.set_sync_debug_mode("warn")
            elif w < self.steps <= w + SYNC_WINDOW:
                self.sync_counts.append(self._syncs)
                self._syncs = 0
                if self.steps == w + SYNC_WINDOW:
                    torch.cuda.set_sync_debug_mode(0)
        if self.flop_mode is not None:
            self.flop_steps += 1
            if self.flop_steps >= FLOP_WINDOW:
                self._stop_flops()
        elif self.steps == self.flop_start and self.flop_steps == 0:
            self._start_flops()
        if self.opts.profile and self.steps == w + SYNC_WINDOW:
            self._start_profiler()
        if self.profiler is not None and self.steps == w + SYNC_WINDOW + 3:
            self._stop_profiler()
        if self.steps >= self.opts.steps:
            raise StopTraining()

    def _start_flops(self) -> None:
        try:
            self.flop_mode = FlopsByDtype(self.flops)
            self.flop_mode.__enter__()
        except Exception as exc:  # private machinery: degrade to a note
            self.flops["note"] = f"FLOP counting unavailable: {type(exc).__name__}: {exc}"
            self.flop_mode = None

    def _stop_flops(self) -> None:
        mode, self.flop_mode = self.flop_mode, None
        try:
            mode.__exit__(None, None, None)
        except Exception:
            pass

    def _start_profiler(self) -> None:
        try:
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            self.profiler = profile(activities=acts, record_shapes=True, with_stack=True)
            self.profiler.__enter__()
        except Exception as exc:  # private/optional machinery: degrade to a note
            self.patterns = {"note": f"profiler unavailable: {exc}"}
            self.profiler = None

    def _stop_profiler(self) -> None:
        prof, self.profiler = self.profiler, None
        try:
            prof.__exit__(None, None, None)
            from torch.profiler import _pattern_matcher as pm

            found = {}
            for name, rule in PATTERN_RULES.items():
                cls = getattr(pm, name, None)
                if cls is None:
                    continue
                events = cls(prof, False).matched_events()
                if events:
                    found[name] = {"events": len(events), "rule": rule}
            self.patterns = {"matched": found}
        except Exception as exc:
            self.patterns = {"note": f"pattern matcher unavailable: {type(exc).__name__}: {exc}"}

    # -- results -----------------------------------------------------------------------------
    def results(self) -> dict:
        torch = self.torch
        if self.flop_mode is not None:
            self._stop_flops()
        if self.profiler is not None:
            self._stop_profiler()
        if self.cuda:
            torch.cuda.synchronize()
            times = [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
            self.peak = torch.cuda.max_memory_allocated()
        else:
            times = [(b - a) * 1000 for a, b in zip(self.marks, self.marks[1:])]
        losses = []
        for group in self.losses:
            losses.append(float(torch.stack(group).mean()) if group else None)
        scales = [float(s) for s in self.scales]
        first = [float(self.initial_scale)] if self.initial_scale is not None else []
        # update k lowered the scale: the k-th scaled step was skipped (inf/NaN gradients)
        skipped_at = [k for k, (a, b) in enumerate(zip(first + scales, scales)) if b < a] if first else []
        skipped = len(skipped_at) if first else sum(1 for a, b in zip(scales, scales[1:]) if b < a)
        counted = {k: v for k, v in self.flops.items() if k.startswith("torch.")}
        total = sum(counted.values())
        half = sum(v for k, v in counted.items() if k in HALF)
        return {
            "steps": self.steps,
            "losses": losses,
            "step_times_ms": times,  # times[i]: from step i+1's end to step i+2's end
            # the first interval free of sync counting (and profiling): timing starts there
            "timing_from": self.opts.warmup + SYNC_WINDOW + (3 if self.opts.profile else 0),
            "peak_memory_bytes": self.peak,
            "syncs_per_step": self.sync_counts,
            "scales": scales,
            "skipped_steps": skipped,
            "skipped_at_update": skipped_at,
            "nonfinite_losses": sum(1 for x in losses if x is not None and x != x or x in (float("inf"), float("-inf"))),
            "device": torch.cuda.get_device_name() if self.cuda else "cpu",
            "torch": torch.__version__,
            "profiler_patterns": self.patterns,
            "dtypes_seen": sorted(self.replica_dtypes),
            # the proof that mixed precision happened
            "flops_by_dtype": counted,
            "flop_steps": self.flop_steps if self.flop_mode is None else self.flop_steps,
            "half_flop_fraction": (half / total) if total else None,
            "flop_note": self.flops.get("note"),
            "amp_counts": dict(self.amp_counts, skipped_steps=skipped),
        }


def seed_everything(seed: int) -> None:
    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass
    import torch

    torch.manual_seed(seed)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="ampfix.verify.runner")
    p.add_argument("--mode", choices=["amp", "fp32"], required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--watch-dtypes", action="store_true")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    opts = p.parse_args(argv)
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args

    rank = int(os.environ.get("RANK", "0"))
    out = opts.out if rank == 0 else f"{opts.out}.rank{rank}"
    seed_everything(opts.seed)
    rec = Recorder(opts)
    rec.install()
    sys.argv = [opts.script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(opts.script)))
    status, error, tb = "finished", None, None
    t0 = time.perf_counter()
    try:
        runpy.run_path(opts.script, run_name="__main__")
    except StopTraining:
        status = "stopped"
    except SystemExit as exc:
        if exc.code not in (0, None):
            status, error = "crashed", f"SystemExit({exc.code})"
    except BaseException as exc:  # the script crashed: report it with the step it reached
        status, error, tb = "crashed", f"{type(exc).__name__}: {exc}", traceback.format_exc()
    wall = time.perf_counter() - t0
    try:
        res = rec.results()
    except Exception as exc:  # a crash left the device unusable: keep what we know
        res = {"steps": rec.steps, "results_error": f"{type(exc).__name__}: {exc}"}
    res.update({"mode": opts.mode, "status": status, "error": error, "traceback": tb, "wall_s": wall,
                "script": opts.script, "warmup": opts.warmup})
    with open(out, "w") as fh:
        json.dump(res, fh)
    # leave without running the script's remaining teardown (threads, atexit of a killed loop)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
