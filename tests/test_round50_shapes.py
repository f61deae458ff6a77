"""Fiftieth round.

1. An import that takes the place of imports that went keeps the file's own spacing before the
   code after it: a file written with one blank line between its imports and its first class keeps
   one (the fix has no reason to touch that line); one with two keeps two; a file that had no
   imports and starts with a function gets two under the added import (PEP 8, E302).
"""
import json
import shutil
import textwrap
from pathlib import Path

from click.testing import CliRunner
from test_round17_shapes import migrated, write

from ampfix.cli import main

CLASS = textwrap.dedent('''\
    import torch.cuda.amp as amp
    {gap}class F(torch.autograd.Function):
        @staticmethod
        @amp.custom_fwd
        def forward(ctx, x):
            return x
''')


def test_replaced_import_keeps_the_files_spacing(tmp_path):
    for blanks in (0, 1, 2):
        root = tmp_path / str(blanks)
        out = migrated(root, {"f.py": CLASS.format(gap="\n" * blanks)}, "f.py", "--select", "AMP202")
        head = out.split("class F")[0]
        # none (not PEP 8 at all) is not kept: the added import gets PEP 8's two
        assert head == "import torch\n" + "\n" * (blanks or 2), (blanks, out)
        assert '@torch.amp.custom_fwd(device_type="cuda")' in out


def test_added_import_above_a_function_gets_two_blank_lines(tmp_path):
    src = textwrap.dedent('''\
        def train(model, optimizer, loader):
            from apex import amp
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for x in loader:
                loss = model(x)
                optimizer.zero_grad()
                with amp.scale_loss(loss, optimizer) as scaled:
                    scaled.backward()
                optimizer.step()
    ''')
    out = migrated(tmp_path, {"m.py": src}, "m.py")
    assert out.startswith("import torch\n\n\ndef train("), out
    assert "scaler.scale(loss).backward()" in out


# 2. A migration that spans files, run with one rule selected: `ampfix migrate --select AMP104` on
#    an `apex.optimizers.FP16_Optimizer` training (its helper in another module changes too) ran
#    no migration planner (AMP104's was only the fused optimizers'), so it left the use with no
#    fix and no reason; and the report in the helper's file was said by AMP101 alone, so with
#    AMP102 or AMP104 selected that file's part was not carried and the migration was taken back.
#    Each rule of the migration's kind says its planner's reports now, once.
FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "projects" / "fp16_loader" / "before"


def _diff(root: Path, *extra) -> str:
    out = CliRunner().invoke(main, ["migrate", *extra, str(root)])
    return out.output.replace(str(root), "ROOT")


def test_one_rule_selected_carries_its_migration_across_files(tmp_path):
    root = tmp_path / "p"
    shutil.copytree(FIXTURE, root)
    full = _diff(root)
    assert "helpers.py: would be rewritten" in full and "main.py: would be rewritten" in full
    assert _diff(root, "--select", "AMP104") == full
    # the helper's report is said once, though AMP102 and AMP104 both say FP16_Optimizer's
    out = CliRunner().invoke(main, ["check", "--no-cache", "--output-format", "json", str(root)])
    rows = [d for d in json.loads(out.output)["diagnostics"] if d["path"].endswith("helpers.py")]
    assert len(rows) == 1, rows


def test_fp16_utils_helper_migrates_with_its_rule_alone(tmp_path):
    files = {"helpers.py": (FIXTURE / "helpers.py").read_text(),
             "main.py": (FIXTURE / "main.py").read_text().replace(
                 "from apex.optimizers import FP16_Optimizer", "from apex.fp16_utils import FP16_Optimizer")}
    write(tmp_path / "a", files)
    write(tmp_path / "b", files)
    alone = migrated(tmp_path / "a", {}, "helpers.py", "--select", "AMP102")
    every = migrated(tmp_path / "b", {}, "helpers.py")
    assert alone == every
    assert "model.half()" not in alone


def test_a_noqa_on_one_files_part_takes_the_whole_migration_back(tmp_path):
    # the helper's part is suppressed on its line: the caller must not be rewritten to pass a scaler
    # the helper would not take (the engine's whole-or-nothing, now that --select carries it)
    from test_round49_shapes import CLIP, TRAIN

    train = TRAIN.replace("from utils import set_lr", "from utils import clip").replace(
        "    set_lr(optimizer, step, 0.1)\n", "    clip(optimizer, 1.0)\n")
    helper = CLIP.replace("def clip(optimizer, norm):", "def clip(optimizer, norm):  # noqa: AMP102")
    write(tmp_path, {"train.py": train, "utils.py": helper})
    out = CliRunner().invoke(main, ["migrate", "--write", str(tmp_path)])
    assert (tmp_path / "train.py").read_text() == train, out.output
    assert (tmp_path / "utils.py").read_text() == helper, out.output
    assert "could not take its part" in out.output, out.output


# 3. An evaluation of a model whose `.half()` the FP16_Optimizer migration removed runs under
#    autocast enabled by that cast's own condition, not the scaler's: SpanBERT's run_squad.py makes
#    the FP16_Optimizer only when training (the scaler is enabled by `fp16 and do_train`) and
#    halves the model it evaluates under `if args.fp16:` alone, so an evaluation-only run with
#    --fp16 evaluated in float16 before and would have been float32 after.
EVAL_ONLY = textwrap.dedent('''\
    import argparse

    import torch
    from apex.optimizers import FP16_Optimizer, FusedAdam

    from tools import Net, evaluate


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--fp16", action="store_true")
        parser.add_argument("--do_train", action="store_true")
        args = parser.parse_args()
        if args.do_train:
            model = Net()
            if args.fp16:
                model.half()
            model.cuda()
            if args.fp16:
                optimizer = FP16_Optimizer(FusedAdam(model.parameters()), dynamic_loss_scale=True)
            else:
                optimizer = torch.optim.Adam(model.parameters())
            for x in range(10):
                loss = model(torch.randn(4, 8, device="cuda")).sum()
                if args.fp16:
                    optimizer.backward(loss)
                else:
                    loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            torch.save(model.state_dict(), "model.pt")
        model = Net()
        model.load_state_dict(torch.load("model.pt"))
        if args.fp16:
            model.half()
        model.cuda()
        print(evaluate(model))


    if __name__ == "__main__":
        main()
''')

TOOLS = textwrap.dedent('''\
    import torch


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 1)

        def forward(self, x):
            return self.fc(x)


    def evaluate(model):
        model.eval()
        with torch.no_grad():
            return model(torch.ones(2, 8, device="cuda")).float().sum().item()
''')


def test_an_evaluation_runs_under_autocast_by_its_own_casts_condition(tmp_path):
    out = migrated(tmp_path, {"train.py": EVAL_ONLY, "tools.py": TOOLS}, "train.py")
    assert "model.half()" not in out
    assert "FP16_Optimizer" not in out
    # the scaler is made where training is chosen (the FP16_Optimizer was only made there)
    assert "GradScaler" in out
    evaluation = out.split("print(evaluate(model))")[0].rsplit("\n", 2)[-2]
    assert evaluation.strip() == 'with torch.autocast("cuda", dtype=torch.float16, enabled=bool(args.fp16)):', out
