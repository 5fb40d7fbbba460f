"""The fixed sample layout (``repack``, ``march_rays_fixed``) against plain-Python oracles."""

from __future__ import annotations

import pytest
import torch

from nerf_lightning.ops import reference as ref
from nerf_lightning.ops.types import PackedSamples


def _packed(counts: list[int]) -> PackedSamples:
    """Dynamic-layout samples: ray r has counts[r] samples with t = 10 r + k."""
    ray_idx, ts = [], []
    for r, c in enumerate(counts):
        ray_idx += [r] * c
        ts += [10.0 * r + k for k in range(c)]
    count = torch.tensor(counts)
    info = torch.stack([torch.cumsum(count, 0) - count, count], dim=-1)
    t = torch.tensor(ts)
    return PackedSamples(torch.tensor(ray_idx, dtype=torch.long), t, t + 0.5, info)


def _oracle(counts, keep, capacity, ray_valid):
    """Walk the rays in order with a Python loop: the expected fixed layout."""
    out_idx, out_ts, info, valid = [], [], [], []
    pos = 0
    i = 0
    overflowed = False
    for r, c in enumerate(counts):
        kept = [10.0 * r + k for k in range(c) if keep[i + k]] if ray_valid[r] else []
        i += c
        if ray_valid[r] and not overflowed and pos + len(kept) <= capacity:
            info.append((pos, len(kept)))
            out_idx += [r] * len(kept)
            out_ts += kept
            pos += len(kept)
            valid.append(True)
        else:
            overflowed = overflowed or (ray_valid[r] and pos + len(kept) > capacity)
            info.append((None, 0))
            valid.append(False)
    info = [(pos if s is None else s, n) for s, n in info]
    pad = capacity - len(out_idx)
    return out_idx + [0] * pad, out_ts + [0.0] * pad, info, valid


@pytest.mark.parametrize("capacity", [0, 3, 7, 12, 40])
def test_repack_equals_python_oracle(capacity: int) -> None:
    counts = [3, 0, 4, 2, 5, 1]
    gen = torch.Generator().manual_seed(capacity)
    packed = _packed(counts)
    keep = torch.rand(sum(counts), generator=gen) < 0.7
    ray_valid = torch.tensor([True, True, True, True, False, True])
    out, valid = ref.repack(packed, keep, capacity, ray_valid)
    exp_idx, exp_ts, exp_info, exp_valid = _oracle(counts, keep.tolist(), capacity, ray_valid.tolist())
    assert out.ray_indices.tolist() == exp_idx
    assert out.t_starts.tolist() == exp_ts
    assert out.t_ends.tolist() == [
        t + 0.5 if k < sum(n for _, n in exp_info) else 0.0 for k, t in enumerate(exp_ts)
    ]
    assert [tuple(x) for x in out.packed_info.tolist()] == exp_info
    assert valid.tolist() == exp_valid


def test_repack_ignores_padding_of_a_fixed_layout() -> None:
    packed = _packed([2, 3])
    fixed, valid = ref.repack(packed, torch.ones(5, dtype=torch.bool), 9)  # 4 padding slots
    again, valid2 = ref.repack(fixed, torch.ones(9, dtype=torch.bool), 9)  # padding must not be kept
    assert again.packed_info.tolist() == [[0, 2], [2, 3]]
    assert again.ray_indices.tolist() == [0, 0, 1, 1, 1, 0, 0, 0, 0]
    assert valid2.tolist() == [True, True]
    assert ref.samples_in_use(fixed).tolist() == [True] * 5 + [False] * 4


def _rays(n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    o = torch.rand(n, 3, generator=gen) * 2.0 - 0.5
    d = torch.nn.functional.normalize(torch.randn(n, 3, generator=gen), dim=-1)
    return o, d


@pytest.mark.parametrize("n_active", [None, 5])
def test_march_rays_fixed_keeps_the_dynamic_samples_of_the_rays_that_fit(n_active) -> None:
    o, d = _rays(16, 0)
    binaries = torch.rand(1, 8, 8, 8, generator=torch.Generator().manual_seed(1)) < 0.5
    t_near, t_far, _ = ref.ray_aabb_intersect(o, d, torch.tensor([0.0, 0, 0, 1, 1, 1]))
    kw = dict(step_size=0.02, max_samples_per_ray=64)
    dyn = ref.march_rays(o, d, t_near, t_far, binaries, **kw)
    counts = dyn.packed_info[:, 1]
    capacity = int(counts[:9].sum())  # exactly the first 9 rays fit
    active = None if n_active is None else torch.tensor(n_active)
    fixed, valid = ref.march_rays_fixed(
        o, d, t_near, t_far, binaries, capacity=capacity, n_active=active, **kw
    )
    # a ray fits while the samples of rays 0..r fit (a ray without samples right after still does)
    n_fit = 9 if n_active is None else n_active
    while n_active is None and n_fit < 16 and int(counts[n_fit]) == 0:
        n_fit += 1
    assert valid.tolist() == [r < n_fit for r in range(16)]
    n = int(counts[:n_fit].sum())
    assert fixed.ray_indices.shape == (capacity,)
    torch.testing.assert_close(fixed.t_starts[:n], dyn.t_starts[:n], rtol=0, atol=0)
    torch.testing.assert_close(fixed.t_ends[:n], dyn.t_ends[:n], rtol=0, atol=0)
    assert (fixed.t_starts[n:] == 0).all() and (fixed.t_ends[n:] == 0).all()
    assert fixed.packed_info[:n_fit].tolist() == dyn.packed_info[:n_fit].tolist()
    assert (fixed.packed_info[n_fit:, 1] == 0).all()


def test_padding_adds_nothing_to_compositing_or_gradients() -> None:
    packed = _packed([2, 3])
    fixed, _ = ref.repack(packed, torch.ones(5, dtype=torch.bool), 8)
    sig = torch.rand(8, requires_grad=True)
    rgb = torch.rand(8, 3, requires_grad=True)
    out = ref.volume_render(
        sig, rgb, fixed.t_starts * 0.01, fixed.t_ends * 0.01, fixed.ray_indices, 2, fixed.packed_info
    )
    sig5 = sig.detach()[:5].clone().requires_grad_(True)
    rgb5 = rgb.detach()[:5].clone().requires_grad_(True)
    exp = ref.volume_render(
        sig5, rgb5, packed.t_starts * 0.01, packed.t_ends * 0.01, packed.ray_indices, 2, packed.packed_info
    )
    torch.testing.assert_close(out["rgb"], exp["rgb"])
    (out["rgb"].sum() + out["depth"].sum()).backward()
    (exp["rgb"].sum() + exp["depth"].sum()).backward()
    torch.testing.assert_close(sig.grad[:5], sig5.grad)
    assert (sig.grad[5:] == 0).all() and (rgb.grad[5:] == 0).all()
    assert (out["weights"][5:] == 0).all()
