"""A fused PyTorch hash-grid encoding: the fast path on CPUs (and GPUs without our extension).

Same numbers as ``ops.reference.hash_encode`` (the readable oracle), computed for all
levels at once, with one gather in the forward pass and one ``index_add_`` in the backward pass
instead of an autograd graph of a few hundred element-wise ops. Gradients flow to the feature
table and, when ``x.requires_grad`` (learned camera poses move the sample positions), to the positions:
the derivative of the trilinear weights, computed in the backward pass only when asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .reference.encoding import MASK32, PRIMES


def _corner_indices_and_weights(
    x: Tensor, scales: Tensor, resolutions: Tensor, sizes: Tensor, offsets: Tensor, dense: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Row indices [N, L, 8] (int64, into the whole table), trilinear weights [N, L, 8] and the
    fractional cell coordinates [N, L, 3] they are products of."""
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
    return idx, torch.stack(w_corners, dim=-1), frac


def _weight_derivatives(frac: Tensor) -> Tensor:
    """d w_c / d frac_d [N, L, 8, 3] of the trilinear weights (corner order as above)."""
    w_lo, w_hi = 1.0 - frac, frac
    out = []
    for corner in range(8):
        pick = [(corner >> d) & 1 for d in range(3)]
        f = [(w_hi if pick[d] else w_lo)[..., d] for d in range(3)]
        sign = [1.0 if pick[d] else -1.0 for d in range(3)]
        out.append(torch.stack([sign[0] * f[1] * f[2], sign[1] * f[0] * f[2], sign[2] * f[0] * f[1]], -1))
    return torch.stack(out, dim=2)


class _FusedHashGrid(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, params: Tensor, level_data: tuple[Tensor, ...]) -> Tensor:
        cdtype = torch.float64 if params.dtype == torch.float64 else torch.float32
        scales, resolutions, sizes, offsets, dense = level_data
        idx, w, frac = _corner_indices_and_weights(
            x.to(cdtype), scales.to(cdtype), resolutions, sizes, offsets, dense
        )
        n, n_levels = x.shape[0], scales.shape[0]
        n_feat = params.shape[1]
        feats = params.index_select(0, idx.reshape(-1)).to(cdtype).view(n, n_levels, 8, n_feat)
        out = (feats * w[..., None]).sum(dim=2)  # [N, L, F]
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(idx, w, frac, params, scales)
        else:
            ctx.save_for_backward(idx, w)
        ctx.param_shape, ctx.param_dtype, ctx.x_dtype = params.shape, params.dtype, x.dtype
        return out.reshape(n, n_levels * n_feat)

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        idx, w, *rest = ctx.saved_tensors
        n, n_levels, _ = w.shape
        n_feat = ctx.param_shape[1]
        g = grad_out.to(w.dtype).view(n, n_levels, 1, n_feat)
        grad_params = None
        if ctx.needs_input_grad[1]:
            contrib = w[..., None] * g  # [N, L, 8, F]
            grad_params = torch.zeros(ctx.param_shape, dtype=w.dtype, device=w.device)
            grad_params.index_add_(0, idx.reshape(-1), contrib.reshape(-1, n_feat))
            grad_params = grad_params.to(ctx.param_dtype)
        grad_x = None
        if ctx.needs_input_grad[0]:
            frac, params, scales = rest
            feats = params.index_select(0, idx.reshape(-1)).to(w.dtype).view(n, n_levels, 8, n_feat)
            dot = (feats * g).sum(-1)  # [N, L, 8]: d loss / d w_c
            dfrac = (dot[..., None] * _weight_derivatives(frac)).sum(2)  # [N, L, 3]
            grad_x = (dfrac * scales.to(w.dtype)[None, :, None]).sum(1).to(ctx.x_dtype)
        return grad_x, grad_params, None


class LevelTables:
    """Per-level constants of a hash grid as tensors, cached per device."""

    def __init__(self, scales: Sequence[float], resolutions: Sequence[int], offsets: Sequence[int]) -> None:
        self.scales = list(scales)
        self.resolutions = list(resolutions)
        self.offsets = list(offsets)
        self._cache: dict[torch.device, tuple[Tensor, ...]] = {}

    def on(self, device: torch.device) -> tuple[Tensor, ...]:
        if device not in self._cache:
            self._cache[device] = self._build(device)
        return self._cache[device]

    def _build(self, device: torch.device) -> tuple[Tensor, ...]:
        # Normal tensors even when the first call runs under torch.inference_mode() (an evaluation
        # pass): the held-out fit after it saves them for its backward, which inference tensors refuse.
        with torch.inference_mode(False):
            sizes = [b - a for a, b in zip(self.offsets[:-1], self.offsets[1:], strict=True)]
            res = torch.tensor(self.resolutions, dtype=torch.int64, device=device)
            size_t = torch.tensor(sizes, dtype=torch.int64, device=device)
            return (
                torch.tensor(self.scales, dtype=torch.float64, device=device),
                res,
                size_t,
                torch.tensor(self.offsets[:-1], dtype=torch.int64, device=device),
                res**3 <= size_t,
            )


def hash_encode_fused(x: Tensor, params: Tensor, tables: LevelTables) -> Tensor:
    """Hash encoding of positions ``x`` [N, 3] in [0, 1]^3 with table ``params`` [sum T_l, F] -> [N, L * F].

    Output dtype: float64 for float64 params, else float32 (as the oracle). Differentiable w.r.t.
    ``params`` and ``x`` (the oracle's gradients; floor() has derivative 0 as in the oracle).
    """
    return _FusedHashGrid.apply(x, params, tables.on(x.device))
