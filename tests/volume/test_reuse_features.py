"""``model.net.renderer.reuse_features``: the differentiable pass takes its samples' hash features from the
density pass. On the CPU reference: the same outputs and gradients as encoding them again, in both layouts,
and the two ops it is built from (``repacked_prefix_slots``, ``hash_encode_given``) on hand-made input."""

from __future__ import annotations

import pytest
import torch

from nerf_lightning.models.encoding import HashEncoding
from nerf_lightning.models.field import NGPField
from nerf_lightning.ops import PackedSamples, reference
from nerf_lightning.volume.occupancy import OccupancyGrid
from nerf_lightning.volume.renderer import Renderer, SampleBudget

ENC = dict(n_levels=4, log2_hashmap_size=12, base_resolution=4, max_resolution=32)


def _scene(reuse: bool, seed: int = 0):
    torch.manual_seed(seed)
    field = NGPField(encoding=ENC, hidden_dim=16, density_bias=5.0, backend="torch")  # dense: rays terminate
    with torch.no_grad():
        field.encoding.params.uniform_(-1.0, 1.0)
    renderer = Renderer(OccupancyGrid(resolution=16), step_size=0.02, backend="torch", reuse_features=reuse)
    gen = torch.Generator().manual_seed(seed + 1)
    renderer.occupancy.binaries.copy_(torch.rand(renderer.occupancy.binaries.shape, generator=gen) < 0.6)
    o = torch.rand(24, 3, generator=gen) * 0.4 + 0.3 + torch.tensor([0.0, 0.0, -1.0])
    d = torch.nn.functional.normalize(
        torch.randn(24, 3, generator=gen) * 0.2 + torch.tensor([0, 0, 1.0]), dim=-1
    )
    return field, renderer, o, d, torch.rand(24, 3, generator=gen)


def _render(reuse: bool, budget: SampleBudget | None):
    field, renderer, o, d, bg = _scene(reuse)
    out = renderer.render_rays(field, o, d, bg, jitter=False, budget=budget)
    out.rgb.square().sum().backward()
    return out, [p.grad.clone() for p in field.parameters()], field


@pytest.mark.parametrize(
    "budget",
    [None, SampleBudget(4096, 4096), SampleBudget(4096, 40)],
    ids=["dynamic", "fixed", "fixed_dropping_rays"],
)
def test_reused_features_give_the_same_render_and_gradients(budget: SampleBudget | None) -> None:
    again, grads_again, _ = _render(False, budget)
    reused, grads_reused, field = _render(True, budget)
    n_kept = int(again.packed_info[:, 1].sum())
    assert 0 < n_kept < int(again.marched_counts.sum())  # samples were dropped behind termination
    if budget is not None and budget.sample_capacity == 40:
        assert not reused.ray_valid.all()  # the case where repack drops whole rays
    assert torch.equal(reused.ray_valid, again.ray_valid)
    for name in ("rgb", "opacity", "depth"):
        assert torch.equal(getattr(reused, name), getattr(again, name)), name
    for a, b in zip(grads_reused, grads_again, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)
    assert field.encoding.params.grad.abs().sum() > 0


def test_the_given_features_are_the_value_of_the_differentiable_pass(monkeypatch) -> None:
    """A wrong gather would go unnoticed if the field encoded again: check that the given value is used."""
    field, renderer, o, d, bg = _scene(True)
    seen = []
    forward = type(field.encoding).forward

    def spy(self, x, features=None):
        out = forward(self, x, features)
        if features is not None:
            seen.append((features.clone(), forward(self, x).detach()))
        return out

    monkeypatch.setattr(type(field.encoding), "forward", spy)
    out = renderer.render_rays(field, o, d, bg, jitter=False, budget=SampleBudget(4096, 4096))
    ((given, encoded_again),) = seen
    n_used = int(out.packed_info[:, 1].sum())
    assert given.shape == (4096, field.encoding.n_output_dims)
    assert torch.equal(given[:n_used], encoded_again[:n_used])  # the kept samples' own features


def test_a_field_without_density_and_features_encodes_again() -> None:
    field, renderer, o, d, bg = _scene(True)

    class PlainField(torch.nn.Module):
        def __init__(self, inner: NGPField) -> None:
            super().__init__()
            self.inner = inner

        def density(self, positions):
            return self.inner.density(positions)

        def forward(self, positions, directions):
            return self.inner(positions, directions)

    reused = renderer.render_rays(PlainField(field), o, d, bg, jitter=False, budget=SampleBudget(4096, 4096))
    again = Renderer(OccupancyGrid(resolution=16), step_size=0.02, backend="torch")
    again.occupancy.binaries.copy_(renderer.occupancy.binaries)
    want = again.render_rays(field, o, d, bg, jitter=False, budget=SampleBudget(4096, 4096))
    assert torch.equal(reused.rgb, want.rgb)


