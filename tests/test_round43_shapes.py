"""Forty-third round: what the public code of this round showed.

1. An optional scaler (some callers of the function that scales the loss have none to give, and
   those never reach the scaled backward: RSNA's ``run_nn(cfg, mode, ..., optim=None, apex=None)``
   called for training with apex and for validation without).  It used to become ``scaler is not
   None and <the test above the backward>``: a caller from outside the project that trains with
   the function and passes no scaler (apex left off) then skipped the backward and the step
   silently where the original trained in float32.  Now the function makes a disabled scaler when
   none is passed: that caller trains in float32 as before, and no presence test is added.
2. A model initialized for inference in a setup function that returns it (DPR's
   ``setup_for_distributed_mode(encoder, None, ...)``, copied by the retrieval projects built on
   it): autocast in the caller went around ``get_model_obj(encoder)`` and ``load_state_dict``
   (no forward) and around building the retriever, but not around ``retriever.encode(...)``,
   where the forward runs: the retriever was bound inside an ``if``, so it was not known to hold
   the model.  Now a function that only returns the model (or the module a wrapper holds) and a
   project class whose ``__init__`` only keeps it run nothing; the object's methods that read
   where it keeps the model run it, its other methods (the index search) do not.
"""
import textwrap
from pathlib import Path

import pytest

from test_round17_shapes import migrated

RUN_NN = textwrap.dedent('''\
    import torch
    from apex import amp


    def main(cfg, model, optim, loader_train, loader_valid, criterion):
        if cfg.apex:
            amp.initialize(model, optim, opt_level="O1")
        for epoch in range(cfg.epochs):
            run_nn("train", model, loader_train, criterion=criterion, optim=optim, apex=cfg.apex)
            with torch.no_grad():
                run_nn("valid", model, loader_valid, criterion=criterion)


    def predict(model, loader):
        with torch.no_grad():
            return run_nn("test", model, loader)


    def run_nn(mode, model, loader, criterion=None, optim=None, apex=None):
        """One pass over the loader."""
        losses = []
        for inputs, targets in loader:
            outputs = model(inputs)
            if criterion is not None:
                loss = criterion(outputs, targets)
                losses.append(loss.detach())
            if mode in ["train"]:
                if apex:
                    with amp.scale_loss(loss, optim) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                optim.step()
                optim.zero_grad()
        return losses


    if __name__ == "__main__":
        predict(torch.nn.Linear(4, 1), [])
''')


def test_an_optional_scaler_defaults_to_a_disabled_one(tmp_path: Path):
    out = migrated(tmp_path, {"main.py": RUN_NN}, "main.py")
    assert "from apex" not in out and "amp.scale_loss" not in out and "amp.initialize" not in out, out
    assert 'def run_nn(mode, model, loader, criterion=None, optim=None, apex=None, *, scaler=None):\n' \
           '    """One pass over the loader."""\n' \
           '    if scaler is None:\n' \
           '        scaler = torch.amp.GradScaler("cuda", enabled=False)\n' in out, out
    # no presence test: the training branch is the original's test, the autocast the scaler's own
    assert "scaler is not None" not in out
    assert '        if mode in ["train"]:\n            scaler.scale(loss).backward()\n' in out
    assert "enabled=scaler.is_enabled()" in out
    assert "            apex=cfg.apex,\n            scaler=scaler,\n        )" in out
    assert 'run_nn("valid", model, loader_valid, criterion=criterion, scaler=scaler)' in out
    assert 'return run_nn("test", model, loader)\n' in out


def test_a_caller_from_outside_that_passes_no_scaler_still_trains(tmp_path: Path):
    """The migrated ``run_nn`` called as another script of the project's users would, with no
    scaler and apex off: it trains in float32 (the weights move), as the original did."""
    torch = pytest.importorskip("torch")
    out = migrated(tmp_path, {"main.py": RUN_NN}, "main.py")
    ns: dict = {}
    exec(compile(out, "main.py", "exec"), ns)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    before = model.weight.detach().clone()
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(3)]
    losses = ns["run_nn"]("train", model, loader, criterion=torch.nn.functional.mse_loss, optim=optim, apex=False)
    assert len(losses) == 3
    assert not torch.equal(before, model.weight.detach()), "the outside caller's training was skipped"
    # the prediction, as in the project: no scaler, no optimizer, nothing stepped
    after = model.weight.detach().clone()
    ns["predict"](model, [(x, y) for x, y in loader])
    assert torch.equal(after, model.weight.detach())


def test_bfloat16_keeps_no_scaler_default(tmp_path: Path):
    out = migrated(tmp_path, {"main.py": RUN_NN}, "main.py", "--dtype", "bfloat16")
    assert "GradScaler" not in out and "from apex" not in out and "amp." not in out, out
    assert "scaler is None" not in out and "use_amp is None" not in out
    assert "*, use_amp=None):" in out and "enabled=bool(use_amp)" in out

