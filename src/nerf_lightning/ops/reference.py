"""Reference ray ops in pure PyTorch: the oracle the CUDA kernels (``ops/cuda.py``) must equal.

Every function here is pure, works on any device, and is vectorized (no Python loop over rays or
samples; ``march_rays`` loops over *chunks* of rays only to bound memory). The docstrings are the
contract of every backend; where a float32 detail matters, the exact sequence of operations is
written down so that a kernel can reproduce it.

Two layouts of packed samples (``types.PackedSamples``):

- *dynamic*: ``S`` is the number of samples (``march_rays``; one host sync sizes the outputs);
- *fixed* (``march_rays_fixed``, ``repack``): ``S`` is a capacity chosen by the caller, so shapes
  never depend on data (no host sync; CUDA-graph capturable). Samples ``[0, n)`` belong to the rays
  as ``packed_info`` says; ``[n, S)`` are padding with ray index 0 and ``t_start = t_end = 0``: a
  zero-length interval has weight 0 and no gradient, so every compositing op may read them. Rays
  that did not fit are flagged in a ``ray_valid`` mask and have no samples.

Scene space is instant-ngp's NGP space: the object in the unit cube [0, 1]^3, the outer box
``[0.5 - aabb_scale/2, 0.5 + aabb_scale/2]^3``, occupancy cascade ``c`` covering
``[0.5 - 2^c/2, 0.5 + 2^c/2]^3`` with ``G^3`` cells, flat cell index ``(ix * G + iy) * G + iz``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from .types import PackedSamples

__all__ = [
    "SQRT3",
    "MISS_T",
    "PackedSamples",
    "ray_aabb_intersect",
    "grid_cell_positions",
    "cascade_of",
    "grid_cell_indices",
    "grid_ema_update",
    "grid_occupancy",
    "pack_bitfield",
    "unpack_bitfield",
    "march_rays",
    "march_rays_fixed",
    "repack",
    "render_weights",
    "accumulate_along_rays",
    "volume_render",
    "sample_points",
    "normalize_to_box",
    "per_ray_loss",
    "masked_ray_loss",
    "adapt_ray_count",
    "trunc_exp",
    "density_activation",
    "distortion_loss",
    "fused_mlp",
]

SQRT3 = math.sqrt(3.0)
#: t_near = t_far value of rays that miss the box.
MISS_T = 1e10
#: Upper bound on the entries of one [rays, candidates] chunk in ``march_rays`` (memory bound:
#: about 60 bytes per entry at the peak).
MAX_CHUNK_ENTRIES = 2**23


# --------------------------------------------------------------------------------------------------
# Rays / boxes
# --------------------------------------------------------------------------------------------------
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
    _check_rays(rays_o, rays_d, "ray_aabb_intersect")
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


# --------------------------------------------------------------------------------------------------
# Occupancy grid helpers
# --------------------------------------------------------------------------------------------------
def grid_cell_positions(cell_indices: Tensor, jitter: Tensor, grid_resolution: int) -> Tensor:
    """NGP-space positions inside occupancy cells.

    Args:
        cell_indices: int64 [N], flat indices over the whole [C, G^3] grid
            (``c * G^3 + (ix * G + iy) * G + iz``).
        jitter: float [N, 3] in [0, 1), offset inside the cell in cell units.
        grid_resolution: G.

    Returns:
        float [N, 3] (dtype of ``jitter``): ``((ijk + jitter) / G - 0.5) * 2^c + 0.5``.
    """
    g = int(grid_resolution)
    if cell_indices.dim() != 1 or jitter.shape != (cell_indices.shape[0], 3):
        raise ValueError(
            f"grid_cell_positions: expected cell_indices [N] and jitter [N, 3], got "
            f"{tuple(cell_indices.shape)} and {tuple(jitter.shape)}"
        )
    idx = cell_indices.long()
    c = idx // (g**3)
    local = idx % (g**3)
    ijk = torch.stack([local // (g * g), (local // g) % g, local % g], dim=-1).to(jitter.dtype)
    scale = torch.ldexp(torch.ones_like(jitter[:, :1]), c[:, None])
    return ((ijk + jitter) / g - 0.5) * scale + 0.5


def cascade_of(positions: Tensor) -> Tensor:
    """Smallest cascade containing each point: ``max(0, ceil(log2(2 * max|p - 0.5|)))``.

    Computed exactly with ``frexp`` (``m = 2*max|p-0.5| = mant * 2^e``, mant in [0.5, 1):
    ``ceil(log2 m) = e - (mant == 0.5)``), so boxes are closed: a point on the unit cube's faces is
    in cascade 0. Not clamped to ``C - 1``: the caller clamps (and checks the outer box).

    Args:
        positions: float [..., 3].

    Returns:
        int64 [...].
    """
    m = 2.0 * (positions - 0.5).abs().amax(dim=-1)
    mant, e = torch.frexp(m)
    c = e.long() - (mant == 0.5).long()
    return c.clamp(min=0)


def grid_cell_indices(positions: Tensor, n_cascades: int, grid_resolution: int) -> tuple[Tensor, Tensor]:
    """Flat cell index (over [C, G^3]) of the finest cascade containing each point.

    Args:
        positions: float [..., 3].
        n_cascades: C.
        grid_resolution: G.

    Returns:
        cell_indices: int64 [...], ``c * G^3 + (ix * G + iy) * G + iz`` with
            ``c = min(cascade_of(p), C - 1)``, ``u = (p - 0.5) / 2^c + 0.5`` and
            ``ix = clamp(floor(u_x * G), 0, G - 1)`` (likewise y, z).
        inside: bool [...], the point lies in the (closed) outer box ``max|p - 0.5| <= 2^(C-1)/2``.
    """
    g = int(grid_resolution)
    c = cascade_of(positions).clamp(max=n_cascades - 1)
    inside = (positions - 0.5).abs().amax(dim=-1) <= 2.0 ** (n_cascades - 1) / 2
    scale = torch.ldexp(torch.ones_like(positions[..., :1]), c[..., None])
    u = (positions - 0.5) / scale + 0.5
    ijk = torch.floor(u * g).long().clamp(0, g - 1)
    flat = ((c * g + ijk[..., 0]) * g + ijk[..., 1]) * g + ijk[..., 2]
    return flat, inside


def grid_ema_update(density_grid: Tensor, cell_indices: Tensor, densities: Tensor, decay: float) -> Tensor:
    """Exponential-max update of the density grid (instant-ngp).

    ``splat = zeros; splat[idx] = max of the densities sampled in that cell``; then for EVERY cell
    ``new = old if old < 0 else max(old * decay, splat)`` (unsampled cells decay; negative cells are
    never seen by a camera and stay negative).

    Args:
        density_grid: float32 [C, G^3].
        cell_indices: int64 [N] flat over [C, G^3].
        densities: float [N].
        decay: EMA decay in [0, 1].

    Returns:
        float32 [C, G^3], a new tensor (the input is not modified).
    """
    if cell_indices.shape != densities.shape or cell_indices.dim() != 1:
        raise ValueError(
            f"grid_ema_update: cell_indices and densities must both be [N], got "
            f"{tuple(cell_indices.shape)} and {tuple(densities.shape)}"
        )
    flat = density_grid.reshape(-1)
    splat = torch.zeros_like(flat).scatter_reduce(
        0, cell_indices.long(), densities.to(flat.dtype), reduce="amax", include_self=True
    )
    new = torch.where(flat < 0, flat, torch.maximum(flat * decay, splat))
    return new.view_as(density_grid)


def grid_occupancy(density_grid: Tensor, threshold: float) -> Tensor:
    """Occupancy from densities: ``density > min(threshold, mean of the non-negative cells)``.

    The mean runs over all non-negative cells of all cascades (0 when there are none).

    Args:
        density_grid: float32 [C, G^3].
        threshold: density threshold (see ``render.occupancy`` for its relation to instant-ngp's
            minimum optical thickness).

    Returns:
        bool [C, G, G, G].
    """
    c, n = density_grid.shape
    g = round(n ** (1.0 / 3.0))
    if g**3 != n:
        raise ValueError(f"grid_occupancy: density_grid must be [C, G^3], got {tuple(density_grid.shape)}")
    seen = density_grid >= 0
    mean = torch.where(seen, density_grid, 0.0).sum() / seen.sum().clamp(min=1)
    thresh = torch.clamp(mean, max=threshold)
    return (density_grid > thresh).view(c, g, g, g)


def pack_bitfield(binaries: Tensor) -> Tensor:
    """Pack occupancy bits: bit ``i % 8`` of byte ``i // 8`` for flat index ``i`` over [C, G^3].

    Args:
        binaries: bool [C, G, G, G] (C * G^3 divisible by 8).

    Returns:
        uint8 [C * G^3 / 8].
    """
    flat = binaries.reshape(-1)
    if flat.numel() % 8 != 0:
        raise ValueError(f"pack_bitfield: number of cells {flat.numel()} is not a multiple of 8")
    weights = 2 ** torch.arange(8, device=flat.device, dtype=torch.int32)
    return (flat.view(-1, 8).to(torch.int32) * weights).sum(dim=-1).to(torch.uint8)


def unpack_bitfield(bits: Tensor, n_cascades: int, grid_resolution: int) -> Tensor:
    """Inverse of :func:`pack_bitfield`: uint8 [C * G^3 / 8] -> bool [C, G, G, G]."""
    g = int(grid_resolution)
    if bits.shape != (n_cascades * g**3 // 8,):
        raise ValueError(
            f"unpack_bitfield: expected {n_cascades * g**3 // 8} bytes for C={n_cascades}, G={g}, "
            f"got shape {tuple(bits.shape)}"
        )
    shifts = torch.arange(8, device=bits.device, dtype=torch.int32)
    b = (bits.to(torch.int32)[:, None] >> shifts) & 1
    return b.bool().view(n_cascades, g, g, g)


# --------------------------------------------------------------------------------------------------
# Ray marching
# --------------------------------------------------------------------------------------------------
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
    rays_o: Tensor,
    rays_d: Tensor,
    t_near: Tensor,
    t_far: Tensor,
    binaries: Tensor,
    *,
    step_size: float = SQRT3 / 1024,
    cone_angle: float = 0.0,
    max_step: float | None = None,
    max_samples_per_ray: int = 1024,
    near_plane: float = 0.0,
    t_jitter: Tensor | None = None,
) -> PackedSamples:
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
    max_step = _check_march_args(
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
    """bool [S]: sample i lies inside its ray's ``packed_info`` range (False for fixed-layout padding)."""
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
    _check_repack_args(packed, keep, capacity)
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


