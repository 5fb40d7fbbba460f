"""A fused PyTorch hash-grid encoding: the fast path on CPUs (and GPUs without our extension).

Same numbers as ``ops.reference.hash_encode`` (the readable oracle), computed for all
levels at once, with one gather in the forward pass and one ``index_add_`` in the backward pass
instead of an autograd graph of a few hundred element-wise ops. Gradients flow to the feature
table only: NeRF positions never need them (use the oracle when ``x.requires_grad``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .reference.encoding import MASK32, PRIMES


def _corner_indices_and_weights(
    x: Tensor, scales: Tensor, resolutions: Tensor, sizes: Tensor, offsets: Tensor, dense: Tensor
) -> tuple[Tensor, Tensor]:
    """Row indices [N, L, 8] (int64, into the whole table) and trilinear weights [N, L, 8]."""
    pos = x[:, None, :] * scales[None, :, None] + 0.5  # [N, L, 3]
    p0f = torch.floor(pos)
    frac = pos - p0f
    p0 = p0f.to(torch.int64)
    # Per axis: the two candidate coordinates, each already multiplied by its dense stride or hash prime.
    dense_mult = torch.stack([torch.ones_like(resolutions), resolutions, resolutions * resolutions], -1)
    hash_mult = torch.tensor(PRIMES, dtype=torch.int64, device=x.device).expand_as(dense_mult)
    mult = torch.where(dense[:, None], dense_mult, hash_mult)  # [L, 3]
    lo = p0 * mult[None]  # [N, L, 3]
    hi = (p0 + 1) * mult[None]
    lo_h, hi_h = lo & MASK32, hi & MASK32
    w_lo, w_hi = 1.0 - frac, frac
    idx_corners, w_corners = [], []
    is_dense = dense[None, :]
    for corner in range(8):  # the 8 cube corners; tcnn order: bit d of the corner index picks hi on axis d
        pick = [(corner >> d) & 1 for d in range(3)]
        cx = (hi if pick[0] else lo)[..., 0], (hi_h if pick[0] else lo_h)[..., 0]
        cy = (hi if pick[1] else lo)[..., 1], (hi_h if pick[1] else lo_h)[..., 1]
        cz = (hi if pick[2] else lo)[..., 2], (hi_h if pick[2] else lo_h)[..., 2]
        summed = cx[0] + cy[0] + cz[0]
        hashed = cx[1] ^ cy[1] ^ cz[1]
        idx_corners.append(torch.where(is_dense, summed, hashed))
        w = (w_hi if pick[0] else w_lo)[..., 0] * (w_hi if pick[1] else w_lo)[..., 1]
        w_corners.append(w * (w_hi if pick[2] else w_lo)[..., 2])
    idx = torch.stack(idx_corners, dim=-1)  # [N, L, 8]
    idx = torch.remainder(idx & MASK32, sizes[None, :, None]) + offsets[None, :, None]
    return idx, torch.stack(w_corners, dim=-1)


class _FusedHashGrid(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, params: Tensor, level_data: tuple[Tensor, ...]) -> Tensor:
        cdtype = torch.float64 if params.dtype == torch.float64 else torch.float32
        scales, resolutions, sizes, offsets, dense = level_data
        idx, w = _corner_indices_and_weights(
            x.to(cdtype), scales.to(cdtype), resolutions, sizes, offsets, dense
        )
        n, n_levels = x.shape[0], scales.shape[0]
        n_feat = params.shape[1]
        feats = params.index_select(0, idx.reshape(-1)).to(cdtype).view(n, n_levels, 8, n_feat)
        out = (feats * w[..., None]).sum(dim=2)  # [N, L, F]
        ctx.save_for_backward(idx, w)
        ctx.param_shape, ctx.param_dtype = params.shape, params.dtype
        return out.reshape(n, n_levels * n_feat)

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[None, Tensor | None, None]:
        idx, w = ctx.saved_tensors
        n, n_levels, _ = w.shape
        n_feat = ctx.param_shape[1]
        contrib = w[..., None] * grad_out.to(w.dtype).view(n, n_levels, 1, n_feat)  # [N, L, 8, F]
        grad_params = torch.zeros(ctx.param_shape, dtype=w.dtype, device=w.device)
        grad_params.index_add_(0, idx.reshape(-1), contrib.reshape(-1, n_feat))
        return None, grad_params.to(ctx.param_dtype), None


class LevelTables:
    """Per-level constants of a hash grid as tensors, cached per device."""

    def __init__(self, scales: Sequence[float], resolutions: Sequence[int], offsets: Sequence[int]) -> None:
        self.scales = list(scales)
        self.resolutions = list(resolutions)
        self.offsets = list(offsets)
        self._cache: dict[torch.device, tuple[Tensor, ...]] = {}

    def on(self, device: torch.device) -> tuple[Tensor, ...]:
        if device not in self._cache:
            sizes = [b - a for a, b in zip(self.offsets[:-1], self.offsets[1:], strict=True)]
            res = torch.tensor(self.resolutions, dtype=torch.int64, device=device)
            size_t = torch.tensor(sizes, dtype=torch.int64, device=device)
            self._cache[device] = (
                torch.tensor(self.scales, dtype=torch.float64, device=device),
                res,
                size_t,
                torch.tensor(self.offsets[:-1], dtype=torch.int64, device=device),
                res**3 <= size_t,
            )
        return self._cache[device]


def hash_encode_fused(x: Tensor, params: Tensor, tables: LevelTables) -> Tensor:
    """Hash encoding of positions ``x`` [N, 3] in [0, 1]^3 with table ``params`` [sum T_l, F] -> [N, L * F].

    Output dtype: float64 for float64 params, else float32 (as the oracle). No gradient to ``x``.
    """
    if x.requires_grad:
        raise ValueError("hash_encode_fused does not differentiate positions; use ops.reference.hash_encode")
    return _FusedHashGrid.apply(x, params, tables.on(x.device))
