"""Learning-rate schedule: instant-ngp's step decay (tiny-cuda-nn ``ExponentialDecay``) in closed form.

tiny-cuda-nn multiplies the learning-rate factor by ``decay_base`` at every step ``s`` with
``s >= decay_start`` and ``(s - decay_start) % decay_interval == 0``, so optimizer step ``s`` (0-based)
runs with ``lr * decay_base ** (floor((s - decay_start) / decay_interval) + 1)`` once ``s >= decay_start``
and with ``lr`` before. The expected values below are written out from that rule, step by step.
"""

from __future__ import annotations

import pytest
import torch

from nerf_lightning.training.lr_schedules import ngp_exponential_decay


def _lrs_of_a_run(n_steps: int, **kwargs) -> list[float]:
    """The learning rate each optimizer step 0..n_steps-1 actually runs with (read before ``step()``)."""
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1e-2)
    sched = ngp_exponential_decay(opt, **kwargs)
    lrs = []
    for _ in range(n_steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()  # (no gradient: a no-op update, only the step order the scheduler expects)
        sched.step()
    return lrs


def test_step_counts() -> None:
    """instant-ngp's schedule shape (start 20k, interval 10k, base 0.33), at 1/100 of its length:
    values > 1 are step counts, not fractions of the run."""
    lrs = _lrs_of_a_run(351, total_steps=350, decay_start=200, decay_interval=100, decay_base=0.33)
    expected = {
        0: 1e-2,
        199: 1e-2,
        200: 1e-2 * 0.33,  # the first decay happens AT decay_start
        299: 1e-2 * 0.33,
        300: 1e-2 * 0.33**2,
        350: 1e-2 * 0.33**2,
    }
    for step, lr in expected.items():
        assert lrs[step] == pytest.approx(lr, rel=1e-12), step


def test_fractions_of_the_run() -> None:
    """Default config: decay from 50% of the run, every 15% of it (here 1000 steps: 500, 650, 800, 950)."""
    lrs = _lrs_of_a_run(1000, total_steps=1000, decay_start=0.5, decay_interval=0.15, decay_base=0.33)
    expected = {
        0: 1.0,
        499: 1.0,
        500: 0.33,
        649: 0.33,
        650: 0.33**2,
        799: 0.33**2,
        800: 0.33**3,
        950: 0.33**4,
    }
    for step, factor in expected.items():
        assert lrs[step] == pytest.approx(1e-2 * factor, rel=1e-12), step
    # never zero, never increasing
    assert min(lrs) > 0 and all(b <= a for a, b in zip(lrs, lrs[1:], strict=False))
