"""Capture space <-> NGP space: the maps the loaders apply, reused for camera paths and exported geometry."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from nerf_lightning.data.datamodule import NeRFDataModule
from nerf_lightning.data.formats import CaptureError, load_capture
from nerf_lightning.data.scene_space import SceneSpace


def _file_poses(root: Path) -> dict[str, np.ndarray]:
    doc = json.loads((root / "transforms.json").read_text())
    return {Path(f["file_path"]).name: np.asarray(f["transform_matrix"], np.float64) for f in doc["frames"]}


@pytest.mark.parametrize("kind", ["ngp", "nerfstudio"])
def test_pose_to_ngp_reproduces_the_loader_and_points_invert(kind: str, make_ngp, make_nerfstudio) -> None:
    # nerfstudio: an arbitrary world frame (rotated, shifted, scaled) that the loader normalizes
    a = np.deg2rad(35.0)
    rot = np.array([[np.cos(a), 0, np.sin(a)], [0, 1, 0], [-np.sin(a), 0, np.cos(a)]])
    root = make_nerfstudio(rot=rot, shift=(4.0, -2.0, 1.5), s=2.5) if kind == "nerfstudio" else make_ngp()
    capture = load_capture(root, test_every=0)
    space = SceneSpace.of(capture)
    assert (capture.world_transform is not None) == (kind == "nerfstudio")
    poses = _file_poses(root)
    for frame in capture.train:
        ngp = space.pose_to_ngp(poses[frame.image_path.name])
        np.testing.assert_allclose(ngp, frame.c2w, atol=1e-9)
        # camera centres go back to where the file has them
        back = space.points_to_capture(ngp[None, :3, 3])[0]
        np.testing.assert_allclose(back, poses[frame.image_path.name][:3, 3], atol=1e-9)


def test_val_split_choices(blender_capture: Path) -> None:
    def views(split: str) -> int:
        dm = NeRFDataModule(path=str(blender_capture), format="blender", val_split=split)
        dm.setup("validate")
        return len(dm.val_set.frames)

    capture = load_capture(blender_capture, format="blender")
    assert views("val") == len(capture.val) and views("train") == len(capture.train)
    assert views("test") == views("auto") == len(capture.test) > 0
    with pytest.raises(ValueError, match=r"^data.val_split=dev: expected one of val, test, auto, train$"):
        NeRFDataModule(path=str(blender_capture), val_split="dev")


def test_val_split_test_without_a_test_split_is_a_user_error(make_ngp) -> None:
    dm = NeRFDataModule(path=str(make_ngp()), val_split="test")
    with pytest.raises(CaptureError, match="no test split"):
        dm.setup("validate")
    dm = NeRFDataModule(path=str(make_ngp()), val_split="auto")
    dm.setup("validate")
    assert dm.val_set is not None and len(dm.val_set.frames) > 0  # the held-out views
