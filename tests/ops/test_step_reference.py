"""Reference contracts of the fused training-step ops (``ops/reference``): sample positions,
box normalization, the masked per-ray loss and the adaptive ray count, against numbers worked out
by hand. The CUDA kernels are held to these functions in ``tests/ops/test_cuda_step_ops.py``."""

from __future__ import annotations

import math

import pytest
import torch

from nerf_lightning.ops import reference as ref


def test_sample_points_are_interval_midpoints_along_their_rays() -> None:
    o = torch.tensor([[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]])
    d = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, -1.0]])
    idx = torch.tensor([1, 0, 1])
    ts = torch.tensor([0.5, 1.0, 2.0])
    te = torch.tensor([1.5, 3.0, 2.0])
    pos, dirs = ref.sample_points(o, d, idx, ts, te)
    assert pos.tolist() == [[1.0, 2.0, 2.0], [2.0, 0.0, 0.0], [1.0, 2.0, 1.0]]
    assert dirs.tolist() == [[0.0, 0.0, -1.0], [1.0, 0.0, 0.0], [0.0, 0.0, -1.0]]


def test_normalize_to_box_clamps_and_flags_points_outside() -> None:
    p = torch.tensor([[-1.0, 0.0, 1.0], [-1.5, 0.0, 1.0], [3.0, 3.0, 3.0], [1.0, -0.5, 0.0]])
    x, inside = ref.normalize_to_box(p, torch.tensor([-1.0, -1.0, -1.0]), torch.tensor([4.0, 4.0, 4.0]))
    assert x.tolist() == [[0.0, 0.25, 0.5], [0.0, 0.25, 0.5], [1.0, 1.0, 1.0], [0.5, 0.125, 0.25]]
    assert inside.tolist() == [True, False, True, True]


def _loss_case():
    pred = torch.tensor([[0.5, 0.5, 0.5], [0.0, 0.3, 1.0], [0.2, 0.2, 0.2], [0.9, 0.1, 0.5]])
    target = torch.tensor([[0.55, 0.5, 0.25], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.9, 0.1, 0.6]])
    valid = torch.tensor([True, True, False, True])
    return pred.requires_grad_(), target, valid


def test_masked_ray_loss_huber_by_hand() -> None:
    pred, target, valid = _loss_case()
    loss, per_ray, aux = ref.masked_ray_loss(pred, target, valid, "huber", 0.1)
    # x = pred - target; |x| < 0.1: x^2 / 2, else 0.1 * (|x| - 0.05)
    ray0 = (0.5 * 0.05**2 + 0.0 + 0.1 * (0.25 - 0.05)) / 3
    ray1 = (0.0 + 0.1 * (0.3 - 0.05) + 0.0) / 3
    ray3 = (0.0 + 0.0 + 0.5 * 0.1**2) / 3  # |x| = 0.1 is not < delta: 0.1 * 0.05, the same value
    expected = [ray0, ray1, 0.0, ray3]
    torch.testing.assert_close(per_ray, torch.tensor(expected), rtol=1e-5, atol=1e-7)
    assert float(loss) == pytest.approx((ray0 + ray1 + ray3) / 3, rel=1e-5)
    sq = [(0.05**2 + 0.25**2) / 3, 0.3**2 / 3, 0.0, 0.1**2 / 3]
    assert aux.dtype == torch.float64
    assert float(aux[0]) == 3.0 and float(aux[1]) == pytest.approx(sum(sq), rel=1e-5)
    loss.backward()
    # d/dx: x inside the quadratic zone, 0.1 * sign(x) outside; / 3 channels / 3 valid rays
    g = torch.tensor([[-0.05, 0.0, 0.1], [0.0, 0.1, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, -0.1]]) / 9
    torch.testing.assert_close(pred.grad, g, rtol=1e-4, atol=1e-7)


def test_masked_ray_loss_mse_and_no_valid_ray() -> None:
    pred, target, valid = _loss_case()
    loss, per_ray, _ = ref.masked_ray_loss(pred, target, valid, "mse")
    assert float(per_ray[1]) == pytest.approx(0.09 / 3, rel=1e-5)
    assert float(loss) == pytest.approx(((0.05**2 + 0.25**2) + 0.09 + 0.01) / 9, rel=1e-5)
    loss, per_ray, aux = ref.masked_ray_loss(pred, target, torch.zeros(4, dtype=torch.bool))
    assert float(loss) == 0.0 and float(per_ray.abs().sum()) == 0.0 and aux.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="huber' or 'mse"):
        ref.masked_ray_loss(pred, target, valid, "l1")


