"""Golden tests: fixtures/apex/before/*.py migrate to fixtures/apex/after/*.py, and the after
scripts run (on the CPU here: autocast("cuda") and GradScaler("cuda") disable themselves)."""
import os
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from ampfix.engine.check import check_source
from ampfix.registry import all_rules
from ampfix.model.settings import Settings

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "apex"
NAMES = sorted(p.name for p in (FIX / "before").glob("*.py"))


#: migrations whose fix is unsafe (the report says why): their goldens are what --unsafe-fixes writes
#: with the apex rules alone (the other rules' unsafe fixes are not part of the migration)
UNSAFE: dict = {
    # the clip after FP16_Optimizer's backward did nothing on the float16 path; now it clips
    "fp16_model_clip.py": "the clip at line 40 clipped the float16 model's gradients",
}


def migrate(data: bytes, name: str = ""):
    if name in UNSAFE:
        return check_source(data, "x.py", [r for r in all_rules() if r.code.startswith("AMP1")], Settings(),
                            fix="unsafe")
    return check_source(data, "x.py", all_rules(), Settings(), fix="safe")


def comments(text):
    import io
    return [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]


def _above_removed_code(before: str, after: str, comment: str) -> bool:
    """``comment`` is a whole-line comment of a run of them right above a statement that is not in
    ``after`` any more."""
    lines = before.splitlines()
    i = next((k for k, x in enumerate(lines) if x.strip() == comment.strip()), None)
    if i is None:
        return False
    while i < len(lines) and lines[i].strip().startswith("#"):
        i += 1
    kept = {x.strip() for x in after.splitlines()}
    return i < len(lines) and lines[i].strip() != "" and lines[i].strip() not in kept


@pytest.mark.parametrize("name", NAMES)
def test_golden(name):
    before = (FIX / "before" / name).read_bytes()
    after = (FIX / "after" / name).read_text()
    result = migrate(before, name)
    assert result.fixed == after
    assert not [d for d in result.diagnostics if d.code.startswith("AMP10")], result.diagnostics
    kept = comments(after)
    for c in comments(before.decode()):  # every comment of the original is still there
        if c not in kept and not c.strip("#").strip():
            continue  # a bare `#` says nothing: it goes with its removed line
        if c not in kept and "master" in c.lower():
            # one on a line the rewrite changed, about apex's float32 master copies that are gone
            line = next(x for x in before.decode().splitlines() if c in x)
            assert line.strip() not in after, c
            continue
        if c not in kept and "apex" in c.lower():
            # except one that described a removed apex import (`from apex import amp  # for fp16`)
            assert any(c in line and ("import" in line or line.strip().startswith("#"))
                       for line in before.decode().splitlines()), c
            continue
        if c not in kept and "warm up" in c and "lr_this_step" not in after:
            # it described the fp16 path's own warm-up, which went (issue 21 §3: no stale comments)
            continue
        if c not in kept and _above_removed_code(before.decode(), after, c):
            # a comment block right above a statement that went described it (issue 21 §3)
            continue
        if c not in kept and c.startswith("# noinspection"):
            # an IDE directive for the apex import right under it goes with that import
            lines = before.decode().splitlines()
            i = next(k for k, x in enumerate(lines) if c in x)
            assert "apex" in lines[i + 1] and "import" in lines[i + 1], c
            continue
        assert c in kept, c
        kept.remove(c)
    again = migrate(after.encode(), name)
    assert again.fixed == after, "a second migrate changed the file"
    assert "from apex" not in after and "import apex" not in after


