"""Camera-path keyframes set in the viewer -> a nerfstudio ``camera_path.json`` for ``render``.

Keyframes are NGP-space cameras (OpenCV camera-to-world and a vertical field of view). The path
between them: positions on a centripetal Catmull-Rom spline through the keyframes (no overshoot,
no cusps), orientations by spherical linear interpolation, the field of view linearly; every segment
takes the same time. With ``loop`` the path returns to the first keyframe.

The file is what ``python -m nerf_lightning.render camera_path=FILE`` reads
(``video/camera_paths.py``): ``camera_type: perspective``, ``render_width``, ``render_height``,
``fps``, ``seconds`` and per frame ``camera_to_world`` (16 numbers, row-major, NeRF/OpenGL camera) in
the capture's own world frame, ``fov`` (vertical, degrees) and ``aspect``. The keyframes are kept in
``keyframes`` (same pose layout, not read by ``render``), so a path can be inspected or edited.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from viser import transforms as tf

from nerf_lightning.data.scene_space import SceneSpace
from nerf_lightning.errors import UserError
from nerf_lightning.utils.io import atomic_write_json
from nerf_lightning.viewer.browser_camera import wxyz_of

__all__ = ["Keyframe", "interpolate_path", "nerfstudio_camera_path", "write_camera_path"]


@dataclass(frozen=True)
class Keyframe:
    """One keyframe: NGP-space OpenCV camera-to-world [4, 4] and vertical field of view in degrees."""

    c2w: np.ndarray
    fov_deg: float


def _catmull_rom(points: np.ndarray, seg: int, u: float, loop: bool) -> np.ndarray:
    """Centripetal Catmull-Rom point at ``u`` in [0, 1] of the segment ``points[seg] -> points[seg + 1]``."""
    n = len(points)

    def pt(i: int) -> np.ndarray:
        if loop:
            return points[i % n]
        if i < 0:  # reflect the ends: the spline leaves and reaches them along the first/last chord
            return 2 * points[0] - points[1]
        if i >= n:
            return 2 * points[-1] - points[-2]
        return points[i]

    p0, p1, p2, p3 = pt(seg - 1), pt(seg), pt(seg + 1), pt(seg + 2)

    def knot(t: float, a: np.ndarray, b: np.ndarray) -> float:
        return t + max(float(np.linalg.norm(b - a)), 1e-9) ** 0.5

    t0 = 0.0
    t1 = knot(t0, p0, p1)
    t2 = knot(t1, p1, p2)
    t3 = knot(t2, p2, p3)
    t = t1 + u * (t2 - t1)
    a1 = (t1 - t) / (t1 - t0) * p0 + (t - t0) / (t1 - t0) * p1
    a2 = (t2 - t) / (t2 - t1) * p1 + (t - t1) / (t2 - t1) * p2
    a3 = (t3 - t) / (t3 - t2) * p2 + (t - t2) / (t3 - t2) * p3
    b1 = (t2 - t) / (t2 - t0) * a1 + (t - t0) / (t2 - t0) * a2
    b2 = (t3 - t) / (t3 - t1) * a2 + (t - t1) / (t3 - t1) * a3
    return (t2 - t) / (t2 - t1) * b1 + (t - t1) / (t2 - t1) * b2


def _slerp(r0: tf.SO3, r1: tf.SO3, u: float) -> tf.SO3:
    delta = r0.inverse() @ r1
    if delta.wxyz[0] < 0:  # the shorter way round
        delta = tf.SO3(-delta.wxyz)
    return r0 @ tf.SO3.exp(delta.log() * u)


def interpolate_path(keyframes: Sequence[Keyframe], n_frames: int, loop: bool = False) -> list[Keyframe]:
    """``n_frames`` cameras along the path through ``keyframes`` (the first is keyframe 0; without
    ``loop`` the last is the last keyframe, with ``loop`` one step before returning to keyframe 0)."""
    if not keyframes:
        raise UserError("camera path: no keyframes; add at least one (Add keyframe)")
    if n_frames < 1:
        raise UserError(f"camera path: {n_frames} frames; expected >= 1 (fps x seconds)")
    if len(keyframes) == 1:
        return [keyframes[0]] * n_frames
    pos = np.stack([np.asarray(k.c2w, np.float64)[:3, 3] for k in keyframes])
    rots = [tf.SO3(wxyz_of(k.c2w)) for k in keyframes]
    n_seg = len(keyframes) if loop else len(keyframes) - 1
    out = []
    for i in range(n_frames):
        if loop:
            s = i / n_frames * n_seg
        else:
            s = i / max(n_frames - 1, 1) * n_seg
        seg = min(int(math.floor(s)), n_seg - 1)
        u = s - seg
        j = (seg + 1) % len(keyframes)
        m = np.eye(4)
        m[:3, :3] = _slerp(rots[seg], rots[j], u).as_matrix()
        m[:3, 3] = _catmull_rom(pos, seg, u, loop)
        fov = (1 - u) * keyframes[seg].fov_deg + u * keyframes[j].fov_deg
        out.append(Keyframe(m, float(fov)))
    return out


def nerfstudio_camera_path(
    keyframes: Sequence[Keyframe],
    space: SceneSpace,
    width: int,
    height: int,
    fps: float,
    seconds: float,
    loop: bool = False,
) -> dict[str, Any]:
    """The camera_path.json document (see the module docstring) of the path through ``keyframes``."""
    if width < 1 or height < 1:
        raise UserError(f"camera path: render size {width}x{height}; expected positive sizes")
    if fps <= 0 or seconds <= 0:
        raise UserError(f"camera path: fps={fps}, seconds={seconds}; expected both > 0")
    frames = interpolate_path(keyframes, max(1, round(fps * seconds)), loop)

    def entry(k: Keyframe) -> dict[str, Any]:
        m = space.pose_to_capture(k.c2w)
        return {
            "camera_to_world": [float(v) for v in m.reshape(-1)],
            "fov": k.fov_deg,
            "aspect": width / height,
        }

    return {
        "camera_type": "perspective",
        "render_width": int(width),
        "render_height": int(height),
        "fps": float(fps),
        "seconds": float(seconds),
        "is_cycle": bool(loop),
        "keyframes": [entry(k) for k in keyframes],
        "camera_path": [entry(k) for k in frames],
    }


def write_camera_path(path: str | Path, doc: dict[str, Any]) -> Path:
    """Write ``doc`` atomically (a reader never sees half a file); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, doc)
    return path
