"""The fixed-budget training step's ray count (``models/train_step.py``): instant-ngp's rule that
sizes the next batch so that its samples fill the budgets."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["adapt_ray_count"]


@torch.no_grad()
def adapt_ray_count(
    aux: Tensor, ray_valid: Tensor, marched_counts: Tensor, rendered_counts: Tensor,
    n_active: Tensor, n_active_f: Tensor, target_fraction: Tensor,
    *, sample_budget: int, march_budget: int, min_rays: int, n_slots: int, momentum: float,
) -> Tensor:  # fmt: skip
    """Next step's ray count under a fixed sample budget, and this step's statistics.

    instant-ngp's rule ``rays * budget / measured samples``, for both budgets, smoothed and
    clamped; in float32, in this order::

        rays = max(float(n_valid), 1)
        per_ray_rendered = max(float(n_rendered) / rays, 0.25)
        per_ray_marched = max(float(n_marched) / rays, 0.25)
        fill = 0.98 * target_fraction          # just under the budgets: an overflow drops rays
        want = min(fill * sample_budget / per_ray_rendered, fill * march_budget / per_ray_marched)
        n_active_f = clamp(momentum * n_active_f + (1 - momentum) * want, min_rays, n_slots)
        n_active = round_half_even(n_active_f)

    Args:
        aux: float64 [2] of :func:`masked_ray_loss` (n_valid, squared-error sum).
        ray_valid: bool [R]; marched_counts: int64 [R] samples marched per ray (counted for valid
            rays only); rendered_counts: int64 [R] samples in the differentiable pass per ray.
        n_active: int64 scalar, updated in place; n_active_f: float32 scalar, updated in place;
        target_fraction: float32 scalar, share of the budgets aimed at.
        sample_budget, march_budget: the two capacities; min_rays, n_slots: the clamp range;
        momentum: weight of the previous estimate.

    Returns:
        float64 [4]: (valid rays, marched samples of valid rays, rendered samples, squared-error sum).
    """
    n_marched = (marched_counts * ray_valid).sum()
    n_rendered = rendered_counts.sum()
    rays = aux[0].float().clamp_min(1.0)
    per_ray_rendered = (n_rendered.float() / rays).clamp_min(0.25)
    per_ray_marched = (n_marched.float() / rays).clamp_min(0.25)
    fill = 0.98 * target_fraction
    want = torch.minimum(fill * sample_budget / per_ray_rendered, fill * march_budget / per_ray_marched)
    new = (momentum * n_active_f + (1.0 - momentum) * want).clamp(min=float(min_rays), max=float(n_slots))
    n_active_f.copy_(new)
    n_active.copy_(new.round().to(torch.int64))
    counts = torch.stack([n_marched, n_rendered]).to(torch.float64)
    return torch.cat([aux[:1], counts, aux[1:]])
