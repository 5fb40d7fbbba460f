"""CUDA wrappers of ``ops/reference/encoding.py``: the hash-grid and spherical-harmonics encodings.

The hash kernels run one thread per (point, level); the gradient w.r.t. the table is an atomic
scatter (fp16 tables accumulate in float32 and are rounded once). The gradients w.r.t. the positions
and the directions (learned camera poses move and turn them) have kernels of their own, launched only
when those inputs require a gradient. ``NERF_LIGHTNING_HASH_ORDER=level``
switches them to a level-major thread order (same results; a benchmark switch), ``=warp`` the table's
gradient to one warp per level over 32 consecutive points, each run of lanes adding into the same row summed
before one atomic (``hash_bwd_warp_kernel``: the same gradient to float rounding; a benchmark switch until
its A/B). Under autocast the table keeps its dtype and the output is float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..reference.encoding import check_given_features
from . import _support
from ._support import device_problem, dtype_problem, reference_for

__all__ = ["hash_encode", "hash_encode_given", "sh_encode"]


class _HashEncode(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(
        ctx: Any,
        x: Tensor,
        params: Tensor,
        scales: list[float],
        resolutions: list[int],
        offsets: list[int],
        given: Tensor | None = None,
    ) -> Tensor:
        xf = x.detach().float().contiguous()
        table = params.detach().contiguous()
        # `given`: the value an earlier pass computed (hash_encode_given), so no gather of the table here
        if given is None:
            out = _support.ext().hash_encode_fwd(xf, table, scales, resolutions, offsets)
        else:
            out = given
        ctx.save_for_backward(xf, table if ctx.needs_input_grad[0] else None)
        ctx.meta = (scales, resolutions, offsets, params.shape[0], params.shape[1], params.dtype)
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx: Any, grad_out: Tensor) -> tuple:
        xf, table = ctx.saved_tensors
        scales, resolutions, offsets, rows, feats, pdtype = ctx.meta
        g = grad_out.float().contiguous()
        grad = grad_x = None
        if ctx.needs_input_grad[1]:
            grad = _support.ext().hash_encode_bwd(xf, g, rows, feats, scales, resolutions, offsets)
            if grad.dtype != pdtype:
                grad = grad.to(pdtype)  # fp16 tables: scatter in fp32, round once
        if ctx.needs_input_grad[0]:  # positions moved by learned camera poses: one thread per point
            grad_x = _support.ext().hash_encode_bwd_input(xf, table, g, scales, resolutions, offsets)
        return grad_x, grad, None, None, None, None


def hash_encode(
    x: Tensor, params: Tensor, scales: Sequence[float], resolutions: Sequence[int], offsets: Sequence[int]
) -> Tensor:
    """See :func:`nerf_lightning.ops.reference.hash_encode`: the multiresolution hash encoding on the GPU.

    Args:
        x: float [N, 3] in [0, 1]^3 on CUDA (cast to float32); its gradient (the trilinear weights'
            derivative) is computed only when it requires one.
        params: float32 or float16 [sum_l T_l, F] table, F in {1, 2, 4, 8}.
        scales, resolutions: per level; offsets: [L + 1] cumulative rows.

    Returns:
        float32 [N, L * F], differentiable w.r.t. ``params`` (atomic scatter; fp16 tables accumulate
        in float32 and are rounded once) and ``x``.
    """
    params, why = _kernel_table(x, params)
    if why:
        return reference_for("hash_encode", why)(x, params, scales, resolutions, offsets)
    return _HashEncode.apply(x, params, *_level_lists(scales, resolutions, offsets))


def hash_encode_given(
    x: Tensor,
    features: Tensor,
    params: Tensor,
    scales: Sequence[float],
    resolutions: Sequence[int],
    offsets: Sequence[int],
) -> Tensor:
    """See :func:`nerf_lightning.ops.reference.hash_encode_given`: ``features`` as the value, no forward
    kernel; the backward kernels of :func:`hash_encode` (the same gradient).

    Args:
        x, params, scales, resolutions, offsets: as :func:`hash_encode`.
        features: float32 [N, L * F] on the same device.
    """
    check_given_features(x, features)
    params, why = _kernel_table(x, params)
    why = why or device_problem(features) or dtype_problem((features,), (torch.float32,))
    if why:
        return reference_for("hash_encode_given", why)(x, features, params, scales, resolutions, offsets)
    return _HashEncode.apply(x, params, *_level_lists(scales, resolutions, offsets), features.detach())


def _kernel_table(x: Tensor, params: Tensor) -> tuple[Tensor, str | None]:
    """The table the kernels read (a bf16 one as float32) and why they cannot run, or None."""
    why = device_problem(x, params)
    if why is None and params.dtype == torch.bfloat16:
        # the kernels read fp32 / fp16 tables; a bf16 one (cast by a framework) goes through fp32, its
        # gradient back through the cast, rather than to the PyTorch reference (tens of times slower)
        params = params.float()
    why = why or dtype_problem((params,), (torch.float32, torch.float16))
    if why is None and (params.dim() != 2 or params.shape[1] not in (1, 2, 4, 8)):
        why = f"the kernels take tables [rows, F] with F in 1, 2, 4, 8, got {tuple(params.shape)}"
    return params, why


def _level_lists(
    scales: Sequence[float], resolutions: Sequence[int], offsets: Sequence[int]
) -> tuple[list[float], list[int], list[int]]:
    return [float(s) for s in scales], [int(r) for r in resolutions], [int(o) for o in offsets]


class _SHEncode(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, dirs: Tensor, degree: int) -> Tensor:
        ctx.save_for_backward(dirs)
        ctx.degree = degree
        return _support.ext().sh_encode_fwd(dirs, degree)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple:
        (dirs,) = ctx.saved_tensors
        return _support.ext().sh_encode_bwd(dirs, g.float().contiguous(), ctx.degree), None


def sh_encode(dirs: Tensor, degree: int = 4) -> Tensor:
    """See :func:`nerf_lightning.ops.reference.sh_encode` (tcnn order).

    Args:
        dirs: float32 [N, 3] unit directions on CUDA; degree: 1..4. Differentiable w.r.t. ``dirs``
            when they require it (learned camera poses turn them): a backward kernel of its own.

    Returns:
        float32 [N, degree^2].
    """
    why = device_problem(dirs) or dtype_problem((dirs,))
    if why:
        return reference_for("sh_encode", why)(dirs, degree)
    if dirs.requires_grad:
        return _SHEncode.apply(dirs.contiguous(), int(degree))
    return _support.ext().sh_encode_fwd(dirs.contiguous(), int(degree))
