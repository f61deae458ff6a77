"""``ampfix verify``: run a training script in child processes and compare AMP with FP32.

Each mode is a separate run of the unchanged script (``ampfix.verify.runner`` instruments it):
``amp`` runs it as written, ``fp32`` forces every autocast region and GradScaler off.  The
verdict compares the two loss curves and reports speed, memory and host syncs per step.

Loss tolerance: both curves are smoothed with a trailing moving average over
``max(3, steps // 10)`` steps (one step's loss is noisy: batch order, float16 rounding), then the
AMP curve must satisfy ``|amp - fp32| <= rtol * |fp32| + atol`` at every step after warm-up,
with ``rtol = 0.10`` and ``atol = 0.02 * |fp32[0]|`` (an absolute floor, so that a loss
approaching zero does not make the relative test meaningless).  float16 autocast changes each
step's loss by well under 1% on well-conditioned models; real AMP bugs (stepping on scaled
gradients, float16 overflow, a scale that never adapts) move the curve by factors or produce
NaN, far outside the band.  Both numbers are options (``--rtol``, ``--atol``).
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional


class VerifyError(Exception):
    """A problem that stops verify before anything runs (no GPU, no script): one line."""


@dataclass
class Options:
    steps: int = 50
    warmup: int = 5
    timeout: float = 600.0
    device: str = "auto"
    rtol: float = 0.10
    atol_frac: float = 0.02
    nproc: int = 1
    profile: bool = True
    watch_dtypes: bool = False
    seed: int = 0
    env: Dict[str, str] = field(default_factory=dict)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        raise VerifyError("ampfix verify needs torch: pip install 'ampfix[verify]'") from None
    return torch.cuda.is_available()


def run_mode(script: str, args: List[str], mode: str, opts: Options) -> dict:
    """Run the script once in a child process group; return the runner's JSON (plus status)."""
    fd, out = tempfile.mkstemp(prefix="ampfix-verify-", suffix=".json")
    os.close(fd)
    os.unlink(out)
    runner = ["-m", "ampfix.verify.runner", "--mode", mode, "--steps", str(opts.steps), "--warmup", str(opts.warmup),
              "--out", out, "--device", opts.device, "--seed", str(opts.seed)]
    if opts.profile and mode == "amp":
        runner.append("--profile")
    if opts.watch_dtypes:
        runner.append("--watch-dtypes")
    if opts.nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={opts.nproc}",
               "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", *runner, script, "--", *args]
    else:
        cmd = [sys.executable, *runner, script, "--", *args]
    env = {**os.environ, **opts.env, "PYTHONUNBUFFERED": "1"}
    if opts.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=opts.timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill(proc)
        output, _ = proc.communicate()
    except KeyboardInterrupt:
        _kill(proc)
        raise
    result = {"mode": mode, "status": "no result", "steps": 0}
    if os.path.exists(out):
        with open(out) as fh:
            result = json.load(fh)
        os.unlink(out)
    if timed_out:
        result.update(status="timeout", error=f"killed after {opts.timeout:.0f} s")
    elif proc.returncode != 0 and result.get("status") in ("no result", "stopped", "finished"):
        result.update(status="crashed", error=result.get("error") or f"exit code {proc.returncode}")
    result["output_tail"] = output[-4000:]
    if result.get("status") == "finished" and not result.get("steps"):
        result["status"] = "never stepped"
        result["error"] = "the script finished without calling optimizer.step()"
    return result


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def smooth(values: List[float], window: int) -> List[float]:
    out, acc = [], []
    for v in values:
        acc.append(v)
        if len(acc) > window:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def compare(amp: dict, ref: dict, opts: Options) -> dict:
    """The loss-band verdict and the speed, memory and sync figures of amp against ref."""
    a = [x for x in amp.get("losses", []) if x is not None]
    f = [x for x in ref.get("losses", []) if x is not None]
    # a step the GradScaler skipped (its first steps calibrate the scale) did not update the
    # weights: the AMP curve runs that many steps behind; compare the steps that applied
    skipped = amp.get("skipped_at_update") or []
    counts = amp.get("amp_counts") or {}
    aligned = bool(skipped) and counts.get("scaler_updates", 0) >= len(a) - 1 and \
        counts.get("scaler_steps", 0) <= counts.get("scaler_updates", 0) + 1
    if aligned:
        drop = set(skipped)
        a = [x for i, x in enumerate(a) if i not in drop]
    n = min(len(a), len(f))
    cmp: dict = {"compared_steps": n, "skipped_steps_left_out": len(skipped) if aligned else 0}
    if n == 0:
        cmp["loss_within_tolerance"] = False
        cmp["loss_note"] = "no losses to compare"
        return cmp
    window = max(3, n // 10)
    sa, sf = smooth(a[:n], window), smooth(f[:n], window)
    atol = opts.atol_frac * abs(f[0])
    parted = None
    worst = 0.0
    for i in range(min(opts.warmup, n - 1), n):
        dev = abs(sa[i] - sf[i])
        worst = max(worst, dev / (abs(sf[i]) or 1.0))
        if dev > opts.rtol * abs(sf[i]) + atol and parted is None:
            parted = i
    cmp.update(
        smoothing_window=window, rtol=opts.rtol, atol=atol, max_relative_deviation=worst,
        loss_within_tolerance=parted is None, parted_at_step=parted,
        amp_final_loss=sa[-1], fp32_final_loss=sf[-1],
    )
    ta, tf = _steady(amp, opts), _steady(ref, opts)
    if ta and tf:
        cmp["amp_step_ms"] = statistics.median(ta)
        cmp["fp32_step_ms"] = statistics.median(tf)
        cmp["speedup"] = cmp["fp32_step_ms"] / cmp["amp_step_ms"]
        # the noise of a mode: half the spread of its middle steps (the interquartile range)
        noise = max(_spread(ta), _spread(tf))
        cmp["step_noise_ms"] = noise
        half = (amp.get("half_flop_fraction") or 0) > 0
        beyond = abs(cmp["fp32_step_ms"] - cmp["amp_step_ms"]) > noise
        cmp["speedup_measured"] = bool(half and beyond)
        if not half:
            cmp["speedup_note"] = "no half-precision compute ran, so there is no speed-up to measure"
        elif not beyond:
            cmp["speedup_note"] = (f"the step times differ by less than their noise (±{noise:.2f} ms): "
                                   "no measurable speed-up")
    if amp.get("peak_memory_bytes") and ref.get("peak_memory_bytes"):
        cmp["memory_ratio"] = amp["peak_memory_bytes"] / ref["peak_memory_bytes"]
    return cmp


def _spread(times: List[float]) -> float:
    """Half the interquartile range of step times (0 with fewer than four)."""
    if len(times) < 4:
        return 0.0
    q = statistics.quantiles(times, n=4)
    return (q[2] - q[0]) / 2


def _steady(run: dict, opts: Options) -> List[float]:
    """Step times after warm-up, sync counting and profiling (all of them if too few steps ran)."""
    times = run.get("step_times_ms") or []
    start = max(run.get("timing_from", opts.warmup), opts.warmup)
    return times[start:] if len(times) > start + 2 else times[opts.warmup:] or times


def mixed_precision(amp: dict) -> dict:
    """Whether the AMP run really ran in mixed precision, and if not, why (plain words)."""
    reasons = []
    frac = amp.get("half_flop_fraction")
    counts = amp.get("amp_counts") or {}
    if "flops_by_dtype" not in amp:
        return {"proved": None, "reasons": ["the run recorded no precision figures"]}
    if frac is None:
        reasons.append("no matmul, convolution or attention ran in the measured steps, so half precision cannot "
                       "be shown" + (f" ({amp['flop_note']})" if amp.get("flop_note") else ""))
        proved = None
    else:
        proved = frac > 0
        if not proved:
            why = f"{counts.get('autocast_enabled', 0)} autocast regions entered enabled"
            if counts.get("autocast_entered") and not counts.get("autocast_enabled"):
                why = (f"{counts['autocast_entered']} autocast regions entered, all disabled: enabled=False, or "
                       "autocast('cuda') with no GPU in use")
            reasons.append(f"the AMP run did no float16/bfloat16 matmul or convolution: mixed precision never "
                           f"happened ({why})")
    if counts.get("scalers_enabled") and not counts.get("scale_calls"):
        proved = False
        reasons.append("a GradScaler exists but scaled no loss: backward ran unscaled")
    if counts.get("scaler_updates") and counts.get("skipped_steps", 0) >= counts["scaler_updates"]:
        proved = False
        reasons.append(f"the GradScaler skipped every step ({counts['skipped_steps']} of {counts['scaler_updates']}): "
                       "the gradients were inf/NaN each time, nothing trained")
    return {"proved": proved, "reasons": reasons}


def verdict(runs: Dict[str, dict], cmp: dict) -> dict:
    amp, ref = runs["amp"], runs["fp32"]
    ran = all(r.get("status") in ("stopped", "finished") for r in (amp, ref))
    finite = not amp.get("nonfinite_losses") and not ref.get("nonfinite_losses")
    mp = mixed_precision(amp)
    ok = ran and finite and cmp.get("loss_within_tolerance", False) and mp["proved"] is not False
    return {"ran": ran, "finite": finite, "loss_tracks_fp32": cmp.get("loss_within_tolerance", False),
            "mixed_precision": mp["proved"], "reasons": mp["reasons"], "pass": ok}


def verify(script: str, args: List[str], opts: Options, original: Optional[str] = None) -> dict:
    if not os.path.isfile(script):
        raise VerifyError(f"{script}: no such file")
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise VerifyError("ampfix verify needs torch in this Python "
                          f"({sys.executable}): pip install 'ampfix[verify]'")
    if opts.device != "cpu" and not _cuda_available():
        raise VerifyError("no CUDA GPU is visible: verify measures AMP on a GPU "
                          "(use --device cpu to check the plumbing with CPU autocast)")
    runs = {"amp": run_mode(script, args, "amp", opts), "fp32": run_mode(script, args, "fp32", opts)}
    report = {"script": script, "args": args, "options": {k: v for k, v in vars(opts).items() if k != "env"},
              "runs": runs}
    if original:
        orig = run_mode(original, args, "amp", opts)
        if "No module named 'apex'" in (orig.get("traceback") or "") + (orig.get("output_tail") or ""):
            orig["note"] = "not runnable here: it needs apex; the fp32 run is the reference"
        runs["original"] = orig
    report["comparison"] = compare(runs["amp"], runs["fp32"], opts)
    report["verdict"] = verdict(runs, report["comparison"])
    return report


def number(x: float) -> str:
    """A figure people read: four significant digits, never 0.0000 for a small non-zero value."""
    if x == 0 or x != x or x in (float("inf"), float("-inf")):
        return str(x) if x else "0"
    return f"{x:.4g}"


def format_report(rep: dict) -> str:
    lines = [f"ampfix verify {rep['script']}"]
    rows = [("run", "status", "steps", "final loss", "step ms", "peak MiB", "syncs/step", "skipped")]
    o = rep.get("options") or {}
    opts = Options(**{k: v for k, v in o.items() if k in Options.__dataclass_fields__})
    for name, r in rep["runs"].items():
        times = _steady(r, opts)  # the steps the speed-up is computed from
        losses = [x for x in r.get("losses") or [] if x is not None]
        syncs = r.get("syncs_per_step") or []
        rows.append((name, r.get("status", "?"), str(r.get("steps", 0)),
                     number(losses[-1]) if losses else "-",
                     f"{statistics.median(times):.2f}" if times else "-",
                     f"{r['peak_memory_bytes'] / 2**20:.0f}" if r.get("peak_memory_bytes") else "-",
                     f"{statistics.median(syncs):.0f}" if syncs else "-",
                     str(r.get("skipped_steps", "-"))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)))
    c = rep["comparison"]
    if c.get("speedup_measured"):
        lines.append(f"  speed-up vs fp32: {c['speedup']:.2f}x  ({c['fp32_step_ms']:.2f} ms -> {c['amp_step_ms']:.2f} ms a step)")
    elif "speedup_note" in c:
        lines.append(f"  speed-up vs fp32: none shown: {c['speedup_note']}")
    if "memory_ratio" in c:
        lines.append(f"  peak memory vs fp32: {c['memory_ratio']:.2f}x")
    if "max_relative_deviation" in c:
        band = f"rtol {c['rtol']:.0%} + atol {c['atol']:.3g}, smoothed over {c['smoothing_window']} steps"
        where = "" if c["loss_within_tolerance"] else f"; they part at step {c['parted_at_step']}"
        lines.append(f"  loss vs fp32: max deviation {c['max_relative_deviation']:.1%} ({band}){where}")
    for name, r in rep["runs"].items():
        if r.get("error"):
            lines.append(f"  {name}: {r['status']} at step {r.get('steps', 0)}: {r['error']}")
            tail = r.get("traceback") or r.get("output_tail") or ""
            lines.extend("    " + t for t in tail.rstrip().splitlines()[-8:])
        if r.get("note"):
            lines.append(f"  {name}: {r['note']}")
    pats = (rep["runs"]["amp"].get("profiler_patterns") or {})
    if pats.get("matched"):
        lines.append("  profiler anti-patterns (torch.profiler._pattern_matcher):")
        for name, info in pats["matched"].items():
            lines.append(f"    {name}: {info['events']} events" + (f"  (static rule {info['rule']})" if info["rule"] else ""))
    elif pats.get("note"):
        lines.append(f"  profiler: {pats['note']}")
    amp = rep["runs"]["amp"]
    if "flops_by_dtype" in amp:
        fl = amp["flops_by_dtype"]
        total = sum(fl.values())
        share = ", ".join(f"{k.replace('torch.', '')} {v / total:.0%}" for k, v in sorted(fl.items(), key=lambda x: -x[1])) \
            if total else "none measured"
        lines.append(f"  amp run, matmul/conv FLOPs by dtype over {amp.get('flop_steps', 0)} steps: {share}"
                     + (f" ({_human(total)}FLOP)" if total else ""))
        c2 = amp.get("amp_counts") or {}
        lines.append(f"  autocast regions entered: {c2.get('autocast_enabled', 0)} enabled of "
                     f"{c2.get('autocast_entered', 0)}; GradScaler: {c2.get('scalers_enabled', 0)} enabled, "
                     f"scale {c2.get('scale_calls', 0)}, step {c2.get('scaler_steps', 0)}, update "
                     f"{c2.get('scaler_updates', 0)}, skipped steps {c2.get('skipped_steps', 0)}")
    v = rep["verdict"]
    mp = {True: "yes", False: "NO", None: "not shown"}[v.get("mixed_precision")]
    lines.append("  verdict: " + ("PASS" if v["pass"] else "FAIL") +
                 f" (ran: {v['ran']}, finite: {v['finite']}, loss tracks fp32: {v['loss_tracks_fp32']}, "
                 f"mixed precision: {mp})")
    for why in v.get("reasons", []):
        lines.append(f"    {why}")
    return "\n".join(lines)


def _human(n: float) -> str:
    for unit, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} "


def plot(rep: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise VerifyError("--plot needs matplotlib: pip install 'ampfix[plot]'") from None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name in ("fp32", "amp"):
        r = rep["runs"][name]
        losses = [x for x in r.get("losses") or [] if x is not None]
        ax1.plot(losses, label=f"{name} (raw)", alpha=0.35)
        if losses:
            ax1.plot(smooth(losses, rep["comparison"].get("smoothing_window", 3)), label=f"{name} (smoothed)")
        ax2.plot(r.get("step_times_ms") or [], label=name)
    ax1.set(title="loss", xlabel="step")
    ax2.set(title="step time (ms)", xlabel="step")
    ax1.legend()
    ax2.legend()
    fig.suptitle(os.path.basename(rep["script"]))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
