"""Thirty-second round: the flags that said whether apex was installed, read as a reviewer reads a
diff.

apex is found with a flag (``has_apex = True`` before ``try: from apex import amp / except
ImportError: has_apex = False``, or ``apex_support = False`` before a try whose body sets it
True), and the flag gates mixed precision (``if has_apex and args.fp16:``).  Once the migration
takes apex out, native AMP is always there: the flag is True for good.  The migrated code kept
it (``enabled=bool(has_apex and args.fp16)``, ``if has_apex: <a> else: <b>``, ``apex_support =
False`` followed by ``apex_support = True``): dead code a reviewer would ask to remove.  The
flag now folds wherever it is read (``enabled=bool(args.fp16)``, the ``if`` becomes its branch,
``if args.fp16 and (has_apex is False): raise`` goes) and goes once nothing reads it.  A flag
that the code also turns off elsewhere (``mixed_precision = False`` on a CPU) is a switch, not
an availability test: it stays.  A ``sys.path.append("./apex")`` in the guard no longer keeps
its bare ``except:`` alive (a constant appended to a list cannot raise).  An ``if`` on the flag
whose body only reports apex's use (``logging.debug("Using apex for fp16")``) goes with apex.

An evaluation script's autocast region began at ``model = DistributedDataParallel(model)`` (apex's
wrapper, not counted as torch's) and took in a project helper that loads weights into the model
(``load_state_dict_with_mismatch(model, path)``): neither runs the forward.  apex's wrappers are
skipped as torch's are, and a project function that only reaches the model through its own
non-running methods (``state_dict``, ``load_state_dict``, ``parameters``, ``eval``, ``to`` ...) or
``isinstance`` does not start a region.
"""
from test_round17_shapes import run, write

TRAIN = '''\
import sys

import torch
import torch.nn as nn

has_apex = True
try:
    from apex import amp
except ImportError:
    has_apex = False


def set_syncbn(net):
    if has_apex:
        net = nn.SyncBatchNorm.convert_sync_batchnorm(net)
    else:
        net = nn.BatchNorm1d(4)
    return net


def main(args):
    model = torch.nn.Linear(4, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if has_apex and args.fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    if args.fp16 and (has_apex is False):
        raise ImportError("install apex")
    for _ in range(3):
        loss = model(torch.randn(2, 4, device="cuda")).sum()
        if has_apex and args.fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()
'''

SIMCLR = '''\
import sys

import torch

apex_support = False
try:
    sys.path.append("./apex")
    from apex import amp

    apex_support = True
except:
    print("Please install apex for mixed precision training")
    apex_support = False


def main(fp16):
    model = torch.nn.Linear(4, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if apex_support and fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
    if apex_support and fp16:
        print("Using apex for fp16 precision training.")
    if apex_support and fp16:
        print("mixed precision on")
    for _ in range(3):
        loss = model(torch.randn(2, 4, device="cuda")).sum()
        if apex_support and fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()
'''


def _migrated(tmp_path, files, read="train.py", *extra):
    """``files`` (a path -> text dict, or the text of train.py) written, migrated in place; the
    text of ``read`` after it."""
    write(tmp_path, files if isinstance(files, dict) else {"train.py": files})
    out = run(tmp_path, "--write", "-q", *extra)
    assert out.exit_code == 0, out.output
    return (tmp_path / read).read_text()


def test_a_flag_set_before_the_guard_folds_and_goes(tmp_path):
    text = _migrated(tmp_path, TRAIN)
    compile(text, "train.py", "exec")
    assert "apex" not in text and "has_apex" not in text, text
    assert 'torch.amp.GradScaler("cuda", enabled=bool(args.fp16))' in text, text
    assert 'enabled=bool(args.fp16)):\n            loss = model(' in text, text
    # the apex branch is the one that runs now; the other is gone with the test
    assert "    net = nn.SyncBatchNorm.convert_sync_batchnorm(net)\n    return net\n" in text, text
    assert "BatchNorm1d" not in text, text
    # the check that apex was installed is gone with it
    assert "raise ImportError" not in text, text


