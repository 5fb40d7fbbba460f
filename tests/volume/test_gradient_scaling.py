"""Near-camera gradient scaling: identity forward, gradients scaled by min(1, (t / d)^2) per sample."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nerf_lightning.run.model_node import instantiate_model
from nerf_lightning.volume.gradient_scaling import scale_near_gradients
from nerf_lightning.volume.occupancy import OccupancyGrid
from nerf_lightning.volume.renderer import Renderer, SampleBudget


def test_values_pass_through_and_gradients_scale_quadratically_up_to_the_distance() -> None:
    sigmas = torch.tensor([3.0, 1.0, 2.0, 5.0], requires_grad=True)
    rgbs = torch.rand(4, 3, requires_grad=True)
    # midpoints 0.25, 0.5, 1.0 and 2.0
    t_starts = torch.tensor([0.2, 0.45, 0.95, 1.9])
    t_ends = torch.tensor([0.3, 0.55, 1.05, 2.1])
    s, c = scale_near_gradients(sigmas, rgbs, t_starts, t_ends, distance=1.0)
    assert torch.equal(s, sigmas) and torch.equal(c, rgbs)
    upstream_s = torch.tensor([1.0, -2.0, 4.0, 0.5])
    upstream_c = torch.arange(12.0).reshape(4, 3)
    (s * upstream_s).sum().add((c * upstream_c).sum()).backward()
    factor = torch.tensor([0.0625, 0.25, 1.0, 1.0])
    torch.testing.assert_close(sigmas.grad, upstream_s * factor)
    torch.testing.assert_close(rgbs.grad, upstream_c * factor[:, None])


class _RecordingField(nn.Module):
    """A slab of constant density (z in [0.4, 0.6]) whose outputs are kept to read their gradients."""

    def __init__(self) -> None:
        super().__init__()
        self.sigma = nn.Parameter(torch.tensor(3.0))
        self.colour = nn.Parameter(torch.tensor([0.2, 0.6, 0.9]))
        self.outputs: tuple[torch.Tensor, torch.Tensor] | None = None

    def density(self, positions: torch.Tensor) -> torch.Tensor:
        inside = (positions[:, 2] > 0.4) & (positions[:, 2] < 0.6)
        return torch.where(inside, self.sigma, torch.zeros(()))

    def forward(self, positions: torch.Tensor, directions: torch.Tensor):
        sigmas = self.density(positions)
        rgbs = self.colour.expand(positions.shape[0], 3) * 1.0
        if torch.is_grad_enabled():
            sigmas.retain_grad()
            rgbs.retain_grad()
        self.outputs = (sigmas, rgbs)
        return sigmas, rgbs


def _render(distance: float | None, fixed: bool):
    field = _RecordingField()
    renderer = Renderer(
        OccupancyGrid(resolution=16),
        step_size=0.02,
        near_plane=0.0,
        backend="torch",
        gradient_scaling_distance=distance,
    )
    # cameras at z = 0.3 looking along +z: the slab spans t in [0.1, 0.3], the box exit is t = 0.7
    o = torch.tensor([[0.5, 0.5, 0.3], [0.3, 0.6, 0.3]])
    d = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    bg = torch.tensor([1.0, 1.0, 1.0])
    if fixed:
        out = renderer.render_rays(
            field, o, d, bg, jitter=False, budget=SampleBudget(256, 256)
        )
    else:
        out = renderer.render_rays(field, o, d, bg, jitter=False)
    out.rgb.sub(0.5).square().sum().backward()
    sigmas, rgbs = field.outputs
    return out, sigmas.grad, rgbs.grad, field.sigma.grad


@pytest.mark.parametrize("fixed", [False, True])
def test_renderer_scales_each_samples_gradient_by_its_distance_from_the_camera(fixed: bool) -> None:
    out, g_sigma, g_rgb, g_param = _render(None, fixed)
    out_s, g_sigma_s, g_rgb_s, g_param_s = _render(0.5, fixed)
    torch.testing.assert_close(out_s.rgb, out.rgb)  # forward unchanged
    t_mid = 0.5 * (out.t_starts + out.t_ends)
    factor = (t_mid / 0.5).square().clamp_max(1.0)
    assert 0 < float(factor[g_sigma != 0].min()) < 0.05 and float(factor.max()) == 1.0
    torch.testing.assert_close(g_sigma_s, g_sigma * factor)
    torch.testing.assert_close(g_rgb_s, g_rgb * factor[:, None])
    # the slab lies at t <= 0.3 < 0.5: the density parameter's gradient shrinks
    assert abs(float(g_param_s)) < 0.4 * abs(float(g_param))


def test_rendering_without_gradients_is_unaffected_and_bad_distances_are_refused() -> None:
    field = _RecordingField()
    renderer = Renderer(OccupancyGrid(resolution=16), backend="torch", gradient_scaling_distance=1.0)
    with torch.no_grad():
        o, d = torch.tensor([[0.5, 0.5, 0.3]]), torch.tensor([[0.0, 0.0, 1.0]])
        out = renderer.render_rays(field, o, d, None, jitter=False)
    assert out.rgb.grad_fn is None
    with pytest.raises(ValueError, match="gradient_scaling_distance"):
        Renderer(OccupancyGrid(resolution=16), gradient_scaling_distance=0.0)


def test_the_config_key_reaches_the_renderer(tmp_path) -> None:

    from nerf_lightning.run.config import compose_train_config

    cfg = compose_train_config(["model.net.renderer.gradient_scaling_distance=0.75"], tmp_path)
    module = instantiate_model(cfg.model, {"aabb_scale": 1})
    assert module.renderer.gradient_scaling_distance == 0.75
    assert compose_train_config([], tmp_path).model.net.renderer.gradient_scaling_distance == 1.0
    off = compose_train_config(["model.net.renderer.gradient_scaling_distance=null"], tmp_path)
    assert instantiate_model(off.model, {"aabb_scale": 1}).renderer.gradient_scaling_distance is None
