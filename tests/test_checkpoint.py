"""convert-checkpoint: each old format built exactly as apex's source writes it (without apex:
its classes are recreated under their module names), converted, and loaded into the migrated
program's objects (a float32 model, the plain optimizer, a GradScaler)."""
import subprocess
import sys
import types

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.serialization, "safe_globals"):  # pragma: no cover
    pytest.skip("needs torch >= 2.5", allow_module_level=True)

from ampfix.migration.checkpoint import ConvertError, convert_file  # noqa: E402


def fake_apex_module():
    """apex.fp16_utils.loss_scaler with its two classes, as pickle will name them."""
    mods = {}
    for name in ("apex", "apex.fp16_utils", "apex.fp16_utils.loss_scaler"):
        mods[name] = types.ModuleType(name)

    class LossScaler:
        def __init__(self, scale=1):
            self.cur_scale = scale

    class DynamicLossScaler:
        def __init__(self, init_scale=2 ** 32, scale_factor=2.0, scale_window=1000):
            self.cur_scale = init_scale
            self.cur_iter = 0
            self.last_overflow_iter = -1
            self.scale_factor = scale_factor
            self.scale_window = scale_window

    for cls in (LossScaler, DynamicLossScaler):
        cls.__module__ = "apex.fp16_utils.loss_scaler"
        cls.__qualname__ = cls.__name__
        setattr(mods["apex.fp16_utils.loss_scaler"], cls.__name__, cls)
    return mods, LossScaler, DynamicLossScaler


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def test_amp_state_becomes_gradscaler_state(tmp_path):
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    old = {"model": m.state_dict(), "optimizer": opt.state_dict(), "epoch": 3,
           "amp": {"loss_scaler0": {"loss_scale": 1024.0, "unskipped": 17}}}  # apex.amp.state_dict()
    torch.save(old, tmp_path / "old.pt")
    report = convert_file(str(tmp_path / "old.pt"), str(tmp_path / "new.pt"))
    assert any("GradScaler state" in line for line in report)
    new = torch.load(tmp_path / "new.pt", weights_only=True)
    scaler = torch.amp.GradScaler("cpu")  # enabled: it reads the state
    scaler.load_state_dict(new["amp"])
    assert scaler.get_scale() == 1024.0 and scaler._init_growth_tracker == 17
    assert new["epoch"] == 3


def test_fp16_utils_optimizer_with_masters(tmp_path, monkeypatch):
    mods, LossScaler, DynamicLossScaler = fake_apex_module()
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    m = model()
    masters = [p.detach().clone().float() + 0.001 for p in m.parameters()]  # fp32 masters differ from fp16
    inner = torch.optim.SGD(masters, lr=0.1, momentum=0.9)
    for p in masters:
        p.grad = torch.ones_like(p)
    inner.step()
    half = m.half()
    ls = DynamicLossScaler(init_scale=2 ** 16)
    ls.cur_iter, ls.last_overflow_iter = 40, 9
    fp16_state = {"loss_scaler": ls, "dynamic_loss_scale": True, "overflow": False,
                  "first_closure_call_this_step": True, "optimizer_state_dict": inner.state_dict(),
                  "fp32_from_fp16": [masters]}  # FP16_Optimizer.state_dict(), apex/fp16_utils
    torch.save({"model": half.state_dict(), "optimizer": fp16_state}, tmp_path / "old.pt")
    for name in mods:  # the converter runs where apex is not installed
        monkeypatch.delitem(sys.modules, name)
    report = convert_file(str(tmp_path / "old.pt"), str(tmp_path / "new.pt"))
    new = torch.load(tmp_path / "new.pt", weights_only=True)
    fresh = model()  # the migrated program: float32 model, plain optimizer, a GradScaler
    fresh.load_state_dict(new["model"])
    for p, mst in zip(fresh.parameters(), masters):
        assert p.dtype == torch.float32 and torch.equal(p.detach(), mst)  # the masters, not the fp16 copies
    opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    opt.load_state_dict(new["optimizer"])
    assert all("momentum_buffer" in s for s in opt.state.values())
    scaler = torch.amp.GradScaler("cpu")
    scaler.load_state_dict(new["scaler"])
    assert scaler.get_scale() == 2 ** 16 and scaler._init_growth_tracker == 30
    assert any("master copies" in line for line in report)


def test_flat_bert_optimizer_one_group(tmp_path):
    m = model()
    params = list(m.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params]).float() + 0.5
    flat.requires_grad_(True)
    inner = torch.optim.Adam([flat], lr=1e-3)
    flat.grad = torch.ones_like(flat)
    inner.step()
    old_state = {"dynamic_loss_scale": True, "cur_scale": 256.0, "cur_iter": 5, "last_overflow_iter": 2,
                 "scale_factor": 2.0, "scale_window": 1000, "optimizer_state_dict": inner.state_dict(),
                 "fp32_groups_flat": [flat.detach()]}  # apex/optimizers/fp16_optimizer.py, 2019
    torch.save({"model": m.half().state_dict(), "optimizer": old_state}, tmp_path / "old.pt")
    convert_file(str(tmp_path / "old.pt"), str(tmp_path / "new.pt"))
    new = torch.load(tmp_path / "new.pt", weights_only=True)
    fresh = model()
    fresh.load_state_dict(new["model"])
    off = 0
    for p in fresh.parameters():
        n = p.numel()
        assert torch.equal(p.detach().reshape(-1), flat.detach()[off:off + n])
        off += n
    opt = torch.optim.Adam(fresh.parameters(), lr=1e-3)
    opt.load_state_dict(new["optimizer"])
    assert len(opt.state) == len(list(fresh.parameters()))
    fresh(torch.randn(3, 4)).sum().backward()
    opt.step()  # the unflattened moments have the parameters' shapes


def test_refuses_unknown_pickled_objects(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"x": Evil(), "amp": {"loss_scaler0": {"loss_scale": 1.0, "unskipped": 0}}}, tmp_path / "old.pt")
    with pytest.raises(ConvertError, match="builtins.print|print"):
        convert_file(str(tmp_path / "old.pt"), str(tmp_path / "new.pt"))
    assert not (tmp_path / "new.pt").exists()


def test_cli(tmp_path):
    torch.save({"amp": {"loss_scaler0": {"loss_scale": 8.0, "unskipped": 1}}}, tmp_path / "old.pt")
    out = subprocess.run([sys.executable, "-m", "ampfix", "convert-checkpoint", str(tmp_path / "old.pt"),
                          str(tmp_path / "new.pt")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "GradScaler state" in out.stdout
    same = subprocess.run([sys.executable, "-m", "ampfix", "convert-checkpoint", str(tmp_path / "old.pt"),
                           str(tmp_path / "old.pt")], capture_output=True, text=True)
    assert same.returncode == 2 and "must differ" in same.stderr
