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


def test_fused_refuses_position_gradients() -> None:
    enc = HashEncoding(n_levels=2, log2_hashmap_size=8, max_resolution=32, backend="torch")
    x = torch.rand(4, 3, requires_grad=True)
    with pytest.raises(ValueError, match="does not differentiate positions"):
        hash_encode_fused(x, enc.params, LevelTables(enc.scales, enc.resolutions, enc.offsets))
    assert enc(x).requires_grad  # the module falls back to the oracle instead
