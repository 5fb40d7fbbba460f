"""Kernels of the data layer: training rays and their targets, and training pixels, one kernel each.

Their contracts and references live with their callers (``data/view_set.py``, ``data/sampler.py``),
which reach them through ``nerf_lightning.ops.data_kernel`` and run their torch path when it returns
None. Not ops of the registry (no reference in ``ops``); CUDA tensors only.
"""

from __future__ import annotations

from torch import Tensor

from . import _support
from ._support import require_kernel

__all__ = ["training_rays", "sample_pixels"]


def training_rays(
    poses: Tensor,
    intrinsics: Tensor,
    pixels: Tensor,
    offsets: Tensor,
    widths: Tensor,
    view_ids: Tensor,
    ix: Tensor,
    iy: Tensor,
    ux: Tensor,
    uy: Tensor,
    background: Tensor,
    table: Tensor | None = None,
    camera_of_view: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Training rays and their targets in one kernel: (rays_o, rays_d, rgb), float32 [R, 3] each.

    The ray goes through pixel position ``(ix + ux, iy + uy)`` of view ``view_ids``: pinhole
    (``(p - c) / f``) without ``table``, else bilinear in the undistorted-direction ``table``
    [U, H + 1, W + 1, 3] of camera ``camera_of_view[view]``; rotated by the pose, normalized. The
    target is ``pixels[offsets[v] + iy * widths[v] + ix] / 255``, RGBA composited over ``background``.
    The contract is the data layer's (``data/cameras.py::pixel_rays`` / ``UndistortionTable.rays`` and
    ``ViewSet.batch``), which is also the fallback and the test oracle; CUDA tensors only (else
    RuntimeError)."""
    require_kernel("training_rays", poses, pixels, view_ids, ix, iy)
    return tuple(
        _support.ext().training_rays(
            poses.contiguous(),
            intrinsics.contiguous(),
            pixels.contiguous(),
            offsets.contiguous(),
            widths.contiguous(),
            view_ids.contiguous(),
            ix.contiguous(),
            iy.contiguous(),
            ux.contiguous(),
            uy.contiguous(),
            background.contiguous(),
            table,
            camera_of_view,
        )  # fmt: skip
    )


def sample_pixels(
    u: Tensor, cdf: Tensor, widths: Tensor, heights: Tensor, res: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Training pixels (view_ids, px, py), int64 [n] each, from uniforms ``u`` float64 [3, n] and the
    (view, cell) ``cdf`` float64 [V * res^2], in one kernel. The contract and fallback is
    ``data/sampler.py::RaySampler._pixels_of``; CUDA tensors only (else RuntimeError)."""
    require_kernel("sample_pixels", u, cdf, widths, heights)
    view_ids, px, py = _support.ext().sample_pixels(
        u.contiguous(), cdf.contiguous(), widths.contiguous(), heights.contiguous(), int(res)
    )
    return view_ids, px, py
