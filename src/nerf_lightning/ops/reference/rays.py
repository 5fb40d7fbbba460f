"""Rays against boxes, and positions along rays: the first and the last step of marching.

``ray_aabb_intersect`` gives each ray its ``[t_near, t_far]`` inside a box (the occupancy grid's outer
box); ``sample_points`` turns packed samples back into positions and directions for the field;
``normalize_to_box`` maps NGP-space positions to the [0, 1]^3 coordinates of the hash encoding.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["SQRT3", "MISS_T", "ray_aabb_intersect", "sample_points", "normalize_to_box"]

SQRT3 = math.sqrt(3.0)
#: t_near = t_far value of rays that miss the box.
MISS_T = 1e10


def ray_aabb_intersect(rays_o: Tensor, rays_d: Tensor, aabb: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Intersect rays with an axis-aligned box (slab method).

    Args:
        rays_o: float [R, 3] ray origins.
        rays_d: float [R, 3] ray directions (need not be unit; zero components allowed).
        aabb: float [6] box (xmin, ymin, zmin, xmax, ymax, zmax).

    Returns:
        t_near: float [R], entry distance clamped to >= 0 (0 when the origin is inside the box).
        t_far: float [R], exit distance.
        hit: bool [R], ``t_far > t_near``. For misses ``t_near = t_far = MISS_T`` (1e10).

    Per axis the slab distances are ``(lo - o) / d`` and ``(hi - o) / d`` (a division, not a
    multiplication by 1/d); an axis with ``d == 0`` gives (-inf, inf) when ``lo <= o <= hi`` and
    (inf, -inf) otherwise, so no NaN appears.
    """
    check_rays(rays_o, rays_d, "ray_aabb_intersect")
    if aabb.shape != (6,):
        raise ValueError(f"ray_aabb_intersect: aabb must have shape [6], got {tuple(aabb.shape)}")
    aabb = aabb.to(device=rays_o.device, dtype=rays_o.dtype)
    lo, hi = aabb[:3], aabb[3:]
    zero = rays_d == 0
    safe_d = torch.where(zero, torch.ones_like(rays_d), rays_d)
    t1 = (lo - rays_o) / safe_d
    t2 = (hi - rays_o) / safe_d
    tmin = torch.minimum(t1, t2)
    tmax = torch.maximum(t1, t2)
    inside_slab = (rays_o >= lo) & (rays_o <= hi)
    inf = torch.full_like(tmin, math.inf)
    tmin = torch.where(zero, torch.where(inside_slab, -inf, inf), tmin)
    tmax = torch.where(zero, torch.where(inside_slab, inf, -inf), tmax)
    t_near = tmin.amax(dim=-1).clamp(min=0.0)
    t_far = tmax.amin(dim=-1)
    hit = t_far > t_near
    miss = torch.full_like(t_near, MISS_T)
    return torch.where(hit, t_near, miss), torch.where(hit, t_far, miss), hit


def sample_points(
    rays_o: Tensor, rays_d: Tensor, ray_indices: Tensor, t_starts: Tensor, t_ends: Tensor
) -> tuple[Tensor, Tensor]:
    """Positions at the packed samples' interval midpoints and their rays' directions.

    Args:
        rays_o, rays_d: float32 [R, 3].
        ray_indices: int64 [S]; t_starts, t_ends: float32 [S].

    Returns:
        positions [S, 3] = ``o + d * ((t_start + t_end) * 0.5)`` (float32, in this order) and
        directions [S, 3] (``rays_d`` of each sample's ray).
    """
    dirs = rays_d[ray_indices]
    return rays_o[ray_indices] + dirs * ((t_starts + t_ends) * 0.5)[:, None], dirs


def normalize_to_box(positions: Tensor, box_min: Tensor, box_size: Tensor) -> tuple[Tensor, Tensor]:
    """Positions as coordinates in [0, 1]^3 of the box ``[box_min, box_min + box_size]``.

    Args:
        positions: float32 [N, 3]; box_min, box_size: float32 [3].

    Returns:
        x [N, 3] = ``clamp((p - box_min) / box_size, 0, 1)`` and inside bool [N]: all three
        unclamped coordinates in [0, 1].
    """
    x = (positions - box_min) / box_size
    inside = ((x >= 0) & (x <= 1)).all(dim=-1)
    return x.clamp(0.0, 1.0), inside


def check_rays(rays_o: Tensor, rays_d: Tensor, where: str) -> None:
    """Raise ``ValueError`` (naming the op ``where``) unless ``rays_o`` and ``rays_d`` are both [R, 3]."""
    if rays_o.dim() != 2 or rays_o.shape[-1] != 3 or rays_d.shape != rays_o.shape:
        raise ValueError(
            f"{where}: rays_o and rays_d must both be [R, 3], got {tuple(rays_o.shape)} and "
            f"{tuple(rays_d.shape)}"
        )
