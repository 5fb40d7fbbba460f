"""CUDA wrappers of ``ops/reference/grid.py``: occupancy-cell positions, the density EMA, occupancy bits.

``cascade_of``, ``grid_cell_indices`` and ``grid_occupancy`` are the reference functions (a few fused
torch kernels already, off the hot path): see ``REFERENCE_OPS`` in the package.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _support
from ._support import device_problem, dtype_problem, reference_for

__all__ = ["grid_cell_positions", "grid_ema_update", "pack_bitfield", "unpack_bitfield"]


def grid_cell_positions(cell_indices: Tensor, jitter: Tensor, grid_resolution: int) -> Tensor:
    """See :func:`nerf_lightning.ops.reference.grid_cell_positions`.

    Args:
        cell_indices: int [N] flat over [C, G^3]; jitter: float32 [N, 3] in [0, 1); both CUDA.

    Returns:
        float32 [N, 3] NGP-space positions ``((ijk + jitter) / G - 0.5) * 2^c + 0.5``.
    """
    if cell_indices.dim() != 1 or jitter.shape != (cell_indices.shape[0], 3):
        raise ValueError(
            f"grid_cell_positions: expected cell_indices [N] and jitter [N, 3], got "
            f"{tuple(cell_indices.shape)} and {tuple(jitter.shape)}"
        )
    why = device_problem(cell_indices, jitter) or dtype_problem((jitter,))
    if why:
        return reference_for("grid_cell_positions", why)(cell_indices, jitter, grid_resolution)
    return _support.ext().grid_cell_positions(
        cell_indices.long().contiguous(), jitter.contiguous(), int(grid_resolution)
    )


def grid_ema_update(density_grid: Tensor, cell_indices: Tensor, densities: Tensor, decay: float) -> Tensor:
    """See :func:`nerf_lightning.ops.reference.grid_ema_update`.

    Args:
        density_grid: float32 [C, G^3]; cell_indices: int [N]; densities: float [N] (detached, read as
            float32); all CUDA.

    Returns:
        float32 [C, G^3], a new tensor.
    """
    if cell_indices.shape != densities.shape or cell_indices.dim() != 1:
        raise ValueError(
            f"grid_ema_update: cell_indices and densities must both be [N], got "
            f"{tuple(cell_indices.shape)} and {tuple(densities.shape)}"
        )
    why = device_problem(density_grid, cell_indices, densities) or dtype_problem((density_grid,))
    if why:
        return reference_for("grid_ema_update", why)(density_grid, cell_indices, densities, decay)
    return _support.ext().grid_ema_update(
        density_grid.contiguous(),
        cell_indices.long().contiguous(),
        densities.detach().float().contiguous(),
        float(decay),
    )


def pack_bitfield(binaries: Tensor) -> Tensor:
    """See :func:`nerf_lightning.ops.reference.pack_bitfield` (bool [C, G, G, G] CUDA -> uint8 [C*G^3/8])."""
    if binaries.numel() % 8 != 0:
        raise ValueError(f"pack_bitfield: number of cells {binaries.numel()} is not a multiple of 8")
    why = device_problem(binaries) or dtype_problem((binaries,), (torch.bool,))
    if why:
        return reference_for("pack_bitfield", why)(binaries)
    return _support.ext().pack_bitfield(binaries.contiguous())


def unpack_bitfield(bits: Tensor, n_cascades: int, grid_resolution: int) -> Tensor:
    """See :func:`nerf_lightning.ops.reference.unpack_bitfield` (uint8 [C*G^3/8] -> bool [C, G, G, G])."""
    g = int(grid_resolution)
    if bits.shape != (n_cascades * g**3 // 8,):
        raise ValueError(
            f"unpack_bitfield: expected {n_cascades * g**3 // 8} bytes for C={n_cascades}, G={g}, "
            f"got shape {tuple(bits.shape)}"
        )
    why = device_problem(bits) or dtype_problem((bits,), (torch.uint8,))
    if why:
        return reference_for("unpack_bitfield", why)(bits, n_cascades, grid_resolution)
    return _support.ext().unpack_bitfield(bits.contiguous(), int(n_cascades), g)
