"""Camera model of the synthetic scenes: NeRF/OpenGL poses, pinhole + OpenCV radial-tangential lens.

All functions work in *world* (NeRF/Blender) coordinates, z up, with camera-to-world matrices in the
OpenGL camera convention (x right, y up, the camera looks down -z), exactly as written to
``transforms.json``. Pixel (i, j) (column, row) has its centre at (i + 0.5, j + 0.5).

Lens model (OpenCV, as instant-ngp reads ``k1 k2 p1 p2``): a camera-space point (X, Y, Z) in OpenCV
axes (x right, y down, z forward) has the normalized coordinates x = X/Z, y = Y/Z and lands at the
distorted point

    r2 = x^2 + y^2,  radial = 1 + k1 r2 + k2 r2^2
    xd = x radial + 2 p1 x y + p2 (r2 + 2 x^2)
    yd = y radial + p1 (r2 + 2 y^2) + 2 p2 x y

and pixel u = fx xd + cx, v = fy yd + cy. Rays are made by inverting this map with Newton's method.
Everything here is float64 numpy: the generator wants sub-1e-3-pixel consistency between rays and
projections, which float32 would not give at these image sizes.
"""

from __future__ import annotations

import numpy as np

__all__ = ["look_at", "distort", "undistort", "camera_rays", "project", "pixel_grid"]


def look_at(
    eye: np.ndarray, target: np.ndarray, up: tuple[float, float, float] = (0.0, 0.0, 1.0)
) -> np.ndarray:
    """Camera-to-world (float64 [4, 4], OpenGL camera axes) of a camera at ``eye`` looking at ``target``.

    The camera x axis is horizontal (no roll) for the given world ``up``.
    """
    eye = np.asarray(eye, dtype=np.float64)
    forward = np.asarray(target, dtype=np.float64) - eye
    forward /= np.linalg.norm(forward)
    right = np.cross(forward, np.asarray(up, dtype=np.float64))
    norm = np.linalg.norm(right)
    if norm < 1e-9:
        raise ValueError(f"look_at: view direction {forward} is parallel to up {up}; the roll is undefined")
    right /= norm
    cam_up = np.cross(right, forward)
    c2w = np.eye(4)
    c2w[:3, 0], c2w[:3, 1], c2w[:3, 2], c2w[:3, 3] = right, cam_up, -forward, eye
    return c2w


