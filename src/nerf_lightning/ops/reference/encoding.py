"""Input encodings of the field: multiresolution hash grid and spherical harmonics.

Both follow tiny-cuda-nn's conventions (``encodings/grid.h``, ``encodings/spherical_harmonics.h``);
the CUDA kernels (``ops/csrc/encoding.cu``) and the fused torch path (``ops/hashgrid_torch.py``) must
equal them. ``models/encoding.py`` holds the modules (level sizes, parameters, backend choice).

Hash-grid conventions (the table layout every backend shares):

- level ``l`` has ``scale_l`` (float32) and ``res_l = ceil(scale_l) + 1``; a point ``x`` in [0, 1]^3
  sits at ``pos = x * scale_l + 0.5`` (two float32 roundings, no fma), corner ``floor(pos)``;
- a level of ``T_l`` rows is dense when ``res_l^3 <= T_l`` (row ``ix + iy * res + iz * res^2``), else
  hashed (``(ix * 1) ^ (iy * 2654435761) ^ (iz * 805459861)`` in uint32), then ``mod T_l``;
- the levels' tables are stacked in ``params`` [sum_l T_l, F], level ``l`` at rows
  ``[offsets[l], offsets[l + 1])``; the output is level-major ``[l0 f0, l0 f1, l1 f0, ...]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["hash_encode", "hash_encode_given", "sh_encode"]

#: tiny-cuda-nn coherent_prime_hash primes (first dimension multiplied by 1).
PRIMES = (1, 2654435761, 805459861)
MASK32 = 0xFFFFFFFF


def _corner_bits(device: torch.device) -> torch.Tensor:
    """[8, 3] int64 corner offsets; corner c has bit d of c as offset along dim d (tcnn order)."""
    c = torch.arange(8, device=device)
    return torch.stack([(c >> d) & 1 for d in range(3)], dim=-1)


def hash_encode(
    x: torch.Tensor,
    params: torch.Tensor,
    scales: Sequence[float],
    resolutions: Sequence[int],
    offsets: Sequence[int],
) -> torch.Tensor:
    """Reference multiresolution hash encoding (vectorized over points; loop over levels only).

    Args:
        x: [N, 3] positions in [0, 1]^3 (float; not clamped: outside points wrap like tcnn's uint32).
        params: [sum_l T_l, F] feature table (float16 / float32 / float64).
        scales: per level ``scale_l`` (float32-representable; applied in the compute dtype).
        resolutions: per level ``res_l``.
        offsets: [L + 1] cumulative row offsets of the levels in ``params``.

    Returns:
        [N, L * F], level-major; float64 if params are float64, else float32.
    """
    if x.ndim != 2 or x.shape[-1] != 3:
        raise ValueError(f"hash encoding expects positions of shape [N, 3], got {tuple(x.shape)}")
    cdtype = torch.float64 if params.dtype == torch.float64 else torch.float32
    xc = x.to(cdtype)
    n_levels = len(scales)
    n_feat = params.shape[1]
    bits = _corner_bits(x.device)  # [8, 3]
    primes = torch.tensor(PRIMES, dtype=torch.int64, device=x.device)
    outs = []
    for lvl in range(n_levels):
        res = int(resolutions[lvl])
        size = int(offsets[lvl + 1] - offsets[lvl])
        # Two roundings (mul, then add), exactly like the CUDA kernel (which avoids fma contraction).
        pos = xc * torch.tensor(scales[lvl], dtype=cdtype, device=x.device) + 0.5
        p0f = torch.floor(pos)
        w = pos - p0f  # [N, 3]
        corners = p0f.to(torch.int64)[:, None, :] + bits[None]  # [N, 8, 3]
        if res**3 <= size:  # dense level: plain row-major index (x fastest)
            idx = corners[..., 0] + corners[..., 1] * res + corners[..., 2] * (res * res)
        else:  # hashed level: uint32 products and xor
            hp = (corners * primes) & MASK32
            idx = hp[..., 0] ^ hp[..., 1] ^ hp[..., 2]
        idx = (idx & MASK32) % size + int(offsets[lvl])  # [N, 8]
        wsel = torch.where(bits[None].bool(), w[:, None, :], 1.0 - w[:, None, :])  # [N, 8, 3]
        wc = wsel[..., 0] * wsel[..., 1] * wsel[..., 2]  # [N, 8]
        feats = params[idx].to(cdtype)  # [N, 8, F]
        outs.append((wc[..., None] * feats).sum(dim=1))  # [N, F]
    if n_levels == 0:
        return x.new_zeros((x.shape[0], 0), dtype=cdtype)
    out = torch.stack(outs, dim=1)  # [N, L, F]
    return out.reshape(x.shape[0], n_levels * n_feat)


# -------------------------------------------------------------------------- spherical harmonics
# tiny-cuda-nn encodings/spherical_harmonics.h, degree <= 4 (real SH, Condon-Shortley phase).
_C0 = 0.28209479177387814
_C1 = 0.48860251190291987
_C2 = (1.0925484305920792, 0.94617469575755997, 0.31539156525251999, 0.54627421529603959)
_C3 = (0.59004358992664352, 2.8906114426405538, 0.45704579946446572, 0.3731763325901154, 1.4453057213202769)


def hash_encode_given(
    x: torch.Tensor,
    features: torch.Tensor,
    params: torch.Tensor,
    scales: Sequence[float],
    resolutions: Sequence[int],
    offsets: Sequence[int],
) -> torch.Tensor:
    """:func:`hash_encode` whose value is already known: ``features`` (the encoding of ``x`` by this table,
    computed by an earlier pass that needed no gradient), with the gradient of :func:`hash_encode` at ``x``
    w.r.t. ``params`` (and ``x``). The training step's density pass encodes every marched sample; the
    differentiable pass on the samples it kept takes their features from it instead of gathering the table a
    second time.

    Args:
        x: [N, 3] positions in [0, 1]^3.
        features: float32 [N, L * F], ``hash_encode(x, params, ...)`` of the same table (not checked: a
            stale value goes through as it is).
        params, scales, resolutions, offsets: as :func:`hash_encode`.

    Returns:
        ``features`` as the value (bit for bit), differentiable as :func:`hash_encode`.
    """
    check_given_features(x, features)
    encoded = hash_encode(x, params, scales, resolutions, offsets)
    # the value of `features`, the gradient of `encoded` (the oracle recomputes what the kernels skip)
    return features.detach().to(encoded.dtype) + (encoded - encoded.detach())


def check_given_features(x: torch.Tensor, features: torch.Tensor) -> None:
    """:func:`hash_encode_given`'s shape rule (every backend's): one row of features per position."""
    if features.ndim != 2 or features.shape[0] != x.shape[0]:
        raise ValueError(
            f"hash_encode_given: features must be [N={x.shape[0]}, L * F], got {tuple(features.shape)}"
        )


def sh_encode(d: torch.Tensor, degree: int = 4) -> torch.Tensor:
    """Real spherical harmonics of unit directions, tcnn order and signs.

    Args:
        d: [N, 3] unit directions (float).
        degree: 1..4 (number of bands).

    Returns:
        [N, degree^2] in d's dtype.
    """
    x, y, z = d.unbind(-1)
    out = [torch.full_like(x, _C0)]
    if degree > 1:
        out += [-_C1 * y, _C1 * z, -_C1 * x]
    if degree > 2:
        xx, yy, zz = x * x, y * y, z * z
        xy, yz, xz = x * y, y * z, x * z
        out += [
            _C2[0] * xy,
            -_C2[0] * yz,
            _C2[1] * zz - _C2[2],
            -_C2[0] * xz,
            _C2[3] * xx - _C2[3] * yy,
        ]
    if degree > 3:
        out += [
            _C3[0] * y * (-3.0 * xx + yy),
            _C3[1] * xy * z,
            _C3[2] * y * (1.0 - 5.0 * zz),
            _C3[3] * z * (5.0 * zz - 3.0),
            _C3[2] * x * (1.0 - 5.0 * zz),
            _C3[4] * z * (xx - yy),
            _C3[0] * x * (-xx + 3.0 * yy),
        ]
    return torch.stack(out, dim=-1)
