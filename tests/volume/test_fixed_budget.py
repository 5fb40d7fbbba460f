"""The budgeted training path (static shapes) against the dynamic renderer, on the CPU reference."""

from __future__ import annotations

import pytest
import torch

from nerf_lightning.models.field import NGPField
from nerf_lightning.models.loss import StepLoss
from nerf_lightning.models.train_step import FieldsStep, StepStats, TrainStep, buffers_kept
from nerf_lightning.volume.occupancy import OccupancyGrid
from nerf_lightning.volume.renderer import Renderer, SampleBudget, ray_distortion, render_counts
from tests.ray_batches import ray_batch

ENC = dict(n_levels=4, log2_hashmap_size=12, base_resolution=4, max_resolution=32)


def _setup(seed: int = 0, compact: bool = True):
    torch.manual_seed(seed)
    # dense enough to terminate rays
    field = NGPField(encoding=ENC, hidden_dim=16, density_bias=2.0, backend="torch")
    with torch.no_grad():
        field.encoding.params.uniform_(-1.0, 1.0)
    renderer = Renderer(
        OccupancyGrid(resolution=16), step_size=0.02, backend="torch", compact_samples=compact
    )
    gen = torch.Generator().manual_seed(seed + 1)
    renderer.occupancy.binaries.copy_(torch.rand(renderer.occupancy.binaries.shape, generator=gen) < 0.6)
    o = torch.rand(24, 3, generator=gen) * 0.4 + 0.3 + torch.tensor([0.0, 0.0, -1.0])
    d = torch.nn.functional.normalize(
        torch.randn(24, 3, generator=gen) * 0.2 + torch.tensor([0, 0, 1.0]), dim=-1
    )
    bg = torch.rand(24, 3, generator=gen)
    return field, renderer, o, d, bg


def _grads(field):
    return [p.grad.clone() for p in field.parameters()]


