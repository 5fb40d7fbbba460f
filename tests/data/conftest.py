"""Fixtures that write small captures (instant-ngp, Blender, nerfstudio layouts) into ``tmp_path``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

FOX_DIR = Path(__file__).resolve().parents[3] / "shared/data/fox"


def look_at_nerf(eye, target, up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """[4, 4] NeRF/OpenGL camera-to-world (camera looks down -z, y up) at ``eye`` facing ``target``."""
    eye, target, up = (np.asarray(v, dtype=np.float64) for v in (eye, target, up))
    fwd = target - eye
    fwd /= np.linalg.norm(fwd)
    right = np.cross(fwd, up)
    right /= np.linalg.norm(right)
    cam_up = np.cross(right, fwd)
    m = np.eye(4)
    m[:3, 0], m[:3, 1], m[:3, 2], m[:3, 3] = right, cam_up, -fwd, eye
    return m


def orbit_poses(n: int, radius: float = 3.0, target=(0.0, 0.0, 0.0), height: float = 1.0) -> list[np.ndarray]:
    """``n`` NeRF poses on a circle around ``target`` (z up), all looking at it."""
    t = np.asarray(target, dtype=np.float64)
    out = []
    for i in range(n):
        a = 2 * np.pi * i / n
        eye = t + np.array([radius * np.cos(a), radius * np.sin(a), height])
        out.append(look_at_nerf(eye, t))
    return out


def write_image(path: Path, width: int, height: int, seed: int, channels: int = 3) -> np.ndarray:
    """Write a random PNG/JPEG (by suffix) of the given size; returns the uint8 [H, W, C] array."""
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 256, size=(height, width, channels), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)
    return arr


def _frames(poses, names) -> list[dict[str, Any]]:
    return [{"file_path": n, "transform_matrix": p.tolist()} for p, n in zip(poses, names, strict=True)]


@pytest.fixture
def make_ngp(tmp_path: Path) -> Callable[..., Path]:
    """Factory writing an instant-ngp ``transforms.json`` capture; returns the capture directory.

    Keyword args: n (frames), size (w, h), missing (frame indices whose image is not written),
    header (dict merged into the top level), frame_extra (index -> dict merged into that frame),
    strip_ext (write file_path without extension), sharpness (list per frame), name (subdir).
    """

    def make(
        n: int = 7,
        size: tuple[int, int] = (16, 12),
        missing: tuple[int, ...] = (),
        header: dict[str, Any] | None = None,
        frame_extra: dict[int, dict[str, Any]] | None = None,
        strip_ext: bool = False,
        sharpness: list[float] | None = None,
        name: str = "ngp",
        image_sizes: dict[int, tuple[int, int]] | None = None,
    ) -> Path:
        root = tmp_path / name
        w, h = size
        top: dict[str, Any] = {
            "fl_x": 20.0,
            "fl_y": 21.0,
            "cx": 7.5,
            "cy": 6.25,
            "w": float(w),
            "h": float(h),
            "k1": 0.01,
            "k2": -0.002,
            "p1": 0.0005,
            "p2": -0.0003,
            "aabb_scale": 2,
        }
        top.update(header or {})
        names = [f"images/{i:04d}.png" for i in range(n)]
        frames = _frames(orbit_poses(n), [nm[:-4] if strip_ext else nm for nm in names])
        for i, f in enumerate(frames):
            if sharpness is not None:
                f["sharpness"] = sharpness[i]
            f.update((frame_extra or {}).get(i, {}))
            if i not in missing:
                iw, ih = (image_sizes or {}).get(i, (w, h))
                write_image(root / names[i], iw, ih, seed=i)
        top["frames"] = frames
        root.mkdir(parents=True, exist_ok=True)
        (root / "transforms.json").write_text(json.dumps(top, indent=2))
        return root

    return make


@pytest.fixture
def blender_capture(tmp_path: Path) -> Path:
    """A Blender-synthetic layout: train 4 / val 2 / test 3 RGBA 10x10 PNGs, extension-less paths."""
    root = tmp_path / "lego"
    for split, n in (("train", 4), ("val", 2), ("test", 3)):
        names = [f"./{split}/r_{i}" for i in range(n)]
        for i, nm in enumerate(names):
            write_image(root / f"{nm}.png", 10, 10, seed=i, channels=4)
        data = {"camera_angle_x": 0.6911112070083618, "frames": _frames(orbit_poses(n, radius=4.0), names)}
        (root / f"transforms_{split}.json").write_text(json.dumps(data))
    return root


@pytest.fixture
def make_nerfstudio(tmp_path: Path) -> Callable[..., Path]:
    """Factory writing a nerfstudio ``transforms.json``; the orbit is placed in an arbitrary world
    frame (rotation ``rot`` [3, 3], translation ``shift``, scale ``s``) as COLMAP would leave it."""

    def make(
        n: int = 9,
        camera_model: str = "OPENCV",
        rot: np.ndarray | None = None,
        shift=(0.0, 0.0, 0.0),
        s: float = 1.0,
        extra: dict[str, Any] | None = None,
    ) -> Path:
        root = tmp_path / "ns"
        sim = np.eye(4)
        sim[:3, :3] = np.eye(3) if rot is None else rot
        poses = []
        for p in orbit_poses(n, radius=3.0, height=1.0):
            q = sim @ p
            q[:3, 3] = q[:3, 3] * s + np.asarray(shift)
            poses.append(q)
        names = [f"images/frame_{i:05d}.png" for i in range(n)]
        for i, nm in enumerate(names):
            write_image(root / nm, 16, 12, seed=i)
        data: dict[str, Any] = {
            "camera_model": camera_model,
            "fl_x": 20.0,
            "fl_y": 20.0,
            "cx": 8.0,
            "cy": 6.0,
            "w": 16,
            "h": 12,
            "k1": 0.02,
            "k2": 0.001,
            "k3": 0.0005,
            "k4": -0.0001,
            "p1": 0.001,
            "p2": 0.002,
            "applied_transform": [[1, 0, 0, 0], [0, 0, 1, 0], [0, -1, 0, 0]],
            "frames": _frames(poses, names),
        }
        data.update(extra or {})
        (root / "transforms.json").write_text(json.dumps(data))
        return root

    return make


@pytest.fixture(scope="session")
def pinhole_scene(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated undistorted capture, 9 views of 24 x 20 (not square: a transposed index shows);
    training rays come from ``pixel_rays`` directly."""
    from nerf_lightning.data.synthetic import generate_scene

    out = tmp_path_factory.mktemp("pinhole") / "scene"
    generate_scene(out, n_views=9, width=24, height=20, supersample=1, distortion=False)
    return out


