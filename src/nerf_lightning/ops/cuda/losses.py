"""CUDA wrappers of ``ops/reference/losses.py``: the distortion loss and the batch's photometric loss.

``distortion_loss``: one warp per ray over the samples of its ``packed_info`` range, within-ray float64
warp scans of the prefix sums (the reference subtracts global float64 cumsums and gathers them per
sample, whose backward serializes the fixed layout's padding, all of ray 0, on one warp).
``masked_ray_loss``: sums over blocks added in block order by the last block to finish (deterministic;
float64 where the reference sums float32). ``per_ray_loss`` is the reference. No host sync in either:
both run inside the captured training step.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..types import check_sample_arrays
from . import _support
from ._support import device_problem, dtype_problem, reference_for
from .compositing import HALF_OR_FLOAT

__all__ = ["distortion_loss", "masked_ray_loss"]


class _DistortionLoss(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    def forward(ctx: Any, weights: Tensor, t_starts: Tensor, t_ends: Tensor, packed_info: Tensor) -> Tensor:
        w, ts, te = weights.contiguous(), t_starts.contiguous(), t_ends.contiguous()
        info = packed_info.contiguous()
        loss = _support.ext().distortion_loss_fwd(w, ts, te, info)
        ctx.save_for_backward(w, ts, te, info)
        ctx.set_materialize_grads(False)
        return loss

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx: Any, g_loss: Tensor | None) -> tuple:
        if g_loss is None:
            return None, None, None, None
        w, ts, te, info = ctx.saved_tensors
        # contiguous(): the gradient of a sum arrives expanded (stride 0)
        g_w = _support.ext().distortion_loss_bwd(g_loss.float().contiguous(), w, ts, te, info)
        return g_w, None, None, None


def distortion_loss(
    weights: Tensor, t_starts: Tensor, t_ends: Tensor, ray_indices: Tensor, packed_info: Tensor
) -> Tensor:
    """See :func:`nerf_lightning.ops.reference.distortion_loss` (-> float32 [R], differentiable w.r.t.
    ``weights``): one kernel each way, no host sync (CUDA-graph capturable).

    One warp per ray over the samples of its ``packed_info`` range (``ray_indices`` is not read: in
    every layout the ranges say which samples a ray has, and padding lies outside all of them).
    Gradient (closed form of the reference's, per ray, ``W_k``/``M_k`` the exclusive prefix sums and
    ``W``/``M`` the ray's totals of ``w`` and ``w m``):
    ``dL/dw_k = g_r (2 (m_k (2 W_k - W) + M - 2 M_k) + 2 w_k (t_end_k - t_start_k) / 3)``.
    """
    check_sample_arrays(
        "distortion_loss", weights=weights, t_starts=t_starts, t_ends=t_ends, ray_indices=ray_indices
    )
    if packed_info.dim() != 2 or packed_info.shape[1] != 2:
        raise ValueError(f"distortion_loss: packed_info must be [R, 2], got {tuple(packed_info.shape)}")
    why = device_problem(weights, t_starts, t_ends, packed_info)
    why = why or dtype_problem((weights,), HALF_OR_FLOAT) or dtype_problem((t_starts, t_ends))
    if why:
        return reference_for("distortion_loss", why)(weights, t_starts, t_ends, ray_indices, packed_info)
    return _DistortionLoss.apply(weights.float(), t_starts, t_ends, packed_info.long())


class _MaskedRayLoss(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, pred: Tensor, target: Tensor, valid: Tensor, huber: bool, delta: float
    ) -> tuple[Tensor, Tensor, Tensor]:
        loss, per_ray, aux = _support.ext().masked_ray_loss_fwd(pred, target, valid, huber, float(delta))
        ctx.save_for_backward(pred, target, valid, aux)
        ctx.huber, ctx.delta = huber, float(delta)
        ctx.mark_non_differentiable(per_ray, aux)
        ctx.set_materialize_grads(False)
        return loss, per_ray, aux

    @staticmethod
    def backward(ctx: Any, g_loss: Tensor | None, _g_per_ray: Any, _g_aux: Any) -> tuple:
        if g_loss is None:
            return None, None, None, None, None
        pred, target, valid, aux = ctx.saved_tensors
        grad = _support.ext().masked_ray_loss_bwd(
            g_loss.float().contiguous(), pred, target, valid, aux, ctx.huber, ctx.delta
        )
        return grad, None, None, None, None


def masked_ray_loss(
    pred: Tensor, target: Tensor, valid: Tensor, kind: str = "huber", delta: float = 0.1
) -> tuple[Tensor, Tensor, Tensor]:
    """See :func:`nerf_lightning.ops.reference.masked_ray_loss`: one forward kernel (per-ray loss and
    the sums, reduced over blocks in a fixed order) and one backward kernel."""
    if kind not in ("huber", "mse"):
        raise ValueError(f"masked_ray_loss: kind must be 'huber' or 'mse', got {kind!r}")
    n = pred.shape[0]
    if not (pred.shape == target.shape == (n, 3) and valid.shape == (n,)):
        raise ValueError(
            f"masked_ray_loss: pred and target must be [R, 3] and valid [R], got {tuple(pred.shape)}, "
            f"{tuple(target.shape)} and {tuple(valid.shape)}"
        )
    why = device_problem(pred, target, valid) or dtype_problem((valid,), (torch.bool,))
    if why:
        return reference_for("masked_ray_loss", why)(pred, target, valid, kind, delta)
    return _MaskedRayLoss.apply(
        pred.float().contiguous(), target.float().contiguous(), valid.contiguous(), kind == "huber", delta
    )
