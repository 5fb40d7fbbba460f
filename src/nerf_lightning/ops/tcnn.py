"""tiny-cuda-nn as a backend of the hash encoding: its ``HashGrid`` run on our table.

``models/encoding.py::HashEncoding`` keeps the table of record (``params`` [sum_l T_l, F]: the
optimizer's parameter, the checkpoint's tensor) whatever the backend; with ``backend=tcnn`` each
forward hands that table to tcnn's kernels through :func:`to_tcnn_params`. The conventions, ours
(``ops/reference/encoding.py``) against tcnn's (``include/tiny-cuda-nn/encodings/grid.h`` and
``common_device.h`` at instant-ngp's pin 2e757bb):

- hash: ours ``(ix * 1) ^ (iy * 2654435761) ^ (iz * 805459861)`` in uint32, then ``mod T_l``; tcnn's
  ``coherent_prime_hash``: the same primes, xor and uint32 arithmetic, then ``% hashmap_size``.
- dense or hashed: dense iff ``res^3 <= T_l``, row ``ix + iy * res + iz * res^2``; tcnn's ``grid_index``:
  the same rule and row order.
- level scale: ours ``float32(base * s^l - 1)`` with ``s`` in float64; tcnn ``exp2f(l * log2f(s)) *
  base - 1`` in float32 on the GPU, with ``--use_fast_math`` (an approximate exp2). The one difference.
- resolution ``ceil(scale) + 1`` and level size ``min(next_multiple(res^3, 8), 2^log2_T)``: the same.
- position: ours ``x * scale + 0.5`` (two roundings), tcnn ``fmaf(scale, x, 0.5f)`` (one).
- interpolation: trilinear, corner bit ``d`` = axis ``d``; tcnn's ``"Linear"``: the same corner order.
- table: ours ``[sum_l T_l, F]``, level ``l`` at rows ``offsets[l]..offsets[l + 1]``; tcnn's flat
  ``[sum_l T_l * F]`` in the same order. Its dtype: ours float32 (float16 on request), tcnn fp16 by
  default and fp32 when asked for; tcnn's output has the table's dtype.
- input x in [0, 1]^3 (float32) and output [N, L * F], level-major: the same.

So the parameter layout needs no conversion: :func:`to_tcnn_params` is a view of our table and
:func:`from_tcnn_params` its inverse. It is exact (the same table, the same index of every corner)
when tcnn's level sizes equal ours, which :func:`tcnn_level_offsets` predicts on the CPU and
:class:`TcnnHashGrid` checks against tcnn's own parameter count before its first use. The features
are then equal up to the level scale and the position's rounding: tcnn's scale differs from ours by
a few float32 ulps (:func:`scale_mismatch`; exactly 0 for power-of-two level scales), which moves a
point by at most ``|delta scale| * x + 1 ulp`` cells; trilinear interpolation is continuous, so a
feature moves by at most that distance times its corner differences (bound used by the GPU tests).
Gradients w.r.t. the table are the same sums of the same weights (tcnn accumulates them in the
table's dtype: fp16 tables get fp16 atomics).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "available",
    "hashgrid_config",
    "tcnn_level_scales",
    "tcnn_level_offsets",
    "scale_mismatch",
    "to_tcnn_params",
    "from_tcnn_params",
    "TcnnHashGrid",
]

#: the table dtypes tcnn's grid encoding reads (its Fp32 and Fp16 precisions)
TCNN_DTYPES = (torch.float32, torch.float16)


def available() -> str | None:
    """None when ``tinycudann`` imports (it needs a CUDA GPU at import), else the reason in one line."""
    try:
        import tinycudann  # noqa: F401
    except Exception as exc:  # a missing wheel, one built for another torch/GPU, or no GPU
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def hashgrid_config(
    n_levels: int,
    n_features_per_level: int,
    log2_hashmap_size: int,
    base_resolution: int,
    per_level_scale: float,
) -> dict[str, Any]:
    """tcnn's encoding config of our hash grid (``DOCUMENTATION.md``: HashGrid)."""
    return {
        "otype": "HashGrid",
        "n_levels": int(n_levels),
        "n_features_per_level": int(n_features_per_level),
        "log2_hashmap_size": int(log2_hashmap_size),
        "base_resolution": int(base_resolution),
        "per_level_scale": float(per_level_scale),
        "interpolation": "Linear",
    }


def tcnn_level_scales(n_levels: int, base_resolution: int, per_level_scale: float) -> list[float]:
    """tcnn's level scales ``exp2f(l * log2f(s)) * base - 1`` emulated in float32 on the CPU.

    The GPU evaluates ``exp2f`` with fast math (relative error up to about 2^-22); this emulation
    rounds it correctly, so a scale here can differ from the GPU's by that much.
    """
    log2_s = np.log2(np.float32(per_level_scale), dtype=np.float32)
    base = np.float32(base_resolution)
    return [
        float(np.exp2(np.float32(level) * log2_s, dtype=np.float32) * base - np.float32(1.0))
        for level in range(n_levels)
    ]


