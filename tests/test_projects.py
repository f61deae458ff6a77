"""Project goldens: fixtures/projects/<name>/before is a small multi-module project; `ampfix
migrate --write` over the whole folder gives <name>/after, a second run changes nothing, and the
migrated entry scripts run (on the CPU: autocast("cuda") and GradScaler("cuda") disable
themselves)."""
import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from ampfix.cli import main

PROJECTS = Path(__file__).resolve().parents[1] / "fixtures" / "projects"
# each project's entry scripts (relative to the project) and their arguments
ENTRIES = {
    "launcher_engine": [["tools/train_net.py", "--steps", "3"]],
    "dual_path": [["train.py", "--steps", "3", "--amp-impl", "apex"], ["train.py", "--steps", "3"]],
    # and a retrieval script: the weights loaded into the unwrapped model and a retriever built in
    # an `if`'s branches stay outside autocast, the retriever's method that runs the encoder is in it
    "setup_returns": [["train.py", "--steps", "3"], ["embed.py"], ["retrieve.py"], ["retrieve.py", "--url", "x"]],
    # one pass function for training (scaled), validation and prediction (no scaler): it makes a
    # disabled scaler when none is passed, so a caller outside the project that trains with it and
    # no scaler (../drive.py) still trains, in float32, as before
    "optional_scaler": [["main.py", "--epochs", "2"], ["main.py", "--epochs", "2", "--apex"], ["main.py", "--predict"],
                        ["../drive.py"]],
    # a trainer class set up in __init__ on self.model: its evaluation loop (through the step method
    # it shares with training) and its prediction method run under autocast, as apex ran them
    "trainer_eval": [["train.py", "--epochs", "2"], ["train.py", "--epochs", "1", "--opt-level", "O0"]],
    # a loader that initializes apex for sampling with an optimizer made only for it, and returns the
    # model with its settings: the optimizer goes, the caller's sampling runs under autocast
    "inference_loader": [["generate.py"], ["generate.py", "--fp16"]],
    # validation whose loss is computed right after the no_grad block of its forward: both in the region
    "eval_loss_after": [["train.py", "--epochs", "1", "--batches", "3"], ["train.py", "--epochs", "1", "--opt-level", "O0"]],
    # a setup that picks apex's loss scale in a local and returns the model and optimizer, a resume
    # that asks apex whether it can load its state: the choice moves to the caller's GradScaler, the
    # question folds; a checkpoint written by the first run is resumed by the second
    "resume_setup": [["train.py", "--epochs", "2", "--apex"], ["train.py", "--epochs", "1", "--apex", "--resume"],
                     ["train.py", "--epochs", "1", "--apex", "--apex-loss-scale", "128"], ["train.py", "--epochs", "1"]],
    "flag_trainer": [["train.py", "--epochs", "2"], ["train.py", "--epochs", "2", "--amp", "O1"]],
    # both paths, the apex wrapper class in a helper module beside a native twin of another name:
    # the class goes with the branch that alone used it; `if True:  # args.distributed` stays
    "twin_elsewhere": [["main.py", "--epochs", "1"], ["main.py", "--epochs", "1", "--apex_amp"]],
    # `if amp is None: <warn, AMP off> else: <initialize the model and its moving average>` (MoCo):
    # the whole `if` goes with the initialize; a clip after the step stays where it was
    "installed_else": [["train.py", "--epochs", "1"], ["train.py", "--epochs", "1", "--amp-opt-level", "O1"]],
    "registry_hook": [["train.py", "--epochs", "2"], ["train.py", "--epochs", "2", "--fp16"]],
    # a library whose callers live elsewhere: ../drive.py is such a caller, written as the note says
    "library_entry": [["../drive.py", "--use-amp", "--epochs", "2"], ["../drive.py", "--epochs", "2"]],
    # FP16_Optimizer made in main.py, its backward and step in engine.py's train()
    "fp16_engine": [["main.py", "--steps", "16"], ["main.py", "--steps", "16", "--fp16"]],
    # FP16_Optimizer made in main.py; helpers.py halves the model under the flag (the cast and its
    # log line go), sets the learning rate (takes the plain optimizer, no scaler), evaluates on token
    # ids (its call runs under autocast)
    "fp16_loader": [["main.py", "--epochs", "2"], ["main.py", "--epochs", "2", "--fp16"]],
    # a schedule class owns the optimizer apex initialized: its method steps it
    "optim_wrapper": [["train.py", "--epochs", "2"], ["train.py", "--epochs", "2", "--fp16"]],
    "fp16_trainer_class": [["main.py", "--epochs", "2"], ["main.py", "--epochs", "2", "--fp16", "--accum", "2"]],
    # a script with no main(): made under `if __name__ == "__main__":`, handed to a trainer class;
    # the fp32 path's LambdaLR now schedules both paths, the fp16 path's own warm-up goes
    "fp16_script_trainer": [["train.py", "--epochs", "2"], ["train.py", "--epochs", "2", "--fp16"]],
    # a setup that returns (model, optimizers) when training and the model alone otherwise; the
    # loss helper gets the loss terms as a parameter: autocast goes around the callers' forward
    "maker_returns": [["train.py", "--epochs", "2"], ["train.py", "--epochs", "2", "--amp", "O1"], ["infer.py"]],
    # apex's amp kept on `args` (`args.amp = amp`) and read by a step the scripts share through
    # `from common import *` (one shadows it with its own), a trainer picked from a dict by name,
    # an adversarial second backward before the step (scaled too)
    "args_amp": [["classify.py", "--epochs", "2"], ["classify.py", "--epochs", "2", "--fp16", "--adv"],
                 ["regress.py", "--epochs", "2", "--fp16"], ["pretrain.py", "--epochs", "2", "--fp16"]],
    # apex's amp None where apex is missing (`amp is not None` folds), AMP set up in a base class's
    # method for a grandchild's step, an attack helper's scaled backward for its input's gradient,
    # and `amp.initialize(..., **amp_args)` from a dict with a key set under a condition
    "attack_trainer": [["train.py", "--epochs", "2"], ["train.py", "--epochs", "2", "--fp16"],
                       ["train.py", "--epochs", "2", "--robust", "--fp16"], ["fast.py", "--epochs", "1"]],
    "backend_trainer": [["train.py", "--epochs", "2"], ["train.py", "--epochs", "2", "--fp16", "--weighted"],
                        ["train.py", "--epochs", "1", "--fp16", "--fp16-backend", "apex"]],
    # a Trainer keeping the object that initializes apex in `self.GAN`, its losses scaled through
    # `backwards = partial(loss_backwards, self.fp16)`, apex's state in its checkpoints
    "gan_holder": [["train.py", "--epochs", "2"], ["train.py", "--epochs", "2", "--fp16"]],
    # a setup that initializes apex for inference where the optimizer handed in is None and for
    # training where it is not, called by a training and an evaluation script; evaluation inside
    # the training function
    "setup_routing": [["train.py", "--epochs", "2"], ["train.py", "--epochs", "2", "--fp16"],
                      ["evaluate.py"], ["evaluate.py", "--fp16"]],
    # a training box (an nn.Module computing its loss in forward, scaling it in update_params) got
    # from a factory: autocast in the box's forward; `master_params(opt) if apex else params` is one
    "box_factory": [["train.py", "--epochs", "2"], ["train.py", "--epochs", "2", "--fp16", "--accum", "2"]],
    # apex's amp imported inside __init__ only, read as an unbound global by the step (NameError
    # before): migrated, and `self.model, self.optimizer = model, optimizer` is not written again
    "unbound_amp": [["run.py", "--epochs", "2"], ["run.py", "--epochs", "2", "--fp16"]],
    # the loss divided for accumulation in one branch and scaled in another, nested one: the
    # forward pass in the function's own block, outside both, gets the autocast region
    "nested_rescale": [["run.py", "--epochs", "2"], ["run.py", "--epochs", "2", "--fp16",
                                                      "--gradient_accumulation_steps", "2"]],
    # apex set up in a `try:` beside a log line and arithmetic, its handler only reporting: the
    # scaler is made before the `if`; the try, which only guarded apex's import, goes with the
    # log line that spoke of apex
    "try_setup": [["train.py", "--epochs", "2"], ["train.py", "--epochs", "2", "--fp16"],
                  ["train.py", "--epochs", "2", "--fp16", "--opt_level", "O0"]],
    # apex initialized in a helper under a comment that described only that line (it goes with
    # it); a warm-up weight computed after the forward stays out of the region; two evaluations
    # in a row share one autocast region
    "eval_pair": [["train.py", "--epochs", "2"], ["train.py", "--epochs", "2", "--fp16"]],
    # two back ends chosen by options (torch.cuda.amp, or apex when an apex opt level is given),
    # apex imported with importlib onto the trainer; the forward already under the native path's
    # autocast (apex's condition joins its `enabled=`); helper methods read the gradients through
    # amp.master_params (the scaler unscales before the first call); predictions kept between the
    # forward and the accumulation division stay out of the region
    "twin_backends": [["train.py"], ["train.py", "--fp16"], ["train.py", "--fp16", "--apex_opt_lvl", "O1"]],
    # modules set on the trainer and fetched by name in each step (`model = getattr(self, name);
    # model.train()`, the batch masked before the forward: the region starts at the forward); the
    # clip of apex's master params in a loop reuses the fp32 arm's `self.parameters[name]`
    "setattr_steps": [["train.py", "--epochs", "2"], ["train.py", "--epochs", "2", "--amp", "-1"]],
    # the model bound into a partial that an evaluation helper calls, and that is called itself:
    # both ran in half precision under O2 and run under autocast now
    "partial_eval": [["train.py", "--epochs", "2"]],
    # apex tried first in a `try` whose handler makes the GradScaler (apex's optional import leaves
    # `amp` unbound without it), the step's apex branch the `else` of `if scaler is not None`: the
    # handler is what runs now, and the apex branch goes
    "fallback_try": [["train.py", "--epochs", "2"], ["train.py", "--epochs", "2", "--amp"]],
    # two training loops stepping one optimizer (each updates the scaler after its step), apex
    # found by a flag set before its guard (the flag folds and goes), batches moved by a helper
    "two_loops": [["train.py", "--epochs", "2"], ["train.py", "--epochs", "2", "--fp16"]],
    # training and an inline evaluation in one function (the evaluation's forward and loss run
    # under autocast too); apex's DDP pre-divided by a project helper imported for it alone (the
    # import goes with the argument)
    "inline_eval": [["train.py"], ["train.py", "--opt_level", "O0"]],
    # apex found with a flag set False before its guard (the handler only reports): the flag
    # folds and goes with its comment; an inference script's optimizer built only for initialize
    "false_flag": [["train.py", "--epochs", "2"], ["train.py", "--epochs", "2", "--opt_level", "O0"],
                   ["predict.py"]],
    # a setup choosing deepspeed, fairscale or apex in an if/elif chain (apex last), called to train
    # and to evaluate (`args, model, _ = setup(...)`): the negated tests are the scaler's enabled=
    "setup_chain": [["main.py", "--do_train"], ["main.py", "--do_train", "--amp_level", "0"],
                    ["main.py", "--do_eval"]],
    # a trainer class whose apex and fp32 branches differ only by amp.initialize (one assignment
    # now), a flag attribute only the removed apex branch read (it goes), callbacks around the step
    "callback_trainer": [["train.py", "--epochs", "2"], ["train.py", "--epochs", "2", "--apex_opt_level", "O1"]],
    # an mmcv optimizer hook scales `runner.outputs["loss"]`, which the runner's forward pass made
    # between the hooks' before_train_iter and after_train_iter: the hook holds the autocast region
    # (entered in a before_train_iter it gains, left first thing in after_train_iter)
    "iteration_hook": [["train.py", "--epochs", "2"], ["train.py", "--epochs", "2", "--fp16"]],
    # the project's own module forwards to apex's amp where apex imports (`import amp_support as
    # amp`): its calls are apex's, rewritten as such; the forwarders go, and the module is left
    # empty for a person to delete
    "apex_shim": [["train.py", "--steps", "5"], ["train.py", "--steps", "5", "--opt-level", "O0"]],
    # the shared backward reached through `from utils import *` (utils/__init__.py only imports it);
    # the actor's and the critic's setups, called one after the other, share one GradScaler
    "star_package": [["train.py", "--epochs", "2"], ["train.py", "--epochs", "2", "--fp16"]],
    # the trainer class is picked by a conditional expression, `(AMPTrainer if fp16 else
    # SimpleTrainer)(...)`, and AMPTrainer has no __init__ of its own: the base's takes the scaler
    "trainer_choice": [["train.py", "--iters", "10"], ["train.py", "--iters", "10", "--fp16"]],
    # ignite's shape: a factory defines the step as a closure and hands it to an engine
    # (`return Engine(_update)`): the factory takes the scaler, the closure reads it
    "closure_engine": [["train.py", "--epochs", "2"], ["train.py", "--epochs", "2", "--fp16"]],
    # k-fold training at the script's top level, a `continue` for the folds left out: each fold
    # makes its scaler beside its optimizer; the fold's evaluation runs under autocast
    "kfold_script": [["train.py", "--epochs", "1"], ["train.py", "--epochs", "1", "--fp16", "--only", "0", "2"]],
}


