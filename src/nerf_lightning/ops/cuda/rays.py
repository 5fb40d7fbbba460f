"""CUDA wrappers of ``ops/reference/rays.py``: ray/box intersection, sample positions, box coordinates.

Kernel input: float32 CUDA tensors. All three replay the reference's float32 operation sequence
(bit-equal results).
"""

from __future__ import annotations

from typing import Any

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


class _SamplePoints(torch.autograd.Function):
    """The kernel forward; the rays' gradient (learned camera poses) scattered back per ray."""

    @staticmethod
    def forward(
        ctx: Any, rays_o: Tensor, rays_d: Tensor, ray_indices: Tensor, t_starts: Tensor, t_ends: Tensor
    ) -> tuple[Tensor, Tensor]:
        ctx.save_for_backward(ray_indices, t_starts, t_ends)
        ctx.n_rays = rays_o.shape[0]
        positions, dirs = _support.ext().sample_points(rays_o, rays_d, ray_indices, t_starts, t_ends)
        return positions, dirs

    @staticmethod
    def backward(ctx: Any, g_pos: Tensor | None, g_dir: Tensor | None) -> tuple:
        ray_indices, t_starts, t_ends = ctx.saved_tensors
        shape = (ctx.n_rays, 3)
        g_pos = torch.zeros(t_starts.shape[0], 3, device=t_starts.device) if g_pos is None else g_pos.float()
        g_o = torch.zeros(shape, device=t_starts.device).index_add_(0, ray_indices, g_pos)
        g_d_samples = g_pos * ((t_starts + t_ends) * 0.5)[:, None]
        if g_dir is not None:
            g_d_samples = g_d_samples + g_dir.float()
        g_d = torch.zeros(shape, device=t_starts.device).index_add_(0, ray_indices, g_d_samples)
        return g_o, g_d, None, None, None


def sample_points(
    rays_o: Tensor, rays_d: Tensor, ray_indices: Tensor, t_starts: Tensor, t_ends: Tensor
) -> tuple[Tensor, Tensor]:
    """See :func:`nerf_lightning.ops.reference.sample_points` (same float32 sequence: bit-equal).

    Args:
        rays_o, rays_d: float32 [R, 3]; ray_indices: int [S]; t_starts, t_ends: float32 [S]; all CUDA.
            Differentiable w.r.t. the rays when they require it (learned camera poses).

    Returns:
        positions float32 [S, 3] (``o + d * ((t_start + t_end) * 0.5)``), directions float32 [S, 3].
    """
    tensors = (rays_o, rays_d, t_starts, t_ends)
    why = device_problem(*tensors, ray_indices) or dtype_problem(tensors)
    if why:
        return reference_for("sample_points", why)(rays_o, rays_d, ray_indices, t_starts, t_ends)
    args = (
        rays_o.contiguous(), rays_d.contiguous(), ray_indices.long().contiguous(), t_starts.contiguous(),
        t_ends.contiguous(),
    )  # fmt: skip
    if rays_o.requires_grad or rays_d.requires_grad:
        return _SamplePoints.apply(*args)
    positions, dirs = _support.ext().sample_points(*args)
    return positions, dirs


class _NormalizeToBox(torch.autograd.Function):
    """The kernel forward; the positions' gradient (learned camera poses) as the reference's autograd
    gives it: ``1 / box_size`` where the coordinate is inside [0, 1] (the clamp passes it), else 0."""

    @staticmethod
    def forward(ctx: Any, positions: Tensor, box_min: Tensor, box_size: Tensor) -> tuple[Tensor, Tensor]:
        ctx.save_for_backward(positions, box_min, box_size)
        x, inside = _support.ext().normalize_to_box(positions, box_min, box_size)
        ctx.mark_non_differentiable(inside)
        return x, inside

    @staticmethod
    def backward(ctx: Any, g_x: Tensor | None, _g_inside: Any) -> tuple:
        positions, box_min, box_size = ctx.saved_tensors
        u = (positions - box_min) / box_size
        passed = (u >= 0) & (u <= 1)
        return g_x * passed / box_size, None, None


def normalize_to_box(positions: Tensor, box_min: Tensor, box_size: Tensor) -> tuple[Tensor, Tensor]:
    """See :func:`nerf_lightning.ops.reference.normalize_to_box` (bit-equal).

    Args:
        positions: float32 [N, 3]; box_min, box_size: float32 [3] (no gradient); all CUDA.
            Differentiable w.r.t. ``positions`` when they require it (learned camera poses).

    Returns:
        x float32 [N, 3] in [0, 1]^3 (clamped), inside bool [N].
    """
    tensors = (positions, box_min, box_size)
    why = device_problem(*tensors) or dtype_problem(tensors)
    if why:
        return reference_for("normalize_to_box", why)(positions, box_min, box_size)
    args = (positions.contiguous(), box_min.contiguous(), box_size.contiguous())
    if positions.requires_grad:
        return _NormalizeToBox.apply(*args)
    x, inside = _support.ext().normalize_to_box(*args)
    return x, inside
