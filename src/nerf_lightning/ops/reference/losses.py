"""Losses on rays: the photometric loss of the training step and mip-NeRF 360's distortion loss."""

from __future__ import annotations

import torch
from torch import Tensor

from ..types import PackedSamples
from .marching import samples_in_use

__all__ = ["distortion_loss", "per_ray_loss", "masked_ray_loss"]


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


def per_ray_loss(pred: Tensor, target: Tensor, kind: str = "huber", delta: float = 0.1) -> Tensor:
    """Photometric loss per ray.

    Args:
        pred, target: float [R, C] (colours); kind: ``"huber"`` or ``"mse"``; delta: Huber's threshold.

    Returns:
        float [R]: the mean over the channels of ``F.huber_loss`` (``x^2 / 2`` for ``|x| < delta``, else
        ``delta * (|x| - delta / 2)``) or of ``x^2`` (``mse``), ``x = pred - target``.
    """
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
