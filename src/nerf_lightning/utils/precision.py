"""``precision=auto`` (the default): the Lightning precision a run gets on this machine."""

from __future__ import annotations

import torch

__all__ = ["resolve_precision"]


def resolve_precision(precision: str, accelerator: str = "auto") -> str:
    """``auto`` -> ``bf16-mixed`` when the run trains on a CUDA GPU of compute capability >= 8.0, where
    the field's MLPs run as fused bf16 tensor-core kernels (``ops/csrc/mlp.cu``: faster than ``32-true``
    at the same held-out PSNR, see BENCHMARKS.md); else ``32-true``
    (CPU runs keep the CPU preset's numbers; older GPUs lack the kernels' MMA instructions). Any
    other value is returned as it is.

    Args:
        precision: the configured ``trainer.precision``.
        accelerator: the configured ``trainer.accelerator`` (``cpu`` never gets mixed precision).
    """
    if precision != "auto":
        return precision
    on_gpu = str(accelerator) in ("auto", "gpu", "cuda") and torch.cuda.is_available()
    if on_gpu and torch.cuda.get_device_capability()[0] >= 8:
        return "bf16-mixed"
    return "32-true"
