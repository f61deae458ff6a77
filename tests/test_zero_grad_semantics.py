"""Why AMP301's fix is unsafe: an optimizer skips a parameter whose gradient is None but steps one
whose gradient is zero, so with momentum or weight decay the two spellings train differently."""
import pytest

from ampfix.api import fix_code

torch = pytest.importorskip("torch")


def _train(set_to_none: bool):
    torch.manual_seed(0)
    used = torch.nn.Parameter(torch.tensor([1.0, -1.0]))
    sometimes = torch.nn.Parameter(torch.tensor([0.5, 0.25]))
    opt = torch.optim.SGD([used, sometimes], lr=0.1, momentum=0.9, weight_decay=0.1)
    for step in range(3):
        opt.zero_grad(set_to_none=set_to_none)
        loss = (used ** 2).sum() + ((sometimes ** 2).sum() if step == 0 else 0.0)
        loss.backward()
        opt.step()
    return sometimes.detach().clone()


def test_zeros_and_none_train_differently():
    assert not torch.allclose(_train(False), _train(True))


def test_the_fix_is_not_applied_as_safe():
    text = "optimizer.zero_grad(set_to_none=False)\n"
    assert fix_code(text, "train.py") == text
    assert fix_code(text, "train.py", unsafe=True) == "optimizer.zero_grad()\n"
