"""Thirty-ninth round: k-fold training written at a script's module level.

Kaggle-style scripts train one fold after another in a loop at the top level of the script:
``for fold in ...: if fold not in folds: continue; model = ...; optimizer = ...; if fp16: model,
optimizer = amp.initialize(...); train(...)``.  apex made a fresh loss scaler at each initialize, so
each fold started from the initial scale.  Inside a function the scaler is made beside the
optimizer, in the loop; at module level the loop was refused ("can stop early": the ``continue``),
though the ``continue`` skips the fold's scaler and its steps alike.  A function of the script that
declares the optimizer's name ``global`` binds it where the loop cannot see: that stays refused.
"""
from test_round17_shapes import migrated, run, write

KFOLD = '''\
import argparse

import torch
from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--fp16", action="store_true")
args = parser.parse_args()
{extra}
for fold in range(3):
    # skip unwanted folds
    if fold not in [0, 1]:
        continue
    model = torch.nn.Linear(4, 2).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for step in range(5):
        x = torch.randn(8, 4, device="cuda")
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        if args.fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()
'''

RESET = '''
def reset(params):
    global optimizer
    optimizer = torch.optim.SGD(params, lr=0.1)
'''


def test_each_fold_makes_its_scaler_beside_its_optimizer(tmp_path):
    out = migrated(tmp_path, {"kfold.py": KFOLD.format(extra="")}, "kfold.py")
    made = '    scaler = torch.amp.GradScaler("cuda", enabled=bool(args.fp16))\n'
    # in the loop, after the `continue` and the optimizer: a fresh scale per fold, as apex's was
    assert out.index("        continue\n") < out.index("    optimizer = torch.optim.SGD") < out.index(made)
    assert out.count("GradScaler(") == 1
    assert "        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n" in out
    assert 'with torch.autocast("cuda", dtype=torch.float16, enabled=bool(args.fp16)):' in out
    assert "amp." not in out.replace("torch.amp.", "")
    compile(out, "kfold.py", "exec")


def test_a_function_that_rebinds_the_optimizer_global_keeps_it_refused(tmp_path):
    files = {"kfold.py": KFOLD.format(extra=RESET)}
    write(tmp_path, files)
    out = run(tmp_path, "--write")
    assert "that can stop early" in out.output
    assert (tmp_path / "kfold.py").read_text() == files["kfold.py"]


MODES = '''\
import torch
from apex import amp


def train(model, optimizer, data, fp16):
    for x in data:
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        if fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()


def predict(model, data):
    model.eval()
    with torch.no_grad():
        return [model(x) for x in data]


def main(args, data):
    model = torch.nn.Linear(4, 2).cuda()
    if args.mode == "train":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if args.fp16:
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        train(model, optimizer, data, args.fp16)
        return predict(model, data)
    elif args.mode == "predict":
        return predict(model, data)
    for x in data:
        if args.mode == "train":
            pass
        else:
            predict(model, [x])
'''


def test_an_evaluation_in_a_branch_the_setup_excludes_is_left(tmp_path):
    out = migrated(tmp_path, {"main.py": MODES}, "main.py")
    train_branch = out[out.index('    if args.mode == "train":'):out.index('    elif args.mode == "predict":')]
    assert "with torch.autocast(" in train_branch and "return predict(model, data)" in train_branch
    # the predict mode never ran after apex's setup: no autocast whose switch is always off there
    assert '    elif args.mode == "predict":\n        return predict(model, data)\n' in out
    # a branch of an `if` inside a loop may run after the setup ran: it is still wrapped
    main = out[out.index("def main("):]
    assert main.count("with torch.autocast(") == 2
    assert "predict(model, [x])" in main[main.rindex("with torch.autocast("):]


DUAL = '''\
from contextlib import suppress

import torch

try:
    from apex import amp
    has_apex = True
except ImportError:
    has_apex = False
# assert not has_apex, "this script takes the native path"

has_native_amp = hasattr(torch.cuda.amp, "autocast")


def main(amp_on, data):
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    use_amp = None
    if amp_on:
        if has_native_amp:
            use_amp = "native"
        elif has_apex:
            use_amp = "apex"
    # if has_apex:
    #     print("apex is here")
    amp_autocast, scaler = suppress, None
    if use_amp == "apex":
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    elif use_amp == "native":
        amp_autocast = torch.cuda.amp.autocast
        scaler = torch.cuda.amp.GradScaler()
    for x in data:
        with amp_autocast():
            loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        if use_amp == "apex":
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
        elif scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
'''


def test_a_commented_line_reading_the_apex_flag_goes_with_the_flag(tmp_path):
    write(tmp_path, {"train.py": DUAL})
    res = run(tmp_path, "--write")
    assert "the apex path goes" in res.output, res.output
    out = (tmp_path / "train.py").read_text()
    assert "has_apex = " not in out and "# assert not has_apex" not in out
    # the commented-out block stays whole
    assert "    # if has_apex:\n    #     print(\"apex is here\")\n" in out
    compile(out, "train.py", "exec")