def test_an_unsafe_migration_is_not_applied_as_safe_and_says_why():
    """A value clip on every micro-batch has no exact form on scaled gradients here: it moves to
    the step, an unsafe fix that says what changes."""
    before = (FIX / "before" / "closure_accum_clip.py").read_text().replace(
        "torch.nn.utils.clip_grad_norm_(", "torch.nn.utils.clip_grad_value_(").encode()
    result = check_source(before, "x.py", all_rules(), Settings(), fix="safe")
    assert result.fixed is None or result.fixed == before.decode() or "from apex" in result.fixed
    amp = [d for d in result.diagnostics if d.code == "AMP101"]
    assert amp and all(d.fix == "unsafe" and "once per optimizer step" in (d.fix_description or "") for d in amp)
    unsafe = check_source(before, "x.py", all_rules(), Settings(), fix="unsafe").fixed
    assert "scaler.unscale_(optimizer)\n            torch.nn.utils.clip_grad_value_(" in unsafe


def test_a_norm_clip_on_every_micro_batch_is_a_safe_fix_that_stays_in_place():
    for name in ("bert_finetune.py", "closure_accum_clip.py"):
        result = check_source((FIX / "before" / name).read_bytes(), "x.py", all_rules(), Settings(), fix="safe")
        assert not [d for d in result.diagnostics if d.code == "AMP101"], result.diagnostics
        assert "scaler.unscale_" not in result.fixed and "_clip_scaled_grad_norm_(scaler, model.parameters()" in result.fixed


def test_no_migrated_fixture_adds_a_host_sync():
    """No rewrite copies the loss scale to the host in the hot loop (AMP303's very sync): a
    scaled clip threshold (`max_norm * scaler.get_scale()`) was how it used to keep the numbers."""
    for path in sorted((FIX / "after").glob("*.py")) + sorted(FIX.parent.glob("projects/*/after/**/*.py")):
        text = path.read_text()
        assert "* scaler.get_scale()" not in text and "* self.scaler.get_scale()" not in text, path


def test_fixtures_cover_the_patterns():
    assert {"cnn_checkpoint.py", "transformer_lm.py", "gan.py", "trainer_class.py", "fp16_optimizer.py",
            "ddp_syncbn_fusedadam.py", "step_hack_accum.py", "bert_finetune.py", "closure_accum_clip.py",
            "inference_only.py", "o3_tuple.py", "function_api.py", "amp_init_eval.py", "bert_fp16_optimizer.py",
            "gan_losses_first.py", "optional_imports.py", "checkpoint_resume.py", "nested_guards.py",
            "lazy_setup.py", "split_step_trainer.py", "fp16_opt_callee.py", "grad_reads.py",
            "trainer_hierarchy.py", "amp_attribute.py", "else_branch_init.py",
            "gan_setup_lists.py", "epoch_setup.py", "version_fallback.py", "hf2_trainer.py", "amp_argument.py", "branch_initialize.py", "trainer_wrap_up.py", "try_initialize.py", "objectives_loop.py"} <= set(NAMES)


@pytest.mark.parametrize("name", [n for n in NAMES if not n.startswith("ddp")])
def test_after_scripts_run(name):
    out = subprocess.run([sys.executable, str(FIX / "after" / name), "--steps", "3"], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "")})
    assert out.returncode == 0, out.stderr[-3000:]


