"""Plain data records shared by the capture loaders, the image cache and the DataModule.

Scene-space convention (instant-ngp): every camera-to-world matrix stored here is already in
NGP space. A NeRF/Blender pose (OpenGL camera: x right, y up, looking down -z) is converted with
``formats.nerf_to_ngp``: camera y and z axes flipped (OpenCV camera: x right, y down, z forward),
translation scaled by ``scale`` and shifted by ``offset``, then world axes cycled x,y,z -> y,z,x.
The object of interest then sits in the unit cube [0, 1]^3 and the outer box is
``[0.5 - aabb_scale/2, 0.5 + aabb_scale/2]^3``.

Pixel convention: pixel (i, j) (column, row) has its centre at (i + 0.5, j + 0.5); the camera-space
direction of an undistorted pixel is ((i + 0.5 - cx) / fx, (j + 0.5 - cy) / fy, 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

CAMERA_MODELS = ("pinhole", "opencv", "opencv_fisheye")


@dataclass(frozen=True)
class Intrinsics:
    """Pinhole intrinsics in pixels plus lens distortion, for an image of ``width`` x ``height``.

    ``opencv``: radial k1, k2, k3 and tangential p1, p2 (instant-ngp / OpenCV rational-free model).
    ``opencv_fisheye``: equidistant fisheye with k1..k4 (p1, p2 unused).
    """

    fx: float
    fy: float
    cx: float
    cy: float
    width: int
    height: int
    k1: float = 0.0
    k2: float = 0.0
    k3: float = 0.0
    k4: float = 0.0
    p1: float = 0.0
    p2: float = 0.0
    model: str = "pinhole"

    @property
    def has_distortion(self) -> bool:
        return any(v != 0.0 for v in (self.k1, self.k2, self.k3, self.k4, self.p1, self.p2))

    def downscaled(self, factor: int) -> Intrinsics:
        """Intrinsics of the image downscaled by an integer ``factor`` as ``images.downscale_image`` does.

        The loader crops the image to a multiple of ``factor`` at the right and bottom and averages
        ``factor x factor`` blocks, so pixel i of the small image covers pixels [factor i, factor (i+1))
        of the original: every pixel coordinate scales by exactly 1/factor (not by the ratio of the
        rounded-down sizes, which is off by up to a pixel at the far edge of the original).
        """
        if factor == 1:
            return self
        s = 1.0 / factor
        return replace(
            self,
            fx=self.fx * s,
            fy=self.fy * s,
            cx=self.cx * s,
            cy=self.cy * s,
            width=self.width // factor,
            height=self.height // factor,
        )

    def as_array(self) -> np.ndarray:
        """[fx, fy, cx, cy, k1, k2, k3, k4, p1, p2] as float32, the layout the ray generator takes."""
        return np.array(
            [self.fx, self.fy, self.cx, self.cy, self.k1, self.k2, self.k3, self.k4, self.p1, self.p2],
            dtype=np.float32,
        )


@dataclass(frozen=True)
class Frame:
    """One view: its image file, camera-to-world matrix in NGP space (float64 [4, 4]) and intrinsics;
    ``mask_path``: its mask of what moved, read in the convention ``mask_kind`` (``data/masks.py``:
    ``keep``, nonzero pixels train; ``dynamic``, nonzero pixels are left out)."""

    image_path: Path
    c2w: np.ndarray
    intrinsics: Intrinsics
    sharpness: float | None = None
    mask_path: Path | None = None
    mask_kind: str = "keep"


@dataclass
class Capture:
    """A parsed capture: frames split into train/val, the scene box and how it was read."""

    root: Path
    format: str
    train: list[Frame]
    val: list[Frame]
    aabb_scale: int = 1
    scale: float = 0.33
    offset: tuple[float, float, float] = (0.5, 0.5, 0.5)
    #: images carry alpha: composited over a random colour per training ray, evaluated over
    #: ``eval_background``.
    has_alpha: bool = False
    eval_background: tuple[float, float, float] = (1.0, 1.0, 1.0)
    test: list[Frame] = field(default_factory=list)
    #: [4, 4] similarity the loader applied to the file's world before ``nerf_to_ngp`` (nerfstudio
    #: captures: orientation, centring and scale); None = identity. See ``data/scene_space.py``.
    world_transform: np.ndarray | None = None

    @property
    def aabb(self) -> tuple[float, float, float, float, float, float]:
        """Outer box (xmin, ymin, zmin, xmax, ymax, zmax) in NGP space."""
        lo, hi = 0.5 - self.aabb_scale / 2, 0.5 + self.aabb_scale / 2
        return (lo, lo, lo, hi, hi, hi)
