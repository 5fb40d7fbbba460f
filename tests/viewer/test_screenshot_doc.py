"""The README's viewer picture shows a scene, not a frame a few dozen pixels wide stretched into a blob."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
SHOT = REPO / "docs" / "images" / "viewer.png"


def test_the_viewer_screenshot_is_a_full_size_frame_of_a_real_scene() -> None:
    assert "(docs/images/viewer.png)" in (REPO / "README.md").read_text()
    caption = (REPO / "docs" / "viewer.md").read_text()
    frame = re.search(r"The\s+(\d+)×(\d+)-pixel frame", caption)
    assert frame and max(int(frame.group(1)), int(frame.group(2))) >= 256, "caption names no frame size"
    image = np.asarray(Image.open(SHOT).convert("RGB")).astype(np.int64)
    height, width, _ = image.shape
    assert width >= 1024 and height >= 640, image.shape
    # the canvas left of the GUI panel: a render of the default scene's textured objects holds hundreds
    # of distinct colours (4 bits a channel, each on >= 50 pixels); a 64x48 frame stretched over the
    # canvas, as the picture before, about a hundred
    canvas = image[:, : int(width * 0.7)] // 16
    codes = (canvas[..., 0] * 256 + canvas[..., 1] * 16 + canvas[..., 2]).reshape(-1)
    colours = int((np.bincount(codes, minlength=4096) >= 50).sum())
    assert colours >= 200, colours
