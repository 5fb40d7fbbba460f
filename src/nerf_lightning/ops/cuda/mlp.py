"""CUDA wrappers of ``ops/reference/mlp.py``: the fused half-precision MLP and the density activation.

``fused_mlp``: one tensor-core kernel per network and direction (``csrc/mlp.cu``); products accumulate
in float32 in another order than the reference's matmul, and the backward pass rounds the output
gradient to the half type as well. ``density_activation``: one kernel each way, ``expf`` where the
reference calls ``torch.exp`` (within an ulp). ``trunc_exp`` is the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..fused_mlp_support import fused_mlp_shapes_ok, has_mma_m16n8k16
from ..reference.mlp import check_half_dtype
from . import _support
from ._support import device_problem, dtype_problem, reference_for
from .compositing import HALF_OR_FLOAT

__all__ = ["fused_mlp", "density_activation"]


class _DensityActivation(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, h: Tensor, inside: Tensor, bias: float) -> Tensor:
        ctx.save_for_backward(h, inside)
        ctx.bias = float(bias)
        return _support.ext().density_activation_fwd(h, inside, float(bias))

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple:
        h, inside = ctx.saved_tensors
        grad_h = _support.ext().density_activation_bwd(
            g.float().contiguous(), h.contiguous(), inside, ctx.bias
        )
        return grad_h, None, None


def density_activation(h: Tensor, inside: Tensor, bias: float) -> Tensor:
    """See :func:`nerf_lightning.ops.reference.density_activation`: one kernel each way (the
    reference's select, cast, add, exp, mask and their backward, zeros of ``h``'s shape included)."""
    if h.dim() != 2 or inside.shape != (h.shape[0],):
        raise ValueError(
            "density_activation: h must be [S, W] and inside [S], got "
            f"{tuple(h.shape)} and {tuple(inside.shape)}"
        )
    why = device_problem(h, inside) or dtype_problem((h,), HALF_OR_FLOAT)
    why = why or dtype_problem((inside,), (torch.bool,))
    if why is None and h.stride(1) != 1:
        why = "the kernel reads rows of h with unit stride"
    if why:
        return reference_for("density_activation", why)(h, inside, bias)
    return _DensityActivation.apply(h, inside.contiguous(), float(bias))


class _FusedMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, in0: Tensor, in1: Tensor | None, bf16: bool, *params: Tensor) -> Tensor:
        weights = [p.detach() for p in params[0::2]]
        biases = [p.detach() for p in params[1::2]]
        ctx.save_for_backward(in0, in1, *weights, *biases)
        ctx.bf16 = bf16
        ctx.n_layers = len(weights)
        return _support.ext().fused_mlp_fwd(in0, in1, weights, biases, bf16)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple:
        in0, in1, *params = ctx.saved_tensors
        weights, biases = params[: ctx.n_layers], params[ctx.n_layers :]
        need_in0 = bool(ctx.needs_input_grad[0])
        # in1 (the colour network's view-direction encoding) needs a gradient only when the
        # directions do (learned camera poses); the kernel then writes those columns too
        need_in1 = in1 is not None and bool(ctx.needs_input_grad[1])
        g_in0, g_w, g_b, *g_in1 = _support.ext().fused_mlp_bwd(
            g.float().contiguous(), in0, in1, weights, biases, ctx.bf16, need_in0, need_in1
        )
        grads: list[Tensor] = []
        w_at = b_at = 0
        for w, b in zip(weights, biases, strict=True):
            grads.append(g_w[w_at : w_at + w.numel()].view_as(w))
            grads.append(g_b[b_at : b_at + b.numel()].view_as(b))
            w_at, b_at = w_at + w.numel(), b_at + b.numel()
        return (g_in0 if need_in0 else None), (g_in1[0] if need_in1 else None), None, *grads


def _fused_mlp_inputs_ok(in0: Tensor, in1: Tensor | None) -> bool:
    if in0.dim() != 2:
        return False
    return in1 is None or (in1.dim() == 2 and in1.shape[0] == in0.shape[0])


def fused_mlp(
    in0: Tensor, in1: Tensor | None, weights: Sequence[Tensor], biases: Sequence[Tensor],
    half_dtype: torch.dtype,
) -> Tensor:  # fmt: skip
    """See :func:`nerf_lightning.ops.reference.fused_mlp`: the whole network in one kernel each way
    (1 or 2 hidden layers 64 wide, input and output up to 64, fp32 weights; other shapes use the
    reference)."""
    check_half_dtype(half_dtype)
    tensors = [in0, *weights, *biases] + ([] if in1 is None else [in1])
    in_width = in0.shape[-1] + (0 if in1 is None else in1.shape[-1])
    why = device_problem(*tensors)
    shapes_ok = _fused_mlp_inputs_ok(in0, in1) and fused_mlp_shapes_ok(in_width, weights, biases)
    if why is None and not shapes_ok:
        why = "the kernels take networks of 1 or 2 hidden layers 64 wide and inputs up to 64 (fp32 weights)"
    if why is None and not has_mma_m16n8k16(in0.device):
        why = "the kernels need an Ampere or later GPU (m16n8k16 tensor-core MMA)"
    if why:
        return reference_for("fused_mlp", why)(in0, in1, weights, biases, half_dtype)
    params = [t for pair in zip(weights, biases, strict=True) for t in pair]
    x1 = None if in1 is None else in1.float().contiguous()
    return _FusedMLP.apply(
        in0.float().contiguous(), x1, half_dtype == torch.bfloat16, *[p.contiguous() for p in params]
    )
