"""The fused training-step kernels (``ops/csrc/step_ops.cu``) against the reference ops, at the
training step's sizes (many blocks), inside a CUDA graph, and with the float details the reference
contract writes down. GPU only: ``pytest -m cuda``."""

from __future__ import annotations

import pytest
import torch

from nerf_lightning.ops import reference as ref

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():  # pragma: no cover - CPU CI
    pytest.skip("needs an NVIDIA GPU", allow_module_level=True)

from nerf_lightning.ops import cuda as cu  # noqa: E402

DEV = torch.device("cuda")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEV).manual_seed(seed)


def test_sample_points_and_normalize_equal_the_reference_bit_for_bit() -> None:
    g = _gen(0)
    o = torch.randn(5000, 3, device=DEV, generator=g)
    d = torch.nn.functional.normalize(torch.randn(5000, 3, device=DEV, generator=g), dim=-1)
    idx = torch.randint(0, 5000, (300_000,), device=DEV, generator=g)
    ts = torch.rand(300_000, device=DEV, generator=g) * 3
    te = ts + torch.rand(300_000, device=DEV, generator=g) * 0.01
    pos, dirs = cu.sample_points(o, d, idx, ts, te)
    pos_r, dirs_r = ref.sample_points(o, d, idx, ts, te)
    assert torch.equal(pos, pos_r) and torch.equal(dirs, dirs_r)
    lo, size = torch.tensor([-1.5, -1.5, -1.5], device=DEV), torch.tensor([4.0, 4.0, 4.0], device=DEV)
    x, inside = cu.normalize_to_box(pos, lo, size)
    x_r, inside_r = ref.normalize_to_box(pos, lo, size)
    assert torch.equal(x, x_r) and torch.equal(inside, inside_r)
    assert 0.05 < float(inside.float().mean()) < 0.95  # both sides of the box boundary are exercised


@pytest.mark.parametrize("kind", ["huber", "mse"])
@pytest.mark.parametrize("n", [1, 1000, 65536, 300_001])
def test_masked_ray_loss_equals_the_reference(kind: str, n: int) -> None:
    g = _gen(n)
    target = torch.rand(n, 3, device=DEV, generator=g)
    # differences on both sides of the Huber threshold
    pred0 = (target + (torch.rand(n, 3, device=DEV, generator=g) - 0.5) * 0.5).requires_grad_()
    valid = torch.rand(n, device=DEV, generator=g) < 0.8
    valid[0] = True
    out, grads = [], []
    for fn in (cu.masked_ray_loss, ref.masked_ray_loss):
        pred = pred0.detach().clone().requires_grad_()
        loss, per_ray, aux = fn(pred, target, valid, kind, 0.1)
        (loss * 2.5).backward()
        out.append((loss.detach(), per_ray, aux))
        grads.append(pred.grad)
    (lc, pc, ac), (lr, pr, ar) = out
    torch.testing.assert_close(pc, pr, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(lc, lr, rtol=1e-5, atol=1e-8)
    assert float(ac[0]) == float(ar[0]) == float(valid.sum())
    assert float(ac[1]) == pytest.approx(float(ar[1]), rel=1e-5)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-10)
    # the block sums are added in a fixed order: the same inputs give the same bits
    again = cu.masked_ray_loss(pred0.detach(), target, valid, kind, 0.1)
    assert torch.equal(again[0], lc) and torch.equal(again[2], ac)


def _adapt_inputs(n: int, seed: int):
    g = _gen(seed)
    valid = torch.rand(n, device=DEV, generator=g) < 0.7
    marched = torch.randint(0, 64, (n,), device=DEV, generator=g)
    rendered = torch.randint(0, 16, (n,), device=DEV, generator=g) * valid
    aux = torch.stack([valid.sum().double(), torch.tensor(12.5, device=DEV, dtype=torch.float64)])
    return aux, valid, marched, rendered


@pytest.mark.parametrize("n", [64, 65536, 200_000])
@pytest.mark.parametrize("momentum", [0.5, 0.3])
def test_adapt_ray_count_equals_the_reference(n: int, momentum: float) -> None:
    aux, valid, marched, rendered = _adapt_inputs(n, n)
    kw = dict(sample_budget=1 << 18, march_budget=1 << 20, min_rays=64, n_slots=n, momentum=momentum)
    results = []
    for fn in (cu.adapt_ray_count, ref.adapt_ray_count):
        n_active = torch.tensor(4096, device=DEV)
        n_active_f = torch.tensor(4096.0, device=DEV)
        stats = fn(aux, valid, marched, rendered, n_active, n_active_f, torch.tensor(0.8, device=DEV), **kw)
        results.append((stats, n_active, n_active_f))
    (sc, ac, fc), (sr, ar, fr) = results
    assert torch.equal(sc, sr)  # integer sums in float64: exact
    # the reference's float32 operation sequence, rounded the same way
    assert torch.equal(fc, fr) and torch.equal(ac, ar)


def test_step_ops_replay_in_a_cuda_graph() -> None:
    """The grid-wide reductions reset their block counter on every launch: replays stay correct."""
    n = 65536
    aux0, valid, marched, rendered = _adapt_inputs(n, 7)
    pred = torch.rand(n, 3, device=DEV)
    target = torch.rand(n, 3, device=DEV)
    n_active = torch.tensor(4096, device=DEV)
    n_active_f = torch.tensor(4096.0, device=DEV)
    frac = torch.tensor(1.0, device=DEV)
    kw = dict(sample_budget=1 << 18, march_budget=1 << 20, min_rays=64, n_slots=n, momentum=0.5)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        cu.masked_ray_loss(pred, target, valid)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss, per_ray, aux = cu.masked_ray_loss(pred, target, valid)
        stats = cu.adapt_ray_count(aux, valid, marched, rendered, n_active, n_active_f, frac, **kw)
    expected_f = torch.tensor(4096.0, device=DEV)
    expected_n = torch.tensor(4096, device=DEV)
    for i in range(3):
        pred.copy_(torch.rand(n, 3, device=DEV))
        graph.replay()
        rl, rp, ra = ref.masked_ray_loss(pred, target, valid)
        rs = ref.adapt_ray_count(ra, valid, marched, rendered, expected_n, expected_f, frac, **kw)
        torch.testing.assert_close(loss, rl, rtol=1e-5, atol=1e-8)
        torch.testing.assert_close(per_ray, rp, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(stats, rs, rtol=1e-6, atol=0)
        assert int(n_active) == int(expected_n), i


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_density_activation_equals_the_reference(dtype: torch.dtype) -> None:
    g = _gen(3)
    h0 = (torch.randn(70_000, 16, device=DEV, generator=g) * 6).to(dtype)  # logits past the clamp at 15
    inside = torch.rand(70_000, device=DEV, generator=g) < 0.9
    up = torch.rand(70_000, device=DEV, generator=g)
    out, grads = [], []
    for fn in (cu.density_activation, ref.density_activation):
        h = h0.clone().requires_grad_()
        sigma = fn(h, inside, -1.0)
        (sigma * up).sum().backward()
        out.append(sigma.detach())
        grads.append(h.grad)
    assert out[0].dtype == torch.float32 and grads[0].dtype == dtype
    torch.testing.assert_close(out[0], out[1], rtol=2e-6, atol=0)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # one rounding to h's dtype
    torch.testing.assert_close(grads[0].float(), grads[1].float(), rtol=tol, atol=0)
    assert bool((grads[0][:, 1:] == 0).all())
