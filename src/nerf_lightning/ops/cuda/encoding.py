"""CUDA wrappers of ``ops/reference/encoding.py``: the hash-grid and spherical-harmonics encodings.

The hash kernels run one thread per (point, level); the gradient w.r.t. the table is an atomic
scatter (fp16 tables accumulate in float32 and are rounded once). ``NERF_LIGHTNING_HASH_ORDER=level``
switches them to a level-major thread order (same results; a benchmark switch). Under autocast the
table keeps its dtype and the output is float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from . import _support
from ._support import device_problem, dtype_problem, reference_for

__all__ = ["hash_encode", "sh_encode"]


class _HashEncode(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(
        ctx: Any, x: Tensor, params: Tensor, scales: list[float], resolutions: list[int], offsets: list[int]
    ) -> Tensor:
        xf = x.detach().float().contiguous()
        out = _support.ext().hash_encode_fwd(xf, params.detach().contiguous(), scales, resolutions, offsets)
        ctx.save_for_backward(xf)
        ctx.meta = (scales, resolutions, offsets, params.shape[0], params.shape[1], params.dtype)
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx: Any, grad_out: Tensor) -> tuple:
        (xf,) = ctx.saved_tensors
        scales, resolutions, offsets, rows, feats, pdtype = ctx.meta
        grad = None
        if ctx.needs_input_grad[1]:
            grad = _support.ext().hash_encode_bwd(
                xf, grad_out.float().contiguous(), rows, feats, scales, resolutions, offsets
            )
            if grad.dtype != pdtype:
                grad = grad.to(pdtype)  # fp16 tables: scatter in fp32, round once
        return None, grad, None, None, None


def hash_encode(
    x: Tensor, params: Tensor, scales: Sequence[float], resolutions: Sequence[int], offsets: Sequence[int]
) -> Tensor:
    """See :func:`nerf_lightning.ops.reference.hash_encode`: the multiresolution hash encoding on the GPU.

    Args:
        x: float [N, 3] in [0, 1]^3 on CUDA (cast to float32; no gradient w.r.t. x).
        params: float32 or float16 [sum_l T_l, F] table, F in {1, 2, 4, 8}.
        scales, resolutions: per level; offsets: [L + 1] cumulative rows.

    Returns:
        float32 [N, L * F], differentiable w.r.t. ``params`` (atomic scatter; fp16 tables accumulate
        in float32 and are rounded once).
    """
    why = device_problem(x, params)
    if why is None and params.dtype == torch.bfloat16:
        # the kernels read fp32 / fp16 tables; a bf16 one (cast by a framework) goes through fp32, its
        # gradient back through the cast, rather than to the PyTorch reference (tens of times slower)
        params = params.float()
    why = why or dtype_problem((params,), (torch.float32, torch.float16))
    if why is None and (params.dim() != 2 or params.shape[1] not in (1, 2, 4, 8)):
        why = f"the kernels take tables [rows, F] with F in 1, 2, 4, 8, got {tuple(params.shape)}"
    if why is None and x.requires_grad:
        why = "the kernels do not differentiate positions"
    if why:
        return reference_for("hash_encode", why)(x, params, scales, resolutions, offsets)
    return _HashEncode.apply(
        x, params, [float(s) for s in scales], [int(r) for r in resolutions], [int(o) for o in offsets]
    )


def sh_encode(dirs: Tensor, degree: int = 4) -> Tensor:
    """See :func:`nerf_lightning.ops.reference.sh_encode` (forward only; tcnn order).

    Args:
        dirs: float32 [N, 3] unit directions on CUDA, needing no gradient; degree: 1..4.

    Returns:
        float32 [N, degree^2].
    """
    why = device_problem(dirs) or dtype_problem((dirs,))
    if why is None and dirs.requires_grad:
        why = "the kernel has no backward pass"
    if why:
        return reference_for("sh_encode", why)(dirs, degree)
    return _support.ext().sh_encode_fwd(dirs.contiguous(), int(degree))
