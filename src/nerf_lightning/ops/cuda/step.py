"""CUDA wrapper of ``ops/reference/step.py``: the fixed-budget step's ray count in one kernel."""

from __future__ import annotations

import torch
from torch import Tensor

from . import _support
from ._support import device_problem, dtype_problem, reference_for

__all__ = ["adapt_ray_count"]


def adapt_ray_count(
    aux: Tensor, ray_valid: Tensor, marched_counts: Tensor, rendered_counts: Tensor,
    n_active: Tensor, n_active_f: Tensor, target_fraction: Tensor,
    *, sample_budget: int, march_budget: int, min_rays: int, n_slots: int, momentum: float,
) -> Tensor:  # fmt: skip
    """See :func:`nerf_lightning.ops.reference.adapt_ray_count`: one kernel (sums over the rays, then
    the update on one thread), with the reference's float32 operation sequence."""
    tensors = (aux, ray_valid, marched_counts, rendered_counts, n_active, n_active_f, target_fraction)
    dtypes = (torch.float64, torch.bool, torch.int64, torch.int64, torch.int64, torch.float32, torch.float32)
    if not (n_active.numel() == 1 and n_active_f.numel() == 1 and target_fraction.numel() == 1):
        raise ValueError("adapt_ray_count: n_active, n_active_f and target_fraction must be scalars")
    why = device_problem(*tensors)
    for t, d in zip(tensors, dtypes, strict=True):
        why = why or dtype_problem((t,), (d,))
    if why is None and not (n_active.is_contiguous() and n_active_f.is_contiguous()):
        why = "n_active and n_active_f are updated in place and must be contiguous"
    if why:
        return reference_for("adapt_ray_count", why)(
            aux, ray_valid, marched_counts, rendered_counts, n_active, n_active_f, target_fraction,
            sample_budget=sample_budget, march_budget=march_budget, min_rays=min_rays, n_slots=n_slots,
            momentum=momentum,
        )  # fmt: skip
    return _support.ext().adapt_ray_count(
        aux.contiguous(), ray_valid.contiguous(), marched_counts.contiguous(), rendered_counts.contiguous(),
        n_active, n_active_f, target_fraction.contiguous(), float(sample_budget), float(march_budget),
        float(min_rays), float(n_slots), float(momentum),
    )  # fmt: skip
