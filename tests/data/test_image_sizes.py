"""What the DataModule checks of a capture's images before training: a downscale that leaves the metrics
too few pixels, and held-out frames that are training views too."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from nerf_lightning.data.datamodule import NeRFDataModule
from nerf_lightning.data.formats import CaptureError
from nerf_lightning.models.metrics import ViewMetrics


@pytest.mark.parametrize("downscale", [6, 256, 257, 512])
def test_a_downscale_too_large_for_the_metrics_names_the_key_and_the_largest_that_works(
    make_ngp, tmp_path: Path, downscale: int
) -> None:
    """40x30 images: SSIM needs 6 pixels per side, so 30 // 6 = 5 is the largest factor. 256 left 0x0
    images (an SSIM traceback after training), 257 "RaySampler: widths must be positive", 512 "max 257"."""
    root = make_ngp(n=6, size=(40, 30), header={"cx": 20.0, "cy": 15.0})
    dm = NeRFDataModule(path=str(root), downscale=downscale, cache_dir=str(tmp_path / "cache"))
    with pytest.raises(CaptureError) as err:
        dm.setup("fit")
    size = f"{40 // downscale}x{30 // downscale}"
    assert str(err.value) == (
        f"data.downscale={downscale}: 0001.png of {root} would be {size} pixels, and the metrics need at "
        "least 6 pixels per side (SSIM's 11x11 window); the largest data.downscale for this capture is 5 "
        "(its smallest image, 0001.png, is 40x30 pixels)"
    )
    assert not list((tmp_path / "cache").glob("*.npy"))  # refused before any image was decoded


def test_the_largest_downscale_named_trains_and_scores(make_ngp, tmp_path: Path) -> None:
    root = make_ngp(n=6, size=(40, 30), header={"cx": 20.0, "cy": 15.0})
    dm = NeRFDataModule(path=str(root), downscale=5, cache_dir=str(tmp_path / "cache"))
    dm.setup("fit")
    batch = dm.val_batch(0)
    assert (batch["width"], batch["height"]) == (8, 6)  # 40 // 5, 30 // 5
    truth = batch["rgb"].reshape(6, 8, 3)
    scores = ViewMetrics(lpips=False).score((truth + 0.1).clamp(0, 1), truth)
    assert 0.0 < float(scores["ssim"]) < 1.0 and float(scores["psnr"]) > 19.0


def test_a_held_out_frame_that_is_a_training_view_too_is_named_once(
    blender_capture: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    test_json = blender_capture / "transforms_test.json"
    doc = json.loads(test_json.read_text())
    train = json.loads((blender_capture / "transforms_train.json").read_text())
    doc["frames"].append(train["frames"][1])  # ./train/r_1 in the test split as well
    test_json.write_text(json.dumps(doc))
    dm = NeRFDataModule(path=str(blender_capture), cache_dir=str(tmp_path / "cache"))
    with caplog.at_level(logging.WARNING, logger="nerf_lightning.data.datamodule"):
        dm.setup("fit")
    lines = [r.getMessage() for r in caplog.records if "not held out" in r.getMessage()]
    assert lines == [
        f"{blender_capture}: 1 held-out frame(s) are training views too (train/r_1.png): their scores are "
        "not held out; list each image in one split only"
    ]
    assert len(dm.capture.test) == 4 and len(dm.capture.train) == 4  # still scored, with the warning
