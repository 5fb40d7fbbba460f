"""CUDA wrappers of ``ops/reference/compositing.py``: compositing weights and volume rendering.

Kernel input: float32 / float16 / bfloat16 densities and colours (computed in float32; autocast casts
them to float32), float32 t values, on CUDA. One warp per ray (32 samples per step, float64 warp scans
of the optical depth): per-ray float64 optical depth where the reference subtracts a global float64
cumsum; gradients by the closed forms below instead of autograd. ``volume_render`` stops each ray at
``T < early_stop_eps`` (weights 0 beyond, as the reference) and composites a background that needs no
gradient inside its kernels. ``accumulate_along_rays`` is the reference (one ``index_add``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..reference.compositing import check_volume_render_args
from ..types import check_sample_arrays
from . import _support
from ._support import device_problem, dtype_problem, reference_for

__all__ = ["render_weights", "volume_render"]

#: the floating dtypes the compositing and loss kernels read (as float32)
HALF_OR_FLOAT = (torch.float32, torch.float16, torch.bfloat16)


def _packed_info_from(ray_indices: Tensor, n_rays: int) -> Tensor:
    """int64 [R, 2] (first, count) from non-decreasing ray indices, without a host sync."""
    counts = torch.zeros(n_rays, dtype=torch.long, device=ray_indices.device)
    counts.index_add_(0, ray_indices.long(), torch.ones_like(ray_indices, dtype=torch.long))
    return torch.stack([torch.cumsum(counts, 0) - counts, counts], dim=-1)


class _RenderWeights(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    def forward(
        ctx: Any, sigmas: Tensor, t_starts: Tensor, t_ends: Tensor, packed_info: Tensor, eps: float
    ) -> tuple[Tensor, Tensor]:
        sig, ts, te = sigmas.contiguous(), t_starts.contiguous(), t_ends.contiguous()
        info = packed_info.contiguous()
        w, trans = _support.ext().render_weights_fwd(sig, ts, te, info, float(eps))
        ctx.save_for_backward(sig, ts, te, info, w, trans)
        ctx.eps = float(eps)
        ctx.set_materialize_grads(False)
        return w, trans

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx: Any, grad_w: Tensor | None, grad_trans: Tensor | None) -> tuple:
        sig, ts, te, info, w, trans = ctx.saved_tensors
        if grad_w is None and grad_trans is None:
            return None, None, None, None, None
        gw = torch.zeros_like(sig) if grad_w is None else grad_w.float().contiguous()
        gt = None if grad_trans is None else grad_trans.float().contiguous()
        gsig = _support.ext().render_weights_bwd(gw, gt, sig, ts, te, info, w, trans, ctx.eps)
        return gsig, None, None, None, None


def render_weights(
    sigmas: Tensor, t_starts: Tensor, t_ends: Tensor, ray_indices: Tensor, n_rays: int,
    packed_info: Tensor | None = None, early_stop_eps: float = 1e-4,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """See :func:`nerf_lightning.ops.reference.render_weights` (-> weights [S], transmittance [S]).

    Gradient w.r.t. ``sigmas`` (closed form, per ray):
    ``dL/dsigma_k = delta_k (g_k T_k e^{-tau_k} [T_k >= eps] - sum_{i>k} g_i w_i - sum_{i>k} gT_i T_i)``.
    """
    check_sample_arrays(
        "render_weights", sigmas=sigmas, t_starts=t_starts, t_ends=t_ends, ray_indices=ray_indices
    )
    why = device_problem(sigmas, t_starts, t_ends) or dtype_problem((sigmas,), HALF_OR_FLOAT)
    if why:
        return reference_for("render_weights", why)(
            sigmas, t_starts, t_ends, ray_indices, n_rays, packed_info, early_stop_eps
        )
    if packed_info is None:
        packed_info = _packed_info_from(ray_indices, n_rays)
    w, trans = _RenderWeights.apply(
        sigmas.float(), t_starts.float(), t_ends.float(), packed_info.long(), early_stop_eps
    )
    return w, trans


class _VolumeRender(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    def forward(
        ctx: Any,
        sigmas: Tensor,
        rgbs: Tensor,
        t_starts: Tensor,
        t_ends: Tensor,
        packed_info: Tensor,
        eps: float,
        background: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        sig, rgb, ts, te = sigmas.contiguous(), rgbs.contiguous(), t_starts.contiguous(), t_ends.contiguous()
        info = packed_info.contiguous()
        bg = None if background is None else background.detach().float().contiguous()
        out_rgb, out_op, out_depth, w = _support.ext().volume_render_fwd(
            sig, rgb, ts, te, info, float(eps), bg
        )
        ctx.save_for_backward(sig, rgb, ts, te, info, w, *([] if bg is None else [bg]))
        ctx.eps = float(eps)
        ctx.set_materialize_grads(False)
        return out_rgb, out_op, out_depth, w

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(
        ctx: Any, g_rgb: Tensor | None, g_op: Tensor | None, g_depth: Tensor | None, g_w: Tensor | None
    ) -> tuple:
        sig, rgb, ts, te, info, w, *bg = ctx.saved_tensors
        if g_rgb is None and g_op is None and g_depth is None and g_w is None:
            return None, None, None, None, None, None, None

        def opt(g: Tensor | None) -> Tensor | None:
            return None if g is None else g.float().contiguous()

        g_sig, g_rgbs = _support.ext().volume_render_bwd(
            sig.new_zeros((info.shape[0], 3)) if g_rgb is None else g_rgb.float().contiguous(),
            opt(g_op),
            opt(g_depth),
            opt(g_w),
            sig,
            rgb,
            ts,
            te,
            info,
            w,
            ctx.eps,
            bg[0] if bg else None,
        )
        return g_sig, g_rgbs, None, None, None, None, None


def volume_render(
    sigmas: Tensor, rgbs: Tensor, t_starts: Tensor, t_ends: Tensor, ray_indices: Tensor, n_rays: int,
    packed_info: Tensor | None = None, background: Tensor | None = None, early_stop_eps: float = 1e-4,
) -> dict[str, Tensor]:  # fmt: skip
    """See :func:`nerf_lightning.ops.reference.volume_render` (fused forward/backward kernels).

    Returns dict(rgb [R,3], opacity [R,1], depth [R,1], weights [S]), differentiable w.r.t. sigmas
    and rgbs (and ``background``, through torch).
    """
    check_volume_render_args(sigmas, rgbs, t_starts, t_ends, ray_indices, n_rays, background)
    why = device_problem(sigmas, rgbs, t_starts, t_ends) or dtype_problem((sigmas, rgbs), HALF_OR_FLOAT)
    if why:
        return reference_for("volume_render", why)(
            sigmas, rgbs, t_starts, t_ends, ray_indices, n_rays, packed_info, background, early_stop_eps
        )
    if packed_info is None:
        packed_info = _packed_info_from(ray_indices, n_rays)
    # a constant background (data) is composited inside the kernels; one that needs a gradient, by torch
    fused = background is not None and background.is_cuda and not background.requires_grad
    fused_bg = background if fused else None
    rgb, opacity, depth, weights = _VolumeRender.apply(
        sigmas.float(), rgbs.float(), t_starts.float(), t_ends.float(), packed_info.long(), early_stop_eps,
        fused_bg,
    )  # fmt: skip
    if background is not None and fused_bg is None:
        rgb = rgb + (1.0 - opacity) * background.to(rgb.dtype)
    return {"rgb": rgb, "opacity": opacity, "depth": depth, "weights": weights}
