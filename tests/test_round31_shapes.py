"""Thirty-first round: what this round's holdout batch showed, read as a reviewer reads a diff.

1. The model bound into a ``functools.partial`` (``embed = partial(embed_all, model=model,
   loader=val_loader)``) and the partial handed to an evaluation (``recall(embed, k)``) or called
   (``x = embed()``): under apex's O2 the model was float16, so that evaluation ran in half
   precision; after the migration it ran in float32 (correct, but as slow as before apex, and
   not what was measured before).  The call runs under autocast, as a direct
   ``evaluate(model, ...)`` does.  A partial handed to a function that stores it, or whose
   function trains, is left as it is.
2. A trainer whose models are set with ``setattr(self, name, ...)`` and fetched in each step
   (``model = getattr(self, name); model.train()``, then the batch is built, masked and moved,
   then the forward and the loss go to ``self.optimize(loss)``): the autocast region in the step
   started at ``model.train()``'s next statement, the batch generation, because the mode switch
   counted as the first use of the model.  It starts at the forward pass now; the batch
   preparation stays outside, as a person would write it.
3. The clip of ``amp.master_params(self.optimizers[name])`` in a loop over the optimizers' names,
   in the apex arm of an ``if`` whose fp32 arm clips ``self.parameters[name]`` in the same loop:
   the migrated clip walked the optimizer's ``param_groups`` though the code names those
   parameters; it reuses the fp32 arm's words (only when they read nothing the apex clip does
   not: the loop variable, ``self``).
4. apex tried first, native AMP in the handler (``try: model, optim = amp.initialize(...) except:
   scaler = torch.cuda.amp.GradScaler()``), the step's apex branch in the ``else`` of ``if scaler
   is not None:``: refused ("runs inside a `try`"), seven modules of one repository of the
   round31b batch.  Once apex is gone the handler is what runs: the try becomes its body and the
   apex branch goes (it ran only where the try's body had run, and there the scaler exists now).
   Where another call hands the step something else for ``scaler``, or an apex.amp use elsewhere
   outlives the fallbacks, nothing of it moves: apex's state is the process's.
"""
from pathlib import Path

from test_round17_shapes import run, write

HELPERS = '''\
import torch


def embed_all(model, loader, flip=False):
    model.eval()
    out = []
    with torch.no_grad():
        for x in loader:
            out.append(model(x.flip(-1) if flip else x))
    model.train()
    return torch.cat(out)


def recall(embed, k):
    a = embed()
    b = embed(flip=True)
    return (a @ b.t()).topk(k).indices


def keep(embed, store):
    store.append(embed)
    return len(store)
'''

TRAIN = '''\
from functools import partial

import torch
from apex import amp

from helpers import embed_all, keep, recall


def train(model, optimizer, loader, val_loader, epochs):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
    embed = partial(embed_all, model=model, loader=val_loader)
    store = []
    for epoch in range(epochs):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
        top = recall(embed, 5)
        print(epoch, top.shape)
    n = keep(embed, store)
    x = embed()
    torch.save(x.float().cpu(), "emb.pt")
    return n
'''


def _migrated(tmp_path, *extra):
    write(tmp_path, {"helpers.py": HELPERS, "train.py": TRAIN})
    out = run(tmp_path, "--write", "-q", *extra)
    assert out.exit_code == 0, out.output
    return (tmp_path / "train.py").read_text(), (tmp_path / "helpers.py").read_text()


def test_a_partial_holding_the_model_evaluates_under_autocast(tmp_path):
    text, helpers = _migrated(tmp_path)
    compile(text, "train.py", "exec")
    assert "amp.initialize" not in text and "apex" not in text, text
    # handed to a function that only calls it, and called directly: both ran in half precision
    assert ('        with torch.autocast("cuda", dtype=torch.float16):\n'
            '            top = recall(embed, 5)\n') in text, text
    assert ('    with torch.autocast("cuda", dtype=torch.float16):\n'
            '        x = embed()\n') in text, text
    # handed to a function that stores it: nothing to wrap, and the helpers stay as written
    assert "    n = keep(embed, store)\n" in text, text
    assert helpers == HELPERS


def test_a_partial_evaluation_with_bfloat16(tmp_path):
    text, _ = _migrated(tmp_path, "--dtype", "bfloat16")
    assert ('        with torch.autocast("cuda", dtype=torch.bfloat16):\n'
            '            top = recall(embed, 5)\n') in text, text
    assert "GradScaler" not in text, text


def test_a_partial_of_a_function_that_trains_is_not_an_evaluation(tmp_path):
    trains = TRAIN.replace("embed = partial(embed_all, model=model, loader=val_loader)",
                           "embed = partial(step_all, model=model, loader=val_loader)").replace(
        "from helpers import embed_all, keep, recall", "from helpers import keep, recall, step_all")
    helpers = HELPERS + '''

def step_all(model, loader, flip=False):
    for x in loader:
        model(x).sum().backward()
    return x
'''
    write(tmp_path, {"helpers.py": helpers, "train.py": trains})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "train.py").read_text()
    assert "        top = recall(embed, 5)\n" in text and "    x = embed()\n" in text, text
    assert text.count("torch.autocast(") == 1, text


def test_idempotent(tmp_path):
    once, _ = _migrated(tmp_path)
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    assert (tmp_path / "train.py").read_text() == once


