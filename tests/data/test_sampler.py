"""Ray samplers: sampled frequencies match the stated probabilities, pixels stay inside their view,
loss weighting / uniform floor / warmup / error map behave, no host sync, checkpoints round-trip."""

from __future__ import annotations

import functools

import pytest
import torch

from nerf_lightning.data.sampler import (
    LossWeightedRaySampler,
    RaySampler,
    UniformRaySampler,
    build_sampler,
)

N_DRAWS = 200_000


def _assert_frequencies(counts: torch.Tensor, probs: torch.Tensor, z_max: float = 4.0) -> None:
    """Each bin's count within z_max binomial sigmas of n * p (fixed seeds: deterministic)."""
    n = counts.sum().double()
    p = probs.double()
    expected = n * p
    sigma = (n * p * (1 - p)).sqrt().clamp_min(1e-9)
    z = (counts.double() - expected).abs() / sigma
    assert bool((z < z_max).all()), (
        f"counts {counts.tolist()} vs expected {expected.tolist()} (z={z.tolist()})"
    )


def _feed(sampler: RaySampler, per_view_loss: list[float], step: int, n: int = 4096, seed: int = 0) -> None:
    """One training step: sample, assign each ray its view's loss, update, step."""
    g = torch.Generator().manual_seed(seed + step)
    v, x, y = sampler.sample(n, g)
    sampler.update(v, x, y, torch.tensor(per_view_loss, dtype=torch.float32)[v])
    sampler.step(step)


def _expected_probs(widths, heights, ema, alpha, eps, floor) -> torch.Tensor:
    npix = torch.tensor(widths, dtype=torch.float64) * torch.tensor(heights, dtype=torch.float64)
    e = torch.tensor(ema, dtype=torch.float64)
    w = npix * (e + eps * e.mean()) ** alpha
    return (1 - floor) * w / w.sum() + floor * npix / npix.sum()


WIDTHS, HEIGHTS = [16, 32, 8, 20], [16, 8, 8, 30]


def test_uniform_sampler_is_uniform_over_pixels():
    s = UniformRaySampler(widths=WIDTHS, heights=HEIGHTS)
    v, x, y = s.sample(N_DRAWS, torch.Generator().manual_seed(1))
    assert v.dtype == x.dtype == y.dtype == torch.int64 and v.shape == (N_DRAWS,)
    npix = torch.tensor(WIDTHS) * torch.tensor(HEIGHTS)
    torch.testing.assert_close(s.view_probabilities(), (npix / npix.sum()).float())
    _assert_frequencies(torch.bincount(v, minlength=4), npix / npix.sum())
    # inside view 2 (8 x 8) every pixel equally likely
    m = v == 2
    flat = y[m] * 8 + x[m]
    _assert_frequencies(torch.bincount(flat, minlength=64), torch.full((64,), 1 / 64))


def test_pixels_inside_views_of_different_sizes():
    widths, heights = [7, 13, 5, 64], [5, 11, 9, 4]
    s = LossWeightedRaySampler(widths=widths, heights=heights, warmup_steps=0, update_every=1)
    # skewed losses so the weighted path is what gets sampled
    for step in range(3):
        _feed(s, [5.0, 0.1, 1.0, 0.5], step)
    v, x, y = s.sample(N_DRAWS, torch.Generator().manual_seed(2))
    w, h = torch.tensor(widths)[v], torch.tensor(heights)[v]
    assert bool(((x >= 0) & (x < w) & (y >= 0) & (y < h)).all())
    # every pixel of every view is reachable
    for view, (wi, hi) in enumerate(zip(widths, heights, strict=True)):
        m = v == view
        assert torch.unique(y[m] * wi + x[m]).numel() == wi * hi


def test_fixed_weights_frequencies_match_probabilities():
    ema = [0.5, 0.0625, 2.0, 0.25]  # dyadic: float32 sums are exact
    s = LossWeightedRaySampler(
        widths=WIDTHS, heights=HEIGHTS, alpha=1.0, eps=1e-2, uniform_floor=0.1, warmup_steps=0, update_every=1
    )
    _feed(s, ema, 0)  # first window initializes the EMA to the window mean exactly
    torch.testing.assert_close(s.ema, torch.tensor(ema, dtype=torch.float64), rtol=1e-6, atol=0)
    expected = _expected_probs(WIDTHS, HEIGHTS, ema, 1.0, 1e-2, 0.1)
    torch.testing.assert_close(s.view_probabilities().double(), expected, rtol=1e-6, atol=1e-7)
    v, _, _ = s.sample(N_DRAWS, torch.Generator().manual_seed(3))
    _assert_frequencies(torch.bincount(v, minlength=4), expected)