#: projects whose migration is an unsafe fix (none now: a norm clip on every micro-batch stays in place)
UNSAFE: set = set()


def migrated(tmp_path, name):
    work = tmp_path / name
    shutil.copytree(PROJECTS / name / "before", work)
    unsafe = ["--unsafe-fixes"] if name in UNSAFE else []
    out = CliRunner().invoke(main, ["migrate", "--write", *unsafe, "--torch-version", "2.4", str(work)])
    assert out.exit_code in (0, 1), out.output
    return work, out.output


def tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*.py"))


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_project_golden(tmp_path, name):
    work, output = migrated(tmp_path, name)
    after = PROJECTS / name / "after"
    assert tree(work) == tree(after)
    for rel in tree(after):
        assert (work / rel).read_text() == (after / rel).read_text(), rel
        assert "from apex" not in (work / rel).read_text() and "import apex" not in (work / rel).read_text()
    assert not [line for line in output.splitlines() if "AMP1" in line and "left for a person" in line], output
    unsafe = ["--unsafe-fixes"] if name in UNSAFE else []
    again = CliRunner().invoke(main, ["migrate", *unsafe, "--torch-version", "2.4", str(work)])
    assert "would be rewritten" not in again.output, again.output


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_project_after_runs(name):
    after = PROJECTS / name / "after"
    for entry in ENTRIES[name]:
        out = subprocess.run([sys.executable, *entry], cwd=after, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "PYTHONPATH": str(after), "PYTHONDONTWRITEBYTECODE": "1"})
        assert out.returncode == 0, (entry, out.stderr[-3000:])


