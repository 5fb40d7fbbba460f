"""CUDA wrappers of ``ops/reference/marching.py``: marching into packed samples, repacking.

Kernel input: float32 rays and t values and a bool occupancy grid, on CUDA. t values are computed with
the reference's float32 operation sequence (bit-identical in practice); the kernels walk candidates
until ``t_{k+1} > t_far`` instead of over the reference's global candidate count, which can differ only
in float-boundary ties. One thread per ray in each pass.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..reference.marching import check_march_args, check_repack_args
from ..reference.rays import SQRT3
from ..types import PackedSamples
from . import _support
from ._support import device_problem, dtype_problem, reference_for

__all__ = ["march_rays", "march_rays_fixed", "repack"]


def _march_problem(
    rays_o: Tensor, rays_d: Tensor, t_near: Tensor, t_far: Tensor, binaries: Tensor, t_jitter: Tensor | None
) -> str | None:
    """Why the marching kernels cannot take these tensors (None when they can)."""
    tensors = [rays_o, rays_d, t_near, t_far] + ([t_jitter] if t_jitter is not None else [])
    return device_problem(*tensors, binaries) or dtype_problem(tensors)


def _march_inputs(
    rays_o: Tensor, rays_d: Tensor, t_near: Tensor, t_far: Tensor, binaries: Tensor, t_jitter: Tensor | None
) -> tuple[Tensor | None, ...]:
    """The marching kernels' leading tensor arguments, contiguous, in their order."""
    tensors = (rays_o, rays_d, t_near, t_far, binaries, t_jitter)
    return tuple(t.contiguous() if t is not None else None for t in tensors)


def march_rays(
    rays_o: Tensor, rays_d: Tensor, t_near: Tensor, t_far: Tensor, binaries: Tensor, *,
    step_size: float = SQRT3 / 1024, cone_angle: float = 0.0, max_step: float | None = None,
    max_samples_per_ray: int = 1024, near_plane: float = 0.0, t_jitter: Tensor | None = None,
) -> PackedSamples:  # fmt: skip
    """See :func:`nerf_lightning.ops.reference.march_rays` (the dynamic layout).

    Args:
        rays_o, rays_d: float32 [R, 3]; t_near, t_far: float32 [R]; binaries: bool [C, G, G, G];
            t_jitter: float32 [R] or None; all CUDA. Others as the reference.

    Returns:
        PackedSamples(ray_indices int64 [S], t_starts float32 [S], t_ends float32 [S],
        packed_info int64 [R, 2]). Two passes (count, then write at the exclusive-cumsum offsets); one
        host sync sizes the [S] outputs, as the reference.
    """
    max_step = check_march_args(
        rays_o, rays_d, t_near, t_far, binaries, t_jitter, step_size, cone_angle, max_step,
        max_samples_per_ray,
    )  # fmt: skip
    why = _march_problem(rays_o, rays_d, t_near, t_far, binaries, t_jitter)
    if why:
        return reference_for("march_rays", why)(
            rays_o, rays_d, t_near, t_far, binaries, step_size=step_size, cone_angle=cone_angle,
            max_step=max_step, max_samples_per_ray=max_samples_per_ray, near_plane=near_plane,
            t_jitter=t_jitter,
        )  # fmt: skip
    ray_idx, t_s, t_e, info = _support.ext().march_rays(
        *_march_inputs(rays_o, rays_d, t_near, t_far, binaries, t_jitter),
        float(step_size), float(cone_angle), float(max_step), int(max_samples_per_ray), float(near_plane),
    )  # fmt: skip
    return PackedSamples(ray_idx, t_s, t_e, info)


def march_rays_fixed(
    rays_o: Tensor, rays_d: Tensor, t_near: Tensor, t_far: Tensor, binaries: Tensor, *,
    capacity: int, n_active: Tensor | None = None,
    step_size: float = SQRT3 / 1024, cone_angle: float = 0.0, max_step: float | None = None,
    max_samples_per_ray: int = 1024, near_plane: float = 0.0, t_jitter: Tensor | None = None,
) -> tuple[PackedSamples, Tensor]:  # fmt: skip
    """See :func:`nerf_lightning.ops.reference.march_rays_fixed` (the fixed layout, no host sync).

    Args:
        n_active: int64 scalar CUDA tensor or None; others as :func:`march_rays`.

    Returns:
        (PackedSamples with ``S = capacity``, ray_valid bool [R]): one count pass, a device cumsum, one
        layout kernel and one fill pass into the caller's capacity, so it can run inside a CUDA graph.
    """
    max_step = check_march_args(
        rays_o, rays_d, t_near, t_far, binaries, t_jitter, step_size, cone_angle, max_step,
        max_samples_per_ray,
    )  # fmt: skip
    why = _march_problem(rays_o, rays_d, t_near, t_far, binaries, t_jitter)
    if why is None and n_active is not None and (n_active.dtype != torch.int64 or n_active.numel() != 1):
        why = f"n_active must be an int64 scalar tensor, got {n_active.dtype} of {n_active.numel()} elements"
    if why:
        return reference_for("march_rays_fixed", why)(
            rays_o, rays_d, t_near, t_far, binaries, capacity=capacity, n_active=n_active,
            step_size=step_size, cone_angle=cone_angle, max_step=max_step,
            max_samples_per_ray=max_samples_per_ray, near_plane=near_plane, t_jitter=t_jitter,
        )  # fmt: skip
    ray_idx, t_s, t_e, info, valid = _support.ext().march_rays_fixed(
        *_march_inputs(rays_o, rays_d, t_near, t_far, binaries, t_jitter),
        n_active.reshape(()).contiguous() if n_active is not None else None,
        float(step_size), float(cone_angle), float(max_step), int(max_samples_per_ray), float(near_plane),
        int(capacity),
    )  # fmt: skip
    return PackedSamples(ray_idx, t_s, t_e, info), valid


def repack(
    packed: PackedSamples, keep: Tensor, capacity: int, ray_valid: Tensor | None = None
) -> tuple[PackedSamples, Tensor]:
    """See :func:`nerf_lightning.ops.reference.repack` (no host sync; equal to it exactly).

    Args:
        packed: float32 t values, int64 packed_info; keep: bool [S]; ray_valid: bool [R] or None; CUDA.

    Returns:
        (PackedSamples in the fixed layout with ``S = capacity``, ray_valid bool [R]): a count pass, the
        same cumsum and layout kernel as :func:`march_rays_fixed`, and a copy pass.
    """
    check_repack_args(packed, keep, capacity)
    _, t_starts, t_ends, packed_info = packed
    tensors = [t_starts, t_ends, packed_info, keep] + ([ray_valid] if ray_valid is not None else [])
    why = device_problem(*tensors) or dtype_problem((t_starts, t_ends))
    if why:
        return reference_for("repack", why)(packed, keep, capacity, ray_valid)
    idx, ts, te, info, valid = _support.ext().repack(
        t_starts.contiguous(), t_ends.contiguous(), packed_info.long().contiguous(), keep.contiguous(),
        int(capacity), ray_valid.contiguous() if ray_valid is not None else None,
    )  # fmt: skip
    return PackedSamples(idx, ts, te, info), valid
