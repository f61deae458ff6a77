"""apex's amp handed to a function as an argument (``prepare(args, model, amp=amp)``, the
caller's ``amp`` imported under the fp16 flag and None otherwise; issue 21 §1.2).  The
parameter is apex's amp where every call in the module hands it amp or None; it becomes the
scaler's parameter.  Anything else it may be keeps it what it was."""
import textwrap

from ampfix.engine.check import check_source
from ampfix.model.settings import Settings
from ampfix.registry import all_rules

HEAD = """\
    import torch


    def setup(args, model, amp):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if amp:
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        return model, optimizer


    def train(args, model, data):
        if args.fp16:
            from apex import amp
        else:
            amp = None
        model, optimizer = setup(args, model, {arg})
        for x in data:
            loss = model(x).sum()
            if args.fp16:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()
"""


def run(src: str, fix=None):
    return check_source(textwrap.dedent(src).encode(), "x.py", all_rules(), Settings(), fix=fix)


def test_the_parameter_is_apex_for_check_and_no_uninitialized_report():
    res = run(HEAD.format(arg="amp"))
    codes = [(d.code, d.line) for d in res.diagnostics]
    assert ("AMP101", 7) in codes  # amp.initialize through the parameter is apex's
    assert not [d for d in res.diagnostics if d.code == "AMP106"], res.diagnostics


def test_a_setup_that_only_initialized_loses_the_parameter():
    res = run(HEAD.format(arg="amp=amp"), fix="safe")
    out = res.fixed
    assert "apex" not in out and "amp.initialize" not in out and "if amp" not in out
    assert "def setup(args, model):" in out
    assert "    model, optimizer = setup(args, model)\n" \
           '    scaler = torch.amp.GradScaler("cuda", enabled=bool(args.fp16))\n' in out
    assert "amp = None" not in out  # nothing reads the caller's amp any more
    assert "scaler.scale(loss).backward()" in out and "scaler.step(optimizer)" in out
    compile(out, "x.py", "exec")
    assert run(out, fix="safe").fixed == out


def test_a_call_that_hands_something_else_keeps_the_parameter_unknown():
    src = HEAD.format(arg="amp") + "\n\n    setup(None, torch.nn.Linear(2, 2), object())\n"
    res = run(src, fix="safe")
    assert not [d for d in res.diagnostics if d.code == "AMP101" and d.line == 7]
    assert "amp.initialize" in res.fixed  # left as it was


def test_a_none_default_keeps_its_none_check():
    src = HEAD.format(arg="amp") + """
    def save(model, amp=None):
        state = {"model": model.state_dict()}
        if amp is not None:
            state["amp"] = amp.state_dict()
        return state


    def after(args, model, data):
        if args.fp16:
            from apex import amp
        else:
            amp = None
        return save(model, amp)
    """
    out = run(src, fix="safe").fixed
    assert "def save(model, scaler=None):" in out
    assert "if scaler is not None and scaler.is_enabled():" in out


RESTORE = """\
            if args.resume:
                amp.load_state_dict(torch.load(args.resume)["amp"])
"""


def test_a_setup_that_also_restores_apex_state_gets_the_scaler_made_before_the_call():
    init = '            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
    src = HEAD.replace(init, init + RESTORE)
    out = run(src.format(arg="amp"), fix="safe").fixed
    assert "def setup(args, model, scaler):" in out
    assert "    if scaler.is_enabled():\n        if args.resume:\n            scaler.load_state_dict(" in out
    assert '    scaler = torch.amp.GradScaler("cuda", enabled=bool(args.fp16))\n' \
           "    model, optimizer = setup(args, model, scaler)\n" in out
    assert "from apex" not in out and "amp = None" not in out
    assert run(out, fix="safe").fixed == out
