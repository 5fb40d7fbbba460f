"""The fused torch hash encoding equals the readable oracle (values and table gradients)."""

from __future__ import annotations

import pytest
import torch

from nerf_lightning.models.encoding import HashEncoding
from nerf_lightning.ops.hashgrid_torch import LevelTables, hash_encode_fused
from nerf_lightning.ops.reference import hash_encode as hash_encode_torch


@pytest.mark.parametrize(
    ("levels", "log2_t", "max_res", "dtype"),
    [(4, 13, 64, torch.float32), (8, 14, 512, torch.float32), (6, 13, 300, torch.float64)],
)
def test_fused_equals_oracle(levels: int, log2_t: int, max_res: int, dtype: torch.dtype) -> None:
    torch.manual_seed(levels)
    enc = HashEncoding(n_levels=levels, log2_hashmap_size=log2_t, max_resolution=max_res, backend="torch")
    assert any(enc.dense_levels) and not all(enc.dense_levels)  # both index kinds exercised
    params = torch.nn.Parameter(torch.randn_like(enc.params, dtype=dtype))
    x = torch.rand(3000, 3, dtype=dtype)
    x[:10] = torch.tensor([0.0, 1.0, 0.5], dtype=dtype)  # box faces and cell boundaries
    ref = hash_encode_torch(x, params, enc.scales, enc.resolutions, enc.offsets)
    fused = hash_encode_fused(x, params, LevelTables(enc.scales, enc.resolutions, enc.offsets))
    torch.testing.assert_close(fused, ref, rtol=0, atol=1e-6 if dtype == torch.float32 else 1e-12)
    weights = torch.randn_like(ref)
    (g_ref,) = torch.autograd.grad((ref * weights).sum(), params)
    (g_fused,) = torch.autograd.grad((fused * weights).sum(), params)
    torch.testing.assert_close(g_fused, g_ref, rtol=1e-5, atol=1e-5 if dtype == torch.float32 else 1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_position_gradient_equals_oracle(dtype: torch.dtype) -> None:
    """Learned camera poses differentiate the sample positions: the fused backward's d/dx (trilinear
    weight derivatives) equals autograd through the oracle, on dense and hashed levels."""
    torch.manual_seed(3)
    enc = HashEncoding(n_levels=6, log2_hashmap_size=13, max_resolution=300, backend="torch")
    assert any(enc.dense_levels) and not all(enc.dense_levels)
    params = torch.randn_like(enc.params, dtype=dtype)
    x = (torch.rand(2000, 3, dtype=dtype) * 0.98 + 0.01).requires_grad_(True)
    weights = torch.randn(2000, enc.n_output_dims, dtype=dtype)
    ref = hash_encode_torch(x, params, enc.scales, enc.resolutions, enc.offsets)
    (g_ref,) = torch.autograd.grad((ref * weights).sum(), x)
    fused = hash_encode_fused(x, params, LevelTables(enc.scales, enc.resolutions, enc.offsets))
    (g_fused,) = torch.autograd.grad((fused * weights).sum(), x)
    assert g_ref.abs().max() > 1.0  # a real gradient, not zeros
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(g_fused, g_ref, rtol=tol, atol=tol)
    assert enc(x).requires_grad
