"""Input encodings of the radiance field: multiresolution hash grid and spherical harmonics.

Both follow tiny-cuda-nn's conventions (``encodings/grid.h`` and ``encodings/spherical_harmonics.h``)
so that parameters and outputs can move between our backends and tcnn's.

Implementations of :class:`HashEncoding`, chosen per input by the step's one backend (``model.net.backend``,
the :class:`~nerf_lightning.ops.Backend` the field hands it; the registry says what ``auto`` chose, once):

- ``"torch"``: vectorized PyTorch on any device (``ops/hashgrid_torch.py``: one gather, one scatter;
  the same numbers and gradients as the readable oracle ``ops.reference.hash_encode``).
- ``"cuda"``: our kernels (``ops.cuda.hash_encode``): one thread per (point, level), gradient by
  atomic scatter into the table; fp32 and fp16 tables. Positions that need a gradient (learned camera
  poses move the samples) get it from a second backward kernel, launched only then.
- ``"tcnn"``: tiny-cuda-nn's ``HashGrid`` kernels (``ops/tcnn.py``) on our ``params`` table: the same
  hash, level sizes and layout, so the table (and a checkpoint) is the same for every backend; a grid
  tcnn would size differently is refused at construction. Its level scales differ from ours by a
  few float32 ulps (said once at construction). ``auto`` picks it only on GPUs the registry lists as
  tested and faster (``ops.TCNN_FASTER_ON``).
- ``"auto"``: our kernels for CUDA input when the extension loads (tcnn instead on a GPU listed in
  ``ops.TCNN_FASTER_ON`` when it imports), else ``torch``. Resolved at each
  forward from the input's device, so a module built on the CPU and moved to the GPU by Lightning
  takes the fast path.

Output dtype: float32 for float32/float16 params (float64 for float64 params, used by gradcheck);
all backends return float32 under autocast too (the following Linear layers cast it themselves),
``tcnn``'s output (in the table's dtype) included.
"""

from __future__ import annotations

import logging
import math
from typing import Annotated

import numpy as np
import torch
from torch import nn

from nerf_lightning.config_keys import check_arguments
from nerf_lightning.config_schema import Injected, Note, Range
from nerf_lightning.ops import Backend, as_backend, tcnn
from nerf_lightning.ops.hashgrid_torch import LevelTables, hash_encode_fused

log = logging.getLogger(__name__)


#: the degree of a spherical-harmonics encoding: the bands written out in ``ops`` (tiny-cuda-nn's 1..4 of 8)
SHDegree = Annotated[int, Range(low=1, high=4), Note("spherical-harmonics bands")]


def _next_multiple(v: int, m: int) -> int:
    return (v + m - 1) // m * m