STEPS = '''\
import torch
from apex import amp


class Trainer:
    def __init__(self, names, models, optimizer, fp16):
        for name, m in zip(names, models):
            setattr(self, name, m)
        self.optimizer = optimizer
        self.fp16 = fp16
        if fp16:
            ms, self.optimizer = amp.initialize([getattr(self, n) for n in names], optimizer, opt_level="O1")
            for name, m in zip(names, ms):
                setattr(self, name, m)

    def optimize(self, loss):
        self.optimizer.zero_grad()
        if self.fp16:
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        self.optimizer.step()

    def lm_step(self, name, batch, lengths):
        model = getattr(self, name)
        model.train()
        x = batch[:-1].clone()
        mask = torch.arange(lengths.max())[:, None] < lengths[None] - 1
        y = batch[1:].masked_select(mask[:-1])
        x, y = x.cuda(), y.cuda()
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out[mask[:-1]], y)
        self.optimize(loss)
        return loss.detach()
'''


def test_a_region_in_a_step_starts_at_the_forward_not_at_the_mode_switch(tmp_path):
    write(tmp_path, {"trainer.py": STEPS})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "trainer.py").read_text()
    compile(text, "trainer.py", "exec")
    assert "apex" not in text, text
    assert ("        x, y = x.cuda(), y.cuda()\n"
            "        with torch.autocast(\"cuda\", dtype=torch.float16, enabled=self.scaler.is_enabled()):\n"
            "            out = model(x)\n"
            "            loss = torch.nn.functional.cross_entropy(out[mask[:-1]], y)\n"
            "        self.optimize(loss)\n") in text, text
    assert "        model.train()\n        x = batch[:-1].clone()\n" in text, text


TWO_ARMS = '''\
import torch
from apex import amp
from torch.nn.utils import clip_grad_norm_


class Trainer:
    def __init__(self, modules, lr, fp16, clip):
        self.modules = modules
        self.parameters = {k: list(m.parameters()) for k, m in modules.items()}
        self.optimizers = {k: torch.optim.Adam(p, lr=lr) for k, p in self.parameters.items()}
        self.fp16 = fp16
        self.clip = clip
        if fp16:
            names = list(modules)
            ms, opts = amp.initialize([modules[k] for k in names], [self.optimizers[k] for k in names],
                                      opt_level="O1")
            self.modules = dict(zip(names, ms))
            self.optimizers = dict(zip(names, opts))

    def optimize(self, loss):
        names = list(self.optimizers)
        extra = {k: list(m.parameters()) for k, m in self.modules.items()}
        optimizers = [self.optimizers[k] for k in names]
        for optimizer in optimizers:
            optimizer.zero_grad()
        if not self.fp16:
            loss.backward()
            for name in names:
                clip_grad_norm_(self.parameters[name], self.clip)
                clip_grad_norm_(extra[name], 2 * self.clip)
        else:
            with amp.scale_loss(loss, optimizers) as scaled_loss:
                scaled_loss.backward()
            for name in names:
                clip_grad_norm_(amp.master_params(self.optimizers[name]), self.clip)
                clip_grad_norm_(amp.master_params(self.optimizers[name]), 2 * self.clip)
        for optimizer in optimizers:
            optimizer.step()

    def step(self, x, y):
        enc = self.modules["encoder"]
        enc.train()
        loss = torch.nn.functional.mse_loss(self.modules["decoder"](enc(x)), y)
        self.optimize(loss)
'''


def test_a_master_params_clip_reuses_the_fp32_arms_names(tmp_path):
    write(tmp_path, {"trainer.py": TWO_ARMS})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "trainer.py").read_text()
    compile(text, "trainer.py", "exec")
    assert "master_params" not in text and "apex" not in text, text
    # the fp32 arm names the parameters by what the apex clip reads too: its words are reused
    assert text.count("clip_grad_norm_(self.parameters[name], self.clip)") == 2, text
    # its twin there reads a local the apex clip does not: the optimizer's own groups
    assert text.count("extra[name]") == 1, text
    assert 'self.optimizers[name].param_groups for p in group["params"]' in text, text


FALLBACK = (Path(__file__).resolve().parents[1] / "fixtures" / "projects" / "fallback_try" / "before" /
            "train.py")


def test_a_fallback_try_keeps_its_refusal_where_a_call_passes_something_else(tmp_path):
    before = FALLBACK.read_text()
    other = before.replace("    for epoch in range(args.epochs):",
                           "    train_batch(model, x[:32], y[:32], optim, use_amp=args.amp, scaler=None)\n"
                           "    for epoch in range(args.epochs):")
    assert other != before
    write(tmp_path, {"train.py": other})
    out = run(tmp_path, "--write")
    text = (tmp_path / "train.py").read_text()
    # apex's initialize and scaled backward stay together, with the reason
    assert "amp.initialize(model, optim" in text and "amp.scale_loss(loss, optim)" in text, text
    assert "import apex.amp as amp" in text, text
    assert "runs inside a `try` statement" in out.output, out.output


def test_a_fallback_try_whose_handler_does_more_is_not_one(tmp_path):
    before = FALLBACK.read_text()
    other = before.replace("            scaler = torch.cuda.amp.GradScaler()\n",
                           "            scaler = torch.cuda.amp.GradScaler()\n"
                           "            optim = torch.optim.SGD(model.parameters(), lr=0.1)\n")
    assert other != before
    write(tmp_path, {"train.py": other})
    run(tmp_path, "--write")
    text = (tmp_path / "train.py").read_text()
    assert "amp.initialize(model, optim" in text and "amp.scale_loss(loss, optim)" in text, text


def test_a_fallback_scaler_set_again_after_the_try_is_not_the_handlers(tmp_path):
    before = FALLBACK.read_text()
    other = before.replace("    for epoch in range(args.epochs):",
                           "    if args.epochs > 100:\n        scaler = None\n    for epoch in range(args.epochs):")
    assert other != before
    write(tmp_path, {"train.py": other})
    run(tmp_path, "--write")
    text = (tmp_path / "train.py").read_text()
    assert "amp.initialize(model, optim" in text and "amp.scale_loss(loss, optim)" in text, text