def _check_repack_args(packed: PackedSamples, keep: Tensor, capacity: int) -> None:
    if keep.shape != packed.ray_indices.shape or keep.dtype != torch.bool:
        n = packed.ray_indices.shape[0]
        raise ValueError(f"repack: keep must be bool [S={n}], got {keep.dtype} {tuple(keep.shape)}")
    if capacity < 0:
        raise ValueError(f"repack: capacity must be >= 0, got {capacity}")


def march_rays_fixed(
    rays_o: Tensor,
    rays_d: Tensor,
    t_near: Tensor,
    t_far: Tensor,
    binaries: Tensor,
    *,
    capacity: int,
    n_active: Tensor | None = None,
    step_size: float = SQRT3 / 1024,
    cone_angle: float = 0.0,
    max_step: float | None = None,
    max_samples_per_ray: int = 1024,
    near_plane: float = 0.0,
    t_jitter: Tensor | None = None,
) -> tuple[PackedSamples, Tensor]:
    """:func:`march_rays` into fixed buffers of ``capacity`` samples (the fixed layout).

    The samples are those of :func:`march_rays`; rays are kept in index order while they fit
    (:func:`repack`), and rays ``r >= n_active`` are not marched at all (invalid).

    Args:
        capacity: number of sample slots.
        n_active: int64 scalar tensor (on the rays' device) or None (all rays).
        others: as :func:`march_rays`.

    Returns:
        (PackedSamples with ``S = capacity``, ray_valid bool [R]).
    """
    n_rays = rays_o.shape[0]
    # The oracle marches only the active rays (one host read of n_active; the CUDA kernel skips the
    # others on the device) and gives the rest no samples.
    n = n_rays if n_active is None else max(0, min(n_rays, int(n_active)))
    packed = march_rays(
        rays_o[:n],
        rays_d[:n],
        t_near[:n],
        t_far[:n],
        binaries,
        step_size=step_size,
        cone_angle=cone_angle,
        max_step=max_step,
        max_samples_per_ray=max_samples_per_ray,
        near_plane=near_plane,
        t_jitter=None if t_jitter is None else t_jitter[:n],
    )
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


