"""What every CUDA wrapper shares: the extension handle, and the rule for input the kernels do not take.

The rule: a wrapper checks the shapes the contract fixes (``ValueError`` as the reference does), then
whether its kernel takes the tensors (on a CUDA device, with the extension loaded, of the dtypes it
was written for). When it does not, the wrapper runs the reference op after ONE ``RuntimeWarning``
per (op, reason) that names the op, the reason and the fallback: never silently, never once per call.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from .. import _ext as _loader
from .. import reference

__all__ = ["ext", "is_available", "device_problem", "dtype_problem", "reference_for", "require_kernel"]

_lock = threading.Lock()
_warned: set[tuple[str, str]] = set()


def is_available() -> bool:
    """True when a CUDA GPU is visible and the extension is built/loaded (the first call may build it)."""
    return torch.cuda.is_available() and _loader.load() is not None


def ext() -> Any:
    """The compiled extension module (``ops/csrc``), or None when it could not be had."""
    return _loader.load()


def device_problem(*tensors: Tensor) -> str | None:
    """Why these tensors cannot run the kernels (None when they can): one is not on a CUDA device, or
    the extension is unavailable."""
    if not all(t.is_cuda for t in tensors):
        return "its input is not on a CUDA device"
    if not is_available():
        return f"the CUDA extension is unavailable ({_loader.error() or 'no CUDA GPU is visible'})"
    return None


def dtype_problem(
    tensors: Iterable[Tensor], allowed: tuple[torch.dtype, ...] = (torch.float32,)
) -> str | None:
    """None when every tensor has one of the ``allowed`` dtypes, else the reason, naming the dtype."""
    for t in tensors:
        if t.dtype not in allowed:
            names = " / ".join(str(d).removeprefix("torch.") for d in allowed)
            return f"the kernels take {names} input, got {str(t.dtype).removeprefix('torch.')}"
    return None


def reference_for(op: str, why: str) -> Callable[..., Any]:
    """The reference implementation of ``op`` (looked up on ``ops.reference`` at call time), after one
    RuntimeWarning per (op, why) that says so."""
    with _lock:
        first = (op, why) not in _warned
        _warned.add((op, why))
    if first:
        warnings.warn(
            f"nerf_lightning.ops.cuda.{op}: {why}; running the PyTorch reference instead (slower). "
            "This warning is shown once.",
            RuntimeWarning,
            stacklevel=3,
        )
    return getattr(reference, op)


def require_kernel(op: str, *tensors: Tensor) -> None:
    """For kernels whose reference lives with their caller (the data layer): raise unless they can run."""
    why = device_problem(*tensors)
    if why is not None:
        raise RuntimeError(f"nerf_lightning.ops.cuda.{op}: {why}; its reference is the caller's torch path")
