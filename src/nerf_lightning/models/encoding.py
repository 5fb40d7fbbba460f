"""Input encodings of the radiance field: multiresolution hash grid and spherical harmonics.

Both follow tiny-cuda-nn's conventions (``encodings/grid.h`` and ``encodings/spherical_harmonics.h``)
so that parameters and outputs can move between our backends and tcnn's.

Backends of :class:`HashEncoding` (``backend=``):

- ``"torch"``: the reference, vectorized PyTorch on any device; uint32 hash arithmetic is emulated in
  int64 masked to 32 bits. Differentiable w.r.t. ``params`` and ``x``.
- ``"cuda"``: our own extension (``nerf_lightning.ops.cuda``): one thread per (point, level), gradient
  by atomic scatter into the table; fp32 and fp16 ``params``. Differentiable w.r.t. ``params`` only
  (positions of a NeRF field never need gradients; ``x.requires_grad`` falls back to ``"torch"``).
- ``"tcnn"``: ``tinycudann.Encoding`` with ``{"otype": "HashGrid", ...}``; our ``params`` table is
  handed to it, so checkpoints are shared. Written against tcnn's documented Python API; UNTESTED here
  (tcnn cannot be installed on our machines).
- ``"auto"``: tcnn when importable and the input is on CUDA, else ``cuda`` when the extension loads and
  the input is on CUDA, else ``torch``. Resolved lazily at each forward from the input's device, so a
  module built on the CPU and moved to the GPU by Lightning picks the fast path.

Output dtype: float32 for float32/float16 params (float64 for float64 params, used by gradcheck);
all backends return float32 under autocast too (the following Linear layers cast it themselves),
except ``tcnn``, whose output is cast back to float32 from tcnn's half precision.
"""

from __future__ import annotations

import logging
import math
import warnings

import numpy as np
import torch
from torch import nn

from nerf_lightning.ops.encoding_reference import hash_encode_torch, sh_encode_torch
from nerf_lightning.ops.hashgrid_torch import LevelTables, hash_encode_fused

log = logging.getLogger(__name__)

HASH_BACKENDS = ("auto", "cuda", "tcnn", "torch")

_warned: set[str] = set()