class HashEncoding(nn.Module):
    """instant-ngp multiresolution hash encoding (tiny-cuda-nn layout).

    Args:
        n_levels: L, number of levels.
        n_features_per_level: F, features per table entry.
        log2_hashmap_size: log2 of the maximum entries per level (T).
        base_resolution: coarsest grid resolution.
        max_resolution: finest grid resolution per unit cube; per_level_scale = (max/base)^(1/(L-1)) over
            the box (:attr:`max_resolution`: ``max_resolution * aabb_scale``).
        backend: the step's :class:`~nerf_lightning.ops.Backend` (``model.net.backend``), or its name
            (``auto`` | ``cuda`` | ``tcnn`` | ``torch``; see the module docstring).
        aabb_scale: the side of the box the positions are normalized over, in unit cubes.
        param_dtype: dtype of the table, ``torch.float32`` or ``torch.float16`` (or their names).

    Shapes:
        forward(x [N, 3] in [0, 1]^3) -> [N, L * F], level-major ([l0 f0, l0 f1, l1 f0, ...]).
    """

    def __init__(
        self,
        n_levels: Annotated[int, Range(low=1)] = 16,
        n_features_per_level: Annotated[int, Range(low=1)] = 2,
        log2_hashmap_size: Annotated[int, Range(low=1, high=30), Note("log2 of the entries per level")] = 19,
        base_resolution: Annotated[int, Range(low=1)] = 16,
        max_resolution: Annotated[int, Range(low=1), Note("per unit cube; >= base_resolution")] = 2048,
        backend: Annotated[Backend | str, Injected("NGPField: model.net.backend")] = "auto",
        aabb_scale: Annotated[int, Injected("NGPField: the capture's box")] = 1,
        param_dtype: Annotated[
            torch.dtype | str, Injected("benchmarks and tests: float32 or float16 tables")
        ] = torch.float32,
    ) -> None:
        super().__init__()
        check_arguments(HashEncoding, locals())
        if max_resolution < base_resolution:  # the one rule between two keys
            raise ValueError(
                f"model.net.field.encoding.max_resolution={max_resolution}: expected >= base_resolution "
                f"({base_resolution})"
            )
        max_resolution = max_resolution * aabb_scale
        if isinstance(param_dtype, str):
            name = param_dtype.replace("torch.", "")
            if name not in ("float32", "float16", "half", "float", "float64"):
                raise ValueError(f"HashEncoding: param_dtype must be float32 or float16, got {param_dtype!r}")
            param_dtype = getattr(torch, name)
        self.n_levels = n_levels
        self.n_features_per_level = n_features_per_level
        self.log2_hashmap_size = log2_hashmap_size
        self.base_resolution = base_resolution
        self.max_resolution = max_resolution
        self.backend = as_backend(backend)
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
        self._level_tables = LevelTables(scales, resolutions, offsets)  # per-device constants, fused path
        # tiny-cuda-nn's kernels on our table (built on first use; ``auto`` may pick them too)
        config = tcnn.hashgrid_config(
            n_levels, n_features_per_level, log2_hashmap_size, base_resolution, self.per_level_scale
        )
        self._tcnn = tcnn.TcnnHashGrid(config, offsets[-1])
        if self.backend.name == "tcnn":
            self._check_tcnn_layout()

    def _check_tcnn_layout(self) -> None:
        """Refuse a grid whose tables tcnn lays out differently (one line), and say once how far its
        features are from ours (the level scales: ``ops/tcnn.py``)."""
        args = (self.n_levels, self.n_features_per_level, self.log2_hashmap_size, self.base_resolution)
        theirs, unsure = tcnn.tcnn_level_offsets(*args, self.per_level_scale)
        if theirs != self.offsets:
            level = next(i for i, (a, b) in enumerate(zip(theirs, self.offsets, strict=True)) if a != b) - 1
            raise ValueError(
                f"model.net.backend=tcnn: tiny-cuda-nn sizes level {level} of this grid "
                f"differently ({theirs[level + 1] - theirs[level]} entries, ours "
                f"{self.offsets[level + 1] - self.offsets[level]}): use model.net.backend=cuda, or another "
                "base_resolution / max_resolution"
            )
        mismatch = tcnn.scale_mismatch(self.scales, self.n_levels, self.base_resolution, self.per_level_scale)
        log.info(
            "hash encoding backend=tcnn: the same table layout (%d x %d); tiny-cuda-nn's level scales "
            "differ from ours by up to %.1e relative, so its features equal ours to that shift of the "
            "positions, not bit for bit%s",
            self.offsets[-1], self.n_features_per_level, mismatch,
            f" (levels {unsure}: size checked at first use)" if unsure else "",
        )  # fmt: skip

    @property
    def n_output_dims(self) -> int:
        return self.n_levels * self.n_features_per_level

    def extra_repr(self) -> str:
        return (
            f"n_levels={self.n_levels}, F={self.n_features_per_level}, log2_T={self.log2_hashmap_size}, "
            f"base={self.base_resolution}, max={self.max_resolution}, "
            f"per_level_scale={self.per_level_scale:.5f}, backend={self.backend.name}, "
            f"params={tuple(self.params.shape)} {self.params.dtype}"
        )

    def resolve_backend(self, x: torch.Tensor) -> str:
        """Backend used for input ``x``: ``torch`` | ``cuda`` | ``tcnn`` (see the module docstring)."""
        return self.backend.hash_encoding(x)

    def forward(self, x: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        """The encoding of ``x`` [N, 3]; with ``features`` (this table's encoding of ``x``, computed by a
        pass without gradient) that value, differentiable as the encoding (``ops.hash_encode_given``):
        our kernels then skip the forward gather, the other backends compute it again for the gradient."""
        if x.ndim != 2 or x.shape[-1] != 3:
            raise ValueError(f"HashEncoding expects x of shape [N, 3] in [0, 1]^3, got {tuple(x.shape)}")
        backend = self.resolve_backend(x)
        if backend == "cuda":
            if features is not None:
                return self.backend.ops.hash_encode_given(
                    x, features, self.params, self.scales, self.resolutions, self.offsets
                )
            return self.backend.ops.hash_encode(x, self.params, self.scales, self.resolutions, self.offsets)
        # The oracle's numbers and gradients (ops.reference.hash_encode), several times faster.
        if backend == "tcnn":
            out = self._forward_tcnn(x)
        else:
            out = hash_encode_fused(x, self.params, self._level_tables)
        if features is None:
            return out
        return features.detach().to(out.dtype) + (out - out.detach())  # the given value, this gradient

    def _forward_tcnn(self, x: torch.Tensor) -> torch.Tensor:
        params = self.params
        if params.dtype == torch.bfloat16:  # cast by a framework: tcnn reads fp32 / fp16 tables
            params = params.float()
        return self._tcnn(x, params)


class SHEncoding(nn.Module):
    """Real spherical-harmonics direction encoding (tiny-cuda-nn ``SphericalHarmonics`` order).

    tcnn maps its input from [0, 1] to [-1, 1]; we take unit vectors directly.

    Shapes:
        forward(d [N, 3] unit directions) -> [N, degree^2], d's dtype (float32 in practice).
    """

    def __init__(
        self,
        degree: SHDegree = 4,
        backend: Annotated[Backend | str, Injected("NGPField: model.net.backend")] = "auto",
    ) -> None:
        super().__init__()
        check_arguments(SHEncoding, locals())
        self.degree = degree
        self.backend = as_backend(backend)

    @property
    def n_output_dims(self) -> int:
        return self.degree**2

    def extra_repr(self) -> str:
        return f"degree={self.degree}"

    def forward(self, d: torch.Tensor) -> torch.Tensor:
        if d.ndim != 2 or d.shape[-1] != 3:
            raise ValueError(f"SHEncoding expects directions of shape [N, 3], got {tuple(d.shape)}")
        # the backend's: under auto, our kernel for CUDA input (its backward kernel when learned camera
        # poses turn the directions), else the reference
        return self.backend.ops.sh_encode(d, self.degree)
