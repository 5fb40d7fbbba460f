"""The ops registry: which ops exist, which backend runs them, and what ``auto`` means on this machine.

The ops are the public functions of ``ops/reference`` (its ``__all__``): :data:`OP_NAMES` is derived
from there and nowhere else, and every backend provides all of them. Backends of :func:`get_ops`:

- ``"torch"`` / ``"reference"``: the reference module (pure PyTorch, any device; the test oracle).
- ``"cuda"``: the ``ops.cuda`` module (our kernels, complete by construction: a backend that lacks an
  op is refused). When the extension cannot be had, the reference with ONE warning naming why.
- ``"auto"``: per call, the CUDA op when the call's first tensor argument is on a CUDA device and the
  extension is available, else the reference op. CPU tensors cannot run kernels, so this is the one
  routing rule; it never picks a backend the GPU tests do not cover.

Whatever a backend name resolves to is logged once per process (INFO, ``nerf_lightning.ops``) when it
is first asked for: at setup, by the renderer and the occupancy grid that validate their backend.

The hash encoding's backends (``models/encoding.py``: ``auto | cuda | tcnn | torch``) resolve here too
(:func:`hash_encoding_backend`); the data layer's kernels are reached through :func:`data_kernel`.
``ops.cuda`` is imported lazily, the first time a CUDA path is wanted.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import threading
import warnings
from collections.abc import Callable
from types import ModuleType, SimpleNamespace
from typing import Any, Literal, get_args

import torch

from . import reference
from .types import PackedSamples

__all__ = [
    "OP_NAMES",
    "BACKENDS",
    "HASH_BACKENDS",
    "HashBackend",
    "OpsBackend",
    "TCNN_FASTER_ON",
    "get_ops",
    "cuda_ops",
    "data_kernel",
    "hash_encoding_backend",
]

log = logging.getLogger("nerf_lightning.ops")

#: every op, in the order of the reference's contract (derived from ``ops.reference.__all__``)
OP_NAMES: tuple[str, ...] = tuple(n for n in reference.__all__ if inspect.isfunction(getattr(reference, n)))
#: a backend name of :func:`get_ops` (``"reference"`` is an alias of ``"torch"``)
OpsBackend = Literal["auto", "cuda", "torch"]
BACKENDS: tuple[str, ...] = get_args(OpsBackend)
#: a backend name of the hash encoding
HashBackend = Literal["auto", "cuda", "tcnn", "torch"]
HASH_BACKENDS: tuple[str, ...] = get_args(HashBackend)
#: GPUs (``torch.cuda.get_device_name``) on which tiny-cuda-nn's hash grid passed our GPU tests AND was
#: measured faster than our kernels (``python -m benchmarks.tcnn``); ``auto`` picks tcnn only there.
TCNN_FASTER_ON: dict[str, str] = {}

_lock = threading.Lock()
_cuda_state: dict[str, Any] = {"probed": False, "module": None, "warned": False}
_announced: set[str] = set()
_resolved: dict[str, Any] = {}
_warned: set[str] = set()


def cuda_ops() -> ModuleType | None:
    """The ``ops.cuda`` module when it imports and reports ``is_available()``, else None (cached)."""
    with _lock:
        if not _cuda_state["probed"]:
            _cuda_state["probed"] = True
            try:
                mod = importlib.import_module(f"{__package__}.cuda")
                if getattr(mod, "is_available", lambda: False)():
                    _cuda_state["module"] = mod
                else:
                    _cuda_state["error"] = _unavailable_reason()
            except Exception as exc:  # a missing module or a failed build both mean "no CUDA ops"
                _cuda_state["error"] = f"{type(exc).__name__}: {exc}"
        return _cuda_state["module"]


def _unavailable_reason() -> str:
    from . import _ext

    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    return _ext.error() or "the extension did not load"


def _announce(key: str, message: str) -> None:
    """Log ``message`` (INFO) the first time ``key`` is resolved in this process."""
    with _lock:
        first = key not in _announced
        _announced.add(key)
    if first:
        log.info(message)


def _warn_once(key: str, message: str) -> None:
    with _lock:
        first = key not in _warned
        _warned.add(key)
    if first:
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _gpu_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a
    return None


def _auto(name: str) -> Callable[..., Any]:
    ref_fn = getattr(reference, name)

    def dispatch(*args: Any, **kwargs: Any) -> Any:
        t = _first_tensor(args, kwargs)
        if t is not None and t.is_cuda:
            mod = cuda_ops()
            if mod is not None:
                return getattr(mod, name)(*args, **kwargs)
        return getattr(reference, name)(*args, **kwargs)

    dispatch.__name__ = dispatch.__qualname__ = name
    dispatch.__doc__ = ref_fn.__doc__
    return dispatch


_AUTO = SimpleNamespace(name="auto", PackedSamples=PackedSamples, **{n: _auto(n) for n in OP_NAMES})


def _complete(mod: ModuleType) -> ModuleType:
    """``mod`` when it provides every op of :data:`OP_NAMES`; a backend that lacks one is refused."""
    missing = [n for n in OP_NAMES if not callable(getattr(mod, n, None))]
    if missing:
        raise RuntimeError(f"ops backend {getattr(mod, '__name__', mod)!r} lacks the ops {missing}")
    return mod


def get_ops(backend: str = "auto") -> Any:
    """A namespace with every op of :data:`OP_NAMES` for ``backend`` (see the module docstring).

    Args:
        backend: ``"auto"``, ``"cuda"`` or ``"torch"`` (alias ``"reference"``).

    Returns:
        ``ops.reference`` (torch, and cuda without the extension), the ``ops.cuda`` module (cuda), or
        the per-call dispatcher (auto). The first call per name logs what it resolved to.
    """
    hit = _resolved.get(backend)
    if hit is not None:
        return hit
    _resolved[backend] = ops = _resolve(backend)
    return ops


def _resolve(backend: str) -> Any:
    if backend in ("torch", "reference"):
        _announce("torch", "ops backend torch: the PyTorch reference ops")
        return reference
    if backend == "auto":
        mod = cuda_ops()
        if mod is not None:
            _complete(mod)
            _announce(
                "auto",
                f"ops backend auto: our CUDA kernels for CUDA tensors ({_gpu_name()}), the PyTorch "
                "reference for CPU tensors",
            )
        else:
            why = _cuda_state.get("error", "the extension did not load")
            _announce("auto", f"ops backend auto: the PyTorch reference ops (no CUDA kernels: {why})")
        return _AUTO
    if backend == "cuda":
        mod = cuda_ops()
        if mod is not None:
            _announce("cuda", f"ops backend cuda: our CUDA kernels ({_gpu_name()})")
            return _complete(mod)
        with _lock:
            first = not _cuda_state["warned"]
            _cuda_state["warned"] = True
        if first:
            warnings.warn(
                "ops backend 'cuda' requested but the CUDA extension is unavailable "
                f"({_cuda_state.get('error', 'unknown reason')}); using the PyTorch reference ops.",
                RuntimeWarning,
                stacklevel=2,
            )
        return reference
    raise ValueError(f"unknown ops backend {backend!r}: expected one of 'auto', 'cuda', 'torch'")


def data_kernel(name: str, *tensors: torch.Tensor) -> Callable[..., Any] | None:
    """The data layer's CUDA kernel ``name`` (``ops.cuda.data``: ``training_rays``, ``sample_pixels``)
    for these tensors, or None when one is not on a CUDA device or the extension is unavailable (its
    loader has warned once). On None the caller runs its torch path, which is the kernel's contract."""
    if not all(t.is_cuda for t in tensors):
        return None
    mod = cuda_ops()
    if mod is None:
        return None
    if name not in mod.data.__all__:
        raise ValueError(f"data_kernel: no data kernel {name!r}; expected one of {mod.data.__all__}")
    return getattr(mod, name)