def test_a_flag_the_guard_sets_and_a_path_append(tmp_path):
    text = _migrated(tmp_path, SIMCLR)
    compile(text, "train.py", "exec")
    assert "apex_support" not in text and "amp.initialize" not in text and "scale_loss" not in text, text
    assert "enabled=bool(fp16)" in text, text
    # no bare `except:` left behind, nor its message about installing apex
    assert "except" not in text and "Please install apex" not in text, text
    # a message that apex is used goes with apex; one that does not speak of it stays
    assert "Using apex" not in text, text
    assert '    if fp16:\n        print("mixed precision on")\n' in text, text


def test_a_flag_turned_off_elsewhere_is_a_switch(tmp_path):
    # `mixed_precision = False` on a CPU: the flag is not a constant once apex is gone
    switched = TRAIN.replace("has_apex", "mixed_precision") + '''

if __name__ == "__main__":
    import argparse
    args = argparse.Namespace(fp16=True, cpu=False)
    if args.cpu:
        mixed_precision = False
    main(args)
'''
    text = _migrated(tmp_path, switched)
    compile(text, "train.py", "exec")
    assert "enabled=bool(mixed_precision and args.fp16)" in text, text
    assert "mixed_precision = True\n" in text and "if mixed_precision:" in text, text


def test_flags_fold_with_bfloat16(tmp_path):
    text = _migrated(tmp_path, TRAIN, "train.py", "--dtype", "bfloat16")
    assert "has_apex" not in text and "GradScaler" not in text, text
    assert "dtype=torch.bfloat16, enabled=bool(args.fp16)" in text, text


# An evaluation script (round32's Text-Proxy): apex initialized the model and an optimizer that
# nothing trains, then the model is wrapped in apex's DDP and its weights loaded by a helper of the
# project, then evaluated.  The autocast region began at the DDP wrapping and took in the weight
# loading: neither runs the model.  Only the evaluation runs under autocast now.
EVAL = '''\
import torch
from apex import amp
from apex.parallel import DistributedDataParallel

from utils import load_weights, validate


def start_eval(cfg):
    model = torch.nn.Linear(4, 4).cuda()
    model, = amp.initialize([model], opt_level="O1")
    model = DistributedDataParallel(model)
    if cfg.weights:
        print("loading", cfg.weights)
        load_weights(model, cfg.weights)
    validate(model, cfg)
'''

UTILS = '''\
import torch


def load_weights(model, path):
    state = torch.load(path, map_location="cpu")
    keys = set(model.state_dict().keys())
    if isinstance(model, torch.nn.Module):
        model.load_state_dict({k: v for k, v in state.items() if k in keys}, strict=False)


def validate(model, cfg):
    model.eval()
    with torch.no_grad():
        return model(torch.randn(2, 4, device="cuda")).sum()
'''


def test_loading_weights_is_not_a_forward(tmp_path):
    text = _migrated(tmp_path, {"eval.py": EVAL, "utils.py": UTILS}, "eval.py")
    compile(text, "eval.py", "exec")
    assert "apex" not in text, text
    assert ("    model = torch.nn.parallel.DistributedDataParallel(model)\n"
            "    if cfg.weights:\n") in text, text
    assert ('    with torch.autocast("cuda", dtype=torch.float16):\n'
            '        validate(model, cfg)\n') in text, text
    assert text.count("torch.autocast") == 1, text


def test_a_helper_that_runs_the_model_is_a_forward(tmp_path):
    # the same helper, but it calls the model: the region starts there, as before
    runs = UTILS.replace("        model.load_state_dict({k: v for k, v in state.items() if k in keys}, strict=False)\n",
                         "        model.load_state_dict({k: v for k, v in state.items() if k in keys}, strict=False)\n"
                         "    model(torch.zeros(1, 4, device=\"cuda\"))\n")
    text = _migrated(tmp_path, {"eval.py": EVAL, "utils.py": runs}, "eval.py")
    assert ('    with torch.autocast("cuda", dtype=torch.float16):\n'
            '        if cfg.weights:\n') in text, text


# A step whose batch goes through a helper of the project that only moves tensors to the device
# (``batch = move_to_cuda(batch)``, recursing through dicts and lists): the autocast region began
# there; it begins at the forward now, as it does after ``batch = batch.cuda()``.  The two loops,
# each with its step, had one ``scaler.update()`` after both: the second iteration's
# ``scaler.step`` would raise (the first step was never updated); each loop updates now.
MOVERS = '''\
import torch


def move_to_cuda(sample):
    if len(sample) == 0:
        return {}

    def _move(x):
        if torch.is_tensor(x):
            return x.cuda()
        elif isinstance(x, dict):
            return {k: _move(v) for k, v in x.items()}
        elif isinstance(x, list):
            return [_move(v) for v in x]
        return x

    return _move(sample)


def log_and_move(sample, log):
    log.append(len(sample))
    return move_to_cuda(sample)
'''

