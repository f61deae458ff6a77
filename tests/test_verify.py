"""ampfix verify on the CPU (CI has no GPU): the plumbing, the verdict, crashes, JSON and plot.
The GPU figures come from bench/gpu_run.sh on a GPU machine; tests marked gpu run there."""
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from click.testing import CliRunner

from ampfix.cli import main
from ampfix.verify import Options, compare, smooth

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "fixtures" / "verify" / "tiny_cpu.py")


def run(*args):
    return CliRunner().invoke(main, ["verify", *args], catch_exceptions=False)


def test_cpu_verify_passes_and_writes_json_and_plot(tmp_path):
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    r = run("--device", "cpu", "--steps", "25", TINY, "--json", str(js), "--plot", str(png))
    assert r.exit_code == 0, r.output
    assert "verdict: PASS" in r.output
    rep = json.loads(js.read_text())
    amp, fp32 = rep["runs"]["amp"], rep["runs"]["fp32"]
    assert amp["status"] == fp32["status"] == "stopped"
    assert amp["steps"] == fp32["steps"] == 25
    assert len(amp["losses"]) == 25 and all(isinstance(x, float) for x in amp["losses"])
    assert amp["losses"][-1] < amp["losses"][0]  # it trains
    assert amp["losses"] != fp32["losses"]  # fp32 really ran without bfloat16 autocast
    assert rep["comparison"]["loss_within_tolerance"] is True
    assert rep["verdict"] == {"ran": True, "finite": True, "loss_tracks_fp32": True, "mixed_precision": True,
                              "reasons": [], "pass": True}
    # the proof: bfloat16 matmul FLOPs, autocast regions entered, and none of it in the fp32 run
    assert amp["half_flop_fraction"] > 0.5 and amp["flops_by_dtype"]["torch.bfloat16"] > 0
    assert amp["amp_counts"]["autocast_enabled"] == 25
    assert fp32["half_flop_fraction"] == 0 and fp32["amp_counts"]["autocast_enabled"] == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_crash_is_reported_with_step_and_traceback():
    r = run("--device", "cpu", "--steps", "25", "--no-profile", TINY, "--crash-at", "7")
    assert r.exit_code == 1
    assert "crashed at step 7: RuntimeError: boom at step 7" in r.output
    assert "tiny_cpu.py\", line" in r.output
    assert "verdict: FAIL" in r.output


def test_script_that_never_steps():
    r = run("--device", "cpu", "--no-profile", TINY, "--no-step")
    assert r.exit_code == 1 and "without calling optimizer.step()" in r.output


def test_timeout_kills_the_process_group(tmp_path):
    hang = tmp_path / "hang.py"
    hang.write_text("import time, subprocess, sys\n"
                    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
                    "time.sleep(300)\n")
    r = run("--device", "cpu", "--timeout", "5", "--no-profile", str(hang))
    assert r.exit_code == 1 and "timeout" in r.output and "killed after 5 s" in r.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_no_gpu_is_a_clear_error():
    r = CliRunner().invoke(main, ["verify", TINY])
    assert r.exit_code == 2 and "no CUDA GPU is visible" in r.output


def test_missing_script():
    r = CliRunner().invoke(main, ["verify", "--device", "cpu", "nope.py"])
    assert r.exit_code == 2 and "nope.py: no such file" in r.output


def test_compare_reports_where_curves_part():
    opts = Options(warmup=2)
    ref = {"losses": [1.0] * 40, "step_times_ms": [10.0] * 39, "peak_memory_bytes": 100}
    good = {"losses": [1.01] * 40, "step_times_ms": [5.0] * 39, "peak_memory_bytes": 60}
    bad = {"losses": [1.0] * 20 + [3.0] * 20, "step_times_ms": [5.0] * 39}
    c = compare(good, ref, opts)
    assert c["loss_within_tolerance"] and c["speedup"] == 2.0 and c["memory_ratio"] == 0.6
    c = compare(bad, ref, opts)
    assert not c["loss_within_tolerance"] and 20 <= c["parted_at_step"] <= 22
    assert smooth([0, 3, 6, 9], 2) == [0, 1.5, 4.5, 7.5]