def _tcnn_unavailable() -> str | None:
    from . import tcnn

    return tcnn.available()


def hash_encoding_backend(requested: str, x: torch.Tensor) -> str:
    """The hash encoding's backend for input ``x``: ``"cuda"``, ``"tcnn"`` or ``"torch"``.

    - ``torch``: always the torch implementation (fused gather/scatter, or the differentiable
      reference for positions that need a gradient).
    - ``cuda``: our kernels for CUDA input when the extension is available (positions that need a
      gradient, under learned camera poses, included). Else ``torch``, with one warning.
    - ``tcnn``: tiny-cuda-nn for CUDA input (RuntimeError naming why when ``tinycudann`` does not
      import); ``torch`` with one warning for CPU input.
    - ``auto``: tcnn only on GPUs listed in :data:`TCNN_FASTER_ON` (tested and measured faster), else
      our kernels for CUDA input (``torch`` for CPU input, or without the extension). The choice is
      logged once per device type.
    """
    if requested not in HASH_BACKENDS:
        raise ValueError(f"hash encoding backend must be one of {HASH_BACKENDS}, got {requested!r}")
    if requested == "torch":
        return "torch"
    if requested == "tcnn":
        if not x.is_cuda:
            _warn_once(
                "hash:tcnn",
                "model.net.field.encoding.backend=tcnn: the input is not on a CUDA device; using the torch "
                "hash encoding (the same table).",
            )
            return "torch"
        why = _tcnn_unavailable()
        if why is not None:
            raise RuntimeError(
                f"model.net.field.encoding.backend=tcnn: tinycudann does not import ({why}); build it "
                "(docs/tcnn.md) or use backend=auto"
            )
        return "tcnn"
    if requested == "cuda":
        if x.is_cuda and cuda_ops() is not None:
            return "cuda"
        _warn_once(
            "hash:cuda",
            "model.net.field.encoding.backend=cuda: the CUDA extension is unavailable or the input is not on "
            "CUDA; using the torch hash encoding.",
        )
        return "torch"
    choice = _auto_hash.get(x.device)
    if choice is None:
        choice, why = _auto_hash_backend(x)
        _auto_hash[x.device] = choice
        _announce(f"hash:auto:{x.device.type}:{choice}", f"hash encoding backend auto -> {choice} ({why})")
    return choice


_auto_hash: dict[torch.device, str] = {}


def _auto_hash_backend(x: torch.Tensor) -> tuple[str, str]:
    """``auto``'s choice for input like ``x`` and the reason (decided once per device)."""
    if not x.is_cuda:
        return "torch", "CPU input"
    gpu = torch.cuda.get_device_name(x.device)
    if gpu in TCNN_FASTER_ON and _tcnn_unavailable() is None:
        return "tcnn", f"tested and faster than our kernels on {gpu}: {TCNN_FASTER_ON[gpu]}"
    if cuda_ops() is None:
        return "torch", f"no CUDA kernels: {_cuda_state.get('error')}"
    return "cuda", f"our kernels on {gpu}"
