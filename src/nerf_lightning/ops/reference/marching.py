"""Ray marching through the occupancy grid into packed samples, and repacking into fixed buffers.

The two layouts of ``PackedSamples`` (see the package docstring): ``march_rays`` makes the dynamic
one (``S`` = the number of samples; one host sync sizes the outputs); ``march_rays_fixed`` and
``repack`` fill buffers of a capacity chosen by the caller (no host sync, CUDA-graph capturable).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ..types import PackedSamples
from .grid import grid_cell_indices
from .rays import SQRT3, check_rays

__all__ = ["march_rays", "march_rays_fixed", "repack", "repacked_prefix_slots", "samples_in_use"]

#: Upper bound on the entries of one [rays, candidates] chunk in ``march_rays`` (memory bound:
#: about 60 bytes per entry at the peak).
MAX_CHUNK_ENTRIES = 2**23


class _StepLaw:
    """Closed form of ``t_{k+1} = t_k + clamp(t_k * cone, step, max_step)`` from a per-ray ``t0``.

    Three phases per ray (float32 ops written as evaluated; a kernel must use the same):
      A: ``t_k = t0 + k * step`` for ``k <= ka``, ``ka = max(0, ceil((step/cone - t0) / step))``;
      B: ``t_k = ta * (1 + cone)^(k - ka)`` for ``ka < k <= ka + nb``, ``ta = t0 + ka * step``,
         ``nb = max(0, ceil(log((max_step/cone) / ta) / log1p(cone)))``;
      C: ``t_k = tb + (k - ka - nb) * max_step`` beyond, ``tb = ta * (1 + cone)^nb``.
    With ``cone == 0`` only phase A exists (``t_k = t0 + k * step``, max_step unused).
    """

    def __init__(self, t0: Tensor, step: float, cone: float, max_step: float) -> None:
        self.t0, self.step, self.cone, self.max_step = t0, step, cone, max_step
        if cone > 0:
            self.ka = torch.ceil((step / cone - t0) / step).clamp(min=0)
            self.ta = t0 + self.ka * step
            self.nb = torch.ceil(torch.log((max_step / cone) / self.ta) / math.log1p(cone)).clamp(min=0)
            self.growth = torch.tensor(1.0 + cone, dtype=t0.dtype, device=t0.device)
            self.tb = self.ta * torch.pow(self.growth, self.nb)

    @staticmethod
    def dt_at(t: Tensor, step: float, cone: float, max_step: float) -> Tensor:
        """Step length at ``t``: ``clamp(t * cone, step, max_step)`` (``step`` when cone == 0)."""
        if cone == 0:
            return torch.full_like(t, step)
        return torch.clamp(t * cone, min=step, max=max_step)

    def t_of_k(self, k: Tensor, rows: slice) -> Tensor:
        """``t_k`` for k float [K] and the rays ``rows``: float [rows, K]."""
        t0 = self.t0[rows, None]
        lin = t0 + k * self.step
        if self.cone == 0:
            return lin
        ka, nb, ta, tb = (x[rows, None] for x in (self.ka, self.nb, self.ta, self.tb))
        geo = ta * torch.pow(self.growth, k - ka)
        lin2 = tb + (k - ka - nb) * self.max_step
        return torch.where(k <= ka, lin, torch.where(k <= ka + nb, geo, lin2))

    def steps_to(self, t_target: Tensor) -> Tensor:
        """Float [R]: smallest k with ``t_k >= t_target`` (up to float rounding; used to size K)."""
        lin = torch.ceil((t_target - self.t0) / self.step)
        if self.cone == 0:
            return lin
        geo = self.ka + torch.ceil(torch.log(t_target / self.ta) / math.log1p(self.cone))
        lin2 = self.ka + self.nb + torch.ceil((t_target - self.tb) / self.max_step)
        out = torch.where(t_target <= self.ta, lin, torch.where(t_target <= self.tb, geo, lin2))
        return torch.nan_to_num(out, nan=0.0, posinf=0.0, neginf=0.0)


def march_rays(
    rays_o: Tensor, rays_d: Tensor, t_near: Tensor, t_far: Tensor, binaries: Tensor, *,
    step_size: float = SQRT3 / 1024, cone_angle: float = 0.0, max_step: float | None = None,
    max_samples_per_ray: int = 1024, near_plane: float = 0.0, t_jitter: Tensor | None = None,
) -> PackedSamples:  # fmt: skip
    """March rays through the occupancy grid into packed samples.

    Step law: ``dt(t) = clamp(t * cone_angle, step_size, max_step)`` (``step_size`` when
    ``cone_angle == 0``); ``t_0 = max(t_near, near_plane)``, plus ``t_jitter * dt(t_0)`` when
    ``t_jitter`` is given; ``t_{k+1} = t_k + dt(t_k)``, evaluated in closed form (see
    :class:`_StepLaw`). Candidate k spans ``[t_k, t_{k+1}]``; its midpoint
    ``p = o + d * ((t_k + t_{k+1}) * 0.5)`` is looked up in the finest cascade containing it
    (:func:`grid_cell_indices`); the candidate is kept iff that cell is occupied, p is inside the
    outer box and ``t_{k+1} <= t_far``. Only the first ``max_samples_per_ray`` kept samples of a
    ray survive. Rays with ``t_far <= t_near`` (misses) or ``t_0 >= t_far`` get no samples.

    Args:
        rays_o: float32 [R, 3] origins (NGP space).
        rays_d: float32 [R, 3] unit directions.
        t_near: float32 [R] from :func:`ray_aabb_intersect` with the outer box.
        t_far: float32 [R].
        binaries: bool [C, G, G, G] occupancy.
        step_size: minimum step (instant-ngp: sqrt(3)/1024).
        cone_angle: step grows as ``t * cone_angle`` (0 = uniform steps).
        max_step: maximum step; default ``sqrt(3) * 2^(C-1) / G``.
        max_samples_per_ray: cap on kept samples per ray.
        near_plane: samples start at ``t >= near_plane``.
        t_jitter: float32 [R] in [0, 1) or None, shift of the first sample in units of ``dt(t_0)``.

    Returns:
        PackedSamples(ray_indices int64 [S], t_starts float32 [S], t_ends float32 [S],
        packed_info int64 [R, 2]).
    """
    max_step = check_march_args(
        rays_o, rays_d, t_near, t_far, binaries, t_jitter, step_size, cone_angle, max_step,
        max_samples_per_ray,
    )  # fmt: skip
    n_rays, n_cascades, g = rays_o.shape[0], binaries.shape[0], binaries.shape[1]

    device, dtype = rays_o.device, rays_o.dtype
    hit = t_far > t_near
    t0 = torch.clamp(t_near, min=near_plane)
    zeros = torch.zeros_like(t0)
    if t_jitter is not None:
        t0 = t0 + t_jitter.to(dtype) * _StepLaw.dt_at(t0, step_size, cone_angle, max_step)
    valid = hit & (t0 < t_far)
    t0 = torch.where(valid, t0, zeros)
    tf = torch.where(valid, t_far, zeros)
    law = _StepLaw(t0, step_size, cone_angle, max_step)

    n_steps = torch.where(valid, law.steps_to(tf), zeros)
    # +2 columns absorb rounding in steps_to; surplus candidates fail `t_{k+1} <= t_far`.
    n_cand = int(n_steps.max().item()) + 2 if n_rays > 0 and max_samples_per_ray > 0 else 0
    if n_cand <= 2:
        return _empty_packed(n_rays, device, dtype)

    k = torch.arange(n_cand + 1, device=device, dtype=dtype)
    flat_bins = binaries.reshape(-1)
    rows_per_chunk = max(1, MAX_CHUNK_ENTRIES // (n_cand + 1))
    ray_ids, starts, ends, counts = [], [], [], []
    for r0 in range(0, n_rays, rows_per_chunk):
        rows = slice(r0, min(n_rays, r0 + rows_per_chunk))
        t = law.t_of_k(k, rows)  # [r, K + 1]
        t_s, t_e = t[:, :-1], t[:, 1:]
        mid = (t_s + t_e) * 0.5
        pos = rays_o[rows, None, :] + rays_d[rows, None, :] * mid[..., None]
        cell, inside = grid_cell_indices(pos, n_cascades, g)
        keep = flat_bins[cell] & inside & (t_e <= tf[rows, None]) & valid[rows, None]
        keep &= torch.cumsum(keep, dim=1, dtype=torch.int32) <= max_samples_per_ray
        rid = torch.arange(rows.start, rows.stop, device=device)[:, None].expand_as(keep)
        ray_ids.append(rid[keep])
        starts.append(t_s[keep])
        ends.append(t_e[keep])
        counts.append(keep.sum(dim=1))
    count = torch.cat(counts)
    packed_info = torch.stack([torch.cumsum(count, 0) - count, count], dim=-1)
    return PackedSamples(torch.cat(ray_ids), torch.cat(starts), torch.cat(ends), packed_info)


def samples_in_use(packed: PackedSamples) -> Tensor:
    """Which slots of a packed layout hold samples of a ray.

    Args:
        packed: packed samples, dynamic or fixed layout.

    Returns:
        bool [S]: sample ``i`` lies inside its ray's ``packed_info`` range ``[first, first + count)``;
        False for the fixed layout's padding (whose ray index 0 points at ray 0's range).
    """
    ray_indices, _, _, packed_info = packed
    local = torch.arange(ray_indices.shape[0], device=ray_indices.device) - packed_info[ray_indices, 0]
    return (local >= 0) & (local < packed_info[ray_indices, 1])


def repack(
    packed: PackedSamples, keep: Tensor, capacity: int, ray_valid: Tensor | None = None
) -> tuple[PackedSamples, Tensor]:
    """Copy the kept samples of valid rays into fixed buffers of ``capacity`` samples, in order.

    Rays are taken in index order while their kept samples fit: ray ``r`` stays valid iff it was
    valid and the kept samples of rays ``0..r`` number at most ``capacity``. So the valid rays of
    the output are the valid rays of the input up to the first one that overflows; a ray is never
    cut. No host synchronization: every shape depends only on ``S``, ``R`` and ``capacity``.

    Args:
        packed: packed samples (dynamic or fixed layout), samples of a ray contiguous, rays in order.
        keep: bool [S], samples to keep (padding is dropped whatever ``keep`` says).
        capacity: size of the output buffers.
        ray_valid: bool [R] or None (all rays valid); samples of invalid rays are dropped.

    Returns:
        (PackedSamples in the fixed layout with ``S = capacity``, ray_valid bool [R]). Invalid rays
        have count 0 and first index = the number of samples in use.
    """
    check_repack_args(packed, keep, capacity)
    ray_indices, t_starts, t_ends, packed_info = packed
    n_rays, device = packed_info.shape[0], packed_info.device
    if ray_valid is None:
        ray_valid = torch.ones(n_rays, dtype=torch.bool, device=device)
    ray_indices = ray_indices.long()
    keep = keep & samples_in_use(packed) & ray_valid[ray_indices]
    # kept samples per ray as differences of one cumsum at the rays' range ends (no atomics)
    kept_before = torch.nn.functional.pad(torch.cumsum(keep, 0), (1, 0))
    first, count = packed_info[:, 0], packed_info[:, 1]
    counts = kept_before[first + count] - kept_before[first]
    incl = torch.cumsum(counts, 0)
    valid = ray_valid & (incl <= capacity)
    counts = torch.where(valid, counts, 0)
    n_used = counts.sum()
    starts = torch.where(valid, incl - counts, n_used)
    keep = keep & valid[ray_indices]
    dest = torch.where(keep, torch.cumsum(keep, 0) - 1, capacity)  # overflow slot `capacity`, cut off
    out_idx = torch.zeros(capacity + 1, dtype=torch.long, device=device).scatter_(0, dest, ray_indices)
    out_ts = t_starts.new_zeros(capacity + 1).scatter_(0, dest, t_starts)
    out_te = t_ends.new_zeros(capacity + 1).scatter_(0, dest, t_ends)
    out = PackedSamples(
        out_idx[:capacity], out_ts[:capacity], out_te[:capacity], torch.stack([starts, counts], dim=-1)
    )
    return out, valid


def repacked_prefix_slots(packed: PackedSamples, source_info: Tensor) -> Tensor:
    """Where each sample of a :func:`repack` output came from, when every ray kept a prefix of its samples.

    Early termination keeps the samples before the transmittance falls under its threshold: a prefix
    of each ray, since the transmittance never grows along a ray. Then the ``j``-th sample of ray ``r``
    in the output is the ``j``-th of ``r`` in the source, and its source slot is
    ``source_info[r, 0] + slot - packed.packed_info[r, 0]``: per-sample values of the source (a density
    pass's features) follow the samples with one gather, without a second pass over the source.

    Args:
        packed: the fixed layout :func:`repack` returned.
        source_info: int [R, 2], the ``packed_info`` of the samples given to :func:`repack`.

    Returns:
        int64 [S]: the source slot of each slot of ``packed``; 0 for its padding.
    """
    ray = packed.ray_indices.long()
    info = packed.packed_info.long()
    if info.shape[0] == 0:
        return torch.zeros_like(ray)
    slot = torch.arange(ray.shape[0], device=ray.device)
    source = source_info[ray, 0].long() + slot - info[ray, 0]
    n_used = info[-1, 0] + info[-1, 1]  # repack's layout: rays in order, an invalid ray starts at n_used
    return torch.where(slot < n_used, source, 0)


def check_repack_args(packed: PackedSamples, keep: Tensor, capacity: int) -> None:
    if keep.shape != packed.ray_indices.shape or keep.dtype != torch.bool:
        n = packed.ray_indices.shape[0]
        raise ValueError(f"repack: keep must be bool [S={n}], got {keep.dtype} {tuple(keep.shape)}")
    if capacity < 0:
        raise ValueError(f"repack: capacity must be >= 0, got {capacity}")


def march_rays_fixed(
    rays_o: Tensor, rays_d: Tensor, t_near: Tensor, t_far: Tensor, binaries: Tensor, *,
    capacity: int, n_active: Tensor | None = None, t_jitter: Tensor | None = None, **march: Any,
) -> tuple[PackedSamples, Tensor]:  # fmt: skip
    """:func:`march_rays` into fixed buffers of ``capacity`` samples (the fixed layout).

    The samples are those of :func:`march_rays`; rays are kept in index order while they fit
    (:func:`repack`), and rays ``r >= n_active`` are not marched at all (invalid).

    Args:
        capacity: number of sample slots.
        n_active: int64 scalar tensor (on the rays' device) or None (all rays).
        t_jitter, march: as :func:`march_rays` (``march``: its step law, ``max_samples_per_ray`` and
            ``near_plane``, with its defaults).

    Returns:
        (PackedSamples with ``S = capacity``, ray_valid bool [R]).
    """
    n_rays = rays_o.shape[0]
    # The oracle marches only the active rays (one host read of n_active; the CUDA kernel skips the
    # others on the device) and gives the rest no samples.
    n = n_rays if n_active is None else max(0, min(n_rays, int(n_active)))
    jitter = None if t_jitter is None else t_jitter[:n]
    packed = march_rays(rays_o[:n], rays_d[:n], t_near[:n], t_far[:n], binaries, t_jitter=jitter, **march)
    counts = torch.zeros(n_rays, dtype=torch.long, device=rays_o.device)
    counts[:n] = packed.packed_info[:, 1]
    info = torch.stack([torch.cumsum(counts, 0) - counts, counts], dim=-1)
    packed = PackedSamples(packed.ray_indices, packed.t_starts, packed.t_ends, info)
    ray_valid = _active_rays(n_rays, n_active, rays_o.device)
    return repack(packed, torch.ones_like(packed.ray_indices, dtype=torch.bool), capacity, ray_valid)


def _active_rays(n_rays: int, n_active: Tensor | None, device: torch.device) -> Tensor:
    """bool [R]: ``r < n_active`` (all True when ``n_active`` is None)."""
    idx = torch.arange(n_rays, device=device)
    return idx >= 0 if n_active is None else idx < n_active


def _empty_packed(n_rays: int, device: torch.device, dtype: torch.dtype) -> PackedSamples:
    return PackedSamples(
        torch.zeros(0, dtype=torch.long, device=device),
        torch.zeros(0, dtype=dtype, device=device),
        torch.zeros(0, dtype=dtype, device=device),
        torch.zeros(n_rays, 2, dtype=torch.long, device=device),
    )


def check_march_args(
    rays_o: Tensor,
    rays_d: Tensor,
    t_near: Tensor,
    t_far: Tensor,
    binaries: Tensor,
    t_jitter: Tensor | None,
    step_size: float,
    cone_angle: float,
    max_step: float | None,
    max_samples_per_ray: int,
) -> float:
    """Validate :func:`march_rays`' arguments (shared by every backend and the fixed layout); returns
    ``max_step`` with its default resolved."""
    check_rays(rays_o, rays_d, "march_rays")
    n_rays = rays_o.shape[0]
    if t_near.shape != (n_rays,) or t_far.shape != (n_rays,):
        raise ValueError(
            f"march_rays: t_near/t_far must be [{n_rays}], got {tuple(t_near.shape)}, {tuple(t_far.shape)}"
        )
    if binaries.dim() != 4 or binaries.dtype != torch.bool or len(set(binaries.shape[1:])) != 1:
        raise ValueError(
            f"march_rays: binaries must be bool [C, G, G, G], got {binaries.dtype} {tuple(binaries.shape)}"
        )
    if t_jitter is not None and t_jitter.shape != (n_rays,):
        raise ValueError(f"march_rays: t_jitter must be [{n_rays}], got {tuple(t_jitter.shape)}")
    n_cascades, g = binaries.shape[0], binaries.shape[1]
    if max_step is None:
        max_step = SQRT3 * 2 ** (n_cascades - 1) / g
    if step_size <= 0 or cone_angle < 0:
        raise ValueError(f"march_rays: need step_size > 0 and cone_angle >= 0, got {step_size}, {cone_angle}")
    if cone_angle > 0 and max_step < step_size:
        raise ValueError(f"march_rays: max_step ({max_step}) must be >= step_size ({step_size})")
    if max_samples_per_ray < 0:
        raise ValueError(f"march_rays: max_samples_per_ray must be >= 0, got {max_samples_per_ray}")
    return max_step
