"""Thirty-third round: an availability flag set False before its guard, read as a reviewer reads
the diff.

``have_apex = False`` right before ``try: from apex import amp ...; have_apex = True / except
ImportError: print(...)``: the handler only reports, so the False set before is what it leaves.
The migrated code kept ``have_apex = False`` followed by ``have_apex = True``, the ``if have_apex:
<apex path> else: <fp32 path>`` and ``enabled=bool(have_apex)``.  The flag is True for good once
apex goes: its tests fold, a GradScaler's or autocast's ``enabled=`` that only read it goes (it
is the default), and the flag goes with the comment above it that spoke of apex.

An inference script (``if __name__ == "__main__":``) that built an optimizer only to hand it to
``amp.initialize`` (``optimizer = torch.optim.Adam(list(model.parameters()))``): once the
initialize goes the optimizer is dead code, and goes too; one that something else reads stays.

A GradScaler the migration wrote one argument a line because the flag made it long is one line
again once the flag folds, where it fits; a line still too long is fitted as black would (one
operand of an ``and`` a line).  A setup whose apex branch is the last of ``if deepspeed: ... elif
fairscale: ... else: amp.initialize(...)`` hands its callers the negated tests; a caller that
throws the optimizer away only evaluates; a scaler made beside the call inside the caller's own
``if`` does not repeat its test.  ``model, teacher = amp.initialize([model, teacher], None)``
unpacks the list of models it returns.
"""
from test_round17_shapes import migrated

TRAIN = '''\
import torch

# NVIDIA Apex for mixed-precision training
have_apex = False
try:
    from apex import amp
    have_apex = True
    print("Found apex.")
except ImportError:
    print("Recommend that you install apex to run this code.")


def train_loop(model, optimizer, steps):
    for _ in range(steps):
        loss = model(torch.randn(2, 4, device="cuda")).sum()
        optimizer.zero_grad()
        if have_apex:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()


def train(opt_level):
    model = torch.nn.Linear(4, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if have_apex:
        model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level)
    else:
        print("No apex.")
    train_loop(model, optimizer, 3)
'''

PREDICT = '''\
import torch

# NVIDIA Apex for mixed-precision training
have_apex = False
try:
    from apex import amp
    have_apex = True
except ImportError:
    print("Recommend that you install apex to run this code.")


def predict(model, x):
    return model(x)


if __name__ == "__main__":
    model = torch.nn.Linear(4, 4).cuda()
    print("loaded")

    if have_apex:
        optimizer = torch.optim.Adam(list(model.parameters()))
        model, optimizer = amp.initialize(model, optimizer, opt_level="O2")

    y = predict(model, torch.randn(2, 4, device="cuda"))
    print(y.shape)
'''


def test_a_flag_set_false_before_its_guard_folds_and_goes(tmp_path):
    text = migrated(tmp_path, {"train.py": TRAIN}, "train.py")
    assert "have_apex" not in text and "apex" not in text.lower(), text
    # the apex path is the path: the fp32 one and the report that apex is missing go
    assert "loss.backward()" not in text and "No apex." not in text, text
    assert "        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n" in text, text
    # opt_level is read at run time: enabled unless O0, no flag left in it
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=opt_level != "O0")' in text, text
    assert text.startswith("import torch\n\n\ndef train_loop("), text


def test_enabled_that_only_read_the_flag_goes(tmp_path):
    text = migrated(tmp_path, {"predict.py": PREDICT}, "predict.py")
    assert "have_apex" not in text and "apex" not in text.lower(), text
    assert '    with torch.autocast("cuda", dtype=torch.float16):\n        y = predict(' in text, text
    # the optimizer was built only for apex's initialize: it goes with it
    assert "optimizer" not in text, text
    assert '    print("loaded")\n\n    with torch.autocast' in text, text


def test_an_optimizer_read_by_something_else_stays(tmp_path):
    kept = PREDICT.replace("        model, optimizer = amp.initialize(",
                           "        print(optimizer)\n        model, optimizer = amp.initialize(")
    text = migrated(tmp_path, {"predict.py": kept}, "predict.py")
    assert "    optimizer = torch.optim.Adam(list(model.parameters()))\n    print(optimizer)\n" in text, text


