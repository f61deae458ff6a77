"""Twenty-ninth round: what the public code of this round showed (the runnable golden is
fixtures/projects/inline_eval; these are the edges).

1. An evaluation written in the training function itself, after ``amp.initialize``
   (``model.eval()``, then ``with torch.no_grad(): for x, y in test_loader: out = model(x)``):
   apex ran it in half precision (O1 patched torch for the whole process), the migrated code ran
   it in float32.  Its forward and the loss computed from it run under autocast now; a forward in
   a loop that trains, or one that is neither under ``no_grad`` nor after ``model.eval()``, does
   not; with bfloat16 an evaluation that hands its tensors to numpy stays as it is.
2. apex's DDP called with an argument torch's has no use for, computed by a project function
   imported for it alone (``gradient_predivide_factor=get_world_size()``): the argument went, the
   import stayed unread.  It goes, unless another module imports that name from this one.
"""
from test_round17_shapes import run, write

INLINE = '''\
import torch
from apex import amp


def run(model, optimizer, train_loader, test_loader, criterion, epochs):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for epoch in range(epochs):
        model.train()
        for x, y in train_loader:
            out = model(x)
            loss = criterion(out, y)
            optimizer.zero_grad()
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
        model.eval()
        total = 0.0
        with torch.no_grad():
            for x, y in test_loader:
                out = model(x)
                test_loss = criterion(out, y)
                total += test_loss.item()
                preds = out.argmax(1).cpu().numpy()
        print(epoch, total, preds)
'''


def _migrated(tmp_path, text, *extra):
    write(tmp_path, {"train.py": text})
    out = run(tmp_path, "--write", "-q", *extra)
    assert out.exit_code == 0, out.output
    return (tmp_path / "train.py").read_text()


def test_an_inline_evaluation_runs_under_autocast_with_its_loss(tmp_path):
    text = _migrated(tmp_path, INLINE)
    compile(text, "train.py", "exec")
    # the evaluation's forward and the loss computed from its output, not the bookkeeping
    assert '''            for x, y in test_loader:
                with torch.autocast("cuda", dtype=torch.float16):
                    out = model(x)
                    test_loss = criterion(out, y)
                total += test_loss.item()''' in text, text
    assert text.count("torch.autocast(") == 2, text


def test_a_forward_in_a_loop_that_steps_is_not_an_evaluation(tmp_path):
    """A forward under no_grad after the step in the training loop (a check of the output) is not
    wrapped as an evaluation: the loop trains."""
    src = INLINE.replace('''            optimizer.step()
''', '''            optimizer.step()
            with torch.no_grad():
                ref = model(x)
            checks.append(ref.sum())
''')
    text = _migrated(tmp_path, src)
    assert "            with torch.no_grad():\n                ref = model(x)\n" in text, text


def test_a_forward_neither_quiet_nor_after_eval_is_left(tmp_path):
    src = INLINE.replace("        model.eval()\n", "").replace(
        "        with torch.no_grad():\n            for x, y in test_loader:", "        if True:\n            for x, y in test_loader:")
    text = _migrated(tmp_path, src)
    assert text.count("torch.autocast(") == 1, text


def test_after_model_train_again_the_forward_is_not_an_evaluation(tmp_path):
    src = INLINE.replace("        with torch.no_grad():\n            for x, y in test_loader:",
                         "        model.train()\n        if True:\n            for x, y in test_loader:")
    text = _migrated(tmp_path, src)
    assert text.count("torch.autocast(") == 1, text


def test_bfloat16_leaves_an_evaluation_that_hands_tensors_to_numpy(tmp_path):
    text = _migrated(tmp_path, INLINE, "--dtype", "bfloat16")
    assert text.count("torch.autocast(") == 1, text
    no_numpy = INLINE.replace("preds = out.argmax(1).cpu().numpy()", "preds = out.argmax(1).tolist()")
    text = _migrated(tmp_path, no_numpy, "--dtype", "bfloat16")
    assert text.count("torch.autocast(") == 2, text


def test_an_evaluation_before_the_initialize_is_left(tmp_path):
    src = INLINE.replace('''    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
''', '''    model.eval()
    with torch.no_grad():
        first = model(next(iter(test_loader))[0])
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
''')
    text = _migrated(tmp_path, src)
    assert "        first = model(" in text, text


DDP_TRAIN = '''\
import torch
from apex import amp
from apex.parallel import DistributedDataParallel as DDP

from utils.dist import get_world_size, is_main


def main(model, optimizer, loader):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    model = DDP(model, message_size=250000000, gradient_predivide_factor=get_world_size())
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
    if is_main():
        torch.save(model.state_dict(), "model.pt")
'''

DIST = '''\
def get_world_size():
    return 1


def is_main():
    return True
'''


