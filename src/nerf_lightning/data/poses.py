"""Pose conventions: NeRF/Blender camera-to-world matrices to instant-ngp's space and back, and the
normalization of nerfstudio's arbitrary world frame."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "NGP_DEFAULT_OFFSET",
    "NGP_DEFAULT_SCALE",
    "nerf_to_ngp",
    "ngp_to_nerf",
    "normalize_nerfstudio_poses",
    "pose_defect",
    "rotation_between",
]

#: instant-ngp's defaults of a transforms.json's ``scale`` and ``offset``
NGP_DEFAULT_SCALE = 0.33
NGP_DEFAULT_OFFSET = (0.5, 0.5, 0.5)
#: a rotation whose determinant is smaller than this (in magnitude) maps every ray direction to (nearly)
#: nothing: the camera sees no scene
MIN_ROTATION_DETERMINANT = 1e-9


def pose_defect(c2w: np.ndarray) -> str | None:
    """Why the finite [4, 4] matrix ``c2w`` is not a camera-to-world pose, or None when it is one.

    The check of every pose read from a file (a capture's ``transform_matrix``, a camera path's
    ``camera_to_world``): the last row is [0, 0, 0, 1] and the rotation is invertible (a zero rotation
    makes a camera whose rays all point nowhere)."""
    if not np.allclose(c2w[3], [0.0, 0.0, 0.0, 1.0]):
        return f"its last row is {np.asarray(c2w[3]).tolist()}; expected [0, 0, 0, 1]"
    det = float(np.linalg.det(c2w[:3, :3]))
    if abs(det) < MIN_ROTATION_DETERMINANT:
        return f"its rotation is not invertible: determinant {det:.3g}; expected a rotation matrix"
    return None


def nerf_to_ngp(c2w: np.ndarray, scale: float, offset: Sequence[float] | np.ndarray) -> np.ndarray:
    """Convert a NeRF (OpenGL camera) camera-to-world matrix to NGP space, exactly as instant-ngp.

    Camera y and z axes are flipped (OpenGL -> OpenCV camera), the translation is scaled by
    ``scale`` and shifted by ``offset``, then the world rows are cycled (x, y, z) -> (y, z, x).

    Args:
        c2w: [4, 4] (or [..., 4, 4]) camera-to-world matrix in NeRF convention.
        scale: scene scale.
        offset: [3] offset added after scaling (before the row cycle, as in instant-ngp).

    Returns:
        [4, 4] (or [..., 4, 4]) float64 matrix in NGP space.
    """
    new = np.array(c2w, dtype=np.float64, copy=True)
    new[..., :, 1] *= -1
    new[..., :, 2] *= -1
    new[..., :3, 3] = new[..., :3, 3] * scale + np.asarray(offset, dtype=np.float64)
    return new[..., [1, 2, 0, 3], :]


def ngp_to_nerf(c2w: np.ndarray, scale: float, offset: Sequence[float] | np.ndarray) -> np.ndarray:
    """Inverse of :func:`nerf_to_ngp`: [4, 4] (or [..., 4, 4]) NGP matrix -> NeRF convention, float64."""
    new = np.array(c2w, dtype=np.float64, copy=True)[..., [2, 0, 1, 3], :]
    new[..., :3, 3] = (new[..., :3, 3] - np.asarray(offset, dtype=np.float64)) / scale
    new[..., :, 1] *= -1
    new[..., :, 2] *= -1
    return new


def rotation_between(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[3, 3] rotation taking unit vector ``a`` onto unit vector ``b`` (Rodrigues)."""
    v = np.cross(a, b)
    c = float(np.dot(a, b))
    s = float(np.linalg.norm(v))
    if s < 1e-12:
        if c > 0:
            return np.eye(3)
        # Opposite vectors: rotate by pi about any axis orthogonal to a.
        axis = np.cross(a, [1.0, 0.0, 0.0])
        if np.linalg.norm(axis) < 1e-6:
            axis = np.cross(a, [0.0, 1.0, 0.0])
        axis /= np.linalg.norm(axis)
        return 2.0 * np.outer(axis, axis) - np.eye(3)
    k = np.array([[0, -v[2], v[1]], [v[2], 0, -v[0]], [-v[1], v[0], 0]])
    return np.eye(3) + k + k @ k * ((1 - c) / s**2)


def normalize_nerfstudio_poses(c2w: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """Orient, centre and scale NeRF-convention poses from an arbitrary world frame.

    1. Rotate the world so that the mean camera up vector (camera +y, OpenGL) becomes +z, the up
       axis instant-ngp expects before its axis cycle.
    2. Centre on the least-squares point closest to all optical axes (camera -z). When the axes are
       nearly parallel (forward-facing captures: the 3x3 normal matrix is ill-conditioned) or that
       point lies far outside the camera cloud, use the mean camera position instead.
    3. Scale positions so that the largest absolute camera coordinate is 1.

    Args:
        c2w: [V, 4, 4] camera-to-world matrices (NeRF/OpenGL camera convention).

    Returns:
        ([V, 4, 4] float64 normalized matrices, info dict with ``rotation`` [3, 3], ``center`` [3]
        (in the rotated frame), ``scale`` and ``center_method``).
    """
    c2w = np.asarray(c2w, dtype=np.float64)
    up = c2w[:, :3, 1].mean(axis=0)
    norm = np.linalg.norm(up)
    rot = rotation_between(up / norm, np.array([0.0, 0.0, 1.0])) if norm > 1e-8 else np.eye(3)
    out = c2w.copy()
    out[:, :3, :3] = rot @ c2w[:, :3, :3]
    out[:, :3, 3] = c2w[:, :3, 3] @ rot.T

    pos = out[:, :3, 3]
    dirs = -out[:, :3, 2]
    dirs = dirs / np.linalg.norm(dirs, axis=1, keepdims=True)
    proj = np.eye(3)[None] - dirs[:, :, None] * dirs[:, None, :]  # [V, 3, 3] projector off each axis
    a = proj.sum(axis=0)
    b = (proj @ pos[:, :, None]).sum(axis=0)[:, 0]
    mean = pos.mean(axis=0)
    spread = max(float(np.abs(pos - mean).max()), 1e-8)
    method = "mean"
    center = mean
    eig = np.linalg.eigvalsh(a)
    if len(pos) >= 2 and eig[0] > 1e-2 * eig[-1]:
        focus = np.linalg.solve(a, b)
        if np.linalg.norm(focus - mean) < 3.0 * spread:
            center, method = focus, "optical_axes"
    out[:, :3, 3] -= center
    extent = float(np.abs(out[:, :3, 3]).max())
    factor = 1.0 / extent if extent > 1e-8 else 1.0
    out[:, :3, 3] *= factor
    return out, {"rotation": rot, "center": center, "scale": factor, "center_method": method}
