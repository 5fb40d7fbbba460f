"""The damage tool (``data/synthetic/damage.py``): the stated amounts, on training views only."""

from __future__ import annotations

import json
import math
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest

from nerf_lightning.data.formats import load_capture
from nerf_lightning.data.synthetic import generate_scene
from nerf_lightning.data.synthetic.damage import damage_gains, damage_poses


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_scene(tmp_path_factory.mktemp("d") / "s", n_views=16, width=16, height=16).parent


def _rotation_angle_deg(a: np.ndarray, b: np.ndarray) -> float:
    return math.degrees(math.acos(max(-1.0, min(1.0, (np.trace(a @ b.T) - 1) / 2))))


def test_poses_of_training_views_move_by_the_stated_amounts_and_held_out_ones_stay(
    scene: Path, tmp_path: Path
) -> None:
    out = damage_poses(scene, tmp_path / "p", seed=3)
    clean, damaged = load_capture(scene), load_capture(out)
    truth = json.loads((out / "damage.json").read_text())["frames"]
    assert len(truth) == len(clean.train) == 14
    for a, b, t in zip(clean.train, damaged.train, truth, strict=True):
        angle = _rotation_angle_deg(a.c2w[:3, :3], b.c2w[:3, :3])
        assert 1.0 - 1e-6 <= angle <= 2.0 + 1e-6
        assert angle == pytest.approx(math.degrees(np.linalg.norm(t["rotation"])), abs=1e-6)
        ratio = np.linalg.norm(b.c2w[:3, 3] - a.c2w[:3, 3]) / np.linalg.norm(t["translation"])
        assert ratio == pytest.approx(clean.scale, rel=1e-5)  # NGP space scales the capture uniformly
    source = json.loads((scene / "transforms.json").read_text())["frames"]
    centres = {Path(f["file_path"]).stem: np.array(f["transform_matrix"])[:3, 3] for f in source}
    for t in truth:
        moved = np.linalg.norm(t["translation"]) / np.linalg.norm(centres[Path(t["file_path"]).stem])
        assert 0.01 - 1e-9 <= moved <= 0.02 + 1e-9
    for a, b in zip(clean.val, damaged.val, strict=True):
        np.testing.assert_array_equal(a.c2w, b.c2w)
    again = damage_poses(scene, tmp_path / "q", seed=3)
    assert (again / "damage.json").read_text() == (out / "damage.json").read_text()  # seeded


def test_training_images_get_known_gains_and_held_out_ones_none(scene: Path, tmp_path: Path) -> None:
    out = damage_gains(scene, tmp_path / "g", seed=1, headroom=0.7)
    record = json.loads((out / "damage.json").read_text())
    clean, damaged = load_capture(scene), load_capture(out)
    gains = {Path(f["file_path"]).name: np.array(f["gain"]) for f in record["frames"]}
    assert record["clipped_fraction"] < 0.01
    for frames, expect_gain in (
        (zip(clean.train, damaged.train, strict=True), True),
        (zip(clean.val, damaged.val, strict=True), False),
    ):
        for a, b in frames:
            x = iio.imread(a.image_path).astype(np.float64)[..., :3]
            y = iio.imread(b.image_path).astype(np.float64)[..., :3]
            g = gains[b.image_path.name] if expect_gain else np.ones(3)
            assert np.all((0.7 <= g) & (g <= 1.3))
            bright = x.mean(-1) > 60
            ratio = y[bright].sum(0) / x[bright].sum(0)
            np.testing.assert_allclose(ratio, 0.7 * g, rtol=0.02)
