"""Camera rays on the GPU keep full float32 precision under TF32 matmuls (what training enables for
the MLPs). GPU only: ``pytest -m cuda``."""

from __future__ import annotations

import pytest
import torch

from nerf_lightning.data.cameras import pixel_rays, project_points

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():  # pragma: no cover - CPU CI
    pytest.skip("needs an NVIDIA GPU", allow_module_level=True)


def test_rays_and_projections_are_float32_exact_under_tf32_matmuls() -> None:
    gen = torch.Generator().manual_seed(0)
    n = 20_000
    q = torch.nn.functional.normalize(torch.randn(n, 4, generator=gen, dtype=torch.float64), dim=-1)
    w, x, y, z = q.unbind(-1)
    rot = torch.stack(
        [
            torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], -1),
            torch.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], -1),
            torch.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], -1),
        ],
        dim=1,
    )
    c2w = torch.cat([rot, torch.randn(n, 3, 1, generator=gen, dtype=torch.float64)], dim=2)
    k = torch.tensor([1111.0, 1111.0, 400.0, 400.0] + [0.0] * 6, dtype=torch.float64).expand(n, 10)
    px = torch.rand(n, generator=gen, dtype=torch.float64) * 800
    py = torch.rand(n, generator=gen, dtype=torch.float64) * 800
    _, d64 = pixel_rays(c2w, k, px, py, model="pinhole")
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        dev = torch.device("cuda")
        c2w32, k32 = c2w.float().to(dev), k.float().to(dev)
        _, d32 = pixel_rays(c2w32, k32, px.float().to(dev), py.float().to(dev), "pinhole")
        points = (c2w[:, :, 3] + 2.0 * d64).float().to(dev)
        u, v, depth = project_points(points, c2w32, k32, "pinhole")
    finally:
        torch.set_float32_matmul_precision(old)
    # float32 rounding is ~1e-7; a TF32 product (10-bit mantissa) is off by ~1e-4 (0.1 pixel here)
    assert float((d32.double().cpu() - d64).abs().max()) < 2e-6
    assert float((u.double().cpu() - px).abs().max()) < 5e-3  # pixels
    assert float((v.double().cpu() - py).abs().max()) < 5e-3 and bool((depth > 0).all())