MODEL_UTILS = textwrap.dedent('''\
    import torch
    from apex import amp


    def setup(model, optimizer, device, fp16=False, opt_level="O1"):
        model.to(device)
        if fp16:
            model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level)
        return model, optimizer


    def get_model_obj(model):
        return model.module if hasattr(model, "module") else model
''')

RETRIEVE = textwrap.dedent('''\
    import torch

    from model_utils import get_model_obj, setup


    class Retriever:
        def __init__(self, encoder, batch_size):
            self.encoder = encoder
            self.batch_size = batch_size

        def encode(self, xs):
            with torch.no_grad():
                return self.encoder(xs)


    class LocalRetriever(Retriever):
        def __init__(self, encoder, batch_size, index):
            super().__init__(encoder, batch_size)
            self.index = index

        def search(self, q):
            return self.index.search(q)


    class RemoteRetriever(Retriever):
        def __init__(self, encoder, batch_size, url):
            super().__init__(encoder, batch_size)
            self.url = url

        def load_index(self, name):
            self.name = name

        def search(self, q):
            return [self.url, q.shape]


    def main(args, encoder, state, index, queries):
        encoder, _ = setup(encoder, None, args.device, args.fp16)
        encoder.eval()

        model_to_load = get_model_obj(encoder)
        model_to_load.load_state_dict(state)

        if args.remote:
            retriever = RemoteRetriever(encoder, 8, args.url)
        else:
            retriever = LocalRetriever(encoder, 8, index)
        vectors = retriever.encode(queries)
        if args.remote:
            retriever.load_index("dr")
        hits = retriever.search(vectors)
        print(hits)
''')


def test_autocast_goes_where_the_returned_model_runs_and_nowhere_else(tmp_path: Path):
    out = migrated(tmp_path, {"model_utils.py": MODEL_UTILS, "retrieve.py": RETRIEVE}, "retrieve.py")
    region = '    with torch.autocast("cuda", dtype=torch.float16, enabled=bool(args.fp16)):\n'
    assert out.count("torch.autocast(") == 1, out
    assert region + "        vectors = retriever.encode(queries)\n" in out
    # loading the weights, building the retriever and searching its index stay as they were
    for line in ("    model_to_load = get_model_obj(encoder)\n", "    model_to_load.load_state_dict(state)\n",
                 "        retriever = RemoteRetriever(encoder, 8, args.url)\n", "    hits = retriever.search(vectors)\n",
                 '        retriever.load_index("dr")\n'):
        assert line in out, line
    assert "apex" not in (tmp_path / "model_utils.py").read_text()


def test_a_retriever_method_that_reads_the_model_is_covered(tmp_path: Path):
    """The search encodes the query itself: it reads the encoder, so it runs under autocast."""
    src = RETRIEVE.replace("        return self.index.search(q)", "        return self.index.search(self.encoder(q))")
    assert src != RETRIEVE
    out = migrated(tmp_path, {"model_utils.py": MODEL_UTILS, "retrieve.py": src}, "retrieve.py")
    assert "enabled=bool(args.fp16)):\n        vectors = retriever.encode(queries)" in out
    assert "        hits = retriever.search(vectors)\n" in out, out


def test_the_migrated_retrieval_runs(tmp_path: Path):
    torch = pytest.importorskip("torch")
    migrated(tmp_path, {"model_utils.py": MODEL_UTILS, "retrieve.py": RETRIEVE}, "retrieve.py")
    import runpy
    import sys
    import types

    sys.path.insert(0, str(tmp_path))
    try:
        ns = runpy.run_path(str(tmp_path / "retrieve.py"))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("model_utils", None)
    encoder = torch.nn.Linear(4, 2)
    args = types.SimpleNamespace(device="cpu", fp16=False, remote=True, url="u")
    ns["main"](args, encoder, encoder.state_dict(), None, torch.randn(3, 4))


def test_a_base_init_called_by_name_keeps_the_model_too(tmp_path: Path):
    """``Retriever.__init__(self, encoder, batch_size)`` instead of ``super().__init__(...)``: the
    same reading, the same single region."""
    src = RETRIEVE.replace("super().__init__(encoder, batch_size)", "Retriever.__init__(self, encoder, batch_size)")
    assert src.count("Retriever.__init__(self, encoder, batch_size)") == 2
    out = migrated(tmp_path, {"model_utils.py": MODEL_UTILS, "retrieve.py": src}, "retrieve.py")
    assert out.count("torch.autocast(") == 1, out
    assert "enabled=bool(args.fp16)):\n        vectors = retriever.encode(queries)" in out
    assert "    hits = retriever.search(vectors)\n" in out
