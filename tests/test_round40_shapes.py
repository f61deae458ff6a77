"""Fortieth round: what the public code of this round showed.

1. With bfloat16, a loss computed by the code itself (nnU-Net's Dice term: ``(-(num + 1e-5) /
   (den + 1e-5)).mean()``, no loss function autocast runs in float32) and then handed to numpy for
   logging (``return total_loss.detach().cpu().numpy()``) refused the whole trainer hierarchy
   ("hands the forward's output to numpy"): numpy has no bfloat16.  A name that was backwarded
   before holds a floating tensor, so ``.float()`` before ``.numpy()`` is exact (a no-op on float32)
   and keeps the array float16 training made; so does a loss's input (kg-bert's and BERT run_glue's
   ``tmp_eval_loss = loss_fct(logits.view(-1, n), label_ids.view(-1))`` then
   ``preds.append(logits.detach().cpu().numpy())``: a loss's first argument is its prediction);
   any other output of the forward stays refused, and so does a loss's target.
2. A fold loop whose initialize reads options computed under its guard (carbonati's melanoma:
   ``for fold_id in fold_ids: ... optim = get_optimizer(...); if config.get('fp_16'): opt_level =
   config.get(...); loss_scale = ...; model, optim = amp.initialize(...)``) was refused ("the
   scaler's options are set inside the `for`").  The optimizer is made in the loop's body, so the
   scalers are made beside it (a disabled one before the guard, the configured one in it): a fresh
   scaler per optimizer, as apex's initialize made a fresh loss scaler.  An optimizer made before
   the loop keeps it refused: the loop would make a new scaler for the same optimizer.
"""
from test_round17_shapes import run, write

DICE = '''\
import torch
from apex import amp


def main(model, optimizer, loader, do_backprop=True):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    out = []
    for x, y in loader:
        logits = model(x)
        dice = (-(logits * y).sum() / (logits + y).sum()).mean()
        total_loss = 0.5 * dice
        if do_backprop:
            with amp.scale_loss(total_loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        out.append(total_loss.detach().cpu().numpy())
    return out
'''


def test_bfloat16_gives_a_backwarded_loss_a_float_before_numpy(tmp_path):
    write(tmp_path, {"train.py": DICE})
    run(tmp_path, "--write", "-q", "--dtype", "bfloat16")
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text and "dtype=torch.bfloat16" in text, text
    assert "out.append(total_loss.detach().cpu().float().numpy())" in text, text
    # idempotent: a second run changes nothing
    before = text
    run(tmp_path, "--write", "-q", "--dtype", "bfloat16")
    assert (tmp_path / "train.py").read_text() == before


def test_bfloat16_still_refuses_an_output_never_backwarded(tmp_path):
    for src in (DICE.replace("out.append(total_loss.", "out.append(logits."),
                # reassigned after the backward: no longer the loss that was backwarded
                DICE.replace("        out.append(total_loss.", "        total_loss = logits\n        out.append(total_loss.")):
        write(tmp_path, {"train.py": src})
        out = run(tmp_path, "--dtype", "bfloat16")
        assert "hands the forward's output to numpy" in out.output, out.output
        assert "would be rewritten" not in out.output, out.output


def test_float16_leaves_the_numpy_call_as_it_is(tmp_path):
    write(tmp_path, {"train.py": DICE})
    run(tmp_path, "--write", "-q")
    text = (tmp_path / "train.py").read_text()
    assert "out.append(total_loss.detach().cpu().numpy())" in text and "scaler.scale(total_loss)" in text, text


EVAL = '''\
import numpy as np
import torch
from apex import amp
from torch.nn import CrossEntropyLoss


def main(model, optimizer, loader, num_labels):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    loss_fct = CrossEntropyLoss()
    preds = []
    for x, label_ids in loader:
        logits = model(x)
        label_ids = label_ids.cuda()
        loss = loss_fct(logits.view(-1, num_labels), label_ids.view(-1))
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        preds.append(logits.detach().cpu().numpy())
        KEEP
    return np.argmax(np.concatenate(preds), axis=1)
'''