def test_migrate_in_memory_leaves_the_tree_alone(tmp_path):
    script = tmp_path / "t.py"
    src = Path(TINY).read_text().replace("import torch.nn as nn", "import torch.nn as nn\nimport torch.cuda")
    src = src.replace("opt.zero_grad()", "opt.zero_grad(set_to_none=False)")
    script.write_text(src)
    r = run("--device", "cpu", "--steps", "12", "--no-profile", "--migrate", str(script))
    assert "migrated in memory" in r.output and "verdict: PASS" in r.output
    assert script.read_text() == src
    assert [p.name for p in tmp_path.iterdir()] == ["t.py"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_transformer_fixture_amp_is_faster(tmp_path):
    script = ROOT / "fixtures" / "apex" / "after" / "transformer_lm.py"
    js = tmp_path / "r.json"
    r = run("--steps", "30", str(script), "--json", str(js))
    rep = json.loads(js.read_text())
    assert rep["verdict"]["ran"] and rep["verdict"]["finite"], r.output
    assert rep["comparison"]["speedup"] > 1.0
    assert rep["runs"]["amp"]["syncs_per_step"], "sync counting ran"


def test_a_program_that_never_ran_in_half_precision_fails(tmp_path):
    js = tmp_path / "r.json"
    r = run("--device", "cpu", "--steps", "20", "--no-profile", str(ROOT / "fixtures" / "verify" / "never_half.py"),
            "--json", str(js))
    assert r.exit_code == 1 and "verdict: FAIL" in r.output, r.output
    assert "mixed precision never happened" in r.output and "scaled no loss" in r.output
    rep = json.loads(js.read_text())
    assert rep["comparison"]["loss_within_tolerance"] is True  # the losses agree: that alone proved nothing
    assert rep["verdict"]["mixed_precision"] is False
    assert rep["runs"]["amp"]["half_flop_fraction"] == 0
    assert rep["runs"]["amp"]["amp_counts"]["scalers_enabled"] == 1
    assert rep["runs"]["amp"]["amp_counts"]["scale_calls"] == 0


def test_a_scaler_that_skips_every_step_fails():
    r = run("--device", "cpu", "--steps", "12", "--no-profile", str(ROOT / "fixtures" / "verify" / "skips_every_step.py"))
    assert r.exit_code == 1 and "skipped every step" in r.output, r.output


def test_json_to_stdout_is_json_alone(tmp_path):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "ampfix", "verify", "--device", "cpu", "--steps", "8", "--no-profile",
                        TINY, "--json", "-"], capture_output=True, text=True, timeout=300)
    rep = json.loads(p.stdout)
    assert rep["verdict"]["pass"] is True
    assert "verdict: PASS" in p.stderr


def test_compare_leaves_out_the_steps_the_scaler_skipped():
    """GradScaler's first steps calibrate its scale and are skipped: the AMP curve runs behind by
    that many steps; compared step for step it parts from fp32 although nothing is wrong."""
    fp32 = [10 * 0.7 ** i for i in range(30)]
    amp = [fp32[0], fp32[0]] + fp32[:28]  # two skipped steps, then the same descent
    opts = Options(steps=30, warmup=2)
    plain = compare({"losses": amp}, {"losses": fp32}, opts)
    assert plain["loss_within_tolerance"] is False
    counts = {"scaler_updates": 30, "scaler_steps": 30}
    aligned = compare({"losses": amp, "skipped_at_update": [0, 1], "amp_counts": counts}, {"losses": fp32}, opts)
    assert aligned["loss_within_tolerance"] is True and aligned["skipped_steps_left_out"] == 2


def test_report_numbers_are_readable_and_agree():
    """A final loss of 5.2e-05 is not printed as 0.0000, and the table's step time is the one the
    speed-up line is computed from (steady steps, after warm-up)."""
    from ampfix.verify import format_report, verdict

    opts = Options(warmup=2)
    amp = {"status": "stopped", "steps": 12, "losses": [1.0] * 11 + [5.2e-05],
           "step_times_ms": [90.0, 80.0] + [4.0] * 10, "half_flop_fraction": 1.0}
    fp32 = {"status": "stopped", "steps": 12, "losses": [1.0] * 11 + [5.3e-05],
            "step_times_ms": [95.0, 85.0] + [8.0] * 10}
    rep = {"script": "t.py", "options": vars(opts), "runs": {"amp": amp, "fp32": fp32}}
    rep["comparison"] = compare(amp, fp32, opts)
    rep["verdict"] = verdict(rep["runs"], rep["comparison"])
    text = format_report(rep)
    assert "5.2e-05" in text and "0.0000" not in text
    row = next(line for line in text.splitlines() if line.strip().startswith("amp "))
    assert " 4.00 " in row and "8.00 ms -> 4.00 ms a step" in text


def test_a_speed_up_is_shown_only_when_half_precision_ran_and_beyond_the_noise():
    opts = Options(warmup=2)
    ref = {"losses": [1.0] * 40, "step_times_ms": [10.0, 12.0, 9.0, 11.0] * 10}
    noisy = {"losses": [1.0] * 40, "step_times_ms": [9.5, 11.5, 8.5, 10.5] * 10, "half_flop_fraction": 1.0}
    c = compare(noisy, ref, opts)
    assert not c["speedup_measured"] and "noise" in c["speedup_note"]
    fast = {"losses": [1.0] * 40, "step_times_ms": [5.0, 5.5, 4.5, 5.2] * 10, "half_flop_fraction": 1.0}
    assert compare(fast, ref, opts)["speedup_measured"]
    fp32_twice = {"losses": [1.0] * 40, "step_times_ms": [5.0, 5.5, 4.5, 5.2] * 10, "half_flop_fraction": 0.0}
    c = compare(fp32_twice, ref, opts)
    assert not c["speedup_measured"] and "no half-precision" in c["speedup_note"]
