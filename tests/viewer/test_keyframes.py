"""Camera-path keyframes -> nerfstudio camera_path.json, and back through the render app's reader."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("viser")


from nerf_lightning.data.scene_space import SceneSpace
from nerf_lightning.errors import UserError
from nerf_lightning.video.camera_paths import look_at, read_nerfstudio_path
from nerf_lightning.viewer.browser_camera import ViewCamera, c2w_of, frame_size, wxyz_of
from nerf_lightning.viewer.keyframes import (
    Keyframe,
    interpolate_path,
    nerfstudio_camera_path,
    write_camera_path,
)


def _ring(n: int) -> list[Keyframe]:
    centre, up = np.array([0.5, 0.5, 0.5]), np.array([0.0, 0.0, 1.0])
    keys = []
    for a in np.linspace(0, 2 * np.pi, n, endpoint=False):
        eye = centre + np.array([1.5 * np.cos(a), 1.5 * np.sin(a), 0.4])
        keys.append(Keyframe(look_at(eye, centre, up), 40.0 + 10 * len(keys)))
    return keys


def _nerfstudio_space() -> SceneSpace:
    """A capture-space map with a rotating, scaling, translating world transform (nerfstudio captures)."""
    c, s = math.cos(0.3), math.sin(0.3)
    wt = np.eye(4)
    wt[:3, :3] = 0.7 * np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])
    wt[:3, 3] = [0.2, -0.1, 0.3]
    return SceneSpace(scale=0.4, offset=(0.5, 0.45, 0.55), world_transform=wt)


def test_pose_to_capture_inverts_pose_to_ngp() -> None:
    space = _nerfstudio_space()
    capture_pose = np.eye(4)
    capture_pose[:3, :3] = c2w_of(
        np.array([0.9, 0.1, -0.3, 0.2]) / np.linalg.norm([0.9, 0.1, -0.3, 0.2]), [0, 0, 0]
    )[:3, :3]
    capture_pose[:3, 3] = [1.0, -2.0, 0.5]
    ngp = space.pose_to_ngp(capture_pose)
    np.testing.assert_allclose(space.pose_to_capture(ngp), capture_pose, atol=1e-12)
    np.testing.assert_allclose(space.pose_to_ngp(space.pose_to_capture(ngp)), ngp, atol=1e-12)


def test_path_passes_through_its_keyframes_smoothly() -> None:
    keys = _ring(4)
    # 3 segments, 31 frames: frames 0, 10, 20, 30 are the keyframes
    path = interpolate_path(keys, 31)
    for i, key in zip((0, 10, 20, 30), keys, strict=True):
        np.testing.assert_allclose(path[i].c2w, key.c2w, atol=1e-9)
        assert path[i].fov_deg == pytest.approx(key.fov_deg)
    assert path[5].fov_deg == pytest.approx(45.0)  # halfway between 40 and 50
    for cam in path:  # every camera is a rotation
        r = cam.c2w[:3, :3]
        np.testing.assert_allclose(r @ r.T, np.eye(3), atol=1e-9)
        assert np.linalg.det(r) == pytest.approx(1.0)
    # no jumps: consecutive positions are about as far apart as the chord / 10
    steps = np.linalg.norm(np.diff([c.c2w[:3, 3] for c in path], axis=0), axis=1)
    chord = np.linalg.norm(keys[1].c2w[:3, 3] - keys[0].c2w[:3, 3])
    assert steps.max() < 0.2 * chord and steps.min() > 0.05 * chord
    # the slerp midpoint of keyframes 0 and 1 looks halfway between their viewing directions
    z0, z1, zm = keys[0].c2w[:3, 2], keys[1].c2w[:3, 2], path[5].c2w[:3, 2]
    assert np.dot(zm, z0) == pytest.approx(np.dot(zm, z1), abs=1e-6)


def test_loop_returns_to_the_first_keyframe() -> None:
    keys = _ring(3)
    path = interpolate_path(keys, 30, loop=True)
    np.testing.assert_allclose(path[0].c2w, keys[0].c2w, atol=1e-9)
    np.testing.assert_allclose(path[20].c2w, keys[2].c2w, atol=1e-9)
    last_step = np.linalg.norm(path[-1].c2w[:3, 3] - path[0].c2w[:3, 3])
    one_step = np.linalg.norm(path[1].c2w[:3, 3] - path[0].c2w[:3, 3])
    assert last_step == pytest.approx(one_step, rel=0.3)
    with pytest.raises(UserError, match="no keyframes"):
        interpolate_path([], 10)


def test_the_render_app_reads_the_exported_path_as_the_viewer_cameras(tmp_path: Path) -> None:
    """camera_path.json in capture space -> render's reader -> the same NGP cameras as the viewer's path."""
    space = _nerfstudio_space()
    keys = _ring(3)
    doc = nerfstudio_camera_path(keys, space, width=64, height=48, fps=10, seconds=2)
    path = write_camera_path(tmp_path / "paths" / "camera_path.json", doc)
    assert json.loads(path.read_text())["camera_type"] == "perspective"
    cams, fps = read_nerfstudio_path(path, space)
    expected = interpolate_path(keys, 20)
    assert fps == 10 and len(cams) == 20 and len(doc["keyframes"]) == 3
    for cam, key in zip(cams, expected, strict=True):
        np.testing.assert_allclose(cam.c2w, key.c2w, atol=1e-9)
        assert (cam.width, cam.height) == (64, 48)
        assert cam.fy == pytest.approx(24 / math.tan(math.radians(key.fov_deg) / 2))
    with pytest.raises(UserError, match="fps=0"):
        nerfstudio_camera_path(keys, space, 64, 48, fps=0, seconds=1)


def test_browser_camera_to_pinhole() -> None:
    c2w = look_at(np.array([2.0, 0.5, 0.5]), np.array([0.5, 0.5, 0.5]), np.array([0.0, 0.0, 1.0]))
    np.testing.assert_allclose(c2w_of(wxyz_of(c2w), c2w[:3, 3]), c2w, atol=1e-12)
    cam = ViewCamera.from_viser(wxyz_of(c2w), c2w[:3, 3], math.radians(60), 1280, 720).at(320)
    assert (cam.width, cam.height) == (320, 180)
    assert cam.fy == pytest.approx(90 / math.tan(math.radians(30)))
    assert frame_size(0.5, 100) == (50, 100)
