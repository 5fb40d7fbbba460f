"""The field's networks (``models/field.py``): the fused half-precision MLP and the density activation
on its output."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["fused_mlp", "trunc_exp", "density_activation"]


class _TruncExp(torch.autograd.Function):
    """exp(x) whose gradient is clamped at x = 15: keeps density gradients finite early in training."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    def forward(ctx, x: Tensor) -> Tensor:  # noqa: ANN001
        ctx.save_for_backward(x)
        return torch.exp(x)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad: Tensor) -> Tensor:  # noqa: ANN001
        (x,) = ctx.saved_tensors
        return grad * torch.exp(x.clamp(max=15.0))


def trunc_exp(x: Tensor) -> Tensor:
    """instant-ngp's density activation.

    Args:
        x: float tensor of any shape (cast to float32 under CUDA autocast).

    Returns:
        ``exp(x)``, same shape; its gradient is ``g * exp(min(x, 15))`` (finite early in training).
    """
    return _TruncExp.apply(x)


def density_activation(h: Tensor, inside: Tensor, bias: float) -> Tensor:
    """Density from the density MLP's output: ``trunc_exp(float32(h[:, 0]) + bias) * inside``.

    Args:
        h: [S, W] float32 / float16 / bfloat16 MLP output (column 0: the density logit),
            differentiable; inside: bool [S] (0 density outside the box); bias: logit offset.

    Returns:
        float32 [S]; the gradient w.r.t. ``h`` is nonzero only in column 0:
        ``g * inside * exp(min(h0 + bias, 15))``, in ``h``'s dtype.
    """
    return trunc_exp(h[..., 0].float() + bias) * inside


def fused_mlp(
    in0: Tensor, in1: Tensor | None, weights: Sequence[Tensor], biases: Sequence[Tensor],
    half_dtype: torch.dtype,
) -> Tensor:  # fmt: skip
    """A ReLU MLP on ``cat(in0, in1)`` with the rounding of tiny-cuda-nn's fully fused MLP.

    Layer ``l`` computes ``y = x W_l^T + b_l``; hidden layers (all but the last) pass ``relu(y)`` on.
    The input and every hidden activation are rounded to ``half_dtype`` (float16 or bfloat16), the
    weights are fp32 master weights rounded to ``half_dtype`` for the product, products accumulate
    in float32 and the biases are added in float32; the output ``y`` of the last layer is float32.
    The CUDA backend runs the whole network in one kernel each way; its gradients round the
    back-propagated activation gradients to ``half_dtype`` as well (within half-precision rounding
    of this function's autograd).

    Args:
        in0: float [N, C0], differentiable; in1: float [N, C1] or None, differentiable too (the
            colour network's view-direction encoding, when learned camera poses turn the directions).
        weights: fp32 ``[out_l, in_l]`` (``nn.Linear.weight``; ``in_0 = C0 + C1``), biases fp32 [out_l].
        half_dtype: ``torch.float16`` or ``torch.bfloat16``.

    Returns:
        float32 [N, out_last].
    """
    check_half_dtype(half_dtype)
    x = in0.float() if in1 is None else torch.cat([in0.float(), in1.float()], dim=-1)
    h = x.to(half_dtype)
    y = x
    for i, (w, b) in enumerate(zip(weights, biases, strict=True)):
        y = h.float() @ w.to(half_dtype).float().t() + b.float()
        if i + 1 < len(weights):
            h = torch.relu(y).to(half_dtype)
    return y


def check_half_dtype(half_dtype: torch.dtype) -> None:
    """Validate :func:`fused_mlp`'s ``half_dtype`` (shared by every backend)."""
    if half_dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"fused_mlp: half_dtype must be float16 or bfloat16, got {half_dtype}")
