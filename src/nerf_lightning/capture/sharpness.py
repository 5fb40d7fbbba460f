"""Image sharpness as instant-ngp's ``colmap2nerf.py`` measures it: the variance of the Laplacian.

``colmap2nerf.py`` writes, per frame, ``sharpness = cv2.Laplacian(gray, cv2.CV_64F).var()`` of the
8-bit grey image (``cv2.cvtColor(image, COLOR_BGR2GRAY)``). This module computes the same number
without OpenCV, so a capture made here carries values on the scale of every instant-ngp capture
(the loader's ``data.min_sharpness`` drops frames below a threshold):

- grey: OpenCV's fixed-point BT.601 luma, ``(4899 R + 9617 G + 1868 B + 2^13) >> 14`` (uint8);
- Laplacian: OpenCV's ``ksize=1`` kernel ``[[0, 1, 0], [1, -4, 1], [0, 1, 0]]`` with its default
  border (``BORDER_REFLECT_101``: the edge pixel is not repeated);
- the population variance of the result over all pixels.

A blurred frame has a smaller value: motion blur removes the high frequencies the Laplacian sees.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["gray8", "laplacian_variance", "sharpness", "image_sharpness"]


def gray8(rgb: np.ndarray) -> np.ndarray:
    """[H, W, 3 or 4] uint8 RGB(A) -> [H, W] uint8 grey, bit-exact with OpenCV's RGB->GRAY (alpha ignored)."""
    if rgb.ndim == 2:
        return rgb.astype(np.uint8, copy=False)
    c = rgb[..., :3].astype(np.uint32)
    return ((c[..., 0] * 4899 + c[..., 1] * 9617 + c[..., 2] * 1868 + (1 << 13)) >> 14).astype(np.uint8)


def laplacian_variance(gray: np.ndarray) -> float:
    """Variance of the 4-neighbour Laplacian of a [H, W] image (OpenCV ``ksize=1``, reflect-101 border)."""
    g = np.pad(np.asarray(gray, dtype=np.float64), 1, mode="reflect")
    lap = g[:-2, 1:-1] + g[2:, 1:-1] + g[1:-1, :-2] + g[1:-1, 2:] - 4.0 * g[1:-1, 1:-1]
    return float(lap.var())


def sharpness(rgb: np.ndarray) -> float:
    """``colmap2nerf.py``'s sharpness of a [H, W, 3|4] (or [H, W]) uint8 image."""
    return laplacian_variance(gray8(rgb))


def image_sharpness(path: str | Path) -> float:
    """Sharpness of an image file (decoded as stored: no EXIF rotation, which leaves it unchanged)."""
    import imageio.v3 as iio

    img = np.asarray(iio.imread(path))
    if img.dtype != np.uint8:  # 16-bit PNGs: the 8-bit image OpenCV's imread would give
        img = (img.astype(np.float64) / np.iinfo(img.dtype).max * 255.0 + 0.5).astype(np.uint8)
    return sharpness(img)