def test_alpha_and_unscaled_mode():
    ema = [1.0, 2.0, 4.0, 8.0]
    s = LossWeightedRaySampler(
        widths=WIDTHS,
        heights=HEIGHTS,
        alpha=0.5,
        eps=0.0,
        uniform_floor=0.0,
        warmup_steps=0,
        update_every=1,
        scale_by_pixel_count=False,
    )
    _feed(s, ema, 0)
    expected = torch.tensor(ema, dtype=torch.float64).sqrt()
    torch.testing.assert_close(s.view_probabilities().double(), expected / expected.sum(), rtol=1e-6, atol=0)


def test_uniform_floor_is_respected():
    f = 0.2
    s = LossWeightedRaySampler(
        widths=[8] * 4, heights=[8] * 4, alpha=1.0, eps=0.0, uniform_floor=f, warmup_steps=0, update_every=1
    )
    _feed(s, [100.0, 0.0, 0.0, 0.0], 0)
    expected = torch.tensor([1 - f + f / 4, f / 4, f / 4, f / 4], dtype=torch.float64)
    torch.testing.assert_close(s.view_probabilities().double(), expected, rtol=1e-6, atol=0)
    v, _, _ = s.sample(N_DRAWS, torch.Generator().manual_seed(4))
    _assert_frequencies(torch.bincount(v, minlength=4), expected)


def test_warmup_is_uniform_then_weighted():
    s = LossWeightedRaySampler(widths=WIDTHS, heights=HEIGHTS, warmup_steps=20, update_every=8)
    uniform = s.view_probabilities().clone()
    for step in range(19):
        _feed(s, [10.0, 0.1, 0.1, 0.1], step)
        torch.testing.assert_close(s.view_probabilities(), uniform, rtol=0, atol=0)
    assert bool(s.seen.all())  # the EMA filled during warmup (windows at steps 7 and 15)
    _feed(s, [10.0, 0.1, 0.1, 0.1], 19)  # step 20 done: weights switch on without waiting for the window
    p = s.view_probabilities()
    assert p[0] > 3 * uniform[0], (p, uniform)


def test_higher_loss_views_sampled_more_after_updates():
    s = LossWeightedRaySampler(widths=[16] * 5, heights=[16] * 5, warmup_steps=0, update_every=4)
    losses = [0.125, 0.25, 0.5, 1.0, 2.0]
    for step in range(16):
        _feed(s, losses, step)
    v, _, _ = s.sample(N_DRAWS, torch.Generator().manual_seed(5))
    counts = torch.bincount(v, minlength=5)
    assert bool((counts[1:] > counts[:-1]).all()), counts
    # and the EMA converged to the constant losses
    torch.testing.assert_close(s.ema, torch.tensor(losses, dtype=torch.float64), rtol=1e-5, atol=0)


def test_unseen_views_keep_their_ema_and_window_decay():
    s = LossWeightedRaySampler(widths=[4, 4], heights=[4, 4], warmup_steps=0, update_every=1, ema_decay=0.5)
    s.update(torch.tensor([0, 1]), torch.tensor([0, 0]), torch.tensor([0, 0]), torch.tensor([2.0, 4.0]))
    s.step(0)
    # window 2: only view 0 seen, mean 6 → 0.5 * 2 + 0.5 * 6 = 4; view 1 keeps 4
    s.update(torch.tensor([0, 0]), torch.tensor([0, 1]), torch.tensor([0, 0]), torch.tensor([5.0, 7.0]))
    s.step(1)
    torch.testing.assert_close(s.ema, torch.tensor([4.0, 4.0], dtype=torch.float64))
    # a non-finite loss does not poison the weights
    s.update(torch.tensor([1]), torch.tensor([0]), torch.tensor([0]), torch.tensor([float("nan")]))
    s.step(2)
    torch.testing.assert_close(s.ema, torch.tensor([4.0, 4.0], dtype=torch.float64))
    assert bool(torch.isfinite(s.cdf).all())