def _warn_once(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _next_multiple(v: int, m: int) -> int:
    return (v + m - 1) // m * m


def _tcnn_available() -> bool:
    try:
        import tinycudann  # noqa: F401
    except Exception:
        return False
    return True


def _cuda_ext_available() -> bool:
    try:
        from nerf_lightning.ops import cuda as cuda_ops
    except Exception:  # never let the fast path break the model
        return False
    return bool(cuda_ops.is_available())


class HashEncoding(nn.Module):
    """instant-ngp multiresolution hash encoding (tiny-cuda-nn layout).

    Args:
        n_levels: L, number of levels.
        n_features_per_level: F, features per table entry.
        log2_hashmap_size: log2 of the maximum entries per level (T).
        base_resolution: coarsest grid resolution.
        max_resolution: finest grid resolution; per_level_scale = (max/base)^(1/(L-1)).
        backend: ``auto`` | ``cuda`` | ``tcnn`` | ``torch`` (see module docstring).
        param_dtype: dtype of the table, ``torch.float32`` or ``torch.float16`` (or their names).

    Shapes:
        forward(x [N, 3] in [0, 1]^3) -> [N, L * F], level-major ([l0 f0, l0 f1, l1 f0, ...]).
    """

    def __init__(
        self,
        n_levels: int = 16,
        n_features_per_level: int = 2,
        log2_hashmap_size: int = 19,
        base_resolution: int = 16,
        max_resolution: int = 2048,
        backend: str = "auto",
        param_dtype: torch.dtype | str = torch.float32,
    ) -> None:
        super().__init__()
        if backend not in HASH_BACKENDS:
            raise ValueError(f"model.encoding.backend must be one of {HASH_BACKENDS}, got {backend!r}")
        if isinstance(param_dtype, str):
            name = param_dtype.replace("torch.", "")
            if name not in ("float32", "float16", "half", "float", "float64"):
                raise ValueError(
                    f"model.encoding.param_dtype must be float32 or float16, got {param_dtype!r}"
                )
            param_dtype = getattr(torch, name)
        if n_levels < 1 or n_features_per_level < 1:
            raise ValueError(
                f"model.encoding: n_levels and n_features_per_level must be >= 1, "
                f"got {n_levels}, {n_features_per_level}"
            )
        if base_resolution < 1 or max_resolution < base_resolution:
            raise ValueError(
                f"model.encoding: need 1 <= base_resolution <= max_resolution, "
                f"got {base_resolution}, {max_resolution}"
            )
        if not 1 <= log2_hashmap_size <= 30:
            raise ValueError(f"model.encoding.log2_hashmap_size must be in [1, 30], got {log2_hashmap_size}")
        self.n_levels = n_levels
        self.n_features_per_level = n_features_per_level
        self.log2_hashmap_size = log2_hashmap_size
        self.base_resolution = base_resolution
        self.max_resolution = max_resolution
        self.backend = backend
        if n_levels > 1:
            self.per_level_scale = math.exp(math.log(max_resolution / base_resolution) / (n_levels - 1))
        else:
            self.per_level_scale = 1.0
        max_params = 2**log2_hashmap_size
        scales: list[float] = []
        resolutions: list[int] = []
        offsets = [0]
        for lvl in range(n_levels):
            # float32 value of the scale, as the kernels see it.
            scale = float(np.float32(base_resolution * self.per_level_scale**lvl - 1.0))
            res = int(math.ceil(scale)) + 1
            size = min(max_params, _next_multiple(res**3, 8))
            scales.append(scale)
            resolutions.append(res)
            offsets.append(offsets[-1] + size)
        self.scales = scales
        self.resolutions = resolutions
        self.offsets = offsets
        self.dense_levels = [r**3 <= offsets[i + 1] - offsets[i] for i, r in enumerate(resolutions)]
        self.params = nn.Parameter(
            torch.empty(offsets[-1], n_features_per_level, dtype=param_dtype).uniform_(-1e-4, 1e-4)
        )
        self._tcnn_holder: list = []  # tcnn module kept out of the nn.Module tree (params are ours)
        self._level_tables = LevelTables(scales, resolutions, offsets)  # per-device constants, fused path

    @property
    def n_output_dims(self) -> int:
        return self.n_levels * self.n_features_per_level

    def extra_repr(self) -> str:
        return (
            f"n_levels={self.n_levels}, F={self.n_features_per_level}, log2_T={self.log2_hashmap_size}, "
            f"base={self.base_resolution}, max={self.max_resolution}, "
            f"per_level_scale={self.per_level_scale:.5f}, backend={self.backend}, "
            f"params={tuple(self.params.shape)} {self.params.dtype}"
        )

    def resolve_backend(self, x: torch.Tensor) -> str:
        """Backend actually used for input ``x`` (``torch`` | ``cuda`` | ``tcnn``)."""
        on_cuda = x.is_cuda
        if self.backend == "torch":
            return "torch"
        if self.backend == "tcnn":
            if on_cuda and _tcnn_available():
                return "tcnn"
            _warn_once(
                "tcnn",
                "model.encoding.backend=tcnn: tinycudann is not importable or the input "
                "is not on CUDA; using the torch reference hash encoding.",
            )
            return "torch"
        if self.backend == "cuda":
            if on_cuda and _cuda_ext_available():
                return "cuda" if not x.requires_grad else "torch"
            _warn_once(
                "cuda",
                "model.encoding.backend=cuda: the CUDA extension is unavailable or the "
                "input is not on CUDA; using the torch reference hash encoding.",
            )
            return "torch"
        # auto
        if not on_cuda:
            return "torch"
        if _tcnn_available():
            return "tcnn"
        if _cuda_ext_available() and not x.requires_grad:
            return "cuda"
        return "torch"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 2 or x.shape[-1] != 3:
            raise ValueError(f"HashEncoding expects x of shape [N, 3] in [0, 1]^3, got {tuple(x.shape)}")
        backend = self.resolve_backend(x)
        if backend == "cuda":
            from nerf_lightning.ops import cuda as cuda_ops

            return cuda_ops.hash_encode(x, self.params, self.scales, self.resolutions, self.offsets)
        if backend == "tcnn":
            return self._forward_tcnn(x)
        if not x.requires_grad:
            # Same numbers as the oracle below, several times faster (one gather, one scatter).
            return hash_encode_fused(x, self.params, self._level_tables)
        return hash_encode_torch(x, self.params, self.scales, self.resolutions, self.offsets)

    # ------------------------------------------------------------------ tcnn (untested here)
    def _forward_tcnn(self, x: torch.Tensor) -> torch.Tensor:
        import tinycudann as tcnn

        if not self._tcnn_holder:
            config = {
                "otype": "HashGrid",
                "n_levels": self.n_levels,
                "n_features_per_level": self.n_features_per_level,
                "log2_hashmap_size": self.log2_hashmap_size,
                "base_resolution": self.base_resolution,
                "per_level_scale": self.per_level_scale,
            }
            enc = tcnn.Encoding(n_input_dims=3, encoding_config=config, dtype=self.params.dtype)
            if enc.params.numel() != self.params.numel():
                raise RuntimeError(
                    f"tinycudann HashGrid has {enc.params.numel()} params, ours {self.params.numel()}; "
                    "use model.encoding.backend=cuda or torch"
                )
            enc = enc.to(x.device)
            self._tcnn_holder.append(enc)
        enc = self._tcnn_holder[0]
        # tcnn's forward reads ``self.params``; hand it a fresh view of OUR table on every forward so that
        # gradients, the optimizer and checkpoints all see a single parameter.
        enc._parameters["params"] = self.params.reshape(-1)
        out = enc(x.float().contiguous())
        return out.float()


class SHEncoding(nn.Module):
    """Real spherical-harmonics direction encoding (tiny-cuda-nn ``SphericalHarmonics`` order).

    tcnn maps its input from [0, 1] to [-1, 1]; we take unit vectors directly.

    Shapes:
        forward(d [N, 3] unit directions) -> [N, degree^2], d's dtype (float32 in practice).
    """

    def __init__(self, degree: int = 4) -> None:
        super().__init__()
        if not 1 <= degree <= 4:
            raise ValueError(f"model.sh_degree / SHEncoding.degree must be in 1..4, got {degree}")
        self.degree = degree

    @property
    def n_output_dims(self) -> int:
        return self.degree**2

    def extra_repr(self) -> str:
        return f"degree={self.degree}"

    def forward(self, d: torch.Tensor) -> torch.Tensor:
        if d.ndim != 2 or d.shape[-1] != 3:
            raise ValueError(f"SHEncoding expects directions of shape [N, 3], got {tuple(d.shape)}")
        if d.is_cuda and not d.requires_grad and d.dtype == torch.float32 and _cuda_ext_available():
            from nerf_lightning.ops import cuda as cuda_ops

            if hasattr(cuda_ops, "sh_encode"):
                return cuda_ops.sh_encode(d, self.degree)
        return sh_encode_torch(d, self.degree)
