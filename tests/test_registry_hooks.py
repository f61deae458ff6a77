"""An optimizer hook that a registry builds from the configuration (mmcv's ``DistOptimizerHook``
shape, fixtures/projects/registry_hook): the hook makes the GradScaler where its ``use_fp16`` is
set, the train API's initialize goes, the framework's ``fp16_enabled`` flag keeps the forward
under autocast, and the checkpoint helpers' apex state goes.  Where any piece is missing, the
whole project stays as it was."""
import filecmp
import shutil
import textwrap
from pathlib import Path

from click.testing import CliRunner

from ampfix.cli import main
from ampfix.engine.check import check_source
from ampfix.model.settings import Settings
from ampfix.registry import all_rules

BEFORE = Path(__file__).resolve().parents[1] / "fixtures" / "projects" / "registry_hook" / "before"
FLAG_LOOP = """            for m in model.modules():
                if hasattr(m, "fp16_enabled"):
                    m.fp16_enabled = True
"""


def run(path, *extra):
    return CliRunner().invoke(main, ["migrate", "--write", "--torch-version", "2.4", *extra, str(path)])


def unchanged(work: Path, rel: str) -> bool:
    return filecmp.cmp(work / rel, BEFORE / rel, shallow=False)


def test_without_the_frameworks_flag_nothing_autocasts_the_forward_so_all_is_refused(tmp_path):
    work = tmp_path / "p"
    shutil.copytree(BEFORE, work)
    api = work / "apis" / "train.py"
    assert FLAG_LOOP in api.read_text()
    api.write_text(api.read_text().replace(FLAG_LOOP, ""))
    out = run(work)
    assert "callers cannot all be followed" in out.output, out.output
    for rel in ("custom/optimizer_hook.py", "custom/checkpoint.py", "custom/runner.py"):
        assert unchanged(work, rel), rel
    assert "apex.amp.initialize" in api.read_text()


def test_two_copies_pair_up_among_themselves(tmp_path):
    """A monorepo with two copies of the project: the one without the flag is left whole (its
    train API keeps the initialize its hook needs), the other migrates."""
    good, bad = tmp_path / "a" / "seg", tmp_path / "b" / "seg"
    shutil.copytree(BEFORE, good)
    shutil.copytree(BEFORE, bad)
    api = bad / "apis" / "train.py"
    api.write_text(api.read_text().replace(FLAG_LOOP, ""))
    out = run(tmp_path)
    assert out.exit_code in (0, 1), out.output
    assert "apex.amp.initialize" in api.read_text()
    assert "apex.amp.scale_loss" in (bad / "custom" / "optimizer_hook.py").read_text()
    assert "apex.amp.state_dict" in (bad / "custom" / "checkpoint.py").read_text()
    assert "apex" not in (good / "apis" / "train.py").read_text()
    assert "self.scaler = torch.amp.GradScaler" in (good / "custom" / "optimizer_hook.py").read_text()


def test_a_hook_built_by_a_call_keeps_its_state_and_is_not_dropped(tmp_path):
    """Where the project builds the hook itself, the checkpoint's apex state is not dropped:
    a call could carry the scaler, so the case is left for a person."""
    work = tmp_path / "p"
    shutil.copytree(BEFORE, work)
    api = work / "apis" / "train.py"
    text = api.read_text().replace('runner.register_training_hooks(cfg["optimizer_config"])',
                                   'from custom.optimizer_hook import DistOptimizerHook\n'
                                   '    hook_cfg = dict(cfg["optimizer_config"])\n'
                                   '    hook_cfg.pop("type")\n'
                                   '    runner.register_training_hooks(DistOptimizerHook(**hook_cfg))')
    api.write_text(text)
    run(work)
    assert "apex.amp.state_dict" in (work / "custom" / "checkpoint.py").read_text()
    assert unchanged(work, "custom/optimizer_hook.py")


def test_the_stale_apex_comments_go_with_what_they_described(tmp_path):
    work = tmp_path / "p"
    shutil.copytree(BEFORE, work)
    run(work)
    assert "apex" not in (work / "custom" / "checkpoint.py").read_text()
    assert "apex" not in (work / "apis" / "train.py").read_text()
    # the flag that now drives the framework's autocast stays
    assert "m.fp16_enabled = True" in (work / "apis" / "train.py").read_text()


def migrate(code: str):
    return check_source(textwrap.dedent(code).encode(), "x.py", all_rules(), Settings(torch_version=(2, 4)),
                        fix="safe")


def test_a_clip_at_the_accumulation_step_reads_unscaled_gradients():
    """apex unscaled the gradients on every backward; with the GradScaler they stay scaled until
    the step, so unscale_ goes right before the clip there (not after each micro-batch)."""
    res = migrate("""
        import torch
        from apex import amp

        model = torch.nn.Linear(4, 4).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        for i, (x, y) in enumerate(loader):
            loss = ((model(x) - y) ** 2).mean()
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            if (i + 1) % 4 == 0:
                if clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
    """)
    out = res.fixed
    assert out is not None and "apex" not in out, out
    lines = [x.strip() for x in out.splitlines()]
    clip = lines.index("torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)")
    assert lines[clip - 1] == "scaler.unscale_(optimizer)", out
    assert lines.count("scaler.unscale_(optimizer)") == 1
    assert lines.index("scaler.scale(loss).backward()") < clip


def test_a_project_floor_below_mmcv_1_3_is_raised_with_the_migration(tmp_path):
    """mmcv before 1.3 casts the inputs to float16 without autocast: the migrated forward would
    stop on a dtype mismatch, so the package's own version floor goes to 1.3.0."""
    work = tmp_path / "p"
    shutil.copytree(BEFORE, work)
    (work / "apis" / "__init__.py").write_text("mmcv_minimum_version = '1.2.4'\nmmcv_maximum_version = '1.4.0'\n")
    out = run(work)
    assert out.exit_code in (0, 1), out.output
    assert (work / "apis" / "__init__.py").read_text() == \
        "mmcv_minimum_version = '1.3.0'\nmmcv_maximum_version = '1.4.0'\n"
    again = CliRunner().invoke(main, ["migrate", "--torch-version", "2.4", str(work)])
    assert "would be rewritten" not in again.output, again.output


def test_bfloat16_is_refused_where_the_framework_autocasts_to_float16(tmp_path):
    """mmcv's auto_fp16 autocasts to float16 whatever --dtype says: without the GradScaler that
    bfloat16 drops, float16 gradients would underflow, so the project stays whole."""
    work = tmp_path / "p"
    shutil.copytree(BEFORE, work)
    out = run(work, "--dtype", "bfloat16")
    assert "without --dtype bfloat16" in out.output, out.output
    for rel in ("apis/train.py", "custom/optimizer_hook.py", "custom/checkpoint.py", "custom/runner.py"):
        assert unchanged(work, rel), rel
