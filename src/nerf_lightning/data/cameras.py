"""Camera models: pixel -> ray generation (with lens undistortion) and the forward projection.

All functions are vectorized PyTorch, run on any device and never synchronize with the host
(fixed Newton iteration counts, no data-dependent Python branching).

Conventions (see ``types.py``): poses are camera-to-world in NGP space with an OpenCV camera
(x right, y down, z forward); pixel (i, j) has its centre at (i + 0.5, j + 0.5). Intrinsics are
passed as ``[..., 10]`` rows in :meth:`Intrinsics.as_array` layout ``fx fy cx cy k1 k2 k3 k4 p1 p2``.

Distortion models, acting on the normalized image point (x, y) = (X / Z, Y / Z):

* ``opencv``: r^2 = x^2 + y^2, radial = 1 + k1 r^2 + k2 r^4 + k3 r^6,
  x_d = x radial + 2 p1 x y + p2 (r^2 + 2 x^2), y_d = y radial + p1 (r^2 + 2 y^2) + 2 p2 x y.
* ``opencv_fisheye`` (equidistant): theta = atan2(r, Z), theta_d = theta (1 + k1 theta^2 + k2 theta^4
  + k3 theta^6 + k4 theta^8), (x_d, y_d) = theta_d / r (x, y).
* ``pinhole``: no distortion (distortion coefficients ignored).

Undistortion inverts these with Newton's method from the distorted point (as instant-ngp's
``iterative_camera_undistortion``, but with the analytic Jacobian).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from nerf_lightning.data.types import CAMERA_MODELS, Frame

__all__ = [
    "UndistortionTable",
    "distort",
    "intrinsics_tensor",
    "pixel_rays",
    "rotate",
    "poses_tensor",
    "project_points",
    "undistort",
]

#: Newton iterations; the distortion maps are close to identity so this converges to float32
#: precision for every realistic lens well before the limit (tested to < 1e-3 px on 1920 px images).
NEWTON_ITERATIONS = 10


def _check_model(model: str) -> str:
    m = model.lower()
    if m not in CAMERA_MODELS:
        raise ValueError(f"camera model {model!r} not supported; expected one of {CAMERA_MODELS}")
    return m


def _opencv_distort(x: Tensor, y: Tensor, k: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """OpenCV radial-tangential distortion and its Jacobian.

    Args:
        x, y: [B] normalized undistorted coordinates.
        k: [B, 10] intrinsics rows.

    Returns:
        x_d, y_d, and Jacobian entries dxd/dx, dxd/dy (== dyd/dx), dyd/dy, each [B].
    """
    k1, k2, k3, p1, p2 = k[:, 4], k[:, 5], k[:, 6], k[:, 8], k[:, 9]
    r2 = x * x + y * y
    radial = 1 + r2 * (k1 + r2 * (k2 + r2 * k3))
    dradial = k1 + r2 * (2 * k2 + 3 * k3 * r2)  # d radial / d(r^2)
    xy = x * y
    xd = x * radial + 2 * p1 * xy + p2 * (r2 + 2 * x * x)
    yd = y * radial + p1 * (r2 + 2 * y * y) + 2 * p2 * xy
    j_xx = radial + 2 * x * x * dradial + 2 * p1 * y + 6 * p2 * x
    j_xy = 2 * xy * dradial + 2 * p1 * x + 2 * p2 * y
    j_yy = radial + 2 * y * y * dradial + 6 * p1 * y + 2 * p2 * x
    return xd, yd, j_xx, j_xy, j_yy


def _fisheye_theta_d(theta: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """Equidistant fisheye: theta_d(theta) and d theta_d / d theta, [B] each."""
    k1, k2, k3, k4 = k[:, 4], k[:, 5], k[:, 6], k[:, 7]
    t2 = theta * theta
    poly = 1 + t2 * (k1 + t2 * (k2 + t2 * (k3 + t2 * k4)))
    dpoly = 1 + t2 * (3 * k1 + t2 * (5 * k2 + t2 * (7 * k3 + t2 * 9 * k4)))
    return theta * poly, dpoly


def undistort(
    xd: Tensor, yd: Tensor, intrinsics: Tensor, model: str = "opencv"
) -> tuple[Tensor, Tensor, Tensor]:
    """Camera-space directions of distorted normalized image points.

    Args:
        xd, yd: [B] distorted normalized coordinates ((px - cx) / fx, (py - cy) / fy).
        intrinsics: [B, 10] rows (only the distortion entries are used).
        model: "pinhole", "opencv" or "opencv_fisheye".

    Returns:
        (dx, dy, dz) [B] each: un-normalized camera-space direction (dz = 1 except for fisheye).
    """
    model = _check_model(model)
    if model == "pinhole":
        return xd, yd, torch.ones_like(xd)
    if model == "opencv":
        x, y = xd, yd
        for _ in range(NEWTON_ITERATIONS):
            fx_, fy_, a, b, d = _opencv_distort(x, y, intrinsics)
            ex, ey = fx_ - xd, fy_ - yd
            det = a * d - b * b
            det = torch.where(det.abs() > 1e-12, det, torch.full_like(det, 1e-12))
            x = x - (d * ex - b * ey) / det
            y = y - (a * ey - b * ex) / det
        return x, y, torch.ones_like(x)
    # Equidistant fisheye: solve theta_d(theta) = |(xd, yd)| for theta, then rebuild a unit ray with
    # sin/cos so fields of view beyond 180 degrees stay valid.
    rd = torch.sqrt(xd * xd + yd * yd)
    theta = rd.clone()
    for _ in range(NEWTON_ITERATIONS):
        f, df = _fisheye_theta_d(theta, intrinsics)
        theta = (theta - (f - rd) / df.clamp_min(1e-6)).clamp(0.0, torch.pi)
    safe_rd = torch.where(rd > 1e-12, rd, torch.ones_like(rd))
    # sin(theta) / rd -> 1 as rd -> 0 (theta ~ rd near the axis).
    s = torch.where(rd > 1e-12, torch.sin(theta) / safe_rd, torch.ones_like(rd))
    return xd * s, yd * s, torch.cos(theta)


def distort(
    x: Tensor, y: Tensor, z: Tensor, intrinsics: Tensor, model: str = "opencv"
) -> tuple[Tensor, Tensor]:
    """Distorted normalized image coordinates of camera-space points.

    Args:
        x, y, z: [N] camera-space coordinates (OpenCV camera, z forward).
        intrinsics: [N, 10] rows.
        model: "pinhole", "opencv" or "opencv_fisheye".

    Returns:
        (xd, yd) [N] each, such that pixel = (fx * xd + cx, fy * yd + cy).
    """
    model = _check_model(model)
    if model == "opencv_fisheye":
        r = torch.sqrt(x * x + y * y)
        theta = torch.atan2(r, z)
        theta_d, _ = _fisheye_theta_d(theta, intrinsics)
        safe_r = torch.where(r > 1e-12, r, torch.ones_like(r))
        # theta_d / r -> 1 / z on the optical axis.
        s = torch.where(r > 1e-12, theta_d / safe_r, 1.0 / z)
        return x * s, y * s
    xn, yn = x / z, y / z
    if model == "pinhole":
        return xn, yn
    xd, yd, *_ = _opencv_distort(xn, yn, intrinsics)
    return xd, yd


def rotate(rot: Tensor, v: Tensor) -> Tensor:
    """``rot @ v`` per row ([B, 3, 3] x [B, 3] -> [B, 3]) in full float32.

    Not a batched matmul: under ``torch.set_float32_matmul_precision("high")`` (what training sets
    for the MLPs) a CUDA matmul may run in TF32, whose 10-bit mantissa puts a ray's direction off by
    ~5e-4, half a pixel of an 800-pixel NeRF-synthetic view."""
    return (rot * v.unsqueeze(1)).sum(dim=-1)


def pixel_rays(
    c2w: Tensor,
    intrinsics: Tensor,
    px: Tensor,
    py: Tensor,
    model: str = "opencv",
) -> tuple[Tensor, Tensor]:
    """World-space rays through continuous pixel coordinates.

    Args:
        c2w: [B, 3, 4] or [B, 4, 4] camera-to-world matrices (NGP space, OpenCV camera).
        intrinsics: [B, 10] rows ``fx fy cx cy k1 k2 k3 k4 p1 p2``.
        px, py: [B] float pixel coordinates; the centre of pixel (i, j) is (i + 0.5, j + 0.5).
        model: "pinhole", "opencv" or "opencv_fisheye" (one model for the whole batch).

    Returns:
        origins [B, 3] and unit directions [B, 3], in the dtype of ``c2w``.
    """
    k = intrinsics.to(c2w.dtype)
    xd = (px.to(c2w.dtype) - k[:, 2]) / k[:, 0]
    yd = (py.to(c2w.dtype) - k[:, 3]) / k[:, 1]
    dx, dy, dz = undistort(xd, yd, k, model)
    d_cam = torch.stack([dx, dy, dz], dim=-1)  # [B, 3]
    dirs = rotate(c2w[:, :3, :3], d_cam)
    dirs = dirs / torch.linalg.vector_norm(dirs, dim=-1, keepdim=True).clamp_min(1e-12)
    origins = c2w[:, :3, 3]
    return origins, dirs


def project_points(
    points: Tensor,
    c2w: Tensor,
    intrinsics: Tensor,
    model: str = "opencv",
) -> tuple[Tensor, Tensor, Tensor]:
    """Forward camera model (the inverse of :func:`pixel_rays`).

    Args:
        points: [N, 3] world points (NGP space).
        c2w: [4, 4] / [3, 4] shared or [N, 4, 4] / [N, 3, 4] per-point camera-to-world matrices.
        intrinsics: [10] shared or [N, 10] per-point intrinsics rows.
        model: "pinhole", "opencv" or "opencv_fisheye".

    Returns:
        px [N], py [N] continuous pixel coordinates and depth [N] (camera-space z; points behind
        the camera have depth <= 0 and meaningless pixel coordinates).
    """
    n = points.shape[0]
    if c2w.dim() == 2:
        c2w = c2w.unsqueeze(0).expand(n, *c2w.shape)
    if intrinsics.dim() == 1:
        intrinsics = intrinsics.unsqueeze(0).expand(n, intrinsics.shape[0])
    k = intrinsics.to(points.dtype)
    rot = c2w[:, :3, :3].to(points.dtype)
    t = c2w[:, :3, 3].to(points.dtype)
    # Camera coordinates: R^T (p - t), R orthonormal.
    p_cam = rotate(rot.transpose(1, 2), points - t)
    x, y, z = p_cam.unbind(-1)
    xd, yd = distort(x, y, z, k, model)
    return k[:, 0] * xd + k[:, 2], k[:, 1] * yd + k[:, 3], z


def intrinsics_tensor(frames: Sequence[Frame]) -> Tensor:
    """[V, 10] float32 intrinsics rows (``Intrinsics.as_array`` layout) of ``frames``, on the CPU."""
    return torch.from_numpy(np.stack([f.intrinsics.as_array() for f in frames]).astype(np.float32))


def poses_tensor(frames: Sequence[Frame]) -> Tensor:
    """[V, 3, 4] float32 camera-to-world matrices (NGP space) of ``frames``, on the CPU."""
    return torch.from_numpy(np.stack([np.asarray(f.c2w)[:3, :4] for f in frames]).astype(np.float32))


class UndistortionTable:
    """Undistorted camera-space directions tabulated at pixel corners, for cheap training rays.

    Newton undistortion costs a few hundred tiny kernels per batch; on a GPU that launch overhead,
    not arithmetic, dominates the data step. Lens distortion is smooth, so a table of the exact
    solution at the (W + 1) x (H + 1) pixel corners of each distinct camera plus bilinear
    interpolation is accurate to well under 1e-3 px and costs a dozen kernels. Used when the views
    share few distinct cameras (``max_cameras``); otherwise ``enabled`` is False and callers fall
    back to :func:`pixel_rays`.

    Args:
        intrinsics: [V, 10] rows per view.
        widths, heights: [V] int64 image sizes.
        model: camera model of all views.
        max_cameras: build tables only for at most this many distinct cameras.
    """

    def __init__(
        self, intrinsics: Tensor, widths: Tensor, heights: Tensor, model: str, max_cameras: int = 8
    ) -> None:
        self.model = _check_model(model)
        keys = torch.cat([intrinsics.double(), widths[:, None].double(), heights[:, None].double()], dim=1)
        unique, self.camera_of_view = torch.unique(keys, dim=0, return_inverse=True)
        has_distortion = bool((intrinsics[:, 4:] != 0).any()) and self.model != "pinhole"
        self.enabled = has_distortion and unique.shape[0] <= max_cameras
        if not self.enabled:
            self.table = torch.zeros(0, 1, 1, 3)
            return
        w_max, h_max = int(unique[:, 10].max()), int(unique[:, 11].max())
        self.table = torch.zeros(unique.shape[0], h_max + 1, w_max + 1, 3)
        gy, gx = torch.meshgrid(
            torch.arange(h_max + 1, dtype=torch.float64),
            torch.arange(w_max + 1, dtype=torch.float64),
            indexing="ij",
        )
        for u, row in enumerate(unique):  # a handful of distinct cameras, once at setup
            k = row[:10][None].expand(gx.numel(), 10)
            xd = (gx.reshape(-1) - row[2]) / row[0]
            yd = (gy.reshape(-1) - row[3]) / row[1]
            dx, dy, dz = undistort(xd, yd, k, self.model)
            self.table[u] = torch.stack([dx, dy, dz], dim=-1).reshape(h_max + 1, w_max + 1, 3).float()

    def to(self, device: torch.device) -> UndistortionTable:
        self.table = self.table.to(device)
        self.camera_of_view = self.camera_of_view.to(device)
        return self

    def rays(self, c2w: Tensor, view_ids: Tensor, px: Tensor, py: Tensor) -> tuple[Tensor, Tensor]:
        """Like :func:`pixel_rays` for ``px``/``py`` inside their image ([0, W] x [0, H])."""
        cam = self.camera_of_view[view_ids]
        x0, y0 = px.floor(), py.floor()
        fx, fy = (px - x0)[:, None], (py - y0)[:, None]
        w1 = self.table.shape[2] - 1
        ix = x0.long().clamp(0, w1 - 1)
        iy = y0.long().clamp(0, self.table.shape[1] - 2)
        flat = self.table.view(-1, 3)
        base = (cam * self.table.shape[1] + iy) * (w1 + 1) + ix
        d00, d01 = flat[base], flat[base + 1]
        d10, d11 = flat[base + w1 + 1], flat[base + w1 + 2]
        d_cam = (d00 * (1 - fx) + d01 * fx) * (1 - fy) + (d10 * (1 - fx) + d11 * fx) * fy
        dirs = rotate(c2w[:, :3, :3], d_cam)
        dirs = dirs / torch.linalg.vector_norm(dirs, dim=-1, keepdim=True).clamp_min(1e-12)
        return c2w[:, :3, 3], dirs
