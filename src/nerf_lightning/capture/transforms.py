"""The capture's ``transforms.json``, in instant-ngp's format (what ``colmap2nerf.py`` writes).

One shared camera at the top level (a frame whose camera differs, from a COLMAP model of several
cameras, carries its own ``fl_x ... h`` keys, which the loader reads over the top-level ones), in
pixels::

    camera_angle_x, camera_angle_y     horizontal / vertical field of view (radians)
    fl_x, fl_y, cx, cy, w, h           pinhole intrinsics of the w x h images
    k1, k2, p1, p2                     OpenCV radial-tangential distortion (0 when the model has none)
    aabb_scale                         the outer box (a power of two; NGP space [0.5 -+ aabb_scale/2]^3)
    frames                             one per registered image, in image order:
        file_path                      "images/<name>", relative to the file
        sharpness                      variance of the Laplacian (``capture/sharpness.py``)
        transform_matrix               4x4 camera-to-world, NeRF/OpenGL camera (x right, y up, -z
                                       forward), in the oriented, centred and scaled world of
                                       ``capture/normalize.py``

No ``scale`` / ``offset``: the loader's (and instant-ngp's) defaults 0.33 and 0.5 apply, which the
normalization is made for. The loader (``data.format=ngp``) reads it as it reads instant-ngp's fox.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nerf_lightning.capture.sfm import Camera
from nerf_lightning.utils.io import atomic_write_bytes

__all__ = ["TransformFrame", "transforms_doc", "write_transforms"]


@dataclass(frozen=True)
class TransformFrame:
    """One frame: image path relative to ``transforms.json``, its sharpness, NeRF c2w float64 [4, 4];
    ``camera``: its own camera when it is not the top-level one; ``mask_path``: its mask (0 = ignore)."""

    file_path: str
    sharpness: float
    transform_matrix: np.ndarray
    camera: Camera | None = None
    mask_path: str | None = None


def transforms_doc(camera: Camera, frames: list[TransformFrame], aabb_scale: int) -> dict[str, Any]:
    """The ``transforms.json`` document (keys in ``colmap2nerf.py``'s order)."""
    intr = camera.intrinsics
    return {
        "camera_angle_x": 2.0 * math.atan(intr.width / (2.0 * intr.fx)),
        "camera_angle_y": 2.0 * math.atan(intr.height / (2.0 * intr.fy)),
        **camera.ngp_keys(),
        "aabb_scale": int(aabb_scale),
        "frames": [_frame_doc(f, camera) for f in frames],
    }


def _frame_doc(frame: TransformFrame, shared: Camera) -> dict[str, Any]:
    doc: dict[str, Any] = {"file_path": frame.file_path}
    if frame.mask_path is not None:
        doc["mask_path"] = frame.mask_path
    doc["sharpness"] = float(frame.sharpness)
    if frame.camera is not None and frame.camera != shared:
        doc.update(frame.camera.ngp_keys())
    doc["transform_matrix"] = np.asarray(frame.transform_matrix, dtype=np.float64).tolist()
    return doc


def write_transforms(path: str | Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` to ``path`` atomically (indented JSON, keys in the document's order)."""
    atomic_write_bytes(path, (json.dumps(doc, indent=2) + "\n").encode())