def test_a_handler_that_resets_the_flag_still_folds(tmp_path):
    # `have_apex = False` before and in the handler: the same availability test, written twice
    src = TRAIN.replace('    print("Recommend that you install apex to run this code.")\n',
                        '    have_apex = False\n')
    text = migrated(tmp_path, {"train.py": src}, "train.py")
    assert "have_apex" not in text, text


def test_a_flag_the_code_turns_off_elsewhere_stays(tmp_path):
    # `have_apex = False` on a CPU too: a switch, not an availability test
    src = TRAIN.replace("def train(opt_level):\n",
                        "def train(opt_level):\n    global have_apex\n"
                        "    if not torch.cuda.is_available():\n        have_apex = False\n")
    text = migrated(tmp_path, {"train.py": src}, "train.py")
    assert "    if not torch.cuda.is_available():\n        have_apex = False\n" in text, text
    assert 'enabled=bool(have_apex) and opt_level != "O0")' in text and "if not have_apex:" in text, text



LONG = '''\
"""A trainer; this docstring's first line is long, so the file is a little wider than 88 columns."""
import torch

apex_is_available = False
try:
    from apex import amp
    apex_is_available = True
except ImportError:
    pass


class Trainer:
    def __init__(self, args, model, optimizer):
        self.args = args
        self.model = model
        self.optimizer = optimizer
        if apex_is_available and self.args.mixed_precision:
            self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O1")

    def train(self, steps):
        for _ in range(steps):
            loss = self.model(torch.randn(2, 4, device="cuda")).sum()
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
            self.optimizer.step()
'''


def test_a_call_broken_for_the_flag_is_one_line_again(tmp_path):
    # with the flag the scaler's line passed 100 columns and was written one argument a line;
    # without it, it fits the file's width again
    text = migrated(tmp_path, {"train.py": LONG}, "train.py")
    assert "apex_is_available" not in text, text
    assert ('        self.scaler = torch.amp.GradScaler("cuda", enabled=bool(self.args.mixed_precision))\n'
            in text), text


def test_a_call_too_long_for_one_line_is_fitted_to_the_width(tmp_path):
    # the file's own width is 88 here: one line would pass it, and it is fitted to it as the
    # engine fits every line a fix makes long
    src = LONG.replace("this docstring's first line is long, so the file is a little wider than 88 columns.",
                       "short.").replace("amp.initialize(self.model,", "amp.initialize(\n                self.model,")
    text = migrated(tmp_path, {"train.py": src}, "train.py")
    assert "apex_is_available" not in text, text
    assert ('        self.scaler = torch.amp.GradScaler(\n'
            '            "cuda", enabled=bool(self.args.mixed_precision)\n        )\n') in text, text
    assert max(len(line) for line in text.splitlines()) <= 88, text


SETUP = '''\
import torch
from apex import amp


def setup(args, model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.method == "deepspeed":
        model, optimizer = model.to_deepspeed(optimizer)
    elif args.method == "fairscale":
        model = model.shard()
    else:
        model, optimizer = amp.initialize(model, optimizer, opt_level=f"O{args.amp_level}")
    return args, model, optimizer


def train(args, model, optimizer):
    for _ in range(3):
        loss = model(torch.randn(2, 4, device="cuda")).sum()
        optimizer.zero_grad()
        if args.method == "deepspeed":
            model.backward(loss)
        else:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        optimizer.step()


def evaluate(model):
    with torch.no_grad():
        return model(torch.randn(2, 4, device="cuda")).sum().item()


def main(args):
    model = torch.nn.Linear(4, 4).cuda()
    if args.do_train:
        args, model, optimizer = setup(args, model)
        train(args, model, optimizer)
    elif args.do_eval:
        args, model, _ = setup(args, model)
        print(evaluate(model))
'''


