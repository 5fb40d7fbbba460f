"""Training batches for tests: the fields a :class:`RayBatch` holds, and batches of rays made by hand."""

from __future__ import annotations

import torch
from torch import Tensor

from nerf_lightning.data.ray_batch import RayBatch


def present_fields(batch: RayBatch) -> dict[str, Tensor]:
    """``{field: tensor}`` of the fields ``batch`` holds (an optional field left None is absent)."""
    return {name: t for name, t in batch.tensors().items() if t is not None}


def ray_batch(
    rays_o: Tensor,
    rays_d: Tensor,
    target: Tensor,
    background: Tensor,
    view_ids: Tensor | None = None,
    alpha: Tensor | None = None,
) -> RayBatch:
    """Rays made by hand as a training batch: their views ``view_ids`` (default view 0) and pixel 0."""
    zeros = torch.zeros(rays_o.shape[0], dtype=torch.int64, device=rays_o.device)
    views = zeros if view_ids is None else view_ids
    return RayBatch(rays_o, rays_d, target, background, views, px=zeros, py=zeros, alpha=alpha)