def test_project_given_in_part_is_refused_not_half_migrated(tmp_path):
    """The launcher alone initializes apex, the engine that scales the loss is not given: the
    launcher is left whole (a GradScaler that nothing uses would drop mixed precision)."""
    work = tmp_path / "p"
    shutil.copytree(PROJECTS / "launcher_engine" / "before", work)
    out = CliRunner().invoke(main, ["migrate", "--write", "--torch-version", "2.4", str(work / "tools")])
    assert "never used with amp.scale_loss" in out.output
    assert filecmp.cmp(work / "tools" / "train_net.py", PROJECTS / "launcher_engine" / "before" / "tools" / "train_net.py",
                       shallow=False)


def test_old_apex_checkpoint_resumes_after_migration(tmp_path):
    """A checkpoint that apex.amp saved (amp.state_dict(): loss_scaler0) loads into the migrated
    script's GradScaler, and what it saves then is GradScaler state."""
    ckpt = tmp_path / "old.pt"
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                "amp": {"loss_scaler0": {"loss_scale": 1024.0, "unskipped": 7}}, "step": 5}, ckpt)
    script = PROJECTS.parent / "apex" / "after" / "checkpoint_resume.py"
    new = tmp_path / "new.pt"
    out = subprocess.run([sys.executable, str(script), "--steps", "2", "--resume", str(ckpt), "--save", str(new)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed at step 5" in out.stdout
    saved = torch.load(new)
    assert saved["step"] == 7 and "loss_scaler0" not in saved["amp"]


def test_projects_side_by_side_plan_as_when_alone(tmp_path):
    """A run over a folder of several projects (no project marker above them) plans each one
    as a part of its own: the same goldens as when each is run alone."""
    for name in sorted(ENTRIES):
        shutil.copytree(PROJECTS / name / "before", tmp_path / name)
    out = CliRunner().invoke(main, ["migrate", "--write", "--torch-version", "2.4", str(tmp_path)])
    assert out.exit_code in (0, 1), out.output
    # then the migrations that are unsafe fixes, alone (the other rules' unsafe fixes are not in the goldens)
    out = CliRunner().invoke(main, ["migrate", "--write", "--unsafe-fixes", "--select", "AMP1", "--torch-version",
                                    "2.4", str(tmp_path)])
    assert out.exit_code in (0, 1), out.output
    for name in sorted(ENTRIES):
        after = PROJECTS / name / "after"
        for rel in tree(after):
            assert (tmp_path / name / rel).read_text() == (after / rel).read_text(), (name, rel)


def test_a_part_that_imports_another_part_is_joined_with_it(tmp_path, monkeypatch):
    """Defence in depth: should planning a part import a file of the run that the first split
    put elsewhere, the project records it and the two parts are planned again as one."""
    from ampfix.project.graph import Project
    from ampfix.model.settings import Settings
    from ampfix.model.source import Source
    import ampfix.project.parts
    import ampfix.project.planning

    shutil.copytree(PROJECTS / "launcher_engine" / "before", tmp_path / "p")
    launcher = tmp_path / "p" / "tools" / "train_net.py"
    trainer = (tmp_path / "p" / "engine" / "trainer.py").resolve()
    project = Project({str(launcher): Source(launcher.read_bytes(), str(launcher))}, Settings(),
                      root=tmp_path / "p", given=[str(launcher)], run_files={str(trainer)})
    assert project.module_named("engine.trainer") is not None and project.foreign == {str(trainer)}


    def split(texts, root=None):  # every file a part of its own
        return ampfix.project.parts.Parts(texts)

    sizes = []
    real_plan = ampfix.project.planning._plan_part

    def plan(members, *a, **k):
        plans, read, other = real_plan(members, *a, **k)
        sizes.append(len(members))
        if len(members) == 1 and members[0].endswith("train_net.py"):
            read = read | {str(trainer)}  # as if planning it had imported the engine
        return plans, read, other

    monkeypatch.setattr(ampfix.project.planning, "import_components", split)
    monkeypatch.setattr(ampfix.project.planning, "_plan_part", plan)
    jobs = [(str(f), ()) for f in sorted((tmp_path / "p").rglob("*.py"))]
    from ampfix.project.plan import planners_of
    from ampfix.registry import rules_by_code

    ampfix.project.planning.plan_projects(jobs, Settings(), planners_of(rules_by_code().values()))
    # the launcher planned again with the trainer (and what else it reads: the leftover-initialize
    # probe follows the optimizer into engine/checkpoint.py too), after the first try
    assert any(n >= 2 for n in sizes[1:]), sizes


def _written(root, files):
    """Write ``files`` (relative path -> bytes) under ``root``: resolved path -> bytes."""
    texts = {}
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        texts[str(p.resolve())] = data
    return texts


def test_import_graph_follows_python_lookup(tmp_path):
    """Files join where Python could import one from the other; a folder of several projects
    (no marker above them) keeps them apart even where module names repeat."""
    from ampfix.project.parts import import_components

    files = {
        "a/train.py": b"from engine.loop \\\n    import run\nimport utils\n",
        "a/engine/loop.py": b"from . import helpers\n",
        "a/engine/helpers.py": b"x = 1\n",
        "a/utils.py": b"y = 2\n",
        "b/train.py": b"import utils\nfrom loop import run\n",  # b's own utils; no loop.py above b
        "b/utils.py": b"z = 3\n",
        "c/scripts/run.py": b"from mylib.core import go\n",  # a src layout
        "c/src/mylib/core.py": b"def go(): pass\n",
        "c/src/mylib/__init__.py": b"",
    }
    texts = _written(tmp_path, files)
    parts = import_components(texts, tmp_path)
    part = {rel: parts.find(str((tmp_path / rel).resolve())) for rel in files}
    assert part["a/train.py"] == part["a/engine/loop.py"] == part["a/engine/helpers.py"] == part["a/utils.py"]
    assert part["b/train.py"] == part["b/utils.py"] != part["a/train.py"]
    assert part["c/scripts/run.py"] == part["c/src/mylib/core.py"] != part["a/train.py"]


def test_parts_planned_side_by_side_in_workers(tmp_path):
    """Enough files for worker processes: the parts are planned there, in parallel, with the
    same result as one after the other."""
    for name in sorted(ENTRIES):
        shutil.copytree(PROJECTS / name / "before", tmp_path / name)
    for i in range(20):
        (tmp_path / "misc" / f"m{i}.py").parent.mkdir(exist_ok=True)
        (tmp_path / "misc" / f"m{i}.py").write_text(f"x{i} = {i}\n")
    out = CliRunner().invoke(main, ["migrate", "--write", "-j", "2", "--torch-version", "2.4", str(tmp_path)])
    assert out.exit_code in (0, 1), out.output
    out = CliRunner().invoke(main, ["migrate", "--write", "-j", "2", "--unsafe-fixes", "--select", "AMP1",
                                    "--torch-version", "2.4", str(tmp_path)])
    assert out.exit_code in (0, 1), out.output
    for name in sorted(ENTRIES):
        after = PROJECTS / name / "after"
        for rel in tree(after):
            assert (tmp_path / name / rel).read_text() == (after / rel).read_text(), (name, rel)


def test_checkout_of_several_projects_keeps_vendored_copies_apart(tmp_path):
    """A checkout whose root has only `.git` (a monorepo of research projects) is not one package:
    `from transformers import Trainer` in one project does not reach the copy vendored in another;
    a file that edits sys.path (or imports a module that does) may import from anywhere."""
    from ampfix.project.parts import import_components

    files = {
        "ChildTuning/run.py": b"from transformers import Trainer\n",
        "PALM/others/transformers/__init__.py": b"from apex import amp\n",
        "exp/exp1.py": b"import sys\nsys.path.append('../input/src/')\nfrom trainer import train\n",
        "exp/exp2.py": b"import _init_paths\nfrom trainer import train\n",
        "exp/_init_paths.py": b"import sys\nsys.path.insert(0, '../input/src')\n",
        "input/src/trainer.py": b"def train(): pass\n",
        "other/run.py": b"from trainer import train\n",  # no path edit: not importable from here
    }
    (tmp_path / ".git").mkdir()
    texts = _written(tmp_path, files)

    def part(parts, rel):
        return parts.find(str((tmp_path / rel).resolve()))

    parts = import_components(texts, tmp_path)
    assert part(parts, "ChildTuning/run.py") != part(parts, "PALM/others/transformers/__init__.py")
    assert part(parts, "exp/exp1.py") == part(parts, "input/src/trainer.py") == part(parts, "exp/exp2.py")
    assert part(parts, "other/run.py") != part(parts, "input/src/trainer.py")
    # no .git: a folder of several checkouts, where a sys.path edit stays in its own (exp1's
    # string names the folders down to trainer.py, which Python's lookup follows still)
    (tmp_path / ".git").rmdir()
    parts = import_components(texts, tmp_path)
    assert part(parts, "exp/exp2.py") != part(parts, "input/src/trainer.py")
    assert part(parts, "exp/exp1.py") == part(parts, "input/src/trainer.py")
    # one installable package: any module imports another by name
    (tmp_path / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    parts = import_components(texts, tmp_path)
    assert part(parts, "ChildTuning/run.py") == part(parts, "PALM/others/transformers/__init__.py")
    assert part(parts, "other/run.py") == part(parts, "input/src/trainer.py")
