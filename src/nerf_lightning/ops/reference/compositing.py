"""Volume rendering of packed samples: compositing weights, per-ray sums, colour/opacity/depth.

Samples of one ray are contiguous and ordered by ``t`` (any layout of ``PackedSamples``; the fixed
layout's padding has ``t_start = t_end = 0``, so weight 0 and no gradient).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..types import check_sample_arrays

__all__ = ["render_weights", "accumulate_along_rays", "volume_render"]


def render_weights(
    sigmas: Tensor, t_starts: Tensor, t_ends: Tensor, ray_indices: Tensor, n_rays: int,
    packed_info: Tensor | None = None, early_stop_eps: float = 1e-4,
) -> tuple[Tensor, Tensor]:  # fmt: skip
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
    check_sample_arrays(
        "render_weights", sigmas=sigmas, t_starts=t_starts, t_ends=t_ends, ray_indices=ray_indices
    )
    return _weights(sigmas, t_starts, t_ends, ray_indices, packed_info, early_stop_eps)


def _weights(
    sigmas: Tensor, t_starts: Tensor, t_ends: Tensor, ray_indices: Tensor, packed_info: Tensor | None,
    early_stop_eps: float,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """:func:`render_weights` on arrays already checked."""
    n = sigmas.shape[0]
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
    sigmas: Tensor, rgbs: Tensor, t_starts: Tensor, t_ends: Tensor, ray_indices: Tensor, n_rays: int,
    packed_info: Tensor | None = None, background: Tensor | None = None, early_stop_eps: float = 1e-4,
) -> dict[str, Tensor]:  # fmt: skip
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
    check_volume_render_args(sigmas, rgbs, t_starts, t_ends, ray_indices, n_rays, background)
    weights, _ = _weights(sigmas, t_starts, t_ends, ray_indices, packed_info, early_stop_eps)
    opacity = accumulate_along_rays(weights, None, ray_indices, n_rays)
    rgb = accumulate_along_rays(weights, rgbs, ray_indices, n_rays)
    depth = accumulate_along_rays(weights, ((t_starts + t_ends) * 0.5)[:, None], ray_indices, n_rays)
    if background is not None:
        rgb = rgb + (1.0 - opacity) * background.to(rgb.dtype)
    return {"rgb": rgb, "opacity": opacity, "depth": depth, "weights": weights}


def check_volume_render_args(
    sigmas: Tensor, rgbs: Tensor, t_starts: Tensor, t_ends: Tensor, ray_indices: Tensor, n_rays: int,
    background: Tensor | None,
) -> None:  # fmt: skip
    """Validate the shapes of :func:`volume_render`'s arguments (shared by every backend)."""
    n = sigmas.shape[0]
    if rgbs.shape != (n, 3):
        raise ValueError(f"volume_render: rgbs must be [S, 3] with S={n}, got {tuple(rgbs.shape)}")
    check_sample_arrays(
        "volume_render", sigmas=sigmas, t_starts=t_starts, t_ends=t_ends, ray_indices=ray_indices
    )
    if background is not None and background.shape not in ((3,), (n_rays, 3)):
        raise ValueError(
            f"volume_render: background must be [3] or [{n_rays}, 3], got {tuple(background.shape)}"
        )