# --------------------------------------------------------------------------------------------------
# Sample positions
# --------------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------------
# Regularizers on packed samples
# --------------------------------------------------------------------------------------------------
def distortion_loss(
    weights: Tensor, t_starts: Tensor, t_ends: Tensor, ray_indices: Tensor, packed_info: Tensor
) -> Tensor:
    """mip-NeRF 360's distortion loss of each ray, on packed samples (any layout, padding weight 0).

    ``L_r = sum_{i,j} w_i w_j |m_i - m_j| + 1/3 sum_i w_i^2 (t_end_i - t_start_i)`` over the samples of
    ray ``r``, ``m`` the interval midpoints (NGP units). Small when a ray's weight sits in one short
    interval; large for weight spread along the ray (floaters in front of a surface). Computed in
    O(S) from within-ray exclusive prefix sums (the samples of a ray are sorted by t):
    ``sum_{i,j} w_i w_j |m_i - m_j| = 2 sum_i w_i (m_i W_i - M_i)``, ``W_i = sum_{j<i} w_j``,
    ``M_i = sum_{j<i} w_j m_j``, accumulated in float64. Samples outside their ray's ``packed_info``
    range (:func:`samples_in_use`: the fixed layout's padding) add no loss and get gradient 0.

    Args:
        weights: float [S], differentiable; t_starts, t_ends: float [S]; ray_indices: int [S];
        packed_info: int64 [R, 2] (first sample, count) per ray.

    Returns:
        [R] in float32 (float64 for float64 weights), 0 for rays without samples, differentiable
        w.r.t. ``weights``.
    """
    n_rays, n = packed_info.shape[0], weights.shape[0]
    out = torch.zeros(n_rays, dtype=torch.float64, device=weights.device)
    if n == 0 or n_rays == 0:
        return (out + 0.0 * weights.sum()).to(torch.promote_types(weights.dtype, torch.float32))
    w = weights.double()
    mid = ((t_starts + t_ends) * 0.5).double()
    ray = ray_indices.long()
    excl_w = torch.cumsum(w, 0) - w  # global exclusive prefix sums ...
    excl_wm = torch.cumsum(w * mid, 0) - w * mid
    # fixed-layout padding lies outside every ray's range: no loss, no gradient
    in_use = samples_in_use(PackedSamples(ray_indices, t_starts, t_ends, packed_info))
    # ... minus their value at the ray's first sample. Padding reads its own slot (its loss is masked
    # below): all of it is "ray 0", and one long run of equal gather indices is serialized on a GPU
    # by the gathers' backward (index_put_ with accumulate).
    own = torch.arange(n, device=weights.device)
    first = torch.where(in_use, packed_info[:, 0].clamp(0, n - 1)[ray], own)
    before_w = excl_w - excl_w[first]
    before_wm = excl_wm - excl_wm[first]
    per_sample = 2.0 * w * (mid * before_w - before_wm) + w * w * (t_ends - t_starts).double() / 3.0
    loss = out.index_add(0, ray, torch.where(in_use, per_sample, 0.0))
    return loss.to(torch.promote_types(weights.dtype, torch.float32))