def test_no_host_sync_on_cpu(monkeypatch):
    """sample / update / step (with a probability recompute) never read a tensor value on the host."""
    s = LossWeightedRaySampler(widths=WIDTHS, heights=HEIGHTS, warmup_steps=2, update_every=2)
    g = torch.Generator().manual_seed(7)

    def forbidden(*args, **kwargs):
        raise AssertionError("host sync in the sampler hot path")

    for name in ("item", "tolist", "numpy", "__bool__", "__int__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    for step in range(4):
        v, x, y = s.sample(1024, g)
        s.update(v, x, y, (v.float() + 1) * 0.1)
        s.step(step)
    monkeypatch.undo()
    assert bool(s.seen.any()) and not torch.equal(s.view_probs, UniformRaySampler(WIDTHS, HEIGHTS).view_probs)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_no_host_sync_on_cuda():
    s = LossWeightedRaySampler(widths=WIDTHS, heights=HEIGHTS, warmup_steps=2, update_every=2).to("cuda")
    g = torch.Generator(device="cuda").manual_seed(8)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(4):
            v, x, y = s.sample(4096, g)
            s.update(v, x, y, (v.float() + 1) * 0.1)
            s.step(step)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert v.is_cuda and s.cdf.is_cuda and s._acc_sum.is_cuda
    assert bool(s.seen.any())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sample_kernel_equals_the_torch_path_on_cuda():
    """``ops.cuda.sample_pixels`` (what ``sample`` runs on a GPU) against ``_pixels_of``, the same
    uniforms, after the losses have moved the distribution away from uniform."""
    s = LossWeightedRaySampler(widths=WIDTHS, heights=HEIGHTS, warmup_steps=0, update_every=1).to("cuda")
    g = torch.Generator(device="cuda").manual_seed(3)
    v, x, y = s.sample(20_000, g)
    s.update(v, x, y, (x.float() + 1) * 0.01 + v.float())
    s.step(1)
    u = torch.rand(3, 200_000, generator=g, device="cuda", dtype=torch.float64)
    u[0, :4] = torch.tensor([0.0, 1.0 - 1e-16, 0.5, 0.999999], dtype=torch.float64)  # the CDF's ends
    from nerf_lightning.ops import cuda_ops

    got = cuda_ops().sample_pixels(u, s.cdf, s.widths, s.heights, 1)
    want = s._pixels_of(u)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def test_checkpoint_round_trip_is_exact():
    kw = dict(widths=WIDTHS, heights=HEIGHTS, warmup_steps=0, update_every=4)
    a = LossWeightedRaySampler(**kw)
    for step in range(6):  # ends mid-window: accumulators hold two steps
        _feed(a, [0.3, 1.0, 0.1, 0.7], step)
    b = LossWeightedRaySampler(**kw)
    b.load_state_dict(a.state_dict())
    for name in ("view_probs", "cdf", "ema", "seen"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    sa = a.sample(1000, torch.Generator().manual_seed(9))
    sb = b.sample(1000, torch.Generator().manual_seed(9))
    assert all(torch.equal(p, q) for p, q in zip(sa, sb, strict=True))
    # the in-flight window was restored too: finishing it gives identical weights
    for step in (6, 7):
        _feed(a, [0.3, 1.0, 0.1, 0.7], step)
        _feed(b, [0.3, 1.0, 0.1, 0.7], step)
    assert torch.equal(a.view_probs, b.view_probs) and torch.equal(a.cdf, b.cdf)


def test_checkpoint_from_other_views_is_rejected():
    a = LossWeightedRaySampler(widths=WIDTHS, heights=HEIGHTS)
    b = LossWeightedRaySampler(widths=[16, 32, 8, 21], heights=HEIGHTS)
    sizes = "4 sizes from 8x8 to 32x8 pixels"
    with pytest.raises(RuntimeError, match=f"training views are {sizes}, this run's 4 are {sizes}: were the"):
        b.load_state_dict(a.state_dict())
    halved = LossWeightedRaySampler(widths=[w // 2 for w in WIDTHS], heights=[h // 2 for h in HEIGHTS])
    with pytest.raises(RuntimeError, match="this run's 4 are 4 sizes from 4x4 to 16x4 pixels"):
        halved.load_state_dict(a.state_dict())
    square = UniformRaySampler(widths=[40] * 3, heights=[40] * 3)
    expected = "the checkpoint's 3 training views are 40x40 pixels, this run's 2 are 20x20 pixels"
    with pytest.raises(RuntimeError, match=expected):
        UniformRaySampler(widths=[20] * 2, heights=[20] * 2).load_state_dict(square.state_dict())


def test_dtype_casts_keep_sampler_state():
    s = LossWeightedRaySampler(widths=WIDTHS, heights=HEIGHTS, warmup_steps=0, update_every=1)
    s.half()
    s.to(torch.bfloat16)
    assert (
        s.cdf.dtype == torch.float64 and s.widths.dtype == torch.int64 and s._acc_sum.dtype == torch.float32
    )
    _feed(s, [1.0, 2.0, 3.0, 4.0], 0)
    assert bool(torch.isfinite(s.cdf).all())


def test_build_sampler_and_partial_construction():
    assert isinstance(build_sampler("uniform", WIDTHS, HEIGHTS), UniformRaySampler)
    s = build_sampler("loss_weighted", WIDTHS, HEIGHTS, alpha=2.0)
    assert isinstance(s, LossWeightedRaySampler) and s.alpha == 2.0
    with pytest.raises(ValueError, match="unknown sampler 'importance'"):
        build_sampler("importance", WIDTHS, HEIGHTS)
    # what Hydra's `_partial_: true` produces, completed at setup time
    part = functools.partial(LossWeightedRaySampler, alpha=0.5, warmup_steps=4)
    s = part(widths=torch.tensor(WIDTHS), heights=torch.tensor(HEIGHTS))
    assert s.alpha == 0.5 and s.warmup_steps == 4 and s.num_views == 4


def test_hydra_partial_instantiate():
    hydra_utils = pytest.importorskip("hydra.utils")
    cfg = {
        "_target_": "nerf_lightning.data.sampler.LossWeightedRaySampler",
        "_partial_": True,
        "alpha": 1.5,
        "uniform_floor": 0.3,
    }
    s = hydra_utils.instantiate(cfg)(widths=WIDTHS, heights=HEIGHTS)
    assert isinstance(s, LossWeightedRaySampler) and s.alpha == 1.5 and s.uniform_floor == 0.3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(widths=[4, 4], heights=[4]), "one entry per view"),
        (dict(widths=[4.0], heights=[4]), "integers"),
        (dict(widths=[0], heights=[4]), "positive"),
        (dict(widths=[], heights=[]), "non-empty"),
        (dict(widths=[4], heights=[4], uniform_floor=1.5), "uniform_floor"),
        (dict(widths=[4], heights=[4], ema_decay=1.0), "ema_decay"),
        (dict(widths=[4], heights=[4], update_every=0), "update_every"),
        (dict(widths=[4], heights=[4], alpha=-1), "alpha"),
    ],
)
def test_bad_arguments_are_explained(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LossWeightedRaySampler(**kwargs)


def test_update_rejects_mismatched_shapes():
    s = LossWeightedRaySampler(widths=WIDTHS, heights=HEIGHTS)
    with pytest.raises(ValueError, match="1-D of one length"):
        s.update(
            torch.zeros(4, dtype=torch.long),
            torch.zeros(4, dtype=torch.long),
            torch.zeros(4, dtype=torch.long),
            torch.zeros(3),
        )


def test_windows_on_a_clock_of_three_reference_steps_per_step():
    """With the training clock's ticks (``training/clock.py``, k = 3 reference steps per optimizer step) a
    window folds on each step whose count of reference steps passes a multiple of ``update_every`` (in the
    sampler's count, one ahead of the clock's position: ``(p - 2, p + 1]``), and the weights take over on
    the step that passes ``warmup_steps``; never twice per step."""
    from dataclasses import replace

    from nerf_lightning.training.batch_rules import large_batch
    from nerf_lightning.training.clock import TrainingClock

    clock = TrainingClock(replace(large_batch(), rank_multiple=3))
    s = LossWeightedRaySampler(widths=WIDTHS, heights=HEIGHTS, warmup_steps=8, update_every=4, alpha=1.0)
    folds, weights = [], []
    fold, recompute = s._fold, s._recompute

    def recorded_fold(*args):
        folds.append(step)
        fold(*args)

    def recorded_recompute(weighted: bool) -> None:
        weights.append(weighted)
        recompute(weighted=weighted)

    s._fold, s._recompute = recorded_fold, recorded_recompute
    for step in range(1, 11):
        g = torch.Generator().manual_seed(step)
        v, x, y = s.sample(256, g)
        s.update(v, x, y, torch.tensor([1.0, 2.0, 3.0, 4.0])[v])
        s.step(clock.tick(step))
    # a naive count: step s covers sampler counts 3s - 1 .. 3s + 1 (positions 3s - 2 .. 3s, one ahead)
    expected = [st for st in range(1, 11) if any(m % 4 == 0 for m in range(3 * st - 1, 3 * st + 2))]
    assert folds == expected == [1, 3, 4, 5, 7, 8, 9]
    assert weights == [st >= 3 for st in expected]  # 8 reached by step 3 (counts 8..10)