@pytest.mark.parametrize("compact", [True, False])
def test_fixed_render_equals_dynamic_render_when_everything_fits(compact: bool) -> None:
    field, renderer, o, d, bg = _setup(compact=compact)
    dyn = renderer.render_rays(field, o, d, bg, jitter=False)
    dyn.rgb.square().sum().backward()
    g_dyn = _grads(field)
    field.zero_grad()
    fixed = renderer.render_rays(
        field, o, d, bg, jitter=False, budget=SampleBudget(4096, 4096)
    )
    fixed.rgb.square().sum().backward()
    assert fixed.ray_valid.all()
    assert fixed.t_starts.shape == (4096,)
    torch.testing.assert_close(fixed.rgb, dyn.rgb, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fixed.depth, dyn.depth, rtol=1e-5, atol=1e-6)
    counts = render_counts(fixed)
    assert int(counts["n_samples"]) == int(dyn.n_samples)
    assert int(counts["n_samples_rendered"]) == int(dyn.n_samples_rendered)
    for a, b in zip(_grads(field), g_dyn, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_fixed_render_drops_whole_rays_that_do_not_fit() -> None:
    field, renderer, o, d, bg = _setup()
    dyn = renderer.render_rays(field, o, d, bg, jitter=False)
    rendered = dyn.packed_info[:, 1]
    cap = int(rendered[:10].sum())
    fixed = renderer.render_rays(
        field, o, d, bg, jitter=False, budget=SampleBudget(4096, cap)
    )
    valid = fixed.ray_valid
    n_valid = int(valid.sum())
    assert n_valid >= 10 and not valid[n_valid:].any() and valid[:n_valid].all()
    assert int(rendered[:n_valid].sum()) <= cap
    torch.testing.assert_close(fixed.rgb[valid], dyn.rgb[valid], rtol=1e-5, atol=1e-6)
    # marching budget: rays are dropped before the density pass too
    marched = renderer.render_rays(field, o, d, bg, jitter=False).n_samples
    small = renderer.render_rays(
        field, o, d, bg, jitter=False, budget=SampleBudget(int(marched) // 2, 4096)
    )
    counts = render_counts(small)
    assert 0 < int(counts["n_rays"]) < 24 and int(counts["n_samples"]) <= int(marched) // 2


def test_budget_step_loss_is_the_mean_over_valid_rays_and_the_ray_count_adapts() -> None:
    field, renderer, o, d, bg = _setup()
    target = torch.rand(24, 3, generator=torch.Generator().manual_seed(5))

    def per_ray(pred, tgt):
        return ((pred - tgt) ** 2).mean(-1)

    step = TrainStep(
        field,
        renderer,
        StepLoss("mse"),
        sample_budget=300,
        march_budget=1200,
        n_rays_init=24,
        min_rays=2,
        jitter=False,
    )
    loss, per_ray_loss, valid, stats_tensor = step(ray_batch(o, d, target, bg))
    stats = StepStats.of(stats_tensor)
    dyn = renderer.render_rays(field, o, d, bg, jitter=False)
    expected = per_ray(dyn.rgb, target)[valid].mean()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-7)
    assert (per_ray_loss[~valid] == 0).all()
    n_valid, marched = float(stats.rays), float(stats.marched_samples)
    rendered = float(stats.rendered_samples)
    assert n_valid == int(valid.sum()) and rendered <= 300 and marched <= 1200
    # the same layout rendered alone (the first 24 rays, the step's budgets): the same sample counts
    layout = SampleBudget(1200, 300, torch.tensor(24))
    alone = render_counts(renderer.render_rays(field, o, d, bg, jitter=False, budget=layout))
    assert (marched, rendered) == (float(alone["n_samples"]), float(alone["n_samples_rendered"]))
    # the summed squared error of the valid rays, over the channels' mean
    expected_sq = ((dyn.rgb - target) ** 2).mean(-1)[valid].sum()
    torch.testing.assert_close(stats.squared_error, expected_sq.double(), rtol=1e-5, atol=1e-7)
    # the next ray count is the one whose samples fill the budget: rays * budget / rendered
    target_rays = min(0.98 * 300 / (rendered / n_valid), 0.98 * 1200 / (marched / n_valid))
    assert float(step.n_active_f) == pytest.approx(0.5 * 24 + 0.5 * min(target_rays, 24), rel=1e-5)
    assert int(step.n_active) == round(float(step.n_active_f))


def test_budget_step_adds_the_distortion_loss_of_the_valid_rays() -> None:
    field, renderer, o, d, bg = _setup()
    target = torch.rand(24, 3, generator=torch.Generator().manual_seed(5))
    kw = dict(sample_budget=300, march_budget=1200, n_rays_init=24, min_rays=2, jitter=False)
    plain, _, valid, _ = TrainStep(field, renderer, StepLoss("mse"), **kw)(ray_batch(o, d, target, bg))
    step = TrainStep(field, renderer, StepLoss("mse", distortion_weight=0.5), **kw)
    regularized, _, valid_r, _ = step(ray_batch(o, d, target, bg))
    assert torch.equal(valid, valid_r) and 0 < int(valid.sum()) < 24
    fixed = renderer.render_rays(
        field, o, d, bg, jitter=False, budget=SampleBudget(1200, 300, torch.tensor(24))
    )
    dist = ray_distortion(fixed, renderer.ops)
    assert float(dist[valid].mean()) > 0
    torch.testing.assert_close(regularized, plain + 0.5 * dist[valid].mean(), rtol=1e-5, atol=1e-7)


def test_budget_step_adds_the_opacity_loss_of_the_valid_rays() -> None:
    """``alpha_weight``: the mean over the valid rays of (opacity - alpha)^2, against the dynamic
    renderer's opacity; the dropped rays' slots (opacity 0, any alpha) are left out."""
    field, renderer, o, d, bg = _setup()
    gen = torch.Generator().manual_seed(5)
    target, alpha = torch.rand(24, 3, generator=gen), torch.rand(24, generator=gen)
    kw = dict(sample_budget=300, march_budget=1200, n_rays_init=24, min_rays=2, jitter=False)
    plain, _, valid, _ = TrainStep(field, renderer, StepLoss("mse"), **kw)(ray_batch(o, d, target, bg))
    step = TrainStep(field, renderer, StepLoss("mse", alpha_weight=0.5), **kw)
    views = torch.zeros(24, dtype=torch.int64)
    weighted, _, valid_a, _ = step(ray_batch(o, d, target, bg, views, alpha))
    assert torch.equal(valid, valid_a) and 0 < int(valid.sum()) < 24
    opacity = renderer.render_rays(field, o, d, bg, jitter=False).opacity[:, 0]
    expected = ((opacity - alpha)[valid] ** 2).mean()
    assert float(expected) > 1e-3
    torch.testing.assert_close(weighted, plain + 0.5 * expected, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="alpha_weight > 0 needs the rays' target alpha"):
        step(ray_batch(o, d, target, bg))


def test_distortion_runs_through_the_renderers_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """The step calls ``distortion_loss`` of ``renderer.ops`` (the CUDA kernel on a GPU), never a
    reference function bound at import time."""
    from nerf_lightning.ops import reference as ref

    calls = []
    real = ref.distortion_loss

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(ref, "distortion_loss", counted)  # renderer.ops is the reference module here
    field, renderer, o, d, bg = _setup()
    target = torch.rand(24, 3, generator=torch.Generator().manual_seed(5))
    kw = dict(sample_budget=300, march_budget=1200, n_rays_init=24, min_rays=2, jitter=False)
    TrainStep(field, renderer, StepLoss("mse", distortion_weight=0.5), **kw)(ray_batch(o, d, target, bg))
    assert calls == [(300,)]
    TrainStep(field, renderer, StepLoss("mse"), **kw)(ray_batch(o, d, target, bg))
    assert len(calls) == 1  # weight 0: not run


def test_budget_step_follows_the_batch_rule_capacity_and_the_clock_rate() -> None:
    """``set_capacity_scale(2)``: twice the budgets and twice the first step's rays; ``set_clock_rate(2)``
    (a step of two reference steps): the ray-count estimate keeps 0.5^2 of the previous one."""
    field, renderer, o, d, bg = _setup()
    target = torch.rand(24, 3, generator=torch.Generator().manual_seed(5))
    step = TrainStep(
        field, renderer, StepLoss("mse"), sample_budget=150, march_budget=600, n_rays_init=12, min_rays=2,
        jitter=False
    )
    step.set_capacity_scale(2.0)
    step.set_clock_rate(2.0)
    assert (step.sample_budget, step.march_budget, int(step.n_active)) == (300, 1200, 24)
    stats = StepStats.of(step(ray_batch(o, d, target, bg))[3])
    n_valid, marched = float(stats.rays), float(stats.marched_samples)
    rendered = float(stats.rendered_samples)
    target_rays = min(0.98 * 300 / (rendered / n_valid), 0.98 * 1200 / (marched / n_valid))
    assert float(step.n_active_f) == pytest.approx(0.25 * 24 + 0.75 * min(target_rays, 24), rel=1e-5)
    adapted = int(step.n_active)
    step.set_capacity_scale(1.5, 1 / 1.5)  # throughput's headroom: the same work aimed at, rays kept
    assert (step.sample_budget, int(step.n_active)) == (225, adapted)


def test_a_graphs_inputs_and_the_buffers_its_warm_up_changes() -> None:
    """What both captures (``capture``, ``capture_update``) build on: the step as a callable of the batch's
    read fields, fed the batch's own tensors or copies, and its ray count restored after warm-up calls."""
    field, renderer, o, d, bg = _setup()
    target = torch.rand(24, 3, generator=torch.Generator().manual_seed(5))
    kw = dict(sample_budget=300, march_budget=1200, n_rays_init=24, min_rays=2, jitter=False)
    step = TrainStep(field, renderer, StepLoss("mse"), **kw)
    batch = ray_batch(o, d, target, bg)
    shared, inputs = FieldsStep.of(step, batch, share_inputs=True)
    assert shared.names == ("rays_o", "rays_d", "rgb", "background")
    assert [t.data_ptr() for t in inputs] == [t.data_ptr() for t in (o, d, target, bg)]
    copied, copies = FieldsStep.of(step, batch, share_inputs=False)
    pairs = zip(copies, inputs, strict=True)
    assert all(a.data_ptr() != b.data_ptr() and torch.equal(a, b) for a, b in pairs)
    with buffers_kept(step):
        loss, *_ = shared(*inputs)
        assert int(step.n_active) != 24  # the call adapted the ray count
    assert int(step.n_active) == 24 and float(step.n_active_f) == 24.0
    torch.testing.assert_close(copied(*copies)[0], loss)