# --------------------------------------------------------------------------------------------------
# Density activation (models/field.py)
# --------------------------------------------------------------------------------------------------
class _TruncExp(torch.autograd.Function):
    """exp(x) whose gradient is clamped at x = 15: keeps density gradients finite early in training."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    def forward(ctx, x: Tensor) -> Tensor:  # noqa: ANN001
        ctx.save_for_backward(x)
        return torch.exp(x)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad: Tensor) -> Tensor:  # noqa: ANN001
        (x,) = ctx.saved_tensors
        return grad * torch.exp(x.clamp(max=15.0))


def trunc_exp(x: Tensor) -> Tensor:
    """instant-ngp's density activation: ``exp(x)``, gradient ``exp(min(x, 15))``."""
    return _TruncExp.apply(x)


def density_activation(h: Tensor, inside: Tensor, bias: float) -> Tensor:
    """Density from the density MLP's output: ``trunc_exp(float32(h[:, 0]) + bias) * inside``.

    Args:
        h: [S, W] float32 / float16 / bfloat16 MLP output (column 0: the density logit),
            differentiable; inside: bool [S] (0 density outside the box); bias: logit offset.

    Returns:
        float32 [S]; the gradient w.r.t. ``h`` is nonzero only in column 0:
        ``g * inside * exp(min(h0 + bias, 15))``, in ``h``'s dtype.
    """
    return trunc_exp(h[..., 0].float() + bias) * inside