def test_adapt_ray_count_follows_the_budget_rule() -> None:
    valid = torch.tensor([True, True, True, False])
    marched = torch.tensor([40, 20, 30, 99])  # the invalid ray's samples are not counted: 90
    rendered = torch.tensor([10, 5, 15, 0])  # 30
    n_active = torch.tensor(1000, dtype=torch.int64)
    n_active_f = torch.tensor(1000.0)
    aux = torch.tensor([3.0, 0.75], dtype=torch.float64)
    stats = ref.adapt_ray_count(
        aux, valid, marched, rendered, n_active, n_active_f, torch.tensor(1.0),
        sample_budget=1000, march_budget=2000, min_rays=64, n_slots=4096, momentum=0.5,
    )  # fmt: skip
    assert stats.dtype == torch.float64 and stats.tolist() == [3.0, 90.0, 30.0, 0.75]
    # 10 rendered and 30 marched per ray: min(0.98 * 1000 / 10, 0.98 * 2000 / 30) = 65.33 rays
    want = min(0.98 * 1000 / 10, 0.98 * 2000 / 30)
    assert float(n_active_f) == pytest.approx(0.5 * 1000 + 0.5 * want, rel=1e-6)
    assert int(n_active) == round(0.5 * 1000 + 0.5 * want)
    # clamped to [min_rays, n_slots]; a target fraction of 0.5 halves the aim
    n_active_f.fill_(10.0)
    ref.adapt_ray_count(
        aux, valid, marched, rendered, n_active, n_active_f, torch.tensor(0.5),
        sample_budget=1000, march_budget=2000, min_rays=64, n_slots=4096, momentum=0.5,
    )  # fmt: skip
    assert float(n_active_f) == 64.0 and int(n_active) == 64
    n_active_f.fill_(4000.0)
    ref.adapt_ray_count(
        aux, valid, marched, rendered, n_active, n_active_f, torch.tensor(1.0),
        sample_budget=10**6, march_budget=10**7, min_rays=64, n_slots=4096, momentum=0.0,
    )  # fmt: skip
    assert float(n_active_f) == 4096.0 and int(n_active) == 4096


def test_density_activation_masks_and_clamps_its_gradient() -> None:
    h = torch.tensor([[0.0, 5.0], [2.0, 1.0], [20.0, 0.0]], requires_grad=True)
    inside = torch.tensor([True, False, True])
    sigma = ref.density_activation(h, inside, -1.0)
    torch.testing.assert_close(sigma, torch.tensor([math.exp(-1.0), 0.0, math.exp(19.0)]))
    sigma.sum().backward()
    # d/dh0 = exp(min(h0 - 1, 15)) inside the box, 0 outside; other columns never get a gradient
    expected = torch.tensor([[math.exp(-1.0), 0.0], [0.0, 0.0], [math.exp(15.0), 0.0]])
    torch.testing.assert_close(h.grad, expected)


def _brute_distortion(w, ts, te, rays, n_rays):
    out = [0.0] * n_rays
    mid = [(a + b) / 2 for a, b in zip(ts, te, strict=True)]
    for i in range(len(w)):
        out[rays[i]] += w[i] * w[i] * (te[i] - ts[i]) / 3
        for j in range(len(w)):
            if rays[i] == rays[j]:
                out[rays[i]] += w[i] * w[j] * abs(mid[i] - mid[j])
    return out


def test_distortion_loss_equals_the_pairwise_sum() -> None:
    # ray 0: 3 samples, ray 1: none, ray 2: 2 samples, then 2 padding slots (ray 0, weight 0)
    w = torch.tensor([0.2, 0.5, 0.1, 0.6, 0.3, 0.0, 0.0], dtype=torch.float64, requires_grad=True)
    ts = torch.tensor([0.1, 0.4, 0.9, 1.0, 2.0, 0.0, 0.0], dtype=torch.float64)
    te = torch.tensor([0.3, 0.5, 1.2, 1.5, 2.1, 0.0, 0.0], dtype=torch.float64)
    rays = torch.tensor([0, 0, 0, 2, 2, 0, 0])
    info = torch.tensor([[0, 3], [5, 0], [3, 2]])
    got = ref.distortion_loss(w, ts, te, rays, info)
    want = _brute_distortion(w.tolist(), ts.tolist(), te.tolist(), rays.tolist(), 3)
    torch.testing.assert_close(got.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=1e-7)
    # two samples, midpoints 1.25 and 2.05: 2 w0 w1 |m0 - m1| + (w0^2 d0 + w1^2 d1) / 3
    assert float(got[2]) == pytest.approx(2 * 0.6 * 0.3 * 0.8 + (0.36 * 0.5 + 0.09 * 0.1) / 3, rel=1e-6)
    assert float(got[1]) == 0.0
    assert torch.autograd.gradcheck(
        lambda x: ref.distortion_loss(x, ts, te, rays, info).double(), (w,), eps=1e-6, atol=1e-4
    )