def test_options_read_under_the_guard_are_not_read_where_amp_is_off():
    """`self.amp = amp; self.amp.initialize(..., opt_level=params["amp"]["opt_level"])` under
    `if "amp" in params`: the scaler is made there (a disabled one before), so the fp32 run, where
    `params["amp"]` does not exist, still starts; `self.amp` is gone with apex."""
    after = (FIX / "after" / "amp_attribute.py").read_text()
    code = after.split('"""', 2)[2]
    assert "self.amp" not in code and "self.scaler.scale(loss).backward()" in code
    assert after.index('self.scaler = torch.amp.GradScaler("cuda", enabled=False)') < after.index("if self.use_amp:")
    out = subprocess.run([sys.executable, str(FIX / "after" / "amp_attribute.py"), "--steps", "2", "--fp32"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]


def test_two_initializes_of_one_setup_make_one_scaler_at_the_call():
    """`netG, optG = initialize(...)`, `netD, opts = initialize(netD, [a] + b)` unpacked by index
    and returned: one GradScaler after the call that receives them, handed to the helper that
    steps whichever optimizer it is given."""
    after = (FIX / "after" / "gan_setup_lists.py").read_text()
    assert after.count("GradScaler(") == 1 and "loss_backward(opt, loss_D_T[s], optD_T[s], scaler=scaler)" in after
    out = subprocess.run([sys.executable, str(FIX / "after" / "gan_setup_lists.py"), "--steps", "2", "--fp16", "0"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]


def test_an_optimizer_built_inside_the_epoch_loop_gets_its_scaler_beside_it():
    """`for epoch ...: if epoch == start: optimizer = SGD(...); if fp16: initialize(...)`: the
    scaler is made where the optimizer is (it exists exactly when the optimizer does), enabled by
    the fp16 flag; the run resumed at a later epoch and the one from epoch 0 both train."""
    after = (FIX / "after" / "epoch_setup.py").read_text()
    block = after[after.index("if epoch == args.start_epoch:"):after.index("model.train()")]
    assert "optimizer = torch.optim.SGD" in block and "scaler = torch.amp.GradScaler(" in block
    assert block.index("optimizer = torch.optim.SGD") < block.index("scaler = torch.amp.GradScaler(")
    assert 'growth_interval=2000 if args.loss_scale in (None, 0, "dynamic") else 2**31 - 1' in block
    for extra in ([], ["--start_epoch", "0"], ["--loss_scale", "128"]):
        out = subprocess.run([sys.executable, str(FIX / "after" / "epoch_setup.py"), "--steps", "2", *extra],
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]


def test_the_optimizer_bound_outside_that_block_too_is_still_refused():
    """An optimizer also bound before the loop (`optimizer = None`) may reach the step without
    passing the block: no scaler there would exist for it, so the loop refusal stands."""
    src = (FIX / "before" / "epoch_setup.py").read_text().replace(
        "    for epoch in range(args.epochs):", "    optimizer = None\n    for epoch in range(args.epochs):", 1)
    res = check_source(src.encode(), "x.py", all_rules(), Settings(), fix="safe")
    msgs = [d.message for d in res.diagnostics if d.code == "AMP101"]
    assert any("runs inside a `for` loop" in m for m in msgs), msgs


def test_an_apex_fallback_below_torch_1_6_goes_with_its_flags():
    """Module flags set by `if version.parse(torch.__version__) < version.parse("1.6"): apex
    else: native`: on the torch that native AMP needs the apex branch never runs, so every
    `_use_apex` path goes, the `elif fp16:` that restates the native test goes with its
    master_params clip, the `_use_apex` flag, its stale comment and the version import go; the
    native path is untouched."""
    after = (FIX / "after" / "version_fallback.py").read_text()
    code = after.split('"""', 2)[2]
    for gone in ("_use_apex", " amp.", "version.parse", "Native AMP and Apex", "elif args.fp16:",
                 "_use_native_amp", "from packaging import version"):
        assert gone not in code, gone
    # the native flag is True wherever it is read: it leaves the tests, and its stores go
    assert code.count("if args.fp16:") == 3 and "self.scaler.scale(loss).backward()" in code
    # without the version check the `if` is a plain switch between a branch that only picks apex
    # and one that sets native AMP up: the apex choice takes the native path the same way
    src = (FIX / "before" / "version_fallback.py").read_text().replace(
        'version.parse(torch.__version__) < version.parse("1.6")', "args_use_apex")
    res = check_source(src.encode(), "x.py", all_rules(), Settings(), fix="safe")
    code = res.fixed.split('"""', 2)[2]
    assert "_use_apex" not in code and "args_use_apex" not in code and " amp." not in code
    assert code.count("if args.fp16:") == 3 and "_use_native_amp" not in code
    # a switch whose other branch does not set native AMP up is no apex choice: left alone here
    src = src.replace("    _use_native_amp = True\n    from torch.cuda.amp import autocast\n",
                      "    from torch.cuda.amp import autocast\n")
    res = check_source(src.encode(), "x.py", all_rules(), Settings(), fix="safe")
    assert res.fixed is None or "args_use_apex" in res.fixed


def test_the_native_flag_leaves_a_test_only_where_every_read_is_an_and_operand():
    """`if self.args.fp16 and _use_native_amp:` -> `if self.args.fp16:` (the flag first as well);
    a flag read any other way (a whole test or an `or` with no `else` that could go, a value
    handed on), or with a comment between the operands, stays whole, its store with it."""
    before = (FIX / "before" / "version_fallback.py").read_text()

    def fixed(src):
        res = check_source(src.encode(), "x.py", all_rules(), Settings(), fix="safe")
        assert res.fixed is not None and "amp.scale_loss" not in res.fixed
        compile(res.fixed, "x.py", "exec")
        return res.fixed.split('"""', 2)[2]

    code = fixed(before.replace("if self.args.fp16 and _use_native_amp:\n            self.scaler.scale",
                                "if _use_native_amp and self.args.fp16:\n            self.scaler.scale"))
    assert "_use_native_amp" not in code and code.count("if self.args.fp16:") == 2
    # where a read cannot leave its test (no `else` that could not run): the flag stays whole
    for other in ("if args.fp16 or _use_native_amp:", "if _use_native_amp:",
                  "if args.fp16 and (  # native\n                _use_native_amp):"):
        code = fixed(before.replace("if args.fp16 and _use_native_amp:\n            self.scaler = ",
                                    other + "\n            self.scaler = "))
        assert "_use_native_amp = True" in code and "if self.args.fp16 and _use_native_amp:" in code, other
    code = fixed(before.replace("            self.scaler = torch.cuda.amp.GradScaler()",
                                "            self.scaler = torch.cuda.amp.GradScaler(enabled=_use_native_amp)"))
    assert "_use_native_amp = True" in code and "enabled=_use_native_amp" in code


def test_a_training_step_method_that_the_train_loop_steps_after():
    """`tr_loss += self._training_step(model, inputs, optimizer)` then, at the accumulation step,
    `clip(amp.master_params(optimizer))` and `optimizer.step()`: the caller's step is the
    scaler's, unscale_ comes right before the clip (apex had unscaled on every backward), and
    the apex install check before initialize goes with it."""
    after = (FIX / "after" / "hf2_trainer.py").read_text()
    train = after[after.index("    def train("):]
    assert train.index("self.scaler.unscale_(optimizer)") < train.index("clip_grad_norm_(model.parameters()") \
        < train.index("self.scaler.step(optimizer)") < train.index("self.scaler.update()")
    assert "Please install apex" not in after and "self.scaler.scale(loss).backward()" in after


HELPER_CLIPS_EVERY_MICRO_BATCH = """\
import torch
from apex import amp


def backward(loss, optimizer, fp16):
    if fp16:
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
    else:
        loss.backward()


def train(args, model, optimizer, loader):
    for step, (x, y) in enumerate(loader):
        loss = ((model(x) - y) ** 2).mean()
        backward(loss, optimizer, args.fp16)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if (step + 1) % 4 == 0:
            optimizer.step()
            optimizer.zero_grad()


def main(args):
    model = torch.nn.Linear(4, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    train(args, model, optimizer, [])
"""


@pytest.mark.parametrize("shape", ["method", "function"])
def test_a_clip_between_the_helper_and_a_later_step_is_refused(shape):
    """The caller clips on every micro-batch and steps every N: apex's gradients were unscaled
    there, native ones are not and unscale_ may run once per step; no exact rewrite, so the
    group is refused with the line (with a plain function as the helper this used to migrate
    into a clip of scaled gradients)."""
    if shape == "function":
        src = HELPER_CLIPS_EVERY_MICRO_BATCH
    else:
        src = (FIX / "before" / "hf2_trainer.py").read_text().replace("""\
            tr_loss += self._training_step(model, inputs, optimizer)
            if (step + 1) % self.args.gradient_accumulation_steps == 0:
                if self.args.fp16:
                    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), self.args.max_grad_norm)
                else:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), self.args.max_grad_norm)
""", """\
            tr_loss += self._training_step(model, inputs, optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.args.max_grad_norm)
            if (step + 1) % self.args.gradient_accumulation_steps == 0:
""")
        assert "clip_grad_norm_(amp.master_params" not in src
    res = check_source(src.encode(), "x.py", all_rules(), Settings(), fix="safe")
    assert res.fixed is None or "amp.initialize" in res.fixed
    msgs = [d.message for d in res.diagnostics if d.code == "AMP101" and "not rewritten" in d.message]
    assert any("before they can be unscaled" in m for m in msgs), msgs


def test_a_helper_goes_after_the_whole_import_head():
    """`import sys; sys.path.insert(0, "."); import numpy` at the top: the helper the migration
    adds comes after the last import, not between two of them."""
    src = (FIX / "before" / "bert_finetune.py").read_text().replace(
        "import torch\n", "import sys\n\nsys.path.insert(0, \".\")\n\nimport torch\n", 1)
    fixed = check_source(src.encode(), "x.py", all_rules(), Settings(), fix="safe").fixed
    assert fixed.index("import torch.nn as nn") < fixed.index("def _clip_scaled_grad_norm_")
    assert fixed.index("def _clip_scaled_grad_norm_") < fixed.index("parser = argparse.ArgumentParser()")


def test_ddp_after_script_runs_under_torchrun(tmp_path):
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1",
                          "--rdzv-endpoint=localhost:0", "--rdzv-backend=c10d",
                          str(FIX / "after" / "ddp_syncbn_fusedadam.py"), "--steps", "2"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step 0 loss" in out.stdout


def test_never_the_hand_migration_mistakes():
    """ampfix's own output never makes the scaler inside a loop nor steps past it."""
    for name in NAMES:
        after = (FIX / "after" / name).read_bytes()
        diags = check_source(after, name, all_rules(), Settings()).diagnostics
        assert not [d for d in diags if d.code in ("AMP203", "AMP204", "AMP205", "AMP206", "AMP207")], diags


def test_refusal_leaves_the_module_whole():
    src = b"from apex import amp\nmodel, opt = amp.initialize(model, opt, opt_level='O3', loss_scale=128.0)\n"
    r = migrate(src)
    assert r.fixed == src.decode()
    assert any("O3" in d.message and "not rewritten" in d.message for d in r.diagnostics)
    src = (b"from apex import amp\nmodel, opt = amp.initialize(model, opt)\n"
           b"def backward(loss):\n    with amp.scale_loss(loss, opt) as s:\n        s.backward()\n    opt.step()\n")
    r = migrate(src)
    assert r.fixed == src.decode()
    # the loss arrives as a parameter of a function that nothing calls: its forward pass is unknown
    assert any("not rewritten" in d.message and "parameter `loss`" in d.message for d in r.diagnostics)


def test_scaler_state_helper_reads_apex_checkpoints():
    """The helper migrate adds for amp.load_state_dict: apex's format and GradScaler's both load."""
    torch = pytest.importorskip("torch")
    from ampfix.migration.seeds import SCALER_STATE_HELPER

    ns = {}
    exec(SCALER_STATE_HELPER, ns)
    scaler = torch.amp.GradScaler("cpu")
    scaler.load_state_dict(ns["_scaler_state"](scaler, {"loss_scaler0": {"loss_scale": 512.0, "unskipped": 7}}))
    assert scaler.get_scale() == 512.0
    saved = scaler.state_dict()
    other = torch.amp.GradScaler("cpu")
    other.load_state_dict(ns["_scaler_state"](other, saved))
    assert other.get_scale() == 512.0


def _ruff_findings(path: Path, width: int) -> dict:
    import shutil

    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    out = subprocess.run([ruff, "check", "--isolated", "--select", "E501,E731,I001", "--line-length", str(width),
                          "--output-format", "json", str(path)], capture_output=True, text=True)
    import json
    counts: dict = {}
    for f in json.loads(out.stdout or "[]"):
        counts[f["code"]] = counts.get(f["code"], 0) + 1
    return counts


@pytest.mark.parametrize("name", NAMES)
def test_migrated_fixture_is_no_worse_for_ruff(name):
    """No line longer than the file's own width, no lambda assigned, no import added out of order:
    ruff's E501/E731/I001 find no more in the migrated file than in the original."""
    before = FIX / "before" / name
    width = max([88, *(len(line) for line in before.read_text().splitlines())])
    b, a = _ruff_findings(before, width), _ruff_findings(FIX / "after" / name, width)
    assert all(a[c] <= b.get(c, 0) for c in a), (name, b, a)


def test_no_rewritten_line_keeps_a_comment_about_master_copies():
    """apex's float32 master copies are gone: a comment about them on a line the migration wrote
    (`scaler.scale(loss).backward()  # ... copies the gradients to the master weights`) is stale."""
    for path in sorted((FIX / "after").glob("*.py")):
        for line in path.read_text().splitlines():
            code, _, comment = line.partition("#")
            if ("scaler" in code or "clip_grad" in code) and "master" in comment.lower():
                raise AssertionError(f"{path.name}: {line.strip()}")


PROJECT_FILES = sorted(str(p.relative_to(FIX.parent / "projects")) for p in (FIX.parent / "projects").glob("*/before/**/*.py"))


@pytest.mark.parametrize("rel", PROJECT_FILES)
def test_migrated_project_file_is_no_worse_for_ruff(rel):
    """The same for each file of the project goldens (fixtures/projects/<name>/before -> after)."""
    before = FIX.parent / "projects" / rel
    after = FIX.parent / "projects" / rel.replace("/before/", "/after/", 1)
    width = max([88, *(len(line) for line in before.read_text().splitlines())])
    b, a = _ruff_findings(before, width), _ruff_findings(after, width)
    assert all(a[c] <= b.get(c, 0) for c in a), (rel, b, a)


SYNC_BN_CHOICE = """\
import argparse

import apex
import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--sync_bn", default="pytorch", choices=["pytorch", "apex"])
args = parser.parse_args()
model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
if args.sync_bn == "pytorch":
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
elif args.sync_bn == "apex":
    # apex syncs per group
    group = apex.parallel.create_syncbn_process_group(8)
    model = apex.parallel.convert_syncbn_model(model, process_group=group)
scaler = torch.amp.GradScaler("cuda")
with torch.autocast("cuda"):
    loss = model(torch.randn(2, 3, 8, 8)).sum()
scaler.scale(loss).backward()
"""


def test_an_apex_choice_that_is_not_mixed_precision_is_not_routed_to_native_amp():
    """`--sync_bn apex` beside native AMP chooses apex's SyncBatchNorm, not its mixed precision:
    the dual-path planner leaves it (a second migrate of a migrated script changed it, saying
    "--sync-bn apex now runs native AMP")."""
    res = check_source(SYNC_BN_CHOICE.encode(), "x.py", all_rules(), Settings(), fix="safe")
    out = res.fixed or SYNC_BN_CHOICE
    assert 'elif args.sync_bn == "apex":' in out and "now runs native AMP" not in out


CLIP_INSIDE_SCALE_LOSS = """\
import torch
from apex import amp

model = torch.nn.Linear(4, 4).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for x, y in loader:
    loss = ((model(x) - y) ** 2).mean()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
        torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
    optimizer.step()
    optimizer.zero_grad()
"""


def test_a_clip_inside_the_scale_loss_block_is_an_unsafe_fix_that_says_why():
    """apex unscales when the block exits: a clip inside it never saw the true gradients. The
    native rewrite clips the true ones (what the code meant), which changes the numbers: not a
    safe fix; with --unsafe-fixes it is applied."""
    safe = check_source(CLIP_INSIDE_SCALE_LOSS.encode(), "x.py", all_rules(), Settings(), fix="safe")
    assert safe.fixed is None or "amp.scale_loss" in safe.fixed
    amp = [d for d in safe.diagnostics if d.code == "AMP101"]
    assert amp and all(d.fix == "unsafe" and "before apex unscaled the gradients" in (d.fix_description or "")
                       for d in amp), [(d.fix, d.fix_description) for d in amp]
    unsafe = check_source(CLIP_INSIDE_SCALE_LOSS.encode(), "x.py", all_rules(), Settings(), fix="unsafe").fixed
    assert "from apex" not in unsafe and "scaler.scale(loss).backward()" in unsafe


LOOP_WITH_BOOKKEEPING_FIRST = """\
import torch
from apex import amp

model = torch.nn.Linear(4, 4).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for data in loader:
    inputs, labels = data
    n = inputs.shape[0]
    pbar.update(n)
    if n < batch_size:
        continue
    inputs = inputs.cuda(non_blocking=True)
    optimizer.zero_grad()
    outputs = model(inputs)
    loss = ((outputs - labels) ** 2).mean() / n
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
"""


def test_autocast_starts_at_the_forward_not_at_the_bookkeeping_before_it():
    """A progress bar, a `continue` for a short batch and zero_grad between the data and the
    forward stay outside the autocast region: it holds the forward pass and the loss."""
    out = check_source(LOOP_WITH_BOOKKEEPING_FIRST.encode(), "x.py", all_rules(), Settings(), fix="safe").fixed
    region = out[out.index("with torch.autocast("):out.index("scaler.scale(loss)")]
    assert "outputs = model(inputs)" in region and "loss = " in region
    for outside in ("pbar.update(n)", "continue", "zero_grad", "inputs.cuda"):
        assert outside not in region, outside


ORDERING_NOTES = """\
import torch
from apex import amp

model = torch.nn.Linear(4, 4).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if fp16:
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")

# multi-gpu training (should be after apex fp16 initialization)
if n_gpu > 1:
    model = torch.nn.DataParallel(model)
for x, y in loader:
    # forward (must come after apex initialization)
    loss = ((model(x) - y) ** 2).mean()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
"""


def test_a_comment_about_where_apex_initialize_must_come_loses_that_parenthesis():
    """`# multi-gpu training (should be after apex fp16 initialization)` (Hugging Face's example
    scripts and their copies): the parenthesis goes with the initialize, the rest stays, also on
    a line the autocast region moves."""
    out = check_source(ORDERING_NOTES.encode(), "x.py", all_rules(), Settings(), fix="safe").fixed
    assert "# multi-gpu training\n" in out and "    # forward\n" in out and "apex" not in out, out


def test_initialize_in_both_branches_of_an_if_makes_one_scaler():
    """RepVGG's shape (Swin's main with a branch per GPU count): a scaler per branch, made one
    after the other before the if, left the second deciding alone, disabled on several GPUs."""
    after = (FIX / "after" / "branch_initialize.py").read_text()
    made = [line.strip() for line in after.splitlines() if "GradScaler(" in line]
    assert made == ['scaler = torch.amp.GradScaler("cuda", enabled=args.amp_opt_level != "O0")'], made
    for name in NAMES:  # no fixture makes a scaler and then another in its place
        lines = [x.strip() for x in (FIX / "after" / name).read_text().splitlines()]
        for a, b in zip(lines, lines[1:]):
            assert not ("GradScaler(" in a and "GradScaler(" in b and a.split("=")[0] == b.split("=")[0]), (name, a)


def test_a_checkpoint_helper_that_some_callers_reach_without_a_scaler_takes_it_optionally():
    after = (FIX / "after" / "branch_initialize.py").read_text()
    assert "def load_checkpoint(args, model, optimizer, path, *, scaler=None):" in after
    assert 'if scaler is not None and "amp" in checkpoint and args.amp_opt_level != "O0":' in after
    assert "load_checkpoint(args, model, None, path)\n" in after  # the evaluation passes none
    assert "def evaluate(args, path):" in after


TEACHERS = '''\
import torch
import torch.nn as nn
from apex import amp


class Trainer(nn.Module):
    def __init__(self, fp16, teachers):
        super().__init__()
        self.fp16 = fp16
        self.student = nn.Linear(4, 4).cuda()
        self.opt = torch.optim.SGD(self.student.parameters(), lr=0.1)
        models = nn.ModuleList()
        for name in teachers:
            t = nn.Linear(4, 4).cuda()
            if self.fp16:
                t = amp.initialize(t, opt_level="O1")
            models.append(t.eval())
        self.teachers = models
        if self.fp16:
            self.student, self.opt = amp.initialize(self.student, self.opt, opt_level="O1")

    def update(self, x):
        with torch.no_grad():
            soft = sum(t(x) for t in self.teachers)
        loss = ((self.student(x) - soft) ** 2).mean()
        self.opt.zero_grad()
        if self.fp16:
            with amp.scale_loss(loss, self.opt) as scaled:
                scaled.backward()
        else:
            loss.backward()
        self.opt.step()
'''


def test_teachers_initialized_in_a_loop_beside_the_student_run_under_its_autocast():
    """NVlabs/DG-Net's shape: distillation teachers `amp.initialize`d one by one in a loop (no
    optimizer), the student with its optimizer after them: the teachers run in the student's
    training step, so its autocast covers them; their initialize goes."""
    out = migrate(TEACHERS.encode()).fixed
    assert "amp.initialize" not in out and "from apex" not in out
    assert "            models.append(t.eval())" in out and "if self.fp16:\n                t =" not in out
    assert out.count("torch.autocast(") == 1 and out.count("GradScaler(") == 1
    assert "soft = sum(t(x) for t in self.teachers)" in out.split("torch.autocast(")[1]


def test_a_training_helper_that_some_callers_reach_without_initialize_is_still_refused():
    src = (
        "import torch\nfrom apex import amp\n\n\n"
        "def step(model, optimizer, x):\n"
        "    loss = model(x).sum()\n"
        "    with amp.scale_loss(loss, optimizer) as scaled:\n"
        "        scaled.backward()\n"
        "    optimizer.step()\n\n\n"
        "def debug(model, optimizer):\n"
        "    step(model, optimizer, torch.zeros(2, 2))\n\n\n"
        "def main():\n"
        "    model = torch.nn.Linear(2, 2).cuda()\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    model, optimizer = amp.initialize(model, optimizer, opt_level='O1')\n"
        "    step(model, optimizer, torch.ones(2, 2))\n\n\n"
        "main()\n"
        "debug(torch.nn.Linear(2, 2), None)\n"
    )
    res = migrate(src.encode())
    assert res.fixed == src  # left whole
    assert any("`step` is also called from `debug`" in d.message for d in res.diagnostics), res.diagnostics


def test_the_fp16_paths_own_warm_up_goes_with_its_comment_helper_and_counter():
    """Issue 21 §3: "# modify learning rate with special warm up BERT uses" above a removed block,
    helpers only the removed branch called (`warmup_linear`), a `global_step` nothing reads."""
    after = (FIX / "after" / "bert_fp16_optimizer.py").read_text()
    assert "warm up" not in after and "def warmup_linear" not in after and "global_step" not in after
    assert "WarmupAdamW(model.parameters()" in after  # the optimizer that schedules itself stays
