"""The refined capture: training poses replaced in the capture's own frame, read back by the loader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from nerf_lightning.data.formats import load_capture
from nerf_lightning.data.refined import write_refined_capture
from nerf_lightning.data.scene_space import SceneSpace


def _turned(poses: np.ndarray) -> np.ndarray:
    """Each NGP pose turned by 2 degrees about z (about its centre) and moved by 0.01 per view index."""
    a = np.deg2rad(2.0)
    rz = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])
    out = poses.copy()
    out[:, :3, :3] = rz @ poses[:, :3, :3]
    out[:, :3, 3] += 0.01 * np.arange(len(poses))[:, None] * np.array([1.0, -0.5, 0.25])
    return out


@pytest.mark.parametrize("kind", ["ngp", "blender", "nerfstudio"])
def test_refined_capture_reads_back_with_the_refined_training_poses(
    kind: str, make_ngp, make_nerfstudio, blender_capture: Path, tmp_path: Path
) -> None:
    a = np.deg2rad(35.0)  # nerfstudio: an arbitrary world frame, which the loader normalizes
    rot = np.array([[np.cos(a), 0, np.sin(a)], [0, 1, 0], [-np.sin(a), 0, np.cos(a)]])
    makers = {
        "ngp": lambda: make_ngp(n=9),
        "nerfstudio": lambda: make_nerfstudio(rot=rot, shift=(4, -2, 1.5), s=2.5),
    }
    root = makers[kind]() if kind in makers else blender_capture
    original = load_capture(root, test_every=4)
    given = np.stack([f.c2w[:3] for f in original.train])
    refined = _turned(given)
    out = tmp_path / "run" / "refined"
    written = write_refined_capture(original, root, refined, out)
    assert written == out / ("transforms_train.json" if kind == "blender" else "transforms.json")
    assert not list(out.glob("*.png")) and not list(out.glob(".*.tmp"))  # no images, no temporaries

    again = load_capture(out, test_every=4)
    assert again.format == original.format
    assert [f.image_path for f in again.train] == [f.image_path.resolve() for f in original.train]
    assert [f.image_path for f in again.val] == [f.image_path.resolve() for f in original.val]
    for a, b in zip(again.val + again.test, original.val + original.test, strict=True):
        assert a.intrinsics == b.intrinsics
    # the file holds the refined poses in the capture's own frame and camera convention
    files = sorted(out.glob("transforms*.json"))
    doc = {Path(f["file_path"]).resolve(): f for p in files for f in json.loads(p.read_text())["frames"]}
    space = SceneSpace.of(original)
    for frame, pose in zip(original.train, refined, strict=True):
        matrix = np.asarray(doc[frame.image_path.resolve()]["transform_matrix"])
        np.testing.assert_allclose(space.pose_to_ngp(matrix)[:3], pose, atol=1e-9)
    if kind != "nerfstudio":  # nerfstudio files are normalized again from their own poses when read
        np.testing.assert_allclose(np.stack([f.c2w[:3] for f in again.train]), refined, atol=1e-9)
        for a, b in zip(again.val + again.test, original.val + original.test, strict=True):
            np.testing.assert_array_equal(a.c2w, b.c2w)  # held-out poses: untouched
    else:
        # held-out matrices are the file's, number for number
        frames = json.loads((root / "transforms.json").read_text())["frames"]
        source = {Path(f["file_path"]).name: f for f in frames}
        for frame in original.val:
            matrix = doc[frame.image_path.resolve()]["transform_matrix"]
            assert matrix == source[frame.image_path.name]["transform_matrix"]


def test_refined_poses_must_match_the_training_views(make_ngp, tmp_path: Path) -> None:
    capture = load_capture(make_ngp(n=5), test_every=0)
    with pytest.raises(ValueError, match=r"expected \[5, 3, 4\] refined poses"):
        write_refined_capture(capture, capture.root, np.zeros((4, 3, 4)), tmp_path)