def test_bfloat16_gives_a_loss_input_a_float_before_numpy(tmp_path):
    write(tmp_path, {"train.py": EVAL.replace("KEEP", "pass")})
    run(tmp_path, "--write", "-q", "--dtype", "bfloat16")
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text and "dtype=torch.bfloat16" in text, text
    assert "preds.append(logits.detach().cpu().float().numpy())" in text, text


def test_bfloat16_refuses_a_loss_target_handed_to_numpy(tmp_path):
    """The target of a loss is often an integer tensor: `.float()` there would change the array."""
    write(tmp_path, {"train.py": EVAL.replace("KEEP", "labels = label_ids.cpu().numpy()")})
    out = run(tmp_path, "--dtype", "bfloat16")
    assert "`label_ids.cpu().numpy()` at line 20 hands the forward's output to numpy" in out.output, out.output
    assert "would be rewritten" not in out.output, out.output


def test_bfloat16_passes_an_output_computed_again_outside_the_region(tmp_path):
    """kg-bert: the evaluation after training reloads the model and computes `logits` again, in
    float32, under `with torch.no_grad():`: its `.numpy()` reads that value, not the region's."""
    src = EVAL.replace("        preds.append(logits.detach().cpu().numpy())\n", "").replace(
        "KEEP", "pass").replace("    return np.argmax", """    model = reload()
    for x, _ in loader:
        with torch.no_grad():
            logits = model(x)
        if preds:
            preds.append(logits.detach().cpu().numpy())
    return np.argmax""")
    write(tmp_path, {"train.py": src})
    run(tmp_path, "--write", "-q", "--dtype", "bfloat16")
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text and "preds.append(logits.detach().cpu().numpy())" in text, text
    # computed from the region's output (relu keeps bfloat16, and an integer tensor's dtype too):
    # still the region's, refused (sigmoid, always floating, gets a `.float()`: test_round41_shapes)
    write(tmp_path, {"train.py": EVAL.replace("KEEP", "logits = torch.relu(logits)\n        "
                                               "probs = logits.cpu().numpy()")})
    out = run(tmp_path, "--dtype", "bfloat16")
    assert "`logits.cpu().numpy()` at line 21 hands the forward's output to numpy" in out.output, out.output
    # where it may not be computed again (one branch), it stays the region's: refused
    write(tmp_path, {"train.py": src.replace("        with torch.no_grad():\n            logits = model(x)",
                                              "        if x is None:\n            logits = model(x)")})
    out = run(tmp_path, "--dtype", "bfloat16")
    assert "hands the forward's output to numpy" in out.output, out.output


FOLDS = '''\
import torch
from apex import amp


def fit(model, optimizer, loader):
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()


def main(config, folds, make_model, loader):
    for fold in folds:
        model = make_model().cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if config.get("fp_16"):
            opt_level = config.get("opt_level", "O1")
            model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level)
        fit(model, optimizer, loader)
'''


def test_options_computed_under_the_guard_in_a_fold_loop(tmp_path):
    write(tmp_path, {"train.py": FOLDS})
    run(tmp_path, "--write", "-q")
    text = (tmp_path / "train.py").read_text()
    assert "apex" not in text, text
    assert '''        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cuda", enabled=False)
        if config.get("fp_16"):
            opt_level = config.get("opt_level", "O1")
            scaler = torch.amp.GradScaler("cuda", enabled=opt_level != "O0")
        fit(model, optimizer, loader, scaler=scaler)
''' in text, text
    assert "scaler.scale(loss).backward()" in text and "enabled=scaler.is_enabled()" in text, text


def test_options_computed_under_the_guard_in_a_loop_without_the_optimizer_refuse(tmp_path):
    src = FOLDS.replace("""    for fold in folds:
        model = make_model().cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
""", """    model = make_model().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for fold in folds:
""")
    write(tmp_path, {"train.py": src})
    out = run(tmp_path)
    assert "runs inside a `for` loop" in out.output and "make the scaler by hand" in out.output, out.output
    assert "would be rewritten" not in out.output, out.output