# --------------------------------------------------------------------------------------------------
# The fixed-budget step's loss and ray count (models/train_step.py)
# --------------------------------------------------------------------------------------------------
def per_ray_loss(pred: Tensor, target: Tensor, kind: str = "huber", delta: float = 0.1) -> Tensor:
    """Photometric loss per ray [R]: the mean over the channels of ``F.huber_loss`` (``x^2 / 2`` for
    ``|x| < delta``, else ``delta * (|x| - delta / 2)``) or of ``x^2`` (``mse``), ``x = pred - target``."""
    if kind == "mse":
        return ((pred - target) ** 2).mean(dim=-1)
    if kind == "huber":
        return torch.nn.functional.huber_loss(pred, target, reduction="none", delta=delta).mean(dim=-1)
    raise ValueError(f"per_ray_loss: kind must be 'huber' or 'mse', got {kind!r}")


def masked_ray_loss(
    pred: Tensor, target: Tensor, valid: Tensor, kind: str = "huber", delta: float = 0.1
) -> tuple[Tensor, Tensor, Tensor]:
    """Mean per-ray loss over the valid rays of a fixed-layout batch.

    Args:
        pred: float [R, 3], differentiable; target: float [R, 3]; valid: bool [R].
        kind, delta: the loss ``f`` of :func:`per_ray_loss`.

    Returns:
        loss: float32 scalar ``sum_r l_r / max(n_valid, 1)`` with ``l_r = valid_r * mean_c f(x_rc)``
            (differentiable w.r.t. ``pred``);
        per_ray: float32 [R], ``l_r`` (detached; 0 for invalid rays);
        aux: float64 [2] = (n_valid, ``sum_r valid_r * mean_c x_rc^2``), detached.
    """
    pred, target = pred.float(), target.float()
    per_ray = per_ray_loss(pred, target, kind, delta) * valid
    n_valid = valid.sum()
    loss = per_ray.sum() / n_valid.clamp_min(1)
    with torch.no_grad():
        sq_err = (((pred.detach() - target) ** 2).mean(dim=-1) * valid).sum()
        aux = torch.stack([n_valid.to(torch.float64), sq_err.to(torch.float64)])
    return loss, per_ray.detach(), aux


@torch.no_grad()
def adapt_ray_count(
    aux: Tensor,
    ray_valid: Tensor,
    marched_counts: Tensor,
    rendered_counts: Tensor,
    n_active: Tensor,
    n_active_f: Tensor,
    target_fraction: Tensor,
    *,
    sample_budget: int,
    march_budget: int,
    min_rays: int,
    n_slots: int,
    momentum: float,
) -> Tensor:
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


