"""CUDA hash / SH encodings equal the torch reference. GPU only: ``pytest -m cuda``.

Tolerances: fp32 tables, forward within 1e-6 absolute on values of size ~1 (same float ops, the
8-corner sum order may differ) and gradients within 1e-5 relative (atomic scatter order);
fp16 tables: forward within 1e-5 (both read the same halves, accumulate in fp32), gradient within
1e-3 relative (ours: fp32 scatter rounded once to fp16; reference: fp16 index_put accumulate,
compared against the fp32 gradient of the same table).
"""

from __future__ import annotations

import pytest
import torch

from nerf_lightning.models.encoding import HashEncoding, SHEncoding
from nerf_lightning.ops.reference import hash_encode as hash_encode_torch
from nerf_lightning.ops.reference import sh_encode as sh_encode_torch

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():  # pragma: no cover - CPU CI
    pytest.skip("needs an NVIDIA GPU", allow_module_level=True)

from nerf_lightning.ops import cuda as cu  # noqa: E402

DEV = torch.device("cuda")


@pytest.fixture(autouse=True)
def extension_loaded():
    """Without the extension ``cu.hash_encode`` runs the torch reference and every comparison below would
    compare the reference with itself: fail instead of passing trivially."""
    from nerf_lightning.ops import _ext

    assert cu.is_available(), f"the CUDA extension did not load: {_ext.error()}"


def poison() -> None:
    blocks = [torch.full((n,), float("nan"), device=DEV) for n in (1 << 12, 1 << 18, 1 << 22, 1 << 25)]
    del blocks


CONFIGS = [
    dict(n_levels=16, n_features_per_level=2, log2_hashmap_size=19, base_resolution=16, max_resolution=2048),
    dict(n_levels=8, n_features_per_level=2, log2_hashmap_size=12, base_resolution=4, max_resolution=512),
    dict(n_levels=4, n_features_per_level=1, log2_hashmap_size=14, base_resolution=8, max_resolution=128),
    dict(n_levels=6, n_features_per_level=4, log2_hashmap_size=15, base_resolution=16, max_resolution=4096),
    dict(n_levels=3, n_features_per_level=8, log2_hashmap_size=10, base_resolution=2, max_resolution=64),
]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30))


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"L{c['n_levels']}F{c['n_features_per_level']}")
@pytest.mark.parametrize("n", [0, 1, 1000, 1 << 17])
@pytest.mark.parametrize("order", ["point", "level", "warp"])
def test_hash_fp32_equal(cfg, n, order, monkeypatch):
    monkeypatch.setenv("NERF_LIGHTNING_HASH_ORDER", order)  # thread order of the kernels
    torch.manual_seed(n)
    enc = HashEncoding(**cfg, backend="cuda").to(DEV)
    with torch.no_grad():
        enc.params.uniform_(-1, 1)
    x = torch.rand(n, 3, device=DEV)
    if n > 4:
        x[0] = 0.0
        x[1] = 1.0
    assert enc.resolve_backend(x) == "cuda"
    poison()
    out = enc(x)
    assert out.shape == (n, enc.n_output_dims) and out.dtype == torch.float32
    assert not torch.isnan(out).any()
    p = enc.params.detach().clone().requires_grad_(True)
    want = hash_encode_torch(x, p, enc.scales, enc.resolutions, enc.offsets)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    (want * g).sum().backward()
    if n:
        assert rel_err(enc.params.grad, p.grad) < 1e-5
    else:
        assert (enc.params.grad == 0).all()


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"L{c['n_levels']}F{c['n_features_per_level']}")
@pytest.mark.parametrize("n_points", [1, 33, 20_000])
def test_warp_backward_sums_runs_of_equal_corners(cfg, n_points, monkeypatch):
    """The warp backward (``NERF_LIGHTNING_HASH_ORDER=warp``) on what it is for: runs of points in one cell
    (each point repeated 1-9 times, some moved a hair within the cell, as consecutive samples of a ray),
    zero gradients inside and between the runs, a last block of fewer than 32 points. Its gradient is the
    reference's, to the float rounding of another summation order."""
    monkeypatch.setenv("NERF_LIGHTNING_HASH_ORDER", "warp")
    gen = torch.Generator().manual_seed(n_points)
    enc = HashEncoding(**cfg, backend="cuda").to(DEV)
    base = torch.rand(n_points, 3, generator=gen)
    x = base.repeat_interleave(torch.randint(1, 10, (n_points,), generator=gen), dim=0)
    nudged = torch.rand(x.shape[0], generator=gen) < 0.3
    x[nudged] = (x[nudged] + 1e-6).clamp(max=1.0)
    x = x.to(DEV)
    g = torch.randn(x.shape[0], enc.n_output_dims, generator=gen)
    g[torch.rand(x.shape[0], generator=gen) < 0.2] = 0.0  # whole points without a gradient
    g[torch.rand(g.shape, generator=gen) < 0.1] = 0.0  # single features
    g = g.to(DEV)
    (enc(x) * g).sum().backward()
    p = enc.params.detach().clone().requires_grad_(True)
    (hash_encode_torch(x, p, enc.scales, enc.resolutions, enc.offsets) * g).sum().backward()
    assert rel_err(enc.params.grad, p.grad) < 1e-5
    assert ((enc.params.grad != 0) == (p.grad != 0)).float().mean() > 0.999  # the same rows touched