@pytest.fixture(scope="session")
def phone_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Generated photographs: the phone rig's opaque RGB images (fruit's camera model: fl_x != fl_y, an
    off-centre principal point, k1 k2 p1 p2, aabb_scale 32) in an instant-ngp transforms.json, 17 views
    of 24 x 20."""
    from nerf_lightning.data.synthetic import generate_scene

    out = tmp_path_factory.mktemp("phone") / "scene"
    generate_scene(out, n_views=17, width=24, height=20, supersample=1, rig="phone")
    return out


@pytest.fixture(scope="session")
def blender_photos(phone_capture: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The phone capture's photographs in Blender split files (transforms_train/test/val.json with
    fl_x/cx/k1..p2 and aabb_scale 32), as COLMAP-to-NeRF converters write real captures."""
    from nerf_lightning.data.split_files import write_split_files

    return write_split_files(phone_capture, tmp_path_factory.mktemp("blender_photos") / "split").root


@pytest.fixture(scope="session")
def opaque_rgba_capture(pinhole_scene: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pinhole scene's renders with every alpha set to 255: RGBA files that are opaque photographs."""
    root = tmp_path_factory.mktemp("opaque_rgba") / "scene"
    doc = json.loads((pinhole_scene / "transforms.json").read_text())
    for f in doc["frames"]:
        rgba = np.array(Image.open(pinhole_scene / f["file_path"]))
        assert rgba.shape[2] == 4
        rgba[..., 3] = 255
        (root / f["file_path"]).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rgba).save(root / f["file_path"])
    (root / "transforms.json").write_text(json.dumps(doc))
    return root
