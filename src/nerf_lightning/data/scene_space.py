"""Between a capture's own world frame and NGP space (the space the model is trained in).

A capture's ``transforms.json`` stores NeRF/OpenGL camera-to-world matrices in its own world frame
("capture space"). The loaders map them to NGP space (see ``data/types.py``): for nerfstudio
captures first the similarity ``Capture.world_transform`` (orientation, centring, scale), then
``formats.nerf_to_ngp`` (camera y/z flip, ``* scale + offset``, world axes cycled x,y,z -> y,z,x).
:class:`SceneSpace` applies the same maps to other poses (a rendering camera path) and inverts
them for points (an exported mesh lands where the capture's cameras are).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nerf_lightning.data.poses import nerf_to_ngp, ngp_to_nerf
from nerf_lightning.data.types import Capture

__all__ = ["SceneSpace", "opengl_to_opencv"]


def opengl_to_opencv(c2w: np.ndarray) -> np.ndarray:
    """Flip the camera y and z axes of [..., 4, 4] poses: OpenGL (x right, y up, -z forward) <-> OpenCV
    (x right, y down, z forward)."""
    out = np.array(c2w, dtype=np.float64, copy=True)
    out[..., :3, 1:3] *= -1
    return out


@dataclass(frozen=True)
class SceneSpace:
    """The capture-space -> NGP-space map of one capture.

    Attributes:
        scale, offset: ``nerf_to_ngp`` parameters.
        world_transform: [4, 4] similarity applied first (identity for instant-ngp / Blender files).
    """

    scale: float
    offset: tuple[float, float, float]
    world_transform: np.ndarray

    @classmethod
    def of(cls, capture: Capture) -> SceneSpace:
        wt = np.eye(4) if capture.world_transform is None else np.asarray(capture.world_transform, np.float64)
        return cls(float(capture.scale), tuple(float(v) for v in capture.offset), wt)  # type: ignore[arg-type]

    @property
    def _similarity_scale(self) -> float:
        return float(np.linalg.norm(self.world_transform[:3, 0]))

    def pose_to_ngp(self, c2w: np.ndarray) -> np.ndarray:
        """Capture-space NeRF/OpenGL camera-to-world [..., 4, 4] -> NGP space (OpenCV camera), float64."""
        c2w = np.asarray(c2w, dtype=np.float64)
        m = self.world_transform
        out = c2w.copy()
        out[..., :3, :3] = (m[:3, :3] / self._similarity_scale) @ c2w[..., :3, :3]
        out[..., :3, 3] = c2w[..., :3, 3] @ m[:3, :3].T + m[:3, 3]
        return nerf_to_ngp(out, self.scale, self.offset)

    def pose_to_capture(self, c2w: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`pose_to_ngp`: NGP-space (OpenCV camera) [..., 4, 4] -> capture space (NeRF/OpenGL
        camera), float64 (a camera path made in NGP space, written for nerfstudio's tools)."""
        out = ngp_to_nerf(np.asarray(c2w, dtype=np.float64), self.scale, self.offset)
        m = self.world_transform
        inv = np.linalg.inv(m[:3, :3])
        res = out.copy()
        res[..., :3, :3] = (inv * self._similarity_scale) @ out[..., :3, :3]
        res[..., :3, 3] = (out[..., :3, 3] - m[:3, 3]) @ inv.T
        return res

    def points_to_capture(self, points: np.ndarray) -> np.ndarray:
        """NGP-space points [N, 3] -> capture space (the frame of the capture's transforms.json)."""
        p = np.asarray(points, dtype=np.float64)
        p = p[:, [2, 0, 1]]  # undo the axis cycle of nerf_to_ngp
        p = (p - np.asarray(self.offset)) / self.scale
        m = self.world_transform
        return (p - m[:3, 3]) @ np.linalg.inv(m[:3, :3]).T
