"""Camera paths for videos: an orbit or a spiral around the scene, or a nerfstudio ``camera_path.json``.

Every path is a list of :class:`PathCamera` in NGP space (OpenCV camera: x right, y down, z forward;
``data/types.py``), with pinhole intrinsics in pixels.

- ``orbit``: the cameras circle the scene's focus point — the point closest to all training cameras'
  optical axes (their mean position's centre when the axes are near parallel) — at the training
  cameras' median distance and median height above it, around their mean up direction; frame 0 is
  next to the first training camera.
- ``spiral``: the orbit with the height swinging by ``±spiral_height`` of the radius (two periods)
  and the radius breathing by ±10 % (one period), so the video sees the scene from above and below.
- a file: nerfstudio's ``camera_path.json`` (``camera_type: perspective``, ``render_width``,
  ``render_height``, and per keyframe ``camera_to_world`` — 16 numbers, row-major, NeRF/OpenGL
  camera — plus ``fov``, the vertical field of view in degrees). Poses are read in the capture's own
  world frame (that of its ``transforms.json``) and mapped to NGP space like the capture's frames
  (``space="capture"``), or taken as NGP-space OpenGL poses (``space="ngp"``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from nerf_lightning.data.poses import pose_defect
from nerf_lightning.data.scene_space import SceneSpace, opengl_to_opencv
from nerf_lightning.errors import UserError

__all__ = ["PathCamera", "focus_point", "look_at", "orbit_path", "read_nerfstudio_path"]


@dataclass(frozen=True)
class PathCamera:
    """One video frame's camera: NGP-space OpenCV camera-to-world [4, 4] and pinhole intrinsics."""

    c2w: np.ndarray
    width: int
    height: int
    fx: float
    fy: float
    cx: float
    cy: float

    def intrinsics_row(self) -> Tensor:
        """[10] float32 in ``Intrinsics.as_array`` layout (no distortion)."""
        return torch.tensor([self.fx, self.fy, self.cx, self.cy, 0, 0, 0, 0, 0, 0], dtype=torch.float32)


def look_at(eye: np.ndarray, target: np.ndarray, up: np.ndarray) -> np.ndarray:
    """OpenCV camera-to-world [4, 4] at ``eye`` looking at ``target``, image-up along ``up``."""
    z = target - eye
    z = z / np.linalg.norm(z)
    x = np.cross(-up, z)
    if np.linalg.norm(x) < 1e-8:  # looking along up: any right vector
        x = np.cross(np.array([1.0, 0.0, 0.0]) if abs(z[0]) < 0.9 else np.array([0.0, 1.0, 0.0]), z)
    x = x / np.linalg.norm(x)
    y = np.cross(z, x)
    m = np.eye(4)
    m[:3, 0], m[:3, 1], m[:3, 2], m[:3, 3] = x, y, z, eye
    return m


def focus_point(c2w: np.ndarray) -> np.ndarray:
    """Least-squares point closest to the optical axes (OpenCV +z) of cameras [V, >=3, 4]."""
    pos = c2w[:, :3, 3]
    dirs = c2w[:, :3, 2] / np.linalg.norm(c2w[:, :3, 2], axis=1, keepdims=True)
    proj = np.eye(3)[None] - dirs[:, :, None] * dirs[:, None, :]
    a = proj.sum(axis=0)
    b = (proj @ pos[:, :, None]).sum(axis=0)[:, 0]
    eig = np.linalg.eigvalsh(a)
    if len(pos) >= 2 and eig[0] > 1e-2 * eig[-1]:
        return np.linalg.solve(a, b)
    # near-parallel axes (forward-facing capture): a point in front of the mean camera
    mean_dir = dirs.mean(axis=0)
    return (
        pos.mean(axis=0)
        + mean_dir / np.linalg.norm(mean_dir) * np.linalg.norm(pos - pos.mean(0), axis=1).mean()
    )


def orbit_path(
    train_c2w: np.ndarray,
    frames: int,
    width: int,
    height: int,
    fx: float,
    fy: float,
    kind: str = "orbit",
    spiral_height: float = 0.25,
) -> list[PathCamera]:
    """``frames`` cameras on an orbit (or spiral) around the training cameras' focus point (NGP space).

    Args:
        train_c2w: [V, 3|4, 4] NGP-space OpenCV camera-to-world of the training views.
        frames: number of cameras (one full turn, the last frame one step before the first).
        width, height, fx, fy: pinhole intrinsics of every frame (principal point at the centre).
        kind: ``orbit`` or ``spiral``.
        spiral_height: spiral's height swing as a fraction of the orbit radius.
    """
    if kind not in ("orbit", "spiral"):
        raise UserError(f"camera_path={kind!r}: expected orbit, spiral or a camera_path.json file")
    if frames < 1:
        raise UserError(f"frames={frames}: expected >= 1")
    c2w = np.asarray(train_c2w, dtype=np.float64)
    centre = focus_point(c2w)
    up = -c2w[:, :3, 1].mean(axis=0)  # OpenCV camera y points down
    up = up / np.linalg.norm(up)
    rel = c2w[:, :3, 3] - centre
    height_up = float(np.median(rel @ up))
    radius = float(np.median(np.linalg.norm(rel, axis=1)))
    horiz0 = rel[0] - (rel[0] @ up) * up
    if np.linalg.norm(horiz0) < 1e-8:
        horiz0 = np.cross(up, [1.0, 0.0, 0.0] if abs(up[0]) < 0.9 else [0.0, 1.0, 0.0])
    e1 = horiz0 / np.linalg.norm(horiz0)
    e2 = np.cross(up, e1)
    cams = []
    for k in range(frames):
        t = k / frames
        theta = 2 * math.pi * t
        r, h = radius, height_up
        if kind == "spiral":
            r = radius * (1.0 + 0.1 * math.sin(2 * math.pi * t))
            h = height_up + spiral_height * radius * math.sin(4 * math.pi * t)
        r_h = math.sqrt(max(r * r - h * h, 1e-12))
        eye = centre + up * h + r_h * (math.cos(theta) * e1 + math.sin(theta) * e2)
        cams.append(PathCamera(look_at(eye, centre, up), width, height, fx, fy, width / 2, height / 2))
    return cams


