"""The one-kernel training rays (``ops.cuda.training_rays`` through ``ViewSet.train_rays``) equal the
data layer's torch path (``ViewSet.batch``): pinhole RGBA (Blender), a distorted lens through the
undistortion table, and a pinhole RGB capture. GPU only: ``pytest -m cuda``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nerf_lightning.data.datamodule import NeRFDataModule
from nerf_lightning.data.synthetic import generate_scene
from tests.ray_batches import present_fields

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():  # pragma: no cover - CPU CI
    pytest.skip("needs an NVIDIA GPU", allow_module_level=True)

from nerf_lightning.ops import cuda_ops  # noqa: E402

DEV = torch.device("cuda")


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A distorted (OpenCV k1 k2 p1 p2) capture: its rays come from the undistortion table."""
    out = tmp_path_factory.mktemp("rays") / "scene"
    generate_scene(out, n_views=16, width=40, height=30, supersample=1, distortion=True)
    return out


@pytest.mark.parametrize("capture", ["scene", "pinhole_scene", "blender_capture"])
def test_fused_training_rays_equal_the_torch_path(
    capture: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    assert cuda_ops() is not None, "the CUDA extension did not load"
    path = request.getfixturevalue(capture)
    fmt = {"blender_capture": "blender"}.get(capture, "auto")
    dm = NeRFDataModule(path=str(path), format=fmt, batch_size=4096, cache_dir=str(tmp_path / "cache"))
    dm.setup("fit")
    dm.ensure_device(DEV)
    ts = dm.train_set
    g = torch.Generator(device=DEV).manual_seed(0)
    view_ids, ix, iy = dm.sampler.sample(4096, generator=g)
    ux, uy = torch.rand(4096, device=DEV, generator=g), torch.rand(4096, device=DEV, generator=g)
    bg = torch.rand(4096, 3, device=DEV, generator=g)
    fused = ts._fused_rays(view_ids, ix, iy, ux, uy, bg)
    assert fused is not None, "this camera model should take the fused kernel"
    want = present_fields(ts.batch(view_ids, ix, iy, ix.float() + ux, iy.float() + uy, bg, with_alpha=True))
    for got, key in zip(fused, ("rays_o", "rays_d", "rgb"), strict=True):
        torch.testing.assert_close(got, want[key], rtol=0, atol=2e-6)
    batch = present_fields(ts.train_rays(view_ids, ix, iy, ux, uy, bg, with_alpha=True))  # the same keys
    assert set(batch) == set(want)
    if "alpha" in want:  # RGBA images: the target opacity of model.net.loss.alpha_weight
        torch.testing.assert_close(batch["alpha"], want["alpha"], rtol=0, atol=0)
    assert ts.undistortion.enabled == (capture == "scene")
