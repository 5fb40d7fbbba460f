"""NeRFDataModule: device batches built from a generated capture."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nerf_lightning.data.datamodule import NeRFDataModule
from nerf_lightning.data.synthetic import generate_scene


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dm") / "scene"
    generate_scene(out, n_views=16, width=24, height=20, supersample=1, distortion=True)
    return out


def test_train_batch_targets_and_rays(scene: Path, tmp_path: Path) -> None:
    dm = NeRFDataModule(path=str(scene), batch_size=512, cache_dir=str(tmp_path / "cache"))
    dm.setup("fit")
    assert len(dm.train_set.frames) == 14 and len(dm.val_set.frames) == 2  # every 8th held out
    assert dm.train_set.undistortion.enabled  # distorted capture: tabulated undistortion
    dm._ensure_device(torch.device("cpu"))
    torch.manual_seed(0)
    b = dm.train_batch(512)
    assert b["rays_o"].shape == (512, 3) and b["rgb"].shape == (512, 3)
    torch.testing.assert_close(b["rays_d"].norm(dim=-1), torch.ones(512))
    # targets are the RGBA pixels composited over the batch's random background
    rgba = dm.train_set.colors(b["view_ids"], b["px"], b["py"])
    expected = rgba[:, :3] * rgba[:, 3:] + b["background"] * (1 - rgba[:, 3:])
    torch.testing.assert_close(b["rgb"], expected)
    assert (rgba[:, 3] < 1).any() and (rgba[:, 3] > 0).any()  # both object and background pixels drawn
    # rays start at their camera centres
    torch.testing.assert_close(b["rays_o"], dm.train_set.poses[b["view_ids"], :, 3])


def test_val_batch_is_a_whole_image_over_white(scene: Path, tmp_path: Path) -> None:
    dm = NeRFDataModule(path=str(scene), cache_dir=str(tmp_path / "cache"))
    dm.setup("fit")
    dm._ensure_device(torch.device("cpu"))
    b = dm.val_batch(1)
    assert (b["height"], b["width"]) == (20, 24) and b["rgb"].shape == (480, 3)
    background_pixels = dm.val_set.colors(b["view_ids"], b["px"], b["py"])[:, 3] == 0
    assert background_pixels.any()
    torch.testing.assert_close(b["rgb"][background_pixels], torch.ones(int(background_pixels.sum()), 3))


def test_unknown_sampler_name_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="data.sampler='nope'"):
        NeRFDataModule(sampler="nope")
