"""The ops registry: which ops exist, which backend runs them, and what ``auto`` means on this machine.

**One key chooses the backend of the whole training step: ``model.net.backend``** (``auto | cuda | tcnn |
torch``). ``build_nerf`` (``models/nerf.py``) reads it, once, into a :class:`Backend` and hands that
object to the field (hash encoding, SH encoding, MLPs) and to the renderer (marching, compositing, the
occupancy grid, the step's loss kernels) when it builds them; no module picks a backend of its own.
It replaces three keys that each covered part of the step: ``model.field.encoding.backend``,
``model.field.mlp_backend`` and ``model.renderer.ops_backend`` (earlier ``model.ops_backend``), still
read as ``model.net.backend`` on a command line and in a checkpoint's stored config (``Formerly`` on
``build_nerf``'s parameter; their spellings under ``model.net`` too). What each value runs:

- ``torch``: the PyTorch reference ops everywhere (the test oracle; the CPU preset), ``torch.nn`` MLPs.
- ``cuda``: our CUDA kernels (``ops.cuda``) everywhere, the fused half-precision MLPs under mixed
  precision. Without the extension: the reference, with ONE warning naming why.
- ``tcnn``: as ``cuda``, but the hash grid runs on tiny-cuda-nn's kernels (``docs/tcnn.md``). A value of
  the one key rather than a key of its own: it swaps one op's implementation on the same table, and it
  only makes sense with the rest of the step on our kernels.
- ``auto`` (default): decided per call by the tensors' device, so that a model built on the CPU and
  moved to a GPU gets the kernels: our CUDA kernel when the call's first tensor is on a CUDA device and
  the extension loads, else the reference op (a CPU machine always gets torch); the hash grid runs on
  tcnn only on GPUs listed in :data:`TCNN_FASTER_ON`.

Beneath that choice, a wrapper of ``ops.cuda`` that is handed tensors its kernel cannot take (CPU
tensors under ``model.net.backend=cuda``, a dtype it was not written for) runs the reference op with one
warning: that is each kernel's input contract, not a second backend choice.

The ops are the public functions of ``ops/reference`` (its ``__all__``): :data:`OP_NAMES` is derived
from there and nowhere else, and every backend provides all of them. :func:`get_ops` gives an ops
namespace by name (``"torch"`` / ``"reference"``, ``"cuda"``, ``"auto"``: the per-call dispatcher);
:class:`Backend` is what the model's components hold. Whatever a name resolves to is logged once per
process (INFO, ``nerf_lightning.ops``) when it is first asked for, at setup. The data layer's kernels
are reached through :func:`data_kernel`. ``ops.cuda`` is imported lazily, the first time a CUDA path is
wanted.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any, Literal, get_args

import torch

from . import reference
from .types import PackedSamples

__all__ = [
    "OP_NAMES",
    "BACKENDS",
    "BACKEND_NAMES",
    "Backend",
    "BackendName",
    "HASH_BACKENDS",
    "HashBackend",
    "OpsBackend",
    "TCNN_FASTER_ON",
    "as_backend",
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
#: a value of ``model.net.backend``, the one backend of the training step (see the module docstring)
BackendName = Literal["auto", "cuda", "tcnn", "torch"]
BACKEND_NAMES: tuple[str, ...] = get_args(BackendName)
#: a backend name of the hash encoding (the values of ``model.net.backend``)
HashBackend = BackendName
HASH_BACKENDS: tuple[str, ...] = BACKEND_NAMES
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
                "model.net.backend=tcnn: the input is not on a CUDA device; using the torch "
                "hash encoding (the same table).",
            )
            return "torch"
        why = _tcnn_unavailable()
        if why is not None:
            raise RuntimeError(
                f"model.net.backend=tcnn: tinycudann does not import ({why}); build it "
                "(docs/tcnn.md) or use model.net.backend=auto"
            )
        return "tcnn"
    if requested == "cuda":
        if x.is_cuda and cuda_ops() is not None:
            return "cuda"
        _warn_once(
            "hash:cuda",
            "model.net.backend=cuda: the CUDA extension is unavailable or the input is not on "
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


@dataclass(frozen=True)
class Backend:
    """``model.net.backend`` resolved: what the field and the renderer run their ops with (module docstring).

    Built once, by ``NeRFModule``, and handed to each component at construction. It holds only the
    name, so the modules holding it can be deep-copied and pickled; the namespace it names is cached by
    the registry, and ``auto`` decides per call (by the tensors' device).

    Args:
        name: ``auto`` | ``cuda`` | ``tcnn`` | ``torch``.
    """

    name: BackendName = "auto"

    def __post_init__(self) -> None:
        if self.name not in BACKEND_NAMES:
            raise ValueError(f"model.net.backend={self.name}: expected one of {', '.join(BACKEND_NAMES)}")
        get_ops(self._ops_name)  # log, once, what it resolves to

    @property
    def _ops_name(self) -> str:
        return "auto" if self.name == "tcnn" else self.name

    @property
    def ops(self) -> Any:
        """The ops namespace of every op but the hash grid's (tcnn: our kernels, as ``auto``)."""
        return get_ops(self._ops_name)

    def hash_encoding(self, x: torch.Tensor) -> str:
        """The hash grid's implementation for input ``x``: ``cuda``, ``tcnn`` or ``torch``
        (:func:`hash_encoding_backend`)."""
        return hash_encoding_backend(self.name, x)

    @property
    def fuses_mlp(self) -> bool:
        """Whether the field's MLPs may run as the fused half-precision kernels (under CUDA autocast)."""
        return self.name != "torch"


def as_backend(backend: Backend | str) -> Backend:
    """``backend`` as a :class:`Backend` (a name is validated: ValueError naming ``model.net.backend``)."""
    return backend if isinstance(backend, Backend) else Backend(backend)  # type: ignore[arg-type]