STEP = '''\
import torch
from apex import amp

from movers import log_and_move, move_to_cuda


class State:
    def __init__(self, model):
        self.model = model


def train(model, optimizer, loader, log):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    state = State(model)
    for batch in loader:
        batch = move_to_cuda(batch)
        loss = state.model(batch["x"]).sum()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    for batch in loader:
        batch = log_and_move(batch, log)
        loss = state.model(batch["x"]).sum()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        optimizer.zero_grad()
'''


def test_a_helper_that_only_moves_the_batch_is_preparation(tmp_path):
    text = _migrated(tmp_path, {"movers.py": MOVERS, "train.py": STEP}, "train.py")
    compile(text, "train.py", "exec")
    assert ('        batch = move_to_cuda(batch)\n'
            '        with torch.autocast("cuda", dtype=torch.float16):\n'
            '            loss = state.model(batch["x"]).sum()\n') in text, text
    # a helper that does more (it appends to a list it was given) is not known to only move
    assert ('        with torch.autocast("cuda", dtype=torch.float16):\n'
            '            batch = log_and_move(batch, log)\n') in text, text
    # each loop steps and updates: one update after both loops made the second step raise
    assert text.count("        scaler.step(optimizer)\n        scaler.update()\n") == 2, text


# An inference script whose model runs inside a ``while True:`` read-eval loop (a prompt, the
# encoding, a search, a print): the region wrapped the whole loop, prompt and printing included.
# It wraps the forward in the loop's body now, with the loss computed from its output right
# after it (a loss runs in float32 under autocast, as apex's O1 ran it).
REPL = '''\
import torch
from apex import amp

model = torch.nn.Linear(4, 4).cuda()
criterion = torch.nn.MSELoss()
model = amp.initialize(model, opt_level="O1")
model.eval()
while True:
    text = input("query: ")
    x = torch.randn(2, 4, device="cuda")
    y = model(x)
    err = criterion(y, x)
    hits = y.float().cpu().numpy()
    print(text, hits, err.item())
'''


def test_an_inference_loop_wraps_its_forward_not_the_loop(tmp_path):
    text = _migrated(tmp_path, {"repl.py": REPL}, "repl.py")
    compile(text, "repl.py", "exec")
    assert ('while True:\n'
            '    text = input("query: ")\n'
            '    x = torch.randn(2, 4, device="cuda")\n'
            '    with torch.autocast("cuda", dtype=torch.float16):\n'
            '        y = model(x)\n'
            '        err = criterion(y, x)\n'
            '    hits = y.float().cpu().numpy()\n') in text, text


# The evaluation script built its optimizer only to hand it to apex's initialize, with a builder
# imported from a module of the project: the optimizer stayed, assigned and never used (a
# reviewer's "unused variable").  It goes with its import where importing that module only binds
# names; where the module runs code when imported, the import and the optimizer stay.
EVAL_OPT = '''\
import torch
from apex import amp

from builders import build_optimizer


def evaluate(model, x):
    optimizer = build_optimizer(model)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    model.eval()
    with torch.no_grad():
        return model(x).sum()
'''

BUILDERS = '''\
import torch


def build_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)
'''


def test_an_optimizer_built_only_for_apex_goes_with_its_import(tmp_path):
    text = _migrated(tmp_path, {"evaluate.py": EVAL_OPT, "builders.py": BUILDERS}, "evaluate.py")
    compile(text, "evaluate.py", "exec")
    assert "optimizer" not in text and "build_optimizer" not in text, text
    assert ('    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):\n'
            '        return model(x).sum()\n') in text, text


def test_an_optimizer_whose_builder_module_runs_code_stays(tmp_path):
    noisy = BUILDERS + 'print("builders imported")\n'
    text = _migrated(tmp_path, {"evaluate.py": EVAL_OPT, "builders.py": noisy}, "evaluate.py")
    assert "from builders import build_optimizer\n" in text, text
    assert "    optimizer = build_optimizer(model)\n" in text, text