def test_an_import_read_only_by_a_dropped_ddp_argument_goes(tmp_path):
    write(tmp_path, {"train.py": DDP_TRAIN, "utils/__init__.py": "", "utils/dist.py": DIST})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "from utils.dist import is_main\n" in text, text
    assert "get_world_size" not in text and "apex" not in text, text
    assert "bucket_cap_mb=953.67431640625" in text, text
    compile(text, "train.py", "exec")


def test_an_import_alone_of_a_module_with_effects_stays(tmp_path):
    """Dropping `from utils.dist import get_world_size` would skip importing utils.dist, whose top
    level does something: the import stays (the argument still goes)."""
    train = DDP_TRAIN.replace("from utils.dist import get_world_size, is_main\n",
                              "from utils.dist import get_world_size\nfrom utils.dist import is_main\n")
    write(tmp_path, {"train.py": train, "utils/__init__.py": "",
                     "utils/dist.py": DIST + "\nprint('distributed helpers loaded')\n"})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "from utils.dist import get_world_size\n" in text and "gradient_predivide_factor" not in text, text
    write(tmp_path, {"train.py": train, "utils/dist.py": DIST})
    out = run(tmp_path, "--write", "-q")
    assert "get_world_size" not in (tmp_path / "train.py").read_text()


def test_an_import_another_module_takes_from_this_one_stays(tmp_path):
    write(tmp_path, {"train.py": DDP_TRAIN, "utils/__init__.py": "", "utils/dist.py": DIST,
                     "launch.py": "from train import get_world_size\n\nprint(get_world_size())\n"})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "from utils.dist import get_world_size, is_main\n" in text, text
    assert "gradient_predivide_factor" not in text, text


VALIDATE = '''\
import torch
from apex import amp


def validate(model, loader):
    model.eval()
    preds = []
    with torch.no_grad():
        for x, _ in loader:
            preds.append(model(x).cpu().numpy())
    return preds


def main(model, optimizer, loader, criterion):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in loader:
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
    preds = validate(model, loader)
    return preds
'''


def test_bfloat16_leaves_an_evaluation_function_that_hands_tensors_to_numpy(tmp_path):
    text = _migrated(tmp_path, VALIDATE)
    assert "        preds = validate(model, loader)" in text and text.count("torch.autocast(") == 2, text
    text = _migrated(tmp_path, VALIDATE, "--dtype", "bfloat16")
    assert "    preds = validate(model, loader)" in text and text.count("torch.autocast(") == 1, text


NUMPY_TRAIN = '''\
import torch
from apex import amp


def main(model, optimizer, loader, criterion):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    kept, losses = [], []
    for x, y in loader:
        logits = model(x)
        loss = criterion(logits, y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        losses.append(loss.detach().cpu().numpy())
        kept.append(KEEP)
    return kept, losses
'''


def test_bfloat16_refuses_an_output_handed_to_numpy(tmp_path):
    """numpy has no bfloat16: the migration would fail at `.numpy()` on the forward's output (an
    output nothing proves floating: the logits a loss takes get a `.float()`, tests/test_round40)."""
    src = NUMPY_TRAIN.replace("logits = model(x)", "logits, aux = model(x)").replace(
        "KEEP", "aux.detach().cpu().numpy()")
    write(tmp_path, {"train.py": src})
    out = run(tmp_path, "--dtype", "bfloat16")
    assert "would be rewritten" not in out.output, out.output
    assert "`aux.detach().cpu().numpy()` at line 16 hands the forward's output to numpy" in out.output, out.output
    run(tmp_path, "--write", "-q")  # float16: numpy has float16
    assert "scaler.scale(loss)" in (tmp_path / "train.py").read_text()


def test_bfloat16_passes_an_output_of_another_dtype_and_the_loss(tmp_path):
    """An argmax makes integers, a `.float()` float32; the loss autocast computes in float32."""
    for keep in ("logits.argmax(1).cpu().numpy()", "logits.detach().float().cpu().numpy()"):
        write(tmp_path, {"train.py": NUMPY_TRAIN.replace("KEEP", keep)})
        run(tmp_path, "--write", "-q", "--dtype", "bfloat16")
        text = (tmp_path / "train.py").read_text()
        assert "dtype=torch.bfloat16" in text and "apex" not in text, text


def test_an_inline_evaluation_that_is_a_whole_no_grad_body_joins_its_with(tmp_path):
    src = INLINE.replace('''        with torch.no_grad():
            for x, y in test_loader:
                out = model(x)
                test_loss = criterion(out, y)
                total += test_loss.item()
                preds = out.argmax(1).cpu().numpy()''', '''        for x, y in test_loader:
            with torch.no_grad():
                out = model(x)
            total += criterion(out, y).item()
            preds = out.argmax(1).cpu().numpy()''')
    text = _migrated(tmp_path, src)
    assert '''            with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
                out = model(x)
''' in text, text
