"""The occupancy grid's math: cells and cascades, the density EMA, occupancy bits.

Cascade ``c`` covers ``[0.5 - 2^c/2, 0.5 + 2^c/2]^3`` with ``G^3`` cells; a cell's flat index over the
whole grid ``[C, G^3]`` is ``c * G^3 + (ix * G + iy) * G + iz``. ``volume/occupancy.py`` decides when
and where to sample; these functions are the pure parts.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "grid_cell_positions",
    "cascade_of",
    "grid_cell_indices",
    "grid_ema_update",
    "grid_occupancy",
    "pack_bitfield",
    "unpack_bitfield",
]


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
    """Inverse of :func:`pack_bitfield`.

    Args:
        bits: uint8 [C * G^3 / 8], bit ``i % 8`` of byte ``i // 8`` for flat cell index ``i``.
        n_cascades: C.
        grid_resolution: G.

    Returns:
        bool [C, G, G, G].
    """
    g = int(grid_resolution)
    if bits.shape != (n_cascades * g**3 // 8,):
        raise ValueError(
            f"unpack_bitfield: expected {n_cascades * g**3 // 8} bytes for C={n_cascades}, G={g}, "
            f"got shape {tuple(bits.shape)}"
        )
    shifts = torch.arange(8, device=bits.device, dtype=torch.int32)
    b = (bits.to(torch.int32)[:, None] >> shifts) & 1
    return b.bool().view(n_cascades, g, g, g)
