"""Reference (torch) hash-grid and spherical-harmonics encodings against independent implementations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nerf_lightning.models.encoding import HashEncoding, SHEncoding
from nerf_lightning.ops.reference import hash_encode as hash_encode_torch
from nerf_lightning.ops.reference import sh_encode as sh_encode_torch


def naive_hash_encode(enc: HashEncoding, x: np.ndarray) -> np.ndarray:
    """Per-point, per-level, per-corner loop in float64 straight from ENCODING_SPEC.md."""
    params = enc.params.detach().double().numpy()
    L, F = enc.n_levels, enc.n_features_per_level
    T = 2**enc.log2_hashmap_size
    b = math.exp(math.log(enc.max_resolution / enc.base_resolution) / (L - 1)) if L > 1 else 1.0
    out = np.zeros((x.shape[0], L * F))
    offset = 0
    for lvl in range(L):
        scale = float(np.float32(enc.base_resolution * b**lvl - 1.0))
        res = math.ceil(scale) + 1
        size = min(T, (res**3 + 7) // 8 * 8)
        for n in range(x.shape[0]):
            # float32 mul then add, as the vectorized code and the kernels do
            pos = [
                float(np.float32(np.float32(x[n, d]) * np.float32(scale)) + np.float32(0.5)) for d in range(3)
            ]
            p0 = [math.floor(p) for p in pos]
            w = [p - q for p, q in zip(pos, p0, strict=True)]
            acc = np.zeros(F)
            for c in range(8):
                cc = [p0[d] + ((c >> d) & 1) for d in range(3)]
                wt = 1.0
                for d in range(3):
                    wt *= w[d] if (c >> d) & 1 else 1.0 - w[d]
                if res**3 <= size:
                    i = cc[0] + cc[1] * res + cc[2] * res * res
                else:
                    i = (cc[0] * 1) ^ ((cc[1] * 2654435761) % 2**32) ^ ((cc[2] * 805459861) % 2**32)
                i = (i % 2**32) % size
                acc += wt * params[offset + i]
            out[n, lvl * F : (lvl + 1) * F] = acc
        offset += size
    return out


def test_table_layout_and_level_sizes():
    enc = HashEncoding(
        n_levels=16,
        n_features_per_level=2,
        log2_hashmap_size=19,
        base_resolution=16,
        max_resolution=2048,
        backend="torch",
    )
    b = math.exp(math.log(2048 / 16) / 15)
    assert enc.per_level_scale == pytest.approx(b)
    # level 0: scale 15, res 16, 16^3 = 4096 entries (dense); finest level hashed with 2^19 entries.
    assert enc.scales[0] == 15.0 and enc.resolutions[0] == 16
    assert enc.offsets[1] == 4096 and enc.dense_levels[0]
    assert not enc.dense_levels[-1] and enc.offsets[-1] - enc.offsets[-2] == 2**19
    sizes = np.diff(enc.offsets)
    assert all(s % 8 == 0 for s in sizes)
    assert enc.params.shape == (enc.offsets[-1], 2)
    assert enc.params.abs().max() <= 1e-4 and enc.params.std() > 1e-5
    # dense iff res^3 fits in the level's table
    for lvl in range(16):
        assert enc.dense_levels[lvl] == (enc.resolutions[lvl] ** 3 <= 2**19)
    assert sum(enc.dense_levels) == 5  # res 16, 22, 30, 42, 58 fit in 2^19 = 524288; res 80 does not


@pytest.mark.parametrize("log2_t,levels", [(19, 16), (12, 6), (8, 3)])
def test_vectorized_equals_naive_loop(log2_t, levels):
    torch.manual_seed(0)
    enc = HashEncoding(
        n_levels=levels,
        n_features_per_level=2,
        log2_hashmap_size=log2_t,
        base_resolution=4,
        max_resolution=300,
        backend="torch",
    )
    with torch.no_grad():
        enc.params.uniform_(-1, 1)  # large values so every corner's contribution is visible
    x = torch.rand(40, 3)
    x[0] = 0.0
    x[1] = 1.0  # upper boundary: corners past res-1 wrap like tcnn (mod T)
    got = enc(x).detach().double().numpy()
    ref = naive_hash_encode(enc, x.numpy())
    assert got.shape == (40, levels * 2)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_dense_and_hashed_levels_are_used():
    """A dense level indexes x + y*res + z*res^2; a hashed one uses the coherent prime hash."""
    enc = HashEncoding(
        n_levels=2,
        n_features_per_level=1,
        log2_hashmap_size=10,
        base_resolution=4,
        max_resolution=40,
        backend="torch",
    )
    assert enc.dense_levels == [True, False]
    res0 = enc.resolutions[0]
    with torch.no_grad():
        enc.params.copy_(torch.arange(enc.params.shape[0], dtype=torch.float32)[:, None])
    # A point on a grid vertex of level 0 (w = 0) reads exactly one entry: its dense index.
    s0 = enc.scales[0]
    cell = torch.tensor([1.0, 2.0, 3.0])
    x = ((cell - 0.5) / s0)[None]
    out = enc(x)
    assert out[0, 0].item() == pytest.approx(1 + 2 * res0 + 3 * res0 * res0, abs=1e-3)
    # Level 1 is hashed (res^3 > T): the naive-loop test checks its values; here, that the finest
    # level's 2^10 entries are far fewer than its res^3 vertices.
    assert enc.resolutions[1] ** 3 > enc.offsets[2] - enc.offsets[1] == 2**10


def test_gradcheck_float64_tiny_table():
    torch.manual_seed(1)
    enc = HashEncoding(
        n_levels=3,
        n_features_per_level=2,
        log2_hashmap_size=6,
        base_resolution=2,
        max_resolution=16,
        backend="torch",
        param_dtype=torch.float64,
    )
    x = torch.rand(7, 3, dtype=torch.float64)
    params = enc.params.detach().clone().uniform_(-1, 1).requires_grad_(True)

    def f(p):
        return hash_encode_torch(x, p, enc.scales, enc.resolutions, enc.offsets)

    assert torch.autograd.gradcheck(f, (params,), eps=1e-6, atol=1e-6)
    # gradient w.r.t. positions too (points away from cell faces; the encoding is piecewise smooth)
    xg = (torch.rand(5, 3, dtype=torch.float64) * 0.8 + 0.1).requires_grad_(True)

    def g(xx):
        return hash_encode_torch(xx, params.detach(), enc.scales, enc.resolutions, enc.offsets)

    assert torch.autograd.gradcheck(g, (xg,), eps=1e-7, atol=1e-5)


def test_param_gradient_is_scatter_of_weights():
    """d out / d params: each corner entry receives the trilinear weight (weights sum to 1 per level)."""
    enc = HashEncoding(
        n_levels=4,
        n_features_per_level=2,
        log2_hashmap_size=14,
        base_resolution=4,
        max_resolution=64,
        backend="torch",
    )
    x = torch.rand(100, 3)
    out = enc(x)
    out[:, 0::2].sum().backward()  # feature 0 of every level
    g = enc.params.grad
    for lvl in range(4):
        lo, hi = enc.offsets[lvl], enc.offsets[lvl + 1]
        assert g[lo:hi, 0].sum().item() == pytest.approx(100.0, rel=1e-4)
        assert g[lo:hi, 1].abs().max().item() == 0.0


def test_fp16_params_and_output_dtype():
    enc = HashEncoding(
        n_levels=4,
        log2_hashmap_size=12,
        base_resolution=4,
        max_resolution=64,
        backend="torch",
        param_dtype="float16",
    )
    assert enc.params.dtype == torch.float16
    out = enc(torch.rand(10, 3))
    assert out.dtype == torch.float32 and out.shape == (10, 8)
    out.sum().backward()
    assert enc.params.grad.dtype == torch.float16


def test_bad_config_errors():
    with pytest.raises(ValueError, match="backend"):
        HashEncoding(backend="fast")
    with pytest.raises(ValueError, match="param_dtype"):
        HashEncoding(param_dtype="int8")
    with pytest.raises(ValueError, match=r"\[N, 3\]"):
        HashEncoding(n_levels=2, log2_hashmap_size=8, backend="torch")(torch.rand(4, 2))


def test_auto_backend_on_cpu_is_torch():
    enc = HashEncoding(n_levels=2, log2_hashmap_size=8, backend="auto")
    assert enc.resolve_backend(torch.rand(3, 3)) == "torch"


# ------------------------------------------------------------------------------ spherical harmonics
def _assoc_legendre(l: int, m: int, t: np.ndarray) -> np.ndarray:
    """P_l^m(t) with the Condon-Shortley phase, m >= 0, by the standard recurrences."""
    pmm = np.ones_like(t)
    s = np.sqrt(np.maximum(0.0, 1 - t * t))
    for i in range(1, m + 1):
        pmm = pmm * (-(2 * i - 1)) * s
    if l == m:
        return pmm
    pm1 = t * (2 * m + 1) * pmm
    if l == m + 1:
        return pm1
    for ll in range(m + 2, l + 1):
        pmm, pm1 = pm1, ((2 * ll - 1) * t * pm1 - (ll + m - 1) * pmm) / (ll - m)
    return pm1


def closed_form_real_sh(d: np.ndarray, degree: int) -> np.ndarray:
    """Real SH from spherical coordinates: index l^2 + l + m; sin for m < 0, cos for m > 0."""
    theta = np.arccos(np.clip(d[:, 2], -1, 1))
    phi = np.arctan2(d[:, 1], d[:, 0])
    ct = np.cos(theta)
    cols = []
    for l in range(degree):
        for m in range(-l, l + 1):
            am = abs(m)
            k = math.sqrt((2 * l + 1) / (4 * math.pi) * math.factorial(l - am) / math.factorial(l + am))
            p = _assoc_legendre(l, am, ct)
            if m == 0:
                cols.append(k * p)
            elif m > 0:
                cols.append(math.sqrt(2) * k * np.cos(m * phi) * p)
            else:
                cols.append(math.sqrt(2) * k * np.sin(am * phi) * p)
    return np.stack(cols, axis=-1)


@pytest.mark.parametrize("degree", [1, 2, 3, 4])
def test_sh_equals_closed_form(degree):
    rng = np.random.default_rng(degree)
    d = rng.normal(size=(50, 3))
    d = np.concatenate([d, np.eye(3), -np.eye(3)])
    d /= np.linalg.norm(d, axis=-1, keepdims=True)
    got = SHEncoding(degree)(torch.from_numpy(d)).numpy()
    assert got.shape == (56, degree**2)
    np.testing.assert_allclose(got, closed_form_real_sh(d, degree), atol=1e-12, rtol=1e-10)
    # a few hand values: +z and +x
    ez = SHEncoding(degree)(torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64))[0]
    assert ez[0].item() == pytest.approx(0.5 / math.sqrt(math.pi))
    if degree > 1:
        assert ez[2].item() == pytest.approx(math.sqrt(3 / (4 * math.pi)))
        ex = SHEncoding(degree)(torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64))[0]
        assert ex[3].item() == pytest.approx(-math.sqrt(3 / (4 * math.pi)))


def test_sh_orthonormal_monte_carlo():
    g = torch.Generator().manual_seed(0)
    d = torch.randn(400_000, 3, generator=g, dtype=torch.float64)
    d = d / d.norm(dim=-1, keepdim=True)
    y = sh_encode_torch(d, 4)  # [N, 16]
    gram = 4 * math.pi * (y.T @ y) / d.shape[0]
    # MC error ~ 1/sqrt(N) * O(1)
    assert torch.allclose(gram, torch.eye(16, dtype=torch.float64), atol=0.03)


def test_sh_float32_and_bad_degree():
    d = torch.nn.functional.normalize(torch.randn(8, 3), dim=-1)
    out = SHEncoding()(d)
    assert out.dtype == torch.float32 and out.shape == (8, 16)
    with pytest.raises(ValueError, match="degree"):
        SHEncoding(5)