# --------------------------------------------------------------------------------------------------
# Volume rendering
# --------------------------------------------------------------------------------------------------
def render_weights(
    sigmas: Tensor,
    t_starts: Tensor,
    t_ends: Tensor,
    ray_indices: Tensor,
    n_rays: int,
    packed_info: Tensor | None = None,
    early_stop_eps: float = 1e-4,
) -> tuple[Tensor, Tensor]:
    """Compositing weights of packed samples.

    ``delta = t_ends - t_starts``, ``alpha = 1 - exp(-sigma * delta)``, exclusive transmittance
    ``T_i = exp(-sum_{j<i, same ray} sigma_j delta_j)``, ``w_i = T_i * alpha_i``, and ``w_i = 0``
    where ``T_i < early_stop_eps`` (early termination). The per-ray prefix sum is a global
    float64 cumsum minus its value at the ray's first sample (float64 so that the subtraction does
    not lose the small per-ray sums); results are cast back to the dtype of ``sigmas``.

    Args:
        sigmas: float [S] densities (>= 0).
        t_starts: float [S].
        t_ends: float [S].
        ray_indices: int64 [S], samples of one ray contiguous.
        n_rays: R (unused by this implementation; part of the shared signature).
        packed_info: int64 [R, 2] or None (then segment starts are found from ``ray_indices``).
        early_stop_eps: transmittance below which samples get weight 0.

    Returns:
        weights: float [S], differentiable w.r.t. ``sigmas``.
        transmittance: float [S], exclusive transmittance ``T_i``.
    """
    n = sigmas.shape[0]
    if not (sigmas.shape == t_starts.shape == t_ends.shape == ray_indices.shape == (n,)):
        raise ValueError(
            "render_weights: sigmas, t_starts, t_ends, ray_indices must all be [S], got "
            f"{tuple(sigmas.shape)}, {tuple(t_starts.shape)}, {tuple(t_ends.shape)}, "
            f"{tuple(ray_indices.shape)}"
        )
    tau = sigmas * (t_ends - t_starts)
    acc_incl = torch.cumsum(tau.double(), dim=0)
    acc_excl = acc_incl - tau.double()
    if packed_info is not None:
        first = packed_info[ray_indices.long(), 0]
    else:
        idx = torch.arange(n, device=sigmas.device)
        is_first = torch.ones(n, dtype=torch.bool, device=sigmas.device)
        is_first[1:] = ray_indices[1:] != ray_indices[:-1]
        first = torch.cummax(torch.where(is_first, idx, 0), dim=0).values
    trans = torch.exp(-(acc_excl - acc_excl[first])).to(sigmas.dtype)
    alpha = 1.0 - torch.exp(-tau)
    weights = torch.where(trans < early_stop_eps, torch.zeros_like(alpha), trans * alpha)
    return weights, trans


def accumulate_along_rays(weights: Tensor, values: Tensor | None, ray_indices: Tensor, n_rays: int) -> Tensor:
    """Per-ray weighted sum: ``out[r] = sum_{i in ray r} w_i * v_i``.

    Args:
        weights: float [S].
        values: float [S, D] or None (then the sum of weights, D = 1).
        ray_indices: int64 [S].
        n_rays: R.

    Returns:
        float [R, D], differentiable w.r.t. weights and values.
    """
    src = weights[:, None] if values is None else weights[:, None] * values
    out = torch.zeros(n_rays, src.shape[-1], dtype=src.dtype, device=src.device)
    return out.index_add(0, ray_indices.long(), src)


