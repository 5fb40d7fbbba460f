"""Renderer on analytic fields: opacity/colour/depth against closed forms, gradients, empty cases."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from nerf_lightning.run.model_node import instantiate_model
from nerf_lightning.volume.occupancy import OccupancyGrid
from nerf_lightning.volume.renderer import Renderer


class SphereField(nn.Module):
    """Constant density ``exp(log_sigma)`` and colour ``sigmoid(logits)`` inside a sphere, 0 outside."""

    def __init__(self, sigma: float = 2.0, radius: float = 0.25, colour=(0.9, 0.2, 0.1)) -> None:
        super().__init__()
        self.log_sigma = nn.Parameter(torch.tensor(math.log(sigma)))
        self.logits = nn.Parameter(torch.logit(torch.tensor(colour)))
        self.radius = radius

    def density(self, positions: torch.Tensor) -> torch.Tensor:
        inside = (positions - 0.5).norm(dim=-1) < self.radius
        return torch.where(inside, self.log_sigma.exp(), torch.zeros(()))

    def forward(self, positions: torch.Tensor, directions: torch.Tensor):
        assert positions.shape == directions.shape and positions.shape[-1] == 3
        rgb = torch.sigmoid(self.logits).expand(positions.shape[0], 3)
        return self.density(positions), rgb


class BoxField(nn.Module):
    """Density inside [0.25, 0.75]^3 (aligned with the cells of a 16^3 grid), colour from position."""

    def density(self, positions: torch.Tensor) -> torch.Tensor:
        inside = ((positions > 0.25) & (positions < 0.75)).all(-1)
        return torch.where(inside, 30.0, 0.0)

    def forward(self, positions: torch.Tensor, directions: torch.Tensor):
        return self.density(positions), positions.clamp(0, 1)


def _axis_rays(n: int = 1):
    o = torch.tensor([[0.5, 0.5, -1.0]]).repeat(n, 1)
    d = torch.tensor([[0.0, 0.0, 1.0]]).repeat(n, 1)
    return o, d


@pytest.mark.parametrize("sigma", [2.0, 8.0])
def test_ray_through_sphere_centre_matches_closed_form(sigma: float) -> None:
    field = SphereField(sigma=sigma)
    renderer = Renderer(OccupancyGrid(resolution=16), backend="torch")
    o, d = _axis_rays()
    bg = torch.tensor([0.0, 0.5, 1.0])
    out = renderer.render_rays(field, o, d, bg, jitter=False)
    chord, t_in = 0.5, 1.25
    opacity = 1 - math.exp(-sigma * chord)
    assert out.opacity.item() == pytest.approx(opacity, abs=3e-3)
    colour = torch.tensor([0.9, 0.2, 0.1])
    torch.testing.assert_close(out.rgb[0], opacity * colour + (1 - opacity) * bg, atol=3e-3, rtol=0)
    # depth = integral of t * sigma * exp(-sigma (t - t_in)) over the chord
    e = math.exp(-sigma * chord)
    depth = t_in * (1 - e) + (1 - e) / sigma - chord * e
    assert out.depth.item() == pytest.approx(depth, abs=5e-3)
    # the whole box diagonal along z is marched with the default step (cap 1024 not reached)
    assert int(out.n_samples) == math.floor(1.0 / (math.sqrt(3) / 1024))
    s = out.t_starts.shape[0]
    assert out.weights.shape == (s,) and out.sigmas.shape == (s,) and out.packed_info.shape == (1, 2)


@pytest.mark.parametrize(("near", "chord"), [(0.0, 0.2), (0.15, 0.1), (0.3, 0.0)])
def test_near_plane_hides_what_lies_closer_to_the_camera(near: float, chord: float) -> None:
    # a dense sphere (z in [0.4, 0.6]) just in front of a camera at z = 0.35: t in [0.05, 0.25]
    sigma = 20.0
    field = SphereField(sigma=sigma, radius=0.1)
    renderer = Renderer(OccupancyGrid(resolution=16), near_plane=near, backend="torch")
    o, d = torch.tensor([[0.5, 0.5, 0.35]]), torch.tensor([[0.0, 0.0, 1.0]])
    bg = torch.tensor([0.0, 0.5, 1.0])
    out = renderer.render_rays(field, o, d, bg, jitter=False)
    assert out.opacity.item() == pytest.approx(1 - math.exp(-sigma * chord), abs=0.02)
    if chord == 0.0:
        torch.testing.assert_close(out.rgb[0], bg)


def test_default_config_sets_the_near_plane_of_the_renderer(tmp_path) -> None:

    from nerf_lightning.run.config import compose_train_config

    cfg = compose_train_config([], tmp_path)
    assert cfg.model.net.renderer.near_plane == 0.2
    module = instantiate_model(cfg.model, {"aabb_scale": 1})
    assert module.renderer.near_plane == 0.2


def test_batch_shapes_misses_and_per_ray_background() -> None:
    field = SphereField()
    renderer = Renderer(OccupancyGrid(resolution=16), backend="torch")
    o = torch.tensor([[0.5, 0.5, -1.0], [5.0, 5.0, -1.0], [0.05, 0.05, -1.0]])
    d = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    bg = torch.rand(3, 3, generator=torch.Generator().manual_seed(0))
    out = renderer.render_rays(field, o, d, bg, jitter=True)
    assert out.rgb.shape == (3, 3) and out.opacity.shape == (3, 1) and out.depth.shape == (3, 1)
    # ray 1 misses the box, ray 2 passes outside the sphere: both show their background
    torch.testing.assert_close(out.rgb[1:], bg[1:])
    assert out.opacity[1:].abs().max() == 0
    assert out.packed_info[1, 1] == 0 and out.packed_info[2, 1] > 0
    assert out.opacity[0].item() == pytest.approx(1 - math.exp(-1.0), abs=4e-3)


def test_zero_samples_give_background_and_backward_works() -> None:
    field = SphereField()
    grid = OccupancyGrid(resolution=16)
    renderer = Renderer(grid, backend="torch")
    o, d = _axis_rays(4)
    o[:, 0] = 7.0  # all rays miss
    out = renderer.render_rays(field, o, d, torch.tensor([0.3, 0.3, 0.3]), jitter=True)
    assert int(out.n_samples) == 0 and out.t_starts.shape == (0,)
    torch.testing.assert_close(out.rgb, torch.full((4, 3), 0.3))
    out.rgb.sum().backward()
    assert field.log_sigma.grad is not None and field.log_sigma.grad == 0
    # an empty grid gives no samples either
    grid.binaries.zero_()
    out = renderer.render_rays(field, *_axis_rays(2), None, jitter=False)
    assert int(out.n_samples) == 0 and out.rgb.abs().max() == 0


def test_gradient_matches_analytic_derivative() -> None:
    sigma, chord = 2.0, 0.5
    field = SphereField(sigma=sigma)
    renderer = Renderer(OccupancyGrid(resolution=16), backend="torch")
    out = renderer.render_rays(field, *_axis_rays(), None, jitter=False)
    out.opacity.sum().backward()
    # d/d(log sigma) of 1 - exp(-sigma L) = sigma L exp(-sigma L)
    assert field.log_sigma.grad.item() == pytest.approx(sigma * chord * math.exp(-sigma * chord), abs=5e-3)
    field.zero_grad()
    out = renderer.render_rays(field, *_axis_rays(), None, jitter=True)
    out.rgb[0, 0].backward()
    assert field.logits.grad[0] > 0 and field.logits.grad[1:].abs().max() == 0


def test_occupancy_skipping_does_not_change_the_image() -> None:
    field = BoxField()
    g = torch.Generator().manual_seed(0)
    o = torch.rand(200, 3, generator=g) * torch.tensor([1.0, 1.0, 0.0]) + torch.tensor([0.0, 0.0, -0.5])
    d = torch.nn.functional.normalize(
        torch.tensor([0.0, 0.0, 1.0]) + 0.3 * torch.randn(200, 3, generator=g), dim=-1
    )
    dense = Renderer(OccupancyGrid(resolution=16), backend="torch")
    grid = OccupancyGrid(resolution=16)
    grid.update(0, field.density)
    assert grid.occupied_fraction() == pytest.approx(0.125)  # exactly the 8^3 cells of the box
    sparse = Renderer(grid, backend="torch")
    a = dense.render_rays(field, o, d, torch.ones(3), jitter=False)
    b = sparse.render_rays(field, o, d, torch.ones(3), jitter=False)
    assert int(b.n_samples) < 0.5 * int(a.n_samples)
    for k in ("rgb", "opacity", "depth"):
        torch.testing.assert_close(getattr(a, k), getattr(b, k), atol=1e-5, rtol=1e-5)
    assert a.opacity.max() > 0.9


def test_render_image_equals_render_rays() -> None:
    field = BoxField()
    grid = OccupancyGrid(resolution=16)
    grid.update(0, field.density)
    renderer = Renderer(grid, backend="torch")
    h = w = 12
    ys, xs = torch.meshgrid(torch.linspace(0.1, 0.9, h), torch.linspace(0.1, 0.9, w), indexing="ij")
    o = torch.stack([xs, ys, torch.full_like(xs, -1.0)], -1).reshape(-1, 3)
    d = torch.tensor([0.0, 0.0, 1.0]).expand(h * w, 3)
    bg = torch.rand(h * w, 3, generator=torch.Generator().manual_seed(1))
    img = renderer.render_image(field, o, d, bg, chunk=50)
    ref = renderer.render_rays(field, o, d, bg, jitter=False)
    for k in ("rgb", "opacity", "depth", "n_samples"):
        torch.testing.assert_close(img[k], getattr(ref, k).detach())
    assert not img["rgb"].requires_grad


def test_renderer_deep_copy_owns_its_buffers() -> None:
    field = BoxField()
    grid = OccupancyGrid(resolution=16, ops="torch")
    grid.update(0, field.density)
    renderer = Renderer(grid, backend="torch")
    o, d = _axis_rays(3)
    o[:, 0] = torch.tensor([0.3, 0.5, 0.6])
    before = renderer.render_rays(field, o, d, torch.ones(3), jitter=False).rgb
    clone = copy.deepcopy(renderer)
    state = {k: v.clone() for k, v in renderer.state_dict().items()}
    assert set(state) == {"occupancy.density_grid", "occupancy.binaries"}
    for k, v in clone.state_dict().items():
        assert torch.equal(v, state[k]) and v.data_ptr() != renderer.state_dict()[k].data_ptr(), k
    # editing the copy (an empty grid: nothing to march) leaves the original and its renders alone
    clone.occupancy.binaries.zero_()
    clone.occupancy.density_grid.fill_(-1.0)
    for k, v in renderer.state_dict().items():
        assert torch.equal(v, state[k]), k
    torch.testing.assert_close(renderer.render_rays(field, o, d, torch.ones(3), jitter=False).rgb, before)
    assert int(clone.render_rays(field, o, d, torch.ones(3), jitter=False).n_samples) == 0
    with pytest.raises(
        ValueError, match=r"^model.net.backend=nope: expected one of auto, cuda, tcnn, torch$"
    ):
        Renderer(OccupancyGrid(resolution=8), backend="nope")


def test_renderer_state_dict_round_trip_and_move_keep_dtypes() -> None:
    field = BoxField()
    grid = OccupancyGrid(aabb_scale=2, resolution=16, ops="torch")
    grid.update(0, field.density)
    renderer = Renderer(grid, backend="torch")
    fresh = Renderer(OccupancyGrid(aabb_scale=2, resolution=16, ops="torch"), backend="torch")
    assert not torch.equal(fresh.occupancy.binaries, renderer.occupancy.binaries)
    fresh.load_state_dict(renderer.state_dict())
    g = torch.Generator().manual_seed(3)
    o = torch.rand(64, 3, generator=g) * torch.tensor([1.0, 1.0, 0.0]) + torch.tensor([0.0, 0.0, -0.5])
    d = torch.nn.functional.normalize(
        torch.tensor([0.0, 0.0, 1.0]) + 0.2 * torch.randn(64, 3, generator=g), dim=-1
    )
    a = renderer.render_rays(field, o, d, None, jitter=False)
    b = fresh.render_rays(field, o, d, None, jitter=False)
    for k in ("rgb", "depth", "n_samples"):
        assert torch.equal(getattr(a, k), getattr(b, k)), k
    # .to() moves every tensor (the meta device stands in for a GPU) and keeps every dtype
    dtypes = {k: v.dtype for k, v in renderer.state_dict().items()}
    assert dtypes == {"occupancy.density_grid": torch.float32, "occupancy.binaries": torch.bool}
    moved = copy.deepcopy(renderer).to("meta")
    assert {k: v.dtype for k, v in moved.state_dict().items()} == dtypes
    assert all(v.device.type == "meta" for v in moved.state_dict().values())
    assert moved.occupancy.aabb.device.type == "meta"


def test_compaction_keeps_outputs_and_gradients_and_drops_terminated_samples() -> None:
    """Dropping samples behind early termination changes neither the image nor the gradients."""
    from nerf_lightning.models.field import NGPField

    torch.manual_seed(0)
    field = NGPField(
        aabb_scale=1,
        encoding=dict(n_levels=4, log2_hashmap_size=10, max_resolution=64),
        density_bias=4.0,
        backend="torch",
    )  # opaque early
    grid = OccupancyGrid(aabb_scale=1, resolution=16)
    rays_o = torch.rand(64, 3) * 0.2 + torch.tensor([0.4, 0.4, -0.5])
    rays_d = torch.nn.functional.normalize(torch.tensor([0.0, 0.0, 1.0]) + 0.1 * torch.randn(64, 3), dim=-1)
    results = {}
    for compact in (False, True):
        renderer = Renderer(grid, step_size=1 / 64, compact_samples=compact, backend="torch")
        field.zero_grad()
        out = renderer.render_rays(field, rays_o, rays_d, torch.ones(3), jitter=False)
        out.rgb.square().sum().backward()
        grads = torch.cat([p.grad.reshape(-1) for p in field.parameters() if p.grad is not None])
        results[compact] = (out.rgb.detach(), out.n_samples, out.n_samples_rendered, grads)
    rgb_full, marched_full, rendered_full, g_full = results[False]
    rgb_compact, marched_compact, rendered_compact, g_compact = results[True]
    torch.testing.assert_close(rgb_compact, rgb_full, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_compact, g_full, rtol=1e-4, atol=1e-7)
    assert marched_compact == marched_full == rendered_full
    assert rendered_compact < 0.5 * rendered_full  # an opaque field terminates rays early
