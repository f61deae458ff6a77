"""The clip that a migration leaves on every micro-batch of an accumulation
(`_clip_scaled_grad_norm_`, written into the migrated module): on gradients that GradScaler has
not unscaled yet it clips exactly what apex clipped (apex unscaled after every backward), returns
the same norm, and a disabled scaler makes it `clip_grad_norm_`."""
import copy

import pytest
import torch

from ampfix.migration.seeds import CLIP_SCALED_HELPER

NS: dict = {"torch": torch}
exec(CLIP_SCALED_HELPER, NS)
clip_scaled = NS["_clip_scaled_grad_norm_"]
# what a migration writes for torch below 1.9 (no torch.linalg.vector_norm there)
OLD: dict = {"torch": torch}
exec(CLIP_SCALED_HELPER.replace("torch.linalg.vector_norm(", "torch.norm("), OLD)


def batches(n=4):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 16, generator=g) * 3, torch.randn(8, 1, generator=g) * 3) for _ in range(n)]


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


@pytest.mark.parametrize("helper", [clip_scaled, OLD["_clip_scaled_grad_norm_"]], ids=["torch>=1.9", "torch<1.9"])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_same_gradients_and_norms_as_clipping_unscaled_partial_sums(norm_type, helper):
    ref, mig = model(), model()
    mig.load_state_dict(copy.deepcopy(ref.state_dict()))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    ref_norms, mig_norms = [], []
    for x, y in batches():
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_norms.append(torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5, norm_type=norm_type))
        scaler.scale(torch.nn.functional.mse_loss(mig(x), y)).backward()
        mig_norms.append(helper(scaler, mig.parameters(), 0.5, norm_type=norm_type))
    assert torch.allclose(torch.stack(ref_norms), torch.stack(mig_norms), rtol=1e-5)
    assert any(n > 0.5 for n in ref_norms)  # the clip did cut
    opt = torch.optim.SGD(mig.parameters(), lr=0.1)
    scaler.unscale_(opt)
    for a, b in zip(ref.parameters(), mig.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-7)


def test_a_disabled_scaler_is_clip_grad_norm():
    a, b = model(), model()
    x, y = batches(1)[0]
    for m in (a, b):
        torch.nn.functional.mse_loss(m(x), y).backward()
    n1 = torch.nn.utils.clip_grad_norm_(a.parameters(), 0.1)
    n2 = clip_scaled(torch.amp.GradScaler("cpu", enabled=False), b.parameters(), 0.1)
    assert torch.allclose(n1, n2)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p.grad, q.grad)


def test_overflowed_gradients_stay_non_finite_so_the_step_is_skipped():
    m = model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    x, y = batches(1)[0]
    scaler.scale(torch.nn.functional.mse_loss(m(x), y)).backward()
    next(m.parameters()).grad[0, 0] = float("inf")
    clip_scaled(scaler, m.parameters(), 1.0)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    before = [p.detach().clone() for p in m.parameters()]
    scaler.step(opt)
    scaler.update()
    assert all(torch.equal(p, q) for p, q in zip(before, m.parameters()))
    assert scaler.get_scale() < 2.0 ** 10


def test_no_gradients():
    assert float(clip_scaled(torch.amp.GradScaler("cpu"), model().parameters(), 1.0)) == 0.0


def test_old_torch_gets_torch_norm(tmp_path):
    from ampfix.engine.check import check_source
    from ampfix.model.settings import Settings
    from ampfix.registry import all_rules
    from pathlib import Path

    before = (Path(__file__).resolve().parents[1] / "fixtures/apex/before/bert_finetune.py").read_bytes()
    import dataclasses
    old = check_source(before, "x.py", all_rules(), dataclasses.replace(Settings(), torch_version=(1, 8)), fix="safe")
    assert "torch.norm(g, norm_type)" in old.fixed and "linalg" not in old.fixed
    assert "torch.cuda.amp.GradScaler(" in old.fixed


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_same_clip_and_no_host_sync():
    """On CUDA: the same gradients as clipping the unscaled partial sums, and the helper runs
    under torch.cuda.set_sync_debug_mode("error") (any device-to-host wait would raise)."""
    ref, mig = model().cuda(), model().cuda()
    mig.load_state_dict(copy.deepcopy(ref.state_dict()))
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 12)
    for x, y in batches():
        x, y = x.cuda(), y.cuda()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        scaler.scale(torch.nn.functional.mse_loss(mig(x), y)).backward()
        torch.cuda.set_sync_debug_mode("error")
        try:
            clip_scaled(scaler, mig.parameters(), 0.5)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    opt = torch.optim.SGD(mig.parameters(), lr=0.1)
    scaler.unscale_(opt)
    for a, b in zip(ref.parameters(), mig.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-6)