def volume_render(
    sigmas: Tensor,
    rgbs: Tensor,
    t_starts: Tensor,
    t_ends: Tensor,
    ray_indices: Tensor,
    n_rays: int,
    packed_info: Tensor | None = None,
    background: Tensor | None = None,
    early_stop_eps: float = 1e-4,
) -> dict[str, Tensor]:
    """Composite packed samples into per-ray colour, opacity and depth.

    Args:
        sigmas: float [S].
        rgbs: float [S, 3].
        t_starts, t_ends: float [S].
        ray_indices: int64 [S].
        n_rays: R.
        packed_info: int64 [R, 2] or None.
        background: float [R, 3], [3] or None (None = black).
        early_stop_eps: see :func:`render_weights`.

    Returns:
        dict with ``rgb`` [R, 3] (``sum w c + (1 - opacity) * background``), ``opacity`` [R, 1]
        (``sum w``), ``depth`` [R, 1] (``sum w (t_start + t_end) / 2``, not normalized) and
        ``weights`` [S]; differentiable w.r.t. sigmas and rgbs.
    """
    if rgbs.shape != (sigmas.shape[0], 3):
        raise ValueError(
            f"volume_render: rgbs must be [S, 3] with S={sigmas.shape[0]}, got {tuple(rgbs.shape)}"
        )
    weights, _ = render_weights(sigmas, t_starts, t_ends, ray_indices, n_rays, packed_info, early_stop_eps)
    opacity = accumulate_along_rays(weights, None, ray_indices, n_rays)
    rgb = accumulate_along_rays(weights, rgbs, ray_indices, n_rays)
    depth = accumulate_along_rays(weights, ((t_starts + t_ends) * 0.5)[:, None], ray_indices, n_rays)
    if background is not None:
        if background.shape not in ((3,), (n_rays, 3)):
            raise ValueError(
                f"volume_render: background must be [3] or [{n_rays}, 3], got {tuple(background.shape)}"
            )
        rgb = rgb + (1.0 - opacity) * background.to(rgb.dtype)
    return {"rgb": rgb, "opacity": opacity, "depth": depth, "weights": weights}


def _check_march_args(
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
    _check_rays(rays_o, rays_d, "march_rays")
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


def _check_rays(rays_o: Tensor, rays_d: Tensor, where: str) -> None:
    if rays_o.dim() != 2 or rays_o.shape[-1] != 3 or rays_d.shape != rays_o.shape:
        raise ValueError(
            f"{where}: rays_o and rays_d must both be [R, 3], got {tuple(rays_o.shape)} and "
            f"{tuple(rays_d.shape)}"
        )


# --------------------------------------------------------------------------------------------------
# The field's MLPs in half precision (models/field.py under 16-mixed / bf16-mixed)
# --------------------------------------------------------------------------------------------------
def fused_mlp(
    in0: Tensor,
    in1: Tensor | None,
    weights: Sequence[Tensor],
    biases: Sequence[Tensor],
    half_dtype: torch.dtype,
) -> Tensor:
    """A ReLU MLP on ``cat(in0, in1)`` with the rounding of tiny-cuda-nn's fully fused MLP.

    Layer ``l`` computes ``y = x W_l^T + b_l``; hidden layers (all but the last) pass ``relu(y)`` on.
    The input and every hidden activation are rounded to ``half_dtype`` (float16 or bfloat16), the
    weights are fp32 master weights rounded to ``half_dtype`` for the product, products accumulate
    in float32 and the biases are added in float32; the output ``y`` of the last layer is float32.
    The CUDA backend runs the whole network in one kernel each way; its gradients round the
    back-propagated activation gradients to ``half_dtype`` as well (within half-precision rounding
    of this function's autograd).

    Args:
        in0: float [N, C0], differentiable; in1: float [N, C1] or None, differentiable too (the
            colour network's view-direction encoding, when learned camera poses turn the directions).
        weights: fp32 ``[out_l, in_l]`` (``nn.Linear.weight``; ``in_0 = C0 + C1``), biases fp32 [out_l].
        half_dtype: ``torch.float16`` or ``torch.bfloat16``.

    Returns:
        float32 [N, out_last].
    """
    if half_dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"fused_mlp: half_dtype must be float16 or bfloat16, got {half_dtype}")
    x = in0.float() if in1 is None else torch.cat([in0.float(), in1.float()], dim=-1)
    h = x.to(half_dtype)
    y = x
    for i, (w, b) in enumerate(zip(weights, biases, strict=True)):
        y = h.float() @ w.to(half_dtype).float().t() + b.float()
        if i + 1 < len(weights):
            h = torch.relu(y).to(half_dtype)
    return y
