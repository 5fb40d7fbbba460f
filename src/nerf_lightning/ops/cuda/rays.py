"""CUDA wrappers of ``ops/reference/rays.py``: ray/box intersection, sample positions, box coordinates.

Kernel input: float32 CUDA tensors. All three replay the reference's float32 operation sequence
(bit-equal results).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..reference.rays import check_rays
from . import _support
from ._support import device_problem, dtype_problem, reference_for

__all__ = ["ray_aabb_intersect", "sample_points", "normalize_to_box"]


def ray_aabb_intersect(rays_o: Tensor, rays_d: Tensor, aabb: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """See :func:`nerf_lightning.ops.reference.ray_aabb_intersect`.

    Args:
        rays_o, rays_d: float32 [R, 3] on CUDA; aabb: float [6] (any device; copied to the rays').

    Returns:
        t_near float32 [R], t_far float32 [R], hit bool [R] (misses: ``t_near = t_far = MISS_T``).
    """
    check_rays(rays_o, rays_d, "ray_aabb_intersect")
    if aabb.shape != (6,):
        raise ValueError(f"ray_aabb_intersect: aabb must have shape [6], got {tuple(aabb.shape)}")
    why = device_problem(rays_o, rays_d) or dtype_problem((rays_o, rays_d))
    if why:
        return reference_for("ray_aabb_intersect", why)(rays_o, rays_d, aabb)
    box = aabb.to(device=rays_o.device, dtype=torch.float32).contiguous()
    t_near, t_far, hit = _support.ext().ray_aabb_intersect(rays_o.contiguous(), rays_d.contiguous(), box)
    return t_near, t_far, hit


def sample_points(
    rays_o: Tensor, rays_d: Tensor, ray_indices: Tensor, t_starts: Tensor, t_ends: Tensor
) -> tuple[Tensor, Tensor]:
    """See :func:`nerf_lightning.ops.reference.sample_points` (same float32 sequence: bit-equal).

    Args:
        rays_o, rays_d: float32 [R, 3]; ray_indices: int [S]; t_starts, t_ends: float32 [S]; all CUDA.

    Returns:
        positions float32 [S, 3] (``o + d * ((t_start + t_end) * 0.5)``), directions float32 [S, 3].
    """
    tensors = (rays_o, rays_d, t_starts, t_ends)
    why = device_problem(*tensors, ray_indices) or dtype_problem(tensors)
    if why:
        return reference_for("sample_points", why)(rays_o, rays_d, ray_indices, t_starts, t_ends)
    positions, dirs = _support.ext().sample_points(
        rays_o.contiguous(), rays_d.contiguous(), ray_indices.long().contiguous(), t_starts.contiguous(),
        t_ends.contiguous(),
    )  # fmt: skip
    return positions, dirs


def normalize_to_box(positions: Tensor, box_min: Tensor, box_size: Tensor) -> tuple[Tensor, Tensor]:
    """See :func:`nerf_lightning.ops.reference.normalize_to_box` (bit-equal; no gradient).

    Args:
        positions: float32 [N, 3] that need no gradient; box_min, box_size: float32 [3]; all CUDA.

    Returns:
        x float32 [N, 3] in [0, 1]^3 (clamped), inside bool [N].
    """
    tensors = (positions, box_min, box_size)
    why = device_problem(*tensors) or dtype_problem(tensors)
    if why is None and positions.requires_grad:
        why = "the kernel does not differentiate positions"
    if why:
        return reference_for("normalize_to_box", why)(positions, box_min, box_size)
    x, inside = _support.ext().normalize_to_box(
        positions.contiguous(), box_min.contiguous(), box_size.contiguous()
    )
    return x, inside