def distort(
    x: np.ndarray, y: np.ndarray, k1: float = 0.0, k2: float = 0.0, p1: float = 0.0, p2: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """Apply OpenCV radial-tangential distortion to normalized coordinates (float64 [...] each)."""
    r2 = x * x + y * y
    radial = 1.0 + r2 * (k1 + k2 * r2)
    xd = x * radial + 2.0 * p1 * x * y + p2 * (r2 + 2.0 * x * x)
    yd = y * radial + p1 * (r2 + 2.0 * y * y) + 2.0 * p2 * x * y
    return xd, yd


def undistort(
    xd: np.ndarray,
    yd: np.ndarray,
    k1: float = 0.0,
    k2: float = 0.0,
    p1: float = 0.0,
    p2: float = 0.0,
    iterations: int = 12,
) -> tuple[np.ndarray, np.ndarray]:
    """Invert :func:`distort` with Newton's method (float64 [...] each); exact when there is no distortion.

    Twelve Newton steps from the distorted point converge to machine precision for the moderate
    distortion this generator writes (k1 = -0.2 over a 50 degree field of view).
    """
    x, y = xd.astype(np.float64, copy=True), yd.astype(np.float64, copy=True)
    if k1 == 0.0 and k2 == 0.0 and p1 == 0.0 and p2 == 0.0:
        return x, y
    for _ in range(iterations):
        r2 = x * x + y * y
        radial = 1.0 + r2 * (k1 + k2 * r2)
        # d radial / dx = (k1 + 2 k2 r2) * 2x, likewise for y.
        dr = 2.0 * (k1 + 2.0 * k2 * r2)
        fx_ = x * radial + 2.0 * p1 * x * y + p2 * (r2 + 2.0 * x * x) - xd
        fy_ = y * radial + p1 * (r2 + 2.0 * y * y) + 2.0 * p2 * x * y - yd
        j00 = radial + x * x * dr + 2.0 * p1 * y + 6.0 * p2 * x
        j01 = x * y * dr + 2.0 * p1 * x + 2.0 * p2 * y
        j10 = j01  # the Jacobian of this model is symmetric
        j11 = radial + y * y * dr + 6.0 * p1 * y + 2.0 * p2 * x
        det = j00 * j11 - j01 * j10
        x = x - (j11 * fx_ - j01 * fy_) / det
        y = y - (-j10 * fx_ + j00 * fy_) / det
    return x, y


def pixel_grid(width: int, height: int) -> np.ndarray:
    """Pixel-centre coordinates (u, v) of an image, row-major: float64 [height * width, 2]."""
    v, u = np.meshgrid(np.arange(height) + 0.5, np.arange(width) + 0.5, indexing="ij")
    return np.stack([u.ravel(), v.ravel()], axis=-1)


def camera_rays(
    c2w: np.ndarray, fx: float, fy: float, cx: float, cy: float, w: int, h: int,
    k1: float = 0.0, k2: float = 0.0, p1: float = 0.0, p2: float = 0.0,
    pixels: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """World-space rays of a (possibly distorted) camera.

    Args:
        c2w: camera-to-world, float [4, 4] or [3, 4], OpenGL camera axes (NeRF convention).
        fx, fy, cx, cy: intrinsics in pixels; ``w``, ``h``: image size.
        k1, k2, p1, p2: OpenCV radial-tangential distortion of the *rendered* image.
        pixels: optional float [N, 2] image coordinates (u, v) to shoot rays through (pixel centres
            are at +0.5); default: all pixel centres, row-major ([h * w, 2] from :func:`pixel_grid`).

    Returns:
        origins float64 [N, 3] (all the camera centre) and unit directions float64 [N, 3].
    """
    c2w = np.asarray(c2w, dtype=np.float64)
    if c2w.shape not in ((4, 4), (3, 4)):
        raise ValueError(f"camera_rays: c2w must be [4, 4] or [3, 4], got {c2w.shape}")
    uv = pixel_grid(w, h) if pixels is None else np.asarray(pixels, dtype=np.float64).reshape(-1, 2)
    x, y = undistort((uv[:, 0] - cx) / fx, (uv[:, 1] - cy) / fy, k1, k2, p1, p2)
    # OpenCV camera (y down, z forward) -> OpenGL camera (y up, -z forward).
    d_cam = np.stack([x, -y, -np.ones_like(x)], axis=-1)
    dirs = d_cam @ c2w[:3, :3].T
    dirs /= np.linalg.norm(dirs, axis=-1, keepdims=True)
    origins = np.broadcast_to(c2w[:3, 3], dirs.shape).copy()
    return origins, dirs


def project(
    points: np.ndarray, c2w: np.ndarray, fx: float, fy: float, cx: float, cy: float,
    k1: float = 0.0, k2: float = 0.0, p1: float = 0.0, p2: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Project world points (float [N, 3]) into the (distorted) image: pixel coordinates (u [N], v [N]).

    The inverse of :func:`camera_rays`: a point on the ray through (u, v) projects to (u, v).
    Points at or behind the camera plane get NaN.
    """
    c2w = np.asarray(c2w, dtype=np.float64)
    p_cam = (np.asarray(points, dtype=np.float64).reshape(-1, 3) - c2w[:3, 3]) @ c2w[:3, :3]
    depth = -p_cam[:, 2]  # OpenGL camera looks down -z
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(depth > 1e-12, 1.0 / depth, np.nan)
    xd, yd = distort(p_cam[:, 0] * inv, -p_cam[:, 1] * inv, k1, k2, p1, p2)
    return fx * xd + cx, fy * yd + cy