@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=["L16", "L8"])
def test_hash_fp16_params(cfg):
    torch.manual_seed(1)
    enc = HashEncoding(**cfg, backend="cuda", param_dtype=torch.float16).to(DEV)
    with torch.no_grad():
        enc.params.uniform_(-1, 1)
    x = torch.rand(50_000, 3, device=DEV)
    poison()
    out = enc(x)
    assert out.dtype == torch.float32
    p32 = enc.params.detach().float().requires_grad_(True)
    want = hash_encode_torch(x, p32, enc.scales, enc.resolutions, enc.offsets)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    (want * g).sum().backward()
    assert enc.params.grad.dtype == torch.float16
    assert rel_err(enc.params.grad.float(), p32.grad) < 1e-3


def test_hash_bf16_table_runs_the_kernels_through_float32():
    """A bf16 table (what FSDP's half-precision parameter casting makes) gives the fp32 kernels' result
    on the same values and a bf16 gradient, not the reference's slow path."""
    cfg = CONFIGS[0]
    enc = HashEncoding(**cfg, backend="cuda").to(DEV)
    table = (torch.rand_like(enc.params) * 2 - 1).to(torch.bfloat16).requires_grad_(True)
    x = torch.rand(50_000, 3, device=DEV)
    out = cu.hash_encode(x, table, enc.scales, enc.resolutions, enc.offsets)
    p32 = table.detach().float().requires_grad_(True)
    want = cu.hash_encode(x, p32, enc.scales, enc.resolutions, enc.offsets)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    (want * g).sum().backward()
    assert table.grad.dtype == torch.bfloat16
    assert rel_err(table.grad.float(), p32.grad) < 1e-2


def test_hash_autocast_and_auto_backend():
    enc = HashEncoding(n_levels=8, log2_hashmap_size=14, base_resolution=4, max_resolution=256).to(DEV)
    x = torch.rand(4096, 3, device=DEV)
    assert enc.resolve_backend(x) in ("cuda", "tcnn")
    lin = torch.nn.Linear(16, 4).to(DEV)
    for dtype in (torch.float16, torch.bfloat16):
        enc.params.grad = None
        with torch.autocast("cuda", dtype=dtype):
            h = enc(x)
            assert h.dtype == torch.float32
            y = lin(h)
            assert y.dtype == dtype
        y.float().sum().backward()
        assert enc.params.grad is not None and enc.params.grad.abs().sum() > 0
    # positions requiring grad (learned camera poses) keep our kernels: they have the d/dx backward
    xg = x[:10].clone().requires_grad_(True)
    assert enc.resolve_backend(xg) == "cuda"


@pytest.mark.parametrize("degree", [1, 2, 3, 4])
def test_sh_equal(degree):
    d = torch.nn.functional.normalize(torch.randn(100_000, 3, device=DEV), dim=-1)
    poison()
    got = cu.sh_encode(d, degree)
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got, sh_encode_torch(d, degree), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(SHEncoding(degree)(d), got)
