"""Sharpness as colmap2nerf.py computes it: OpenCV's grey, ksize-1 Laplacian, reflect-101 border, variance."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from nerf_lightning.capture.sharpness import gray8, laplacian_variance, sharpness

FOX = Path(os.environ.get("NERF_LIGHTNING_FOX", Path(__file__).resolve().parents[3] / "shared/data/fox"))


def test_grey_is_opencvs_fixed_point_luma() -> None:
    # cv2.cvtColor(..., COLOR_RGB2GRAY) of pure red, green, blue, white and a mid grey
    rgb = np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 255], [128, 128, 128]]], np.uint8)
    assert gray8(rgb).tolist() == [[76, 150, 29, 255, 128]]
    rgba = np.concatenate([rgb, np.zeros((1, 5, 1), np.uint8)], axis=-1)
    assert gray8(rgba).tolist() == [[76, 150, 29, 255, 128]]  # alpha ignored


def test_laplacian_variance_by_hand() -> None:
    # one bright pixel in the middle of a 3x3 image: the Laplacian is -4 there. Reflect-101 mirrors
    # the border without repeating it, so an edge-centre pixel's outer neighbour is the bright one
    # again (+2); the corners see only dark pixels (0)
    img = np.zeros((3, 3))
    img[1, 1] = 1.0
    lap = np.array([[0, 2, 0], [2, -4, 2], [0, 2, 0]], dtype=np.float64)
    mean = 4.0 / 9.0
    assert laplacian_variance(img) == pytest.approx(((lap - mean) ** 2).mean())
    # replicating the border instead (cv2.BORDER_REPLICATE) would give 1 at the edge centres
    assert laplacian_variance(img) != pytest.approx(np.array([[0, 1, 0], [1, -4, 1], [0, 1, 0]]).var())
    assert laplacian_variance(np.full((5, 7), 9.0)) == 0.0


def test_blur_lowers_it() -> None:
    rng = np.random.default_rng(0)
    img = (rng.uniform(0, 255, (64, 64, 3))).astype(np.uint8)
    blurred = ((img[:-1, :-1].astype(np.uint16) + img[1:, 1:] + img[:-1, 1:] + img[1:, :-1]) // 4).astype(
        np.uint8
    )
    assert sharpness(blurred) < 0.5 * sharpness(img)


@pytest.mark.skipif(not (FOX / "transforms.json").is_file(), reason="the fox capture is absent")
def test_fox_sharpness_is_what_colmap2nerf_wrote() -> None:
    from nerf_lightning.capture.sharpness import image_sharpness

    doc = json.loads((FOX / "transforms.json").read_text())
    frames = [f for f in doc["frames"] if (FOX / f["file_path"]).is_file()][:4]
    for f in frames:  # computed by OpenCV (libjpeg-turbo) when fox was made; JPEG decoders may differ by 1e-6
        assert image_sharpness(FOX / f["file_path"]) == pytest.approx(f["sharpness"], rel=1e-5), f[
            "file_path"
        ]
