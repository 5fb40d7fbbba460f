"""Ray ops: one contract (the docstrings of ``ops/reference.py``), two backends.

``reference`` is pure PyTorch (any device, the test oracle); ``cuda`` (``ops/cuda.py``, optional)
wraps the CUDA extension with the same function names and signatures. :func:`get_ops` picks one:

- ``"torch"`` / ``"reference"``: always the reference.
- ``"cuda"``: the CUDA module (reference functions for any name it lacks); if it cannot be
  imported or ``cuda.is_available()`` is False, the reference with ONE warning.
- ``"auto"``: a dispatcher that, per call, uses the CUDA function when the extension is available
  and the call's first tensor argument is on a CUDA device, else the reference.

``ops.cuda`` is imported lazily (the first time a CUDA path is wanted) so that CPU-only installs
never try to build the extension.
"""

from __future__ import annotations

import importlib
import threading
import warnings
from types import ModuleType, SimpleNamespace
from typing import Any

import torch

from . import reference
from .types import PackedSamples

__all__ = ["PackedSamples", "OP_NAMES", "get_ops", "cuda_ops", "reference"]

#: The functions every backend provides.
OP_NAMES = (
    "ray_aabb_intersect",
    "grid_cell_positions",
    "cascade_of",
    "grid_ema_update",
    "grid_occupancy",
    "pack_bitfield",
    "unpack_bitfield",
    "march_rays",
    "march_rays_fixed",
    "repack",
    "render_weights",
    "accumulate_along_rays",
    "volume_render",
    "sample_points",
    "normalize_to_box",
    "distortion_loss",
    "masked_ray_loss",
    "adapt_ray_count",
    "density_activation",
    "fused_mlp",
)

_lock = threading.Lock()
_cuda_state: dict[str, Any] = {"probed": False, "module": None, "warned": False}


def cuda_ops() -> ModuleType | None:
    """The ``ops.cuda`` module when it imports and reports ``is_available()``, else None (cached)."""
    with _lock:
        if not _cuda_state["probed"]:
            _cuda_state["probed"] = True
            try:
                mod = importlib.import_module(f"{__name__}.cuda")
                if getattr(mod, "is_available", lambda: False)():
                    _cuda_state["module"] = mod
                else:
                    _cuda_state["error"] = "nerf_lightning.ops.cuda.is_available() returned False"
            except Exception as exc:  # a missing module or a failed build both mean "no CUDA ops"
                _cuda_state["error"] = f"{type(exc).__name__}: {exc}"
        return _cuda_state["module"]


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a
    return None


def _auto(name: str):
    ref_fn = getattr(reference, name)

    def dispatch(*args: Any, **kwargs: Any) -> Any:
        t = _first_tensor(args, kwargs)
        if t is not None and t.is_cuda:
            mod = cuda_ops()
            fn = getattr(mod, name, None) if mod is not None else None
            if fn is not None:
                return fn(*args, **kwargs)
        return ref_fn(*args, **kwargs)

    dispatch.__name__ = name
    dispatch.__doc__ = ref_fn.__doc__
    return dispatch


class _Layered:
    """Attributes of ``primary`` (the CUDA module), falling back to ``fallback`` for missing ones."""

    def __init__(self, primary: ModuleType, fallback: ModuleType) -> None:
        self._primary, self._fallback = primary, fallback
        self.name = getattr(primary, "__name__", "cuda")

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self._primary, name)
        except AttributeError:
            return getattr(self._fallback, name)


_AUTO = SimpleNamespace(name="auto", PackedSamples=PackedSamples, **{n: _auto(n) for n in OP_NAMES})


def get_ops(backend: str = "auto") -> Any:
    """Return a namespace with the ops of ``OP_NAMES`` for ``backend`` in {auto, cuda, torch}.

    Args:
        backend: ``"auto"`` (CUDA per call when available and the tensors are on CUDA),
            ``"cuda"`` (the CUDA module, falling back to the reference with one warning) or
            ``"torch"`` / ``"reference"``.
    """
    if backend in ("torch", "reference"):
        return reference
    if backend == "auto":
        return _AUTO
    if backend == "cuda":
        mod = cuda_ops()
        if mod is not None:
            return _Layered(mod, reference)
        with _lock:
            if not _cuda_state["warned"]:
                _cuda_state["warned"] = True
                warnings.warn(
                    "ops backend 'cuda' requested but the CUDA extension is unavailable "
                    f"({_cuda_state.get('error', 'unknown reason')}); using the PyTorch reference ops.",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return reference
    raise ValueError(f"unknown ops backend {backend!r}: expected one of 'auto', 'cuda', 'torch'")
