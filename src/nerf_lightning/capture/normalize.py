"""COLMAP's world -> the capture's world, as instant-ngp's ``colmap2nerf.py`` orients, centres and scales it.

COLMAP's world frame is arbitrary (the first camera pair's, up to scale). ``colmap2nerf.py`` maps it
to one the NeRF tools expect, and this module does the same, step for step:

1. cameras to the NeRF/OpenGL convention (camera y and z axes flipped: x right, y up, looking down
   -z) and COLMAP's world axes (x, y, z) to (y, x, -z);
2. **up**: the world is rotated so that the mean of the cameras' up vectors becomes +z;
3. **centre**: the origin moves to the point the cameras look at: for every pair of cameras, the
   midpoint of the closest points of their optical axes (taken in front of both cameras), weighted by
   the squared sine of the angle between the axes (near-parallel pairs say little); when every
   pair is parallel, the mean camera position;
4. **scale**: the cameras' mean distance from the centre becomes :data:`CAMERA_DISTANCE` (4,
   ``colmap2nerf.py``'s "nerf sized"). The loader's default NGP scale (0.33) then puts the cameras
   1.32 NGP units from the centre of the unit cube, as in instant-ngp's own captures.

The same similarity maps COLMAP's sparse points, from which :func:`suggest_aabb_scale` sizes the
box the scene lives in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nerf_lightning.data.poses import NGP_DEFAULT_SCALE, rotation_between

__all__ = [
    "CAMERA_DISTANCE",
    "MAX_AABB_SCALE",
    "Normalization",
    "colmap2nerf_axes",
    "focus_point",
    "normalization",
    "suggest_aabb_scale",
]

#: mean camera distance from the scene centre after normalization (``colmap2nerf.py``)
CAMERA_DISTANCE = 4.0
#: instant-ngp's largest outer box
MAX_AABB_SCALE = 128
#: share of the sparse points that the suggested outer box holds (the rest: outliers, far background)
AABB_COVERAGE = 0.95

#: COLMAP world axes -> colmap2nerf's: rows [1, 0, 2] swapped (x <-> y), then z negated (a rotation)
_COLMAP_AXES = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, -1.0]])


def colmap2nerf_axes(cam_to_world: np.ndarray) -> np.ndarray:
    """Step 1: [..., 4, 4] COLMAP camera-to-world (OpenCV camera) -> NeRF/OpenGL camera, axes (y, x, -z)."""
    c2w = np.array(cam_to_world, dtype=np.float64, copy=True)
    c2w[..., :3, 1:3] *= -1
    c2w[..., :3, :] = np.einsum("ij,...jk->...ik", _COLMAP_AXES, c2w[..., :3, :])
    return c2w


def focus_point(c2w: np.ndarray, min_weight: float = 1e-5) -> np.ndarray:
    """Step 3: the point the cameras look at, ``colmap2nerf.py``'s weighted pairwise closest points.

    Args:
        c2w: [V, 4, 4] NeRF/OpenGL camera-to-world (the optical axis is camera -z).
        min_weight: pairs whose squared sine of the angle between their axes is below this are skipped.

    Returns:
        [3] the point; the mean camera position when no pair counts.
    """
    origins = c2w[:, :3, 3]
    back = c2w[:, :3, 2] / np.linalg.norm(c2w[:, :3, 2], axis=1, keepdims=True)  # +z: behind the camera
    i, j = np.triu_indices(len(c2w), k=1)
    oa, da, ob, db = origins[i], back[i], origins[j], back[j]
    c = np.cross(da, db)
    denom = (c * c).sum(axis=1)
    t = ob - oa
    # closest points oa + ta da and ob + tb db (Cramer's rule), clamped in front of each camera (t <= 0)
    ta = np.minimum(np.einsum("ij,ij->i", t, np.cross(db, c)) / (denom + 1e-10), 0.0)
    tb = np.minimum(np.einsum("ij,ij->i", t, np.cross(da, c)) / (denom + 1e-10), 0.0)
    mid = 0.5 * (oa + ta[:, None] * da + ob + tb[:, None] * db)
    keep = denom > min_weight
    if not keep.any():
        return origins.mean(axis=0)
    w = denom[keep]
    return (mid[keep] * w[:, None]).sum(axis=0) / w.sum()


@dataclass(frozen=True)
class Normalization:
    """The similarity COLMAP world -> capture world: ``p -> scale * (rotation @ p - center)``.

    Attributes:
        rotation: [3, 3] COLMAP axes to the capture's (step 1's axis change, then step 2's up).
        center: [3] the scene centre in the rotated frame.
        scale: the factor of step 4.
    """

    rotation: np.ndarray
    center: np.ndarray
    scale: float

    @property
    def matrix(self) -> np.ndarray:
        """[4, 4] the similarity as one matrix (points as column vectors)."""
        m = np.eye(4)
        m[:3, :3] = self.scale * self.rotation
        m[:3, 3] = -self.scale * self.center
        return m

    def points(self, points: np.ndarray) -> np.ndarray:
        """[P, 3] COLMAP points -> [P, 3] capture points."""
        return self.scale * (
            np.asarray(points, dtype=np.float64).reshape(-1, 3) @ self.rotation.T - self.center
        )

    def poses(self, cam_to_world: np.ndarray) -> np.ndarray:
        """[V, 4, 4] COLMAP camera-to-world (OpenCV camera) -> [V, 4, 4] capture NeRF/OpenGL poses."""
        c2w = np.array(cam_to_world, dtype=np.float64, copy=True)
        c2w[..., :3, 1:3] *= -1
        out = np.zeros_like(c2w)
        out[..., :3, :3] = np.einsum("ij,...jk->...ik", self.rotation, c2w[..., :3, :3])
        out[..., :3, 3] = self.points(c2w[..., :3, 3].reshape(-1, 3)).reshape(c2w[..., :3, 3].shape)
        out[..., 3, 3] = 1.0
        return out


def normalization(cam_to_world: np.ndarray) -> Normalization:
    """Steps 1-4 for cameras [V, 4, 4] (COLMAP camera-to-world, OpenCV camera, COLMAP world)."""
    c2w = colmap2nerf_axes(cam_to_world)
    up = c2w[:, :3, 1].mean(axis=0)
    up_rot = rotation_between(up / np.linalg.norm(up), np.array([0.0, 0.0, 1.0]))
    rotation = up_rot @ _COLMAP_AXES
    c2w[:, :3, :] = np.einsum("ij,vjk->vik", up_rot, c2w[:, :3, :])
    center = focus_point(c2w)
    distance = float(np.linalg.norm(c2w[:, :3, 3] - center, axis=1).mean())
    scale = CAMERA_DISTANCE / distance if distance > 1e-12 else 1.0
    return Normalization(rotation=rotation, center=center, scale=scale)


def suggest_aabb_scale(
    points: np.ndarray, ngp_scale: float = NGP_DEFAULT_SCALE, coverage: float = AABB_COVERAGE
) -> int:
    """The smallest power of two whose outer box holds ``coverage`` of the sparse points.

    The loader maps a capture point ``p`` to ``p * ngp_scale + 0.5`` (NGP space); the outer box of
    ``aabb_scale = a`` is ``[0.5 - a/2, 0.5 + a/2]^3``. So ``p`` is inside when
    ``2 * ngp_scale * max|p_i| <= a``. Returns 1..:data:`MAX_AABB_SCALE` (1 without points).

    Args:
        points: [P, 3] sparse points in the capture's world (after :class:`Normalization`).
        ngp_scale: the loader's scale (instant-ngp's default 0.33).
        coverage: the share of points the box must hold; the rest are taken as outliers.
    """
    pts = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    if len(pts) == 0:
        return 1
    need = float(np.quantile(2.0 * ngp_scale * np.abs(pts).max(axis=1), coverage))
    a = 1
    while a < need and a < MAX_AABB_SCALE:
        a *= 2
    return a
