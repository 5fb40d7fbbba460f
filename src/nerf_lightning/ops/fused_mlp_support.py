"""Which networks and GPUs the fused MLP kernels (``csrc/mlp.cu``) run, importable without the
extension: ``ops.cuda.fused_mlp`` checks each call with these (else it runs the reference), and
``models/field.py`` decides once whether its networks use the kernels or ``torch.nn`` layers."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["fused_mlp_shapes_ok", "has_mma_m16n8k16"]

#: width of the hidden layers, and the largest input and output width
WIDTH = 64


def fused_mlp_shapes_ok(in_width: int, weights: Sequence[Tensor], biases: Sequence[Tensor]) -> bool:
    """The kernels' networks: 1 or 2 hidden layers ``WIDTH`` wide, an input of ``in_width`` <= ``WIDTH``
    and an output of at most ``WIDTH``, fp32 ``nn.Linear``-shaped weights ``[out, in]`` and biases."""
    if len(weights) not in (2, 3) or len(biases) != len(weights):
        return False
    width = in_width
    for i, (w, b) in enumerate(zip(weights, biases, strict=True)):
        if w.dtype != torch.float32 or b.dtype != torch.float32 or w.dim() != 2 or w.shape[1] != width:
            return False
        out, hidden = w.shape[0], i + 1 < len(weights)
        if width > WIDTH or b.shape != (out,) or (out != WIDTH if hidden else out > WIDTH):
            return False
        width = out
    return True


@functools.cache
def has_mma_m16n8k16(device: torch.device) -> bool:
    """Whether the CUDA device has the kernels' m16n8k16 tensor-core MMA (compute capability >= 8.0:
    Ampere and later); cached per device."""
    return torch.cuda.get_device_capability(device)[0] >= 8