def _random_fixed_layout(seed: int, n_rays: int = 40, pad: int = 23):
    """A fixed layout with empty rays (count 0), one-sample rays, rays longer than a warp, invalid
    rays (count 0 at the end of the samples in use) and ``pad`` padding slots (ray 0) whose weights
    and intervals are NOT zero: the loss must ignore them because they lie outside every range."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 70, (n_rays,), generator=g)
    counts[torch.rand(n_rays, generator=g) < 0.2] = 0
    counts[1], counts[2] = 1, 0
    starts = torch.cumsum(counts, 0) - counts
    n_used = int(counts.sum())
    starts[counts == 0] = n_used  # as repack writes invalid rays
    padding = torch.zeros(pad, dtype=torch.long)  # ray 0
    rays = torch.cat([torch.repeat_interleave(torch.arange(n_rays), counts), padding])
    dt = torch.rand(n_used + pad, generator=g, dtype=torch.float64) * 0.05 + 1e-3
    t_start = torch.rand(n_used + pad, generator=g, dtype=torch.float64)  # overwritten per ray below
    for r, c in enumerate(counts.tolist()):
        s0 = int(starts[r])
        t = 0.2 + float(torch.rand(1, generator=g)) + torch.cumsum(dt[s0 : s0 + c], 0) - dt[s0 : s0 + c]
        t_start[s0 : s0 + c] = t
    t_end = t_start + dt
    w = torch.rand(n_used + pad, generator=g, dtype=torch.float64) * 0.3
    return w, t_start, t_end, rays, torch.stack([starts, counts], dim=-1), n_used


def _closed_form_distortion(w, ts, te, info, g_out):
    """Per ray, in float64: the loss and the gradient formula of ``ops.cuda.distortion_loss``'s backward
    kernel, ``dL/dw_k = g (2 (m_k (2 W_k - W) + M - 2 M_k) + 2 w_k d_k / 3)``."""
    loss = torch.zeros(info.shape[0], dtype=torch.float64)
    grad = torch.zeros_like(w)
    mid, delta = (ts + te) * 0.5, te - ts
    for r, (s0, c) in enumerate(info.tolist()):
        if c == 0:
            continue
        wr, mr, dr = w[s0 : s0 + c], mid[s0 : s0 + c], delta[s0 : s0 + c]
        excl_w = torch.cumsum(wr, 0) - wr
        excl_wm = torch.cumsum(wr * mr, 0) - wr * mr
        loss[r] = (2.0 * wr * (mr * excl_w - excl_wm) + wr * wr * dr / 3.0).sum()
        tot_w, tot_wm = wr.sum(), (wr * mr).sum()
        dl = 2.0 * (mr * (2.0 * excl_w - tot_w) + (tot_wm - 2.0 * excl_wm)) + 2.0 * wr * dr / 3.0
        grad[s0 : s0 + c] = g_out[r] * dl
    return loss, grad


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_distortion_loss_ignores_padding_and_empty_rays(seed: int) -> None:
    w, ts, te, rays, info, n_used = _random_fixed_layout(seed)
    assert n_used < w.shape[0]
    w = w.requires_grad_()
    got = ref.distortion_loss(w, ts, te, rays, info)
    in_use = torch.arange(w.shape[0]) < n_used
    want = _brute_distortion(
        w[in_use].tolist(), ts[in_use].tolist(), te[in_use].tolist(), rays[in_use].tolist(), info.shape[0]
    )
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-9, atol=1e-12)
    assert (got[info[:, 1] == 0] == 0).all()
    up = torch.rand(info.shape[0], generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    (got * up).sum().backward()
    assert (w.grad[~in_use] == 0).all()  # padding: no gradient, whatever its weight


@pytest.mark.parametrize("seed", [3, 4])
def test_distortion_loss_gradient_has_the_kernels_closed_form(seed: int) -> None:
    """The CUDA kernel differentiates by a closed form; here it is held to the reference's autograd
    (CPU, float64), so that the GPU test only has to find kernel bugs, not formula ones."""
    w, ts, te, rays, info, _ = _random_fixed_layout(seed, n_rays=25, pad=7)
    w = w.requires_grad_()
    got = ref.distortion_loss(w, ts, te, rays, info)
    up = torch.rand(info.shape[0], generator=torch.Generator().manual_seed(seed), dtype=torch.float64) - 0.3
    (got * up).sum().backward()
    loss, grad = _closed_form_distortion(w.detach(), ts, te, info, up)
    torch.testing.assert_close(got.detach(), loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(w.grad, grad, rtol=1e-10, atol=1e-12)


def test_distortion_loss_float32_rounds_the_float64_sum_once() -> None:
    w, ts, te, rays, info, _ = _random_fixed_layout(5)
    got = ref.distortion_loss(w.float(), ts.float(), te.float(), rays, info)
    assert got.dtype == torch.float32
    want = ref.distortion_loss(w.float().double(), ts.float(), te.float(), rays, info)
    assert torch.equal(got, want.float())