def tcnn_level_offsets(
    n_levels: int,
    n_features_per_level: int,
    log2_hashmap_size: int,
    base_resolution: int,
    per_level_scale: float,
) -> tuple[list[int], list[int]]:
    """Row offsets [L + 1] of tcnn's levels (its constructor's sizes) and the levels whose size the
    CPU cannot predict: dense levels whose scale lies within the GPU's exp2 error of an integer
    (there ``ceil`` may round either way). ``n_features_per_level`` does not change the rows."""
    del n_features_per_level
    offsets, unsure = [0], []
    for level, scale in enumerate(tcnn_level_scales(n_levels, base_resolution, per_level_scale)):
        res = math.ceil(scale) + 1
        size = min(_next_multiple(res**3, 8), 2**log2_hashmap_size)
        near_integer = abs(scale - round(scale)) <= 6e-7 * max(abs(scale), 1.0)
        if near_integer and level > 0 and res**3 <= size:
            unsure.append(level)
        offsets.append(offsets[-1] + size)
    return offsets, unsure


def scale_mismatch(
    ours: Sequence[float], n_levels: int, base_resolution: int, per_level_scale: float
) -> float:
    """Largest relative difference between our level scales and tcnn's (emulated): what moves the
    positions at which the two backends read the same table."""
    theirs = tcnn_level_scales(n_levels, base_resolution, per_level_scale)
    return max((abs(a - b) / max(abs(a), 1.0) for a, b in zip(ours, theirs, strict=True)), default=0.0)


def to_tcnn_params(params: Tensor) -> Tensor:
    """Our table [sum_l T_l, F] as tcnn's flat parameter vector [sum_l T_l * F]: a view (row-major:
    level by level, entry by entry, feature by feature), differentiable; exact, no copy."""
    if params.dim() != 2:
        raise ValueError(f"to_tcnn_params: expected a table [rows, F], got {tuple(params.shape)}")
    return params.reshape(-1)


def from_tcnn_params(flat: Tensor, n_features_per_level: int) -> Tensor:
    """tcnn's flat parameter vector [sum_l T_l * F] as our table [sum_l T_l, F] (the inverse view)."""
    if flat.dim() != 1 or flat.numel() % n_features_per_level:
        raise ValueError(
            f"from_tcnn_params: expected a flat vector of a multiple of F={n_features_per_level} "
            f"elements, got {tuple(flat.shape)}"
        )
    return flat.view(-1, n_features_per_level)


def _next_multiple(v: int, m: int) -> int:
    return (v + m - 1) // m * m


class TcnnHashGrid:
    """tcnn's ``HashGrid`` kernels applied to a table we own (built on first use, one per device).

    Args:
        config: :func:`hashgrid_config` of the encoding.
        n_rows: ``sum_l T_l`` of our table (tcnn must lay out the same number of entries).

    ``__call__(x [N, 3] float in [0, 1]^3 on CUDA, params [sum T_l, F] fp32/fp16)`` -> float32
    [N, L * F], differentiable w.r.t. ``params`` (and ``x``, which tcnn supports). Not a
    ``torch.nn.Module``: tcnn's own parameter vector is never used, the table of record stays ours.
    """

    def __init__(self, config: dict[str, Any], n_rows: int) -> None:
        self.config = dict(config)
        self.n_rows = int(n_rows)
        self._native: dict[tuple[torch.device, torch.dtype], tuple[Any, float]] = {}

    def __deepcopy__(self, memo: dict) -> TcnnHashGrid:
        return TcnnHashGrid(self.config, self.n_rows)  # native modules are rebuilt on first use

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "n_rows": self.n_rows, "_native": {}}

    def _module(self, device: torch.device, dtype: torch.dtype) -> tuple[Any, float]:
        key = (device, dtype)
        if key not in self._native:
            import tinycudann as tcnn

            # tcnn allocates its initial parameters on the current CUDA device
            with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
                enc = tcnn.Encoding(n_input_dims=3, encoding_config=self.config, dtype=dtype)
            n_params, n_features = enc.native_tcnn_module.n_params(), self.config["n_features_per_level"]
            if n_params != self.n_rows * n_features:
                raise RuntimeError(
                    f"hash encoding backend=tcnn: tiny-cuda-nn lays this grid out in {n_params} parameters, "
                    f"ours in {self.n_rows * n_features} (a level's resolution differs): its tables do "
                    "not correspond; use model.net.backend=cuda"
                )
            self._native[key] = (enc.native_tcnn_module, float(enc.loss_scale))
        return self._native[key]

    def __call__(self, x: Tensor, params: Tensor) -> Tensor:
        from tinycudann.modules import _C, _module_function

        if params.dtype not in TCNN_DTYPES:
            raise ValueError(f"hash encoding backend=tcnn: tables are float32 or float16, got {params.dtype}")
        native, loss_scale = self._module(x.device, params.dtype)
        n = x.shape[0]
        granularity = int(_C.batch_size_granularity())
        padded = (n + granularity - 1) // granularity * granularity
        xf = x.float()
        if padded != n:
            xf = torch.nn.functional.pad(xf, [0, 0, 0, padded - n])
        out = _module_function.apply(native, xf.contiguous(), to_tcnn_params(params).contiguous(), loss_scale)
        return out[:n].float()
