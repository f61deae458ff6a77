"""`migrate --dtype bfloat16`: bfloat16 autocast and no GradScaler (bfloat16 has float32's range,
so nothing scales the loss), from the same planning as float16."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ampfix.cli import main
from ampfix.engine.check import check_source
from ampfix.model.settings import Settings
from ampfix.registry import all_rules

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "apex"
BF16 = Settings(dtype="bfloat16")
#: every training shape of the goldens, apex.amp and FP16_Optimizer alike
NAMES = ["trainer_class.py", "transformer_lm.py", "bert_finetune.py", "closure_accum_clip.py", "step_hack_accum.py",
         "gan.py", "checkpoint_resume.py", "nested_guards.py", "lazy_setup.py", "split_step_trainer.py",
         "grad_reads.py", "fp16_opt_callee.py", "bert_fp16_optimizer.py", "inference_only.py"]


def migrated(name: str) -> str:
    res = check_source((FIX / "before" / name).read_bytes(), "x.py", all_rules(), BF16, fix="safe")
    return res.fixed


@pytest.mark.parametrize("name", NAMES)
def test_bfloat16_migration_has_no_scaler_and_runs(name, tmp_path):
    out = migrated(name)
    assert out and "from apex" not in out and "import apex" not in out, out
    assert "torch.bfloat16" in out and "torch.float16" not in out
    assert "GradScaler" not in out and ".scale(" not in out and "unscale_" not in out and ".update()" not in out
    compile(out, name, "exec")
    again = check_source(out.encode(), "x.py", all_rules(), BF16, fix="safe")
    assert again.fixed in (None, out), "a second migrate changed the file"
    script = tmp_path / name
    script.write_text(out)
    if name == "inference_only.py":
        return
    run = subprocess.run([sys.executable, str(script), "--steps", "3"], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]


def test_a_flag_is_carried_only_where_a_function_reads_it():
    """Where autocast reads the seed's own condition no flag is made; a trainer keeps one on self,
    made disabled in __init__; a function the optimizer is handed to takes it as a parameter."""
    assert "use_amp" not in migrated("nested_guards.py")
    t = migrated("trainer_class.py")
    assert "self.use_amp = False" in t and "self.use_amp = bool(self.fp16)" in t and "enabled=self.use_amp" in t
    f = migrated("fp16_opt_callee.py")
    assert "def train(args, model, device, loader, optimizer, epoch, *, use_amp):" in f
    assert "use_amp=use_amp" in f and "enabled=use_amp" in f


def test_per_micro_batch_clip_is_exact_and_safe_in_bfloat16():
    """No loss scaling means nothing to unscale: the clip of every micro-batch stays where it was
    (float16 keeps it there through a helper that divides the norm by the scale)."""
    res = check_source((FIX / "before" / "bert_finetune.py").read_bytes(), "x.py", all_rules(), BF16, fix="safe")
    amp = [d for d in res.diagnostics if d.code == "AMP101"]
    assert not amp, amp
    assert "torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)" in res.fixed


def test_checkpoint_keeps_an_empty_amp_entry_and_loading_ignores_it():
    out = migrated("checkpoint_resume.py")
    assert '"amp": {}' in out and "load_state_dict(checkpoint[\"amp\"])" not in out


def test_o3_is_refused_with_the_reason():
    res = check_source((FIX / "before" / "o3_pure_fp16.py").read_bytes(), "x.py", all_rules(), BF16, fix="safe")
    assert any(d.code == "AMP101" and "bfloat16" in d.message and "O3" in d.message for d in res.diagnostics)


def test_dtype_from_the_command_line_and_the_config(tmp_path):
    (tmp_path / "t.py").write_bytes((FIX / "before" / "trainer_class.py").read_bytes())
    out = CliRunner().invoke(main, ["migrate", "--dtype", "bfloat16", str(tmp_path / "t.py")])
    assert "torch.bfloat16" in out.output and "GradScaler" not in out.output.split("would be rewritten")[0]
    (tmp_path / "pyproject.toml").write_text('[tool.ampfix]\ndtype = "bfloat16"\n')
    out = CliRunner().invoke(main, ["migrate", str(tmp_path / "t.py")])
    assert "torch.bfloat16" in out.output
    show = CliRunner().invoke(main, ["check", "--show-settings", str(tmp_path / "t.py")])
    assert "bfloat16" in show.output
    (tmp_path / "pyproject.toml").write_text('[tool.ampfix]\ndtype = "bf16"\n')
    bad = CliRunner().invoke(main, ["migrate", str(tmp_path / "t.py")])
    assert bad.exit_code == 2 and "dtype must be one of float16, bfloat16" in bad.output