def test_a_setup_that_picks_apex_in_its_last_branch(tmp_path):
    """``if deepspeed: ... elif fairscale: ... else: amp.initialize(...)`` in a setup whose callers
    train or evaluate (SwinBERT's ``mixed_precision_init``): the training caller makes the scaler,
    enabled where the setup took the apex branch; the caller that throws the optimizer away
    (``args, model, _ = setup(...)``) only evaluates, under autocast; neither repeats the caller's
    own ``if args.do_train:`` in enabled=."""
    text = migrated(tmp_path, {"train.py": SETUP}, "train.py")
    assert "apex" not in text and "amp.initialize" not in text and "scale_loss" not in text, text
    # enabled where the apex branch ran, one operand a line where the line would pass the width
    cond = ('            enabled=args.method != "deepspeed"\n            and args.method != "fairscale"\n'
            '            and (f"O{args.amp_level}" != "O0"),\n')
    # the training caller: one scaler, made beside the call
    assert text.count("GradScaler(") == 1 and text.count(cond) == 2, text
    assert ('        args, model, optimizer = setup(args, model)\n        scaler = torch.amp.GradScaler(\n'
            '            "cuda",\n' + cond + '        )\n        train(args, model, optimizer, scaler=scaler)\n') in text, text
    # the evaluating caller: autocast around what runs the model, under the same condition
    assert ('        args, model, _ = setup(args, model)\n        with torch.autocast(\n            "cuda",\n'
            '            dtype=torch.float16,\n' + cond + '        ):\n            print(evaluate(model))\n') in text, text
    assert "do_train and" not in text and "bool(args.do_eval)" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 88, text


SIMPLE_SETUP = '''\
import torch
from apex import amp


def setup(args, model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    return model, optimizer


def train(model, optimizer):
    for _ in range(3):
        loss = model(torch.randn(2, 4, device="cuda")).sum()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()


def main(args):
    model = torch.nn.Linear(4, 4).cuda()
    if args.do_train:
        model, optimizer = setup(args, model)
        train(model, optimizer)
'''


def test_a_setup_called_inside_the_callers_if_keeps_the_test_out_of_enabled(tmp_path):
    # made beside the call, inside `if args.do_train:`: the test holds there
    text = migrated(tmp_path, {"train.py": SIMPLE_SETUP}, "train.py")
    assert ('        model, optimizer = setup(args, model)\n        scaler = torch.amp.GradScaler("cuda")\n'
            '        train(model, optimizer, scaler=scaler)\n') in text, text


def test_fit_breaks_a_long_boolean_argument_one_operand_a_line():
    from ampfix.engine.fit import fit_lines, split_line

    line = ('        with torch.autocast("cuda", enabled=args.method != "deepspeed" and args.method != "fairscale" '
            'and args.level != "O0"):')
    assert split_line(line, 88) == [
        '        with torch.autocast(', '            "cuda",', '            enabled=args.method != "deepspeed"',
        '            and args.method != "fairscale"', '            and args.level != "O0",', '        ):']
    # an argument line inside a call the fix wrote over lines
    after = ('def f(args):\n    scaler = torch.amp.GradScaler(\n        "cuda",\n'
             '        enabled=args.method != "deepspeed" and args.method != "fairscale" and (args.level != "O0") or x,\n'
             '    )\n')
    assert fit_lines("x = 1\n", after) == (
        'def f(args):\n    scaler = torch.amp.GradScaler(\n        "cuda",\n'
        '        enabled=args.method != "deepspeed"\n        and args.method != "fairscale"\n'
        '        and (args.level != "O0")\n        or x,\n    )\n')
    # no operator outside brackets: left as it is
    assert split_line("        f(" + "x" * 100 + ")", 88) is None


TWO_MODELS = '''\
import torch
from apex import amp


def main():
    model = torch.nn.Linear(4, 4).cuda()
    teacher = torch.nn.Linear(4, 4).cuda()
    model, teacher = amp.initialize([model, teacher], None, opt_level="O1")
    x = torch.randn(2, 4, device="cuda")
    with torch.no_grad():
        gap = (model(x) - teacher(x)).abs().mean()
    print(gap.item())
'''


def test_two_models_initialized_for_inference_and_unpacked(tmp_path):
    """``model, teacher = amp.initialize([model, teacher], None, ...)`` (LightningDOT's setup): the
    list of models comes back and is unpacked one by one; refused before ("assigns 2 names from 1
    values"), the statement goes and what runs both models is under autocast."""
    text = migrated(tmp_path, {"eval.py": TWO_MODELS}, "eval.py")
    assert "apex" not in text and "amp.initialize" not in text, text
    assert "model, teacher =" not in text, text
    assert ('    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):\n'
            '        gap = (model(x) - teacher(x)).abs().mean()\n') in text, text
