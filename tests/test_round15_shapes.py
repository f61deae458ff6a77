"""Fifteenth round: a library function that scales the loss with apex while nothing in the
project calls it (its training scripts live elsewhere and initialized apex there).  It takes the
GradScaler as `scaler=`, and the report tells its callers what to pass.  The runnable project is
fixtures/projects/library_entry (its caller, drive.py, is outside the migrated tree)."""
import textwrap
from pathlib import Path

from click.testing import CliRunner

from ampfix.cli import main

LIBRARY = textwrap.dedent('''\
    import torch


    def train_epoch(loader, model, optimizer, config):
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            if config.use_amp:
                from apex import amp
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()
''')


def write(root: Path, files: dict) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def run(root: Path, *extra):
    return CliRunner().invoke(main, ["migrate", *extra, "--torch-version", "2.4", str(root)])


def test_an_uncalled_library_function_takes_the_scaler_and_the_report_says_what_to_pass(tmp_path):
    write(tmp_path, {"lib/__init__.py": "", "lib/epochs.py": LIBRARY})
    out = run(tmp_path, "--write")
    assert out.exit_code == 0, out.output
    after = (tmp_path / "lib" / "epochs.py").read_text()
    assert "apex" not in after, after
    assert "def train_epoch(loader, model, optimizer, config, *, scaler):" in after, after
    assert 'torch.autocast("cuda", dtype=torch.float16, enabled=scaler.is_enabled())' in after, after
    assert "scaler.scale(loss).backward()" in after and "scaler.step(optimizer)" in after, after
    assert 'its callers pass `scaler=torch.amp.GradScaler("cuda", enabled=config.use_amp)`' in out.output, out.output
    assert "would be rewritten" not in run(tmp_path).output


def test_bfloat16_passes_the_flag_instead(tmp_path):
    write(tmp_path, {"lib/__init__.py": "", "lib/epochs.py": LIBRARY})
    out = run(tmp_path, "--write", "--dtype", "bfloat16")
    assert out.exit_code == 0, out.output
    after = (tmp_path / "lib" / "epochs.py").read_text()
    assert "apex" not in after and "GradScaler" not in after, after
    # `use_amp` is the config's attribute already: the flag takes the next name
    assert "*, amp_enabled)" in after and "dtype=torch.bfloat16, enabled=amp_enabled" in after, after
    assert "its callers pass `amp_enabled=config.use_amp`" in out.output, out.output


def test_a_method_nothing_calls_keeps_apex(tmp_path):
    # its object's protocol (`scaler(loss, optimizer)`, called by a framework) is not ours to change
    write(tmp_path, {"lib/scaler.py": textwrap.dedent('''\
        from apex import amp


        class ApexScaler:
            def __call__(self, loss, optimizer):
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
    ''')})
    out = run(tmp_path, "--write")
    assert "amp.scale_loss" in (tmp_path / "lib" / "scaler.py").read_text()
    assert "amp.initialize is not called in the project on the way here" in out.output, out.output


def test_a_module_whose_other_apex_use_is_refused_keeps_the_entry_too(tmp_path):
    write(tmp_path, {"lib/epochs.py": LIBRARY + textwrap.dedent('''\


        def backward(loss, optimizer):
            from apex import amp
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()


        HOOKS = {"backward": backward}
    ''')})
    out = run(tmp_path, "--write")
    after = (tmp_path / "lib" / "epochs.py").read_text()
    assert after.count("amp.scale_loss") == 2, after
    assert "is used other than by a call" in out.output, out.output


# FP16_Optimizer handed to a function of another module (issue 21 §1.3): the project golden is
# fixtures/projects/fp16_engine; these are the edges.
ENGINE = textwrap.dedent('''\
    import torch.nn.functional as F


    def train(args, model, loader, optimizer):
        for data, target in loader:
            if args.fp16:
                data = data.half()
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data).float(), target)
            if args.fp16:
                optimizer.backward(loss)
            else:
                loss.backward()
            optimizer.step()
''')

MAIN = textwrap.dedent('''\
    import torch
    from apex.fp16_utils import FP16_Optimizer

    from engine import train


    def main(args, model, loader):
        if args.fp16:
            model.half()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if args.fp16:
            optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)
        train(args, model, loader, optimizer)
''')


def test_fp16_optimizer_handed_into_another_module_takes_the_scaler_there(tmp_path):
    write(tmp_path, {"engine.py": ENGINE, "main.py": MAIN})
    out = run(tmp_path, "--write")
    assert out.exit_code == 0, out.output
    engine = (tmp_path / "engine.py").read_text()
    main_ = (tmp_path / "main.py").read_text()
    assert "def train(args, model, loader, optimizer, *, scaler):" in engine, engine
    assert "scaler.scale(loss).backward()" in engine and ".half()" not in engine, engine
    assert "train(args, model, loader, optimizer, scaler=scaler)" in main_, main_
    assert "apex" not in main_ and "model.half()" not in main_, main_
    assert "import torch" in engine, engine
    assert "would be rewritten" not in run(tmp_path).output


def test_fp16_optimizer_callee_also_called_without_it_is_left_whole(tmp_path):
    write(tmp_path, {"engine.py": ENGINE, "main.py": MAIN,
                     "finetune.py": "from engine import train\n\n\ndef go(args, m, data, opt):\n"
                                    "    train(args, m, data, opt)\n"})
    out = run(tmp_path, "--write")
    assert "FP16_Optimizer(" in (tmp_path / "main.py").read_text()
    assert (tmp_path / "engine.py").read_text() == ENGINE
    assert "without this FP16_Optimizer" in out.output, out.output


def test_fp16_optimizer_callee_module_not_given_is_left_whole(tmp_path):
    write(tmp_path, {"engine.py": ENGINE, "main.py": MAIN})
    out = CliRunner().invoke(main, ["migrate", "--write", "--torch-version", "2.4", str(tmp_path / "main.py")])
    assert "FP16_Optimizer(" in (tmp_path / "main.py").read_text()
    assert (tmp_path / "engine.py").read_text() == ENGINE
    assert "not rewritten" in out.output, out.output