#: what a JSON document's top level is, by the Python type ``json`` reads it as
_JSON_TYPES = {dict: "object", list: "list", str: "string", int: "number", float: "number", bool: "boolean"}


def read_nerfstudio_path(path: str | Path, space: SceneSpace | None) -> tuple[list[PathCamera], float | None]:
    """Cameras of a nerfstudio ``camera_path.json`` in NGP space, and its ``fps`` (None if absent).

    Args:
        path: the JSON file.
        space: the capture's :class:`SceneSpace` for capture-space poses; None when the file's poses
            are already in NGP space (OpenGL camera).
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(
            f"camera_path={path}: no such file; expected orbit, spiral or a camera_path.json"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not valid JSON ({err}); expected nerfstudio's camera_path.json") from err
    if not isinstance(doc, dict):
        raise UserError(
            f"{path}: a JSON {_JSON_TYPES.get(type(doc), 'null')}; expected nerfstudio's "
            "camera_path.json, an object with `render_width`, `render_height` and a `camera_path` list"
        )
    kind = doc.get("camera_type", "perspective")
    if kind != "perspective":
        raise UserError(f"{path}: camera_type {kind!r} is not supported; expected 'perspective'")
    try:
        width, height = int(doc["render_width"]), int(doc["render_height"])
        keyframes = doc["camera_path"]
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(
            f"{path}: missing or invalid {err}; expected `render_width`, `render_height` and a "
            "`camera_path` list"
        ) from err
    if width < 1 or height < 1:
        raise UserError(f"{path}: render_width x render_height is {width}x{height}; expected >= 1 pixel each")
    if not isinstance(keyframes, list):
        raise UserError(
            f"{path}: `camera_path` is a JSON {_JSON_TYPES.get(type(keyframes), 'null')}; expected a list "
            "with one entry per frame"
        )
    if not keyframes:
        raise UserError(f"{path}: `camera_path` is empty; expected one entry per frame")
    cams = []
    for i, cam in enumerate(keyframes):
        try:
            m = np.asarray(cam["camera_to_world"], dtype=np.float64).reshape(4, 4)
            fov = float(cam["fov"])
        except (KeyError, TypeError, ValueError) as err:
            raise UserError(
                f"{path}: camera_path[{i}] needs `camera_to_world` (16 numbers) and `fov` (degrees): {err}"
            ) from err
        if not np.isfinite(m).all():
            raise UserError(f"{path}: camera_path[{i}]: `camera_to_world` contains NaN or inf")
        defect = pose_defect(m)
        if defect is not None:
            raise UserError(f"{path}: camera_path[{i}]: `camera_to_world` is not a camera pose ({defect})")
        if not 0 < fov < 180:
            raise UserError(f"{path}: camera_path[{i}]: `fov` is {fov:g}; expected degrees in (0, 180)")
        c2w = space.pose_to_ngp(m) if space is not None else opengl_to_opencv(m)
        f = 0.5 * height / math.tan(math.radians(fov) / 2)
        cams.append(PathCamera(c2w, width, height, f, f, width / 2, height / 2))
    fps = doc.get("fps")
    if fps is not None and (not isinstance(fps, int | float) or isinstance(fps, bool) or not 0 < fps < 1e4):
        raise UserError(f"{path}: `fps` is {fps!r}; expected a number > 0")
    return cams, (float(fps) if fps else None)


def camera_rays(cam: PathCamera, device: torch.device) -> tuple[Tensor, Tensor]:
    """Rays [H*W, 3] (origins, unit directions) through every pixel centre of ``cam``, row-major."""
    from nerf_lightning.data.cameras import pixel_rays

    iy, ix = torch.meshgrid(
        torch.arange(cam.height, device=device, dtype=torch.float32),
        torch.arange(cam.width, device=device, dtype=torch.float32),
        indexing="ij",
    )
    n = cam.width * cam.height
    c2w = torch.as_tensor(cam.c2w[:3, :4], dtype=torch.float32, device=device)[None].expand(n, 3, 4)
    k = cam.intrinsics_row().to(device)[None].expand(n, 10)
    return pixel_rays(c2w, k, ix.reshape(-1) + 0.5, iy.reshape(-1) + 0.5, model="pinhole")
