"""Forty-third round: what the public code of this round showed.

1. An optional scaler (some callers of the function that scales the loss have none to give, and
   those never reach the scaled backward: RSNA's ``run_nn(cfg, mode, ..., optim=None, apex=None)``
   called for training with apex and for validation without).  It used to become ``scaler is not
   None and <the test above the backward>``: a caller from outside the project that trains with
   the function and passes no scaler (apex left off) then skipped the backward and the step
   silently where the original trained in float32.  Now the function makes a disabled scaler when
   none is passed: that caller trains in float32 as before, and no presence test is added.
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
