"""Between the browser's camera (viser) and the renderer's cameras.

The viewer's 3D scene is NGP space itself (``data/types.py``): the training cameras, the scene box and
the occupancy grid's cells are drawn where the model sees them, and a browser camera is a renderer
camera without any conversion. viser reports a camera as ``wxyz`` (the rotation of
``P_world = R p_camera``) and ``position``, with the OpenCV camera convention (x right, y down,
z forward) that NGP space uses too, and ``fov``: the vertical field of view in radians.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from viser import transforms as tf

from nerf_lightning.video.camera_paths import PathCamera

__all__ = ["ViewCamera", "c2w_of", "fov_y_of", "frame_size", "wxyz_of"]


def c2w_of(wxyz: np.ndarray, position: np.ndarray) -> np.ndarray:
    """OpenCV camera-to-world float64 [4, 4] of a viser camera pose."""
    m = np.eye(4)
    m[:3, :3] = tf.SO3(np.asarray(wxyz, dtype=np.float64)).as_matrix()
    m[:3, 3] = np.asarray(position, dtype=np.float64)
    return m


def wxyz_of(c2w: np.ndarray) -> np.ndarray:
    """viser's ``wxyz`` [4] of an OpenCV camera-to-world [3|4, 4] (its rotation, re-orthonormalized)."""
    u, _, vt = np.linalg.svd(np.asarray(c2w, dtype=np.float64)[:3, :3])
    return tf.SO3.from_matrix(u @ vt).wxyz


def fov_y_of(height: int, fy: float) -> float:
    """Vertical field of view (radians) of a pinhole camera ``height`` pixels high with focal ``fy``."""
    return 2.0 * math.atan(0.5 * height / fy)


def frame_size(aspect: float, max_side: int) -> tuple[int, int]:
    """(width, height) of an image of ``aspect`` (width / height) whose longer side is ``max_side``."""
    if aspect >= 1.0:
        return max_side, max(1, round(max_side / aspect))
    return max(1, round(max_side * aspect)), max_side


@dataclass(frozen=True)
class ViewCamera:
    """A browser's camera: pose in NGP space, vertical field of view, the canvas's aspect ratio and its
    longer side in pixels."""

    c2w: np.ndarray
    fov_y: float
    aspect: float
    canvas_side: int = 0

    @classmethod
    def from_viser(
        cls, wxyz: np.ndarray, position: np.ndarray, fov: float, width: int, height: int
    ) -> ViewCamera:
        w, h = max(1, int(width)), max(1, int(height))
        return cls(c2w_of(wxyz, position), float(fov), w / h, max(w, h))

    def at(self, max_side: int) -> PathCamera:
        """This camera as a pinhole image whose longer side is ``max_side`` px (principal point centred)."""
        w, h = frame_size(self.aspect, max_side)
        f = 0.5 * h / math.tan(0.5 * self.fov_y)
        return PathCamera(self.c2w, w, h, f, f, w / 2, h / 2)

    def same_as(self, other: ViewCamera | None, tol: float = 1e-6) -> bool:
        return (
            other is not None
            and np.allclose(self.c2w, other.c2w, atol=tol)
            and abs(self.fov_y - other.fov_y) < tol
            and abs(self.aspect - other.aspect) < 1e-4
            and self.canvas_side == other.canvas_side
        )