def test_repacked_prefix_slots_on_a_hand_made_layout() -> None:
    # source: ray 0 has slots 0-3, ray 1 none, ray 2 slots 4-8, ray 3 slots 9-10; 12 slots (one padding)
    source_info = torch.tensor([[0, 4], [4, 0], [4, 5], [9, 2]])
    # repack kept 2 of ray 0, 3 of ray 2, and ray 3 did not fit: 5 slots in use of 7, ray 3 invalid
    packed = PackedSamples(
        ray_indices=torch.tensor([0, 0, 2, 2, 2, 0, 0]),
        t_starts=torch.zeros(7),
        t_ends=torch.zeros(7),
        packed_info=torch.tensor([[0, 2], [2, 0], [2, 3], [5, 0]]),
    )
    slots = reference.repacked_prefix_slots(packed, source_info)
    assert slots.tolist() == [0, 1, 4, 5, 6, 0, 0]
    assert slots.dtype == torch.int64


def test_repacked_prefix_slots_follow_repack_of_early_terminated_rays() -> None:
    """Against repack itself: the source slots of a real early-termination keep point at the samples that
    repack copied (same ray, same t)."""
    field, renderer, o, d, _ = _scene(True)
    t_near, t_far, _ = reference.ray_aabb_intersect(o, d, renderer.occupancy.aabb)
    marched, valid = reference.march_rays_fixed(
        o, d, t_near, t_far, renderer.occupancy.binaries, capacity=4096, step_size=0.02
    )
    positions, _ = reference.sample_points(o, d, *marched[:3])
    with torch.no_grad():
        sigmas = field.density(positions).reshape(-1)
    _, trans = reference.render_weights(
        sigmas, marched.t_starts, marched.t_ends, marched.ray_indices, 24, packed_info=marched.packed_info
    )
    keep = trans >= 1e-4
    packed, _ = reference.repack(marched, keep, 40, valid)
    slots = reference.repacked_prefix_slots(packed, marched.packed_info)
    n_used = int(packed.packed_info[:, 1].sum())
    assert 0 < n_used < int(keep.sum())  # some rays did not fit
    assert torch.equal(marched.ray_indices[slots[:n_used]], packed.ray_indices[:n_used])
    assert torch.equal(marched.t_starts[slots[:n_used]], packed.t_starts[:n_used])
    assert keep[slots[:n_used]].all()


def test_hash_encode_given_has_the_given_value_and_the_encodings_gradient() -> None:
    enc_args = dict(n_levels=3, log2_hashmap_size=8, base_resolution=2, max_resolution=16)
    enc = HashEncoding(**enc_args, backend="torch")
    x = torch.rand(50, 3, generator=torch.Generator().manual_seed(3))
    features = torch.full((50, enc.n_output_dims), 7.0)  # not the encoding: the value must be this one
    p = enc.params.detach().clone().requires_grad_(True)
    out = reference.hash_encode_given(x, features, p, enc.scales, enc.resolutions, enc.offsets)
    assert torch.equal(out, features)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
    (out * g).sum().backward()
    q = enc.params.detach().clone().requires_grad_(True)
    (reference.hash_encode(x, q, enc.scales, enc.resolutions, enc.offsets) * g).sum().backward()
    assert torch.equal(p.grad, q.grad)
    with pytest.raises(ValueError, match=r"features must be \[N=50"):
        reference.hash_encode_given(x, features[:10], p, enc.scales, enc.resolutions, enc.offsets)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("precision", ["32", "bf16"])
def test_reused_features_on_the_gpu_kernels(precision: str) -> None:
    """Our kernels (``hash_encode_given``: no forward gather, the same backward) against encoding again,
    in the fixed layout, with the fused bf16 MLPs where the step runs them."""
    from nerf_lightning.ops import cuda as cu

    assert cu.is_available(), "the CUDA extension did not load"
    results = []
    for reuse in (False, True):
        torch.manual_seed(0)
        field = NGPField(encoding=ENC, hidden_dim=64, density_bias=5.0, backend="cuda").cuda()
        with torch.no_grad():
            field.encoding.params.uniform_(-1.0, 1.0)
        renderer = Renderer(
            OccupancyGrid(resolution=16), step_size=0.02, backend="cuda", reuse_features=reuse
        )
        renderer = renderer.cuda()
        gen = torch.Generator().manual_seed(1)
        renderer.occupancy.binaries.copy_(torch.rand(renderer.occupancy.binaries.shape, generator=gen) < 0.6)
        o = (torch.rand(2048, 3, generator=gen) * 0.4 + 0.3 + torch.tensor([0.0, 0.0, -1.0])).cuda()
        d = torch.nn.functional.normalize(
            torch.randn(2048, 3, generator=gen) * 0.2 + torch.tensor([0, 0, 1.0]), dim=-1
        )
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = renderer.render_rays(
                field, o, d.cuda(), None, jitter=False, budget=SampleBudget(2**17, 2**15)
            )
        out.rgb.float().square().sum().backward()
        results.append((out, [p.grad.clone() for p in field.parameters()]))
    (again, g_again), (reused, g_reused) = results
    assert 0 < int(reused.packed_info[:, 1].sum()) < int(reused.marched_counts.sum())
    assert torch.equal(reused.ray_valid, again.ray_valid)
    torch.testing.assert_close(reused.rgb, again.rgb, rtol=0, atol=1e-6)  # the same value, bit for bit or so
    for a, b in zip(g_reused, g_again, strict=True):  # atomics: another summation order
        assert float((a - b).norm() / b.norm().clamp(min=1e-30)) < 1e-4
