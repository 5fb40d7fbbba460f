"""Ten identical photos: refused for what they are (no baseline between views), not for their features.

Before, the real solver took ten copies of one photo and the app said "too few matching features
between them" with advice about overlap and texture, which does not apply: every feature matches, the
camera never moved.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from hydra.core.global_hydra import GlobalHydra
from PIL import Image

import nerf_lightning.apps.process as app
from nerf_lightning.capture.baseline import distinct_views
from nerf_lightning.errors import UserError
from nerf_lightning.run.config import compose_app_config


def _scene(rng: np.random.Generator, size: int = 160) -> np.ndarray:
    """A textured picture: blobs of colour (smooth enough for SIFT) on noise."""
    small = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(small).resize((size, size), Image.Resampling.BICUBIC))


def _jpeg(pixels: np.ndarray, path: Path, quality: int = 95) -> None:
    Image.fromarray(pixels).save(path, quality=quality)


def test_views_are_grouped_by_what_they_show(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    big = _scene(rng, 320)
    paths = []
    for i, (dx, noise) in enumerate([(0, 0), (0, 2), (0, 0), (24, 0), (48, 2)]):
        view = big[40:200, 40 + dx : 200 + dx].astype(np.int16)
        view = np.clip(view + rng.integers(-noise, noise + 1, view.shape), 0, 255).astype(np.uint8)
        paths.append(tmp_path / f"{i}.jpg")
        _jpeg(view, paths[-1], quality=90 if i == 2 else 95)  # a re-encoded copy is still the same view
    groups = distinct_views(paths)
    # the first three: one view (sensor noise of +-2 levels, another JPEG quality); 24 and 48 px to the
    # side: two more
    assert [[p.name for p in g] for g in groups] == [["0.jpg", "1.jpg", "2.jpg"], ["3.jpg"], ["4.jpg"]]


def test_ten_identical_photos_say_the_camera_never_moved(tmp_path: Path) -> None:
    pytest.importorskip("pycolmap", reason="pycolmap is not installed: pip install 'nerf_lightning[process]'")
    photos = tmp_path / "photos"
    photos.mkdir()
    _jpeg(_scene(np.random.default_rng(1)), photos / "000.jpg")
    for i in range(1, 10):
        shutil.copy(photos / "000.jpg", photos / f"{i:03d}.jpg")
    out = tmp_path / "capture"
    try:
        cfg = compose_app_config("process", [f"images={photos}", f"out={out}"], tmp_path / "run")
        with pytest.raises(UserError) as caught:
            app.process(cfg)
    finally:
        GlobalHydra.instance().clear()
    message = str(caught.value)
    assert message.startswith(
        f"images={photos}: the 10 photos show only 1 distinct view(s) (000.jpg = 10 images)"
    )
    assert "camera never moved, so there is no baseline between the views" in message
    assert "matching features" not in message and "overlap" not in message
    assert not out.exists() and not list(tmp_path.glob(".capture.*"))
