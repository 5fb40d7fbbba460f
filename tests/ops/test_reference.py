"""Reference ray ops: checked against naive per-ray loops and hand-computed values."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from nerf_lightning.ops import PackedSamples, get_ops
from nerf_lightning.ops import reference as ref

SQRT3 = math.sqrt(3.0)
UNIT_BOX = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, 1.0])


def _random_rays(n: int, seed: int = 0, spread: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    o = (torch.rand(n, 3, generator=g) - 0.5) * spread + 0.5
    d = torch.nn.functional.normalize(torch.randn(n, 3, generator=g), dim=-1)
    return o, d


# ----------------------------------------------------------------------------- dispatcher
def test_get_ops_backends() -> None:
    assert get_ops("torch") is ref
    auto = get_ops("auto")
    o, d = _random_rays(8)
    for a, b in zip(
        auto.ray_aabb_intersect(o, d, UNIT_BOX), ref.ray_aabb_intersect(o, d, UNIT_BOX), strict=True
    ):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="unknown ops backend"):
        get_ops("tcnn")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only fallback")
def test_cuda_backend_falls_back_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    from nerf_lightning.ops import registry

    monkeypatch.setattr(registry, "_cuda_state", {"probed": False, "module": None, "warned": False})
    monkeypatch.setattr(registry, "_resolved", {})
    with pytest.warns(RuntimeWarning, match="CUDA extension is unavailable"):
        assert get_ops("cuda") is ref
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert get_ops("cuda") is ref  # no second warning


# ----------------------------------------------------------------------------- ray / box
def test_ray_aabb_known_cases() -> None:
    o = torch.tensor([[-1.0, 0.5, 0.5], [0.5, 0.5, 0.5], [0.5, 0.5, -1.0], [2.0, 0.5, -1.0], [2.0, 0.5, 0.5]])
    d = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    t_near, t_far, hit = ref.ray_aabb_intersect(o, d, UNIT_BOX)
    assert hit.tolist() == [True, True, True, False, False]
    torch.testing.assert_close(t_near[:3], torch.tensor([0.5, 0.0, 1.0]))
    torch.testing.assert_close(t_far[:3], torch.tensor([1.0, 0.5, 2.0]))
    assert (t_near[3:] == ref.MISS_T).all() and (t_far[3:] == ref.MISS_T).all()
    assert torch.isfinite(t_near).all() and torch.isfinite(t_far).all()


def test_ray_aabb_random_rays_enter_and_leave_the_box() -> None:
    o, d = _random_rays(2000, seed=1)
    d[:100, 0] = 0.0  # zero components must not produce NaN
    d[100:150, 1:] = 0.0
    t_near, t_far, hit = ref.ray_aabb_intersect(o, d, UNIT_BOX)
    assert not torch.isnan(t_near).any() and not torch.isnan(t_far).any()
    assert 0.05 < hit.float().mean() < 0.95

    def inside(t: torch.Tensor) -> torch.Tensor:
        p = o + d * t[:, None]
        return ((p >= -1e-5) & (p <= 1 + 1e-5)).all(-1)

    h = hit
    mid = (t_near + t_far) / 2
    assert inside(mid)[h].all()
    assert inside(t_near + 1e-4)[h].all() and inside(t_far - 1e-4)[h].all()
    assert not inside(t_far + 1e-3)[h].any()
    entered = h & (t_near > 0)
    assert not inside(t_near - 1e-3)[entered].any()
    # misses: the whole forward ray stays outside (sampled densely)
    ts = torch.linspace(0, 6, 600)
    p = o[~h, None, :] + d[~h, None, :] * ts[None, :, None]
    assert not ((p > 1e-3) & (p < 1 - 1e-3)).all(-1).any()


# ----------------------------------------------------------------------------- grid helpers
def test_cascade_of_boundaries() -> None:
    p = torch.tensor(
        [
            [0.5, 0.5, 0.5],
            [1.0, 0.5, 0.5],
            [1.01, 0.5, 0.5],
            [-0.5, 0.5, 0.5],
            [0.5, 2.5, 0.5],
            [0.5, 0.5, 8.5],
        ]
    )
    assert ref.cascade_of(p).tolist() == [0, 0, 1, 1, 2, 4]


def test_grid_cell_positions_and_indices_round_trip() -> None:
    g, c = 8, 3
    idx = torch.arange(c * g**3)
    pos = ref.grid_cell_positions(idx, torch.full((idx.numel(), 3), 0.5), g)
    # cell (c=0, ix=1, iy=2, iz=3) centre
    torch.testing.assert_close(pos[(1 * g + 2) * g + 3], torch.tensor([1.5, 2.5, 3.5]) / g)
    # cascade 1 corner cell with zero jitter is the cascade's corner
    torch.testing.assert_close(
        ref.grid_cell_positions(torch.tensor([g**3]), torch.zeros(1, 3), g)[0],
        torch.tensor([-0.5, -0.5, -0.5]),
    )
    back, inside = ref.grid_cell_indices(pos, c, g)
    assert inside.all()
    # a centre maps back to its own cell unless a finer cascade covers it
    finer_covers = ref.cascade_of(pos) < idx // g**3
    assert torch.equal(back[~finer_covers], idx[~finer_covers])
    assert (back[finer_covers] // g**3 < idx[finer_covers] // g**3).all()
    _, inside_far = ref.grid_cell_indices(torch.tensor([[0.5, 0.5, 2.6]]), c, g)
    assert not inside_far.any()


def test_grid_ema_update_hand_computed() -> None:
    grid = torch.zeros(1, 8)
    grid[0, :4] = torch.tensor([-1.0, 0.5, 2.0, 0.0])
    grid[0, 7] = 4.0
    idx = torch.tensor([1, 1, 2, 3, 0])
    dens = torch.tensor([3.0, 1.0, 0.1, 0.2, 50.0])
    new = ref.grid_ema_update(grid, idx, dens, decay=0.95)
    expect = torch.tensor([[-1.0, 3.0, 1.9, 0.2, 0.0, 0.0, 0.0, 3.8]])
    torch.testing.assert_close(new, expect)
    assert grid[0, 1] == 0.5  # input not modified


def test_grid_occupancy_threshold_and_mean() -> None:
    grid = torch.tensor([[-1.0, 0.0, 1.0, 3.0, 8.0, 0.0, 0.0, 0.0]])
    # mean over non-negative cells = 12 / 7 ~ 1.71 < threshold 5 -> cells above the mean
    occ = ref.grid_occupancy(grid, threshold=5.0)
    assert occ.shape == (1, 2, 2, 2)
    assert occ.reshape(-1).tolist() == [False, False, False, True, True, False, False, False]
    # threshold below the mean wins
    assert ref.grid_occupancy(grid, threshold=0.5).reshape(-1).tolist() == [
        False,
        False,
        True,
        True,
        True,
        False,
        False,
        False,
    ]


def test_bitfield_layout_and_round_trip() -> None:
    b = torch.zeros(2, 4, 4, 4, dtype=torch.bool)
    b.view(-1)[9] = True  # byte 1, bit 1
    b.view(-1)[64 + 7] = True  # cascade 1 flat 7: byte 8, bit 7
    bits = ref.pack_bitfield(b)
    assert bits.dtype == torch.uint8 and bits.shape == (16,)
    assert bits[1] == 2 and bits[8] == 128 and int(bits.sum()) == 130
    r = torch.rand(3, 8, 8, 8, generator=torch.Generator().manual_seed(0)) < 0.4
    assert torch.equal(ref.unpack_bitfield(ref.pack_bitfield(r), 3, 8), r)


# ----------------------------------------------------------------------------- marching
def _dense_t(t0: float, t_far: float, step: float) -> torch.Tensor:
    """Naive per-ray loop with the same float32 arithmetic: starts of k with t0 + (k+1) s <= t_far."""
    starts = []
    k = 0
    t0_ = torch.tensor(t0, dtype=torch.float32)
    tf_ = torch.tensor(t_far, dtype=torch.float32)
    while True:
        t_end = t0_ + torch.tensor(float(k + 1)) * step
        if t_end > tf_:
            break
        starts.append(float(t0_ + torch.tensor(float(k)) * step))
        k += 1
    return torch.tensor(starts)


def _check_layout(p: PackedSamples, n_rays: int) -> None:
    assert p.ray_indices.dtype == torch.long and p.packed_info.dtype == torch.long
    assert p.t_starts.dtype == torch.float32 and p.packed_info.shape == (n_rays, 2)
    first, count = p.packed_info.unbind(-1)
    assert int(count.sum()) == p.t_starts.numel()
    assert torch.equal(torch.repeat_interleave(torch.arange(n_rays), count), p.ray_indices)
    assert torch.equal(first, torch.cumsum(count, 0) - count)
    assert (p.t_ends > p.t_starts).all()
    same = p.ray_indices[1:] == p.ray_indices[:-1]
    assert (p.t_starts[1:][same] >= p.t_ends[:-1][same] - 1e-6).all()


def test_march_all_occupied_equals_dense_sampling() -> None:
    o, d = _random_rays(48, seed=2, spread=1.6)
    t_near, t_far, hit = ref.ray_aabb_intersect(o, d, UNIT_BOX)
    assert (~hit).sum() > 3 and hit.sum() > 10
    step = 0.01
    full = torch.ones(1, 16, 16, 16, dtype=torch.bool)
    p = ref.march_rays(o, d, t_near, t_far, full, step_size=step)
    _check_layout(p, 48)
    for r in range(48):
        first, count = p.packed_info[r].tolist()
        expect = _dense_t(float(t_near[r]), float(t_far[r]), step) if hit[r] else torch.zeros(0)
        assert count == expect.numel(), r
        torch.testing.assert_close(p.t_starts[first : first + count], expect, rtol=0, atol=1e-6)
        torch.testing.assert_close(p.t_ends[first : first + count], expect + step, rtol=0, atol=1e-6)


def test_march_skips_empty_cells_exactly() -> None:
    o, d = _random_rays(300, seed=3)
    c, g = 2, 8
    aabb = torch.tensor([-0.5, -0.5, -0.5, 1.5, 1.5, 1.5])
    t_near, t_far, _ = ref.ray_aabb_intersect(o, d, aabb)
    occ = torch.rand(c, g, g, g, generator=torch.Generator().manual_seed(4)) < 0.3
    dense = ref.march_rays(o, d, t_near, t_far, torch.ones_like(occ), max_samples_per_ray=10**6)
    sparse = ref.march_rays(o, d, t_near, t_far, occ, max_samples_per_ray=10**6)
    _check_layout(sparse, 300)

    def occupied(ps: PackedSamples) -> torch.Tensor:
        mid = (ps.t_starts + ps.t_ends) * 0.5
        pos = o[ps.ray_indices] + d[ps.ray_indices] * mid[:, None]
        # independent cell lookup in float64
        pos = pos.double()
        m = 2 * (pos - 0.5).abs().amax(-1)
        casc = torch.ceil(torch.log2(m.clamp(min=1e-12))).clamp(0, c - 1).long()
        u = (pos - 0.5) / (2.0**casc)[:, None] + 0.5
        ijk = (u * g).floor().long().clamp(0, g - 1)
        return occ[casc, ijk[:, 0], ijk[:, 1], ijk[:, 2]]

    assert occupied(sparse).all()
    keep = occupied(dense)
    assert 0 < sparse.t_starts.numel() < dense.t_starts.numel()
    assert torch.equal(sparse.ray_indices, dense.ray_indices[keep])
    assert torch.equal(sparse.t_starts, dense.t_starts[keep])
    assert torch.equal(sparse.t_ends, dense.t_ends[keep])


def test_march_cap_keeps_first_samples_and_chunking_is_invisible(monkeypatch: pytest.MonkeyPatch) -> None:
    o, d = _random_rays(64, seed=5, spread=1.0)
    t_near, t_far, _ = ref.ray_aabb_intersect(o, d, UNIT_BOX)
    occ = torch.rand(1, 16, 16, 16, generator=torch.Generator().manual_seed(6)) < 0.5
    full = ref.march_rays(o, d, t_near, t_far, occ)
    cap = 20
    capped = ref.march_rays(o, d, t_near, t_far, occ, max_samples_per_ray=cap)
    assert capped.packed_info[:, 1].max() == cap
    assert torch.equal(capped.packed_info[:, 1], full.packed_info[:, 1].clamp(max=cap))
    rank = torch.arange(full.t_starts.numel()) - full.packed_info[full.ray_indices, 0]
    assert torch.equal(capped.t_starts, full.t_starts[rank < cap])
    monkeypatch.setattr(ref.marching, "MAX_CHUNK_ENTRIES", 3000)  # many chunks of a few rays
    chunked = ref.march_rays(o, d, t_near, t_far, occ)
    for a, b in zip(chunked, full, strict=True):
        assert torch.equal(a, b)


def test_march_cone_steps_follow_the_law() -> None:
    o, d = _random_rays(64, seed=7, spread=8.0)
    c, g = 4, 16
    aabb = torch.tensor([-3.5, -3.5, -3.5, 4.5, 4.5, 4.5])
    t_near, t_far, hit = ref.ray_aabb_intersect(o, d, aabb)
    cone, step, max_step = 1 / 32, 0.01, 0.1  # phases: linear below t=0.32, geometric to 3.2, linear
    full = torch.ones(c, g, g, g, dtype=torch.bool)
    p = ref.march_rays(
        o,
        d,
        t_near,
        t_far,
        full,
        step_size=step,
        cone_angle=cone,
        max_step=max_step,
        max_samples_per_ray=10**6,
    )
    _check_layout(p, 64)
    dt = p.t_ends - p.t_starts
    law = torch.clamp(p.t_starts * cone, step, max_step)
    torch.testing.assert_close(dt, law, rtol=1e-4, atol=1e-6)
    # all three phases occur
    assert (dt < step * 1.001).any() and ((dt > step * 1.1) & (dt < max_step * 0.9)).any()
    assert (dt > max_step * 0.999).any()
    # contiguous, starting at t_near, ending within one step of t_far
    same = p.ray_indices[1:] == p.ray_indices[:-1]
    torch.testing.assert_close(p.t_starts[1:][same], p.t_ends[:-1][same])
    first, count = p.packed_info.unbind(-1)
    has = count > 0
    assert torch.equal(has, hit & (t_far - t_near >= step))
    torch.testing.assert_close(p.t_starts[first[has]], t_near[has])
    last_end = p.t_ends[(first + count - 1)[has]]
    assert (last_end <= t_far[has]).all()
    assert (last_end + torch.clamp(last_end * cone, step, max_step) > t_far[has] - 1e-5).all()


def test_march_jitter_near_plane_and_empty() -> None:
    o, d = _random_rays(32, seed=8, spread=1.0)
    t_near, t_far, _ = ref.ray_aabb_intersect(o, d, UNIT_BOX)
    full = torch.ones(1, 8, 8, 8, dtype=torch.bool)
    jit = torch.rand(32, generator=torch.Generator().manual_seed(9))
    p = ref.march_rays(o, d, t_near, t_far, full, step_size=0.02, near_plane=0.3, t_jitter=jit)
    first, count = p.packed_info.unbind(-1)
    has = count > 0
    t0 = t_near.clamp(min=0.3) + jit * 0.02
    torch.testing.assert_close(p.t_starts[first[has]], t0[has])
    assert (p.t_starts >= 0.3).all()
    empty = ref.march_rays(o, d, t_near, t_far, torch.zeros_like(full))
    assert empty.t_starts.shape == (0,) and empty.ray_indices.dtype == torch.long
    assert empty.packed_info.shape == (32, 2) and (empty.packed_info == 0).all()
    none = ref.march_rays(o[:0], d[:0], t_near[:0], t_far[:0], full)
    assert none.packed_info.shape == (0, 2)
    with pytest.raises(ValueError, match="binaries must be bool"):
        ref.march_rays(o, d, t_near, t_far, full.float())


# ----------------------------------------------------------------------------- volume rendering
def _packed_example(dtype: torch.dtype = torch.float32, seed: int = 10):
    g = torch.Generator().manual_seed(seed)
    counts = torch.tensor([3, 0, 5, 1, 4])
    ray_indices = torch.repeat_interleave(torch.arange(5), counts)
    n = int(counts.sum())
    deltas = torch.rand(n, generator=g, dtype=dtype) * 0.1 + 0.01
    t_starts = torch.zeros(n, dtype=dtype)
    for r in range(5):  # per-ray contiguous intervals
        sel = ray_indices == r
        t_starts[sel] = torch.cumsum(deltas[sel], 0) - deltas[sel] + 0.5
    t_ends = t_starts + deltas
    sigmas = torch.rand(n, generator=g, dtype=dtype) * 5
    rgbs = torch.rand(n, 3, generator=g, dtype=dtype)
    packed_info = torch.stack([torch.cumsum(counts, 0) - counts, counts], -1)
    return sigmas, rgbs, t_starts, t_ends, ray_indices, packed_info


def _naive_render(sigmas, rgbs, t_starts, t_ends, ray_indices, n_rays, bg, eps):
    rgb = torch.zeros(n_rays, 3, dtype=sigmas.dtype)
    opacity = torch.zeros(n_rays, 1, dtype=sigmas.dtype)
    depth = torch.zeros(n_rays, 1, dtype=sigmas.dtype)
    for r in range(n_rays):
        T = 1.0
        for i in torch.nonzero(ray_indices == r).flatten().tolist():
            a = 1 - math.exp(-float(sigmas[i]) * float(t_ends[i] - t_starts[i]))
            w = 0.0 if T < eps else T * a
            rgb[r] += w * rgbs[i]
            opacity[r] += w
            depth[r] += w * float(t_starts[i] + t_ends[i]) / 2
            T *= 1 - a
    return rgb + (1 - opacity) * bg, opacity, depth


@pytest.mark.parametrize("eps", [1e-4, 0.3])
def test_volume_render_matches_naive_loop(eps: float) -> None:
    sigmas, rgbs, t_s, t_e, ri, info = _packed_example()
    bg = torch.tensor([0.2, 0.4, 0.9])
    out = ref.volume_render(
        sigmas, rgbs, t_s, t_e, ri, 5, packed_info=info, background=bg, early_stop_eps=eps
    )
    rgb, opacity, depth = _naive_render(sigmas, rgbs, t_s, t_e, ri, 5, bg, eps)
    torch.testing.assert_close(out["rgb"], rgb)
    torch.testing.assert_close(out["opacity"], opacity)
    torch.testing.assert_close(out["depth"], depth)
    assert out["weights"].shape == sigmas.shape
    torch.testing.assert_close(out["rgb"][1], bg)  # ray without samples shows the background
    out2 = ref.volume_render(
        sigmas, rgbs, t_s, t_e, ri, 5, packed_info=None, background=bg, early_stop_eps=eps
    )
    torch.testing.assert_close(out2["rgb"], out["rgb"])


def test_weights_sum_to_one_minus_final_transmittance() -> None:
    sigmas, _, t_s, t_e, ri, info = _packed_example()
    w, trans = ref.render_weights(sigmas, t_s, t_e, ri, 5, info, early_stop_eps=0.0)
    tau = torch.zeros(5).index_add(0, ri, sigmas * (t_e - t_s))
    torch.testing.assert_close(torch.zeros(5).index_add(0, ri, w), 1 - torch.exp(-tau))
    first = info[:, 0][info[:, 1] > 0]
    assert (trans[first] == 1).all()


def test_early_stop_zeroes_weights_after_low_transmittance() -> None:
    ri = torch.zeros(4, dtype=torch.long)
    t_s = torch.tensor([0.0, 1.0, 2.0, 3.0])
    sig = torch.tensor([20.0, 1.0, 1.0, 1.0])  # T after the first sample: e^-20 < 1e-4
    w, trans = ref.render_weights(sig, t_s, t_s + 1, ri, 1, early_stop_eps=1e-4)
    assert w[0] > 0.99 and (w[1:] == 0).all() and trans[1] < 1e-8


def test_gradcheck_float64() -> None:
    sigmas, rgbs, t_s, t_e, ri, info = _packed_example(torch.float64)
    sigmas = (sigmas * 0.3).requires_grad_()
    rgbs = rgbs.requires_grad_()
    bg = torch.tensor([0.1, 0.5, 0.3], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda s: ref.render_weights(s, t_s, t_e, ri, 5, info)[0], (sigmas,))
    assert torch.autograd.gradcheck(
        lambda s, c: tuple(ref.volume_render(s, c, t_s, t_e, ri, 5, info, bg).values())[:3], (sigmas, rgbs)
    )
