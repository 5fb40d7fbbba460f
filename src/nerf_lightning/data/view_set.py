"""The frames of one split held on one device, and the training rays drawn from them.

:class:`ViewSet` keeps a split's uint8 pixels, poses, intrinsics and sizes on the training device and
turns pixel positions into rays and targets (``data/ray_batch.py``'s :class:`RayBatch`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from nerf_lightning.data.cameras import UndistortionTable, intrinsics_tensor, pixel_rays, poses_tensor
from nerf_lightning.data.images import ImageSet
from nerf_lightning.data.ray_batch import RayBatch
from nerf_lightning.data.types import Frame
from nerf_lightning.ops import data_kernel

__all__ = ["ViewSet", "training_batch"]


class ViewSet:
    """The frames of one split on one device: uint8 pixels, poses, intrinsics, sizes."""

    def __init__(self, frames: list[Frame], images: ImageSet, camera_model: str) -> None:
        self.frames = frames
        self.camera_model = camera_model
        self.pixels = images.pixels  # [P, C] uint8
        self.offsets = images.offsets  # [V]
        self.widths = images.widths
        self.heights = images.heights
        self.poses = poses_tensor(frames)  # [V, 3, 4]
        self.intrinsics = intrinsics_tensor(frames)  # [V, 10]
        self.undistortion = UndistortionTable(self.intrinsics, self.widths, self.heights, camera_model)
        self._has_distortion = bool((self.intrinsics[:, 4:] != 0).any())
        #: bool [P], packed as ``pixels``: the pixels that score (held-out views with masks), else None
        self.keep: Tensor | None = None

    def to(self, device: torch.device, pixels: bool = True) -> ViewSet:
        """Everything onto ``device``; ``pixels=False``: the pixels stay where they are (the host)."""
        for name in ("pixels", "offsets", "widths", "heights", "poses", "intrinsics")[0 if pixels else 1 :]:
            setattr(self, name, getattr(self, name).to(device, non_blocking=True))
        if self.keep is not None:
            self.keep = self.keep.to(device)
        self.undistortion.to(device)
        return self

    @property
    def channels(self) -> int:
        return int(self.pixels.shape[1])

    def rays(self, view_ids: Tensor, px: Tensor, py: Tensor) -> tuple[Tensor, Tensor]:
        """Rays through continuous pixel positions (pixel centre at i + 0.5)."""
        if self.undistortion.enabled:
            return self.undistortion.rays(self.poses[view_ids], view_ids, px, py)
        return pixel_rays(self.poses[view_ids], self.intrinsics[view_ids], px, py, model=self.camera_model)

    def train_rays(
        self, view_ids: Tensor, ix: Tensor, iy: Tensor, ux: Tensor, uy: Tensor, background: Tensor,
        with_alpha: bool = False,
    ) -> RayBatch:  # fmt: skip
        """:meth:`batch` at the sub-pixel positions ``(ix + ux, iy + uy)``. On a GPU with the CUDA
        extension, pinhole and tabulated (distorted) cameras take one kernel (``ops.cuda.training_rays``)
        instead of about 25 small ones; :meth:`batch` is its contract and test oracle."""
        fused = self._fused_rays(view_ids, ix, iy, ux, uy, background)
        if fused is not None:
            alpha = self.alphas(view_ids, ix, iy) if with_alpha and self.channels == 4 else None
            return training_batch(*fused, background, view_ids, ix, iy, alpha)
        return self.batch(view_ids, ix, iy, ix.float() + ux, iy.float() + uy, background, with_alpha)

    def _fused_rays(
        self, view_ids: Tensor, ix: Tensor, iy: Tensor, ux: Tensor, uy: Tensor, background: Tensor
    ) -> tuple[Tensor, Tensor, Tensor] | None:
        shapes_ok = background.shape == ux.shape + (3,) and self.poses.dtype == torch.float32
        kernel = data_kernel("training_rays", self.pixels, view_ids) if shapes_ok else None
        if kernel is None:
            return None
        table = self.undistortion
        if not table.enabled:
            distorted = bool(self._has_distortion) and self.camera_model != "pinhole"
            if distorted or self.camera_model == "opencv_fisheye":
                return None  # Newton undistortion per ray: the torch path
        args = (self.poses, self.intrinsics, self.pixels, self.offsets, self.widths, view_ids, ix, iy)
        extra = (table.table, table.camera_of_view) if table.enabled else (None, None)
        return kernel(*args, ux.float(), uy.float(), background.float(), *extra)

    def batch(
        self,
        view_ids: Tensor,
        ix: Tensor,
        iy: Tensor,
        px: Tensor,
        py: Tensor,
        background: Tensor,
        with_alpha: bool = False,
        pixels: Tensor | None = None,
    ) -> RayBatch:
        """Rays through (px, py) of integer pixels (ix, iy), targets composited over ``background``;
        ``with_alpha``: also the pixels' ``alpha`` (images that carry it). ``pixels``: those pixels'
        uint8 [R, C] values when gathered elsewhere (``data/host_pixels.py``), else read here."""
        rays_o, rays_d = self.rays(view_ids, px, py)
        color = self.colors(view_ids, ix, iy) if pixels is None else pixels.float() / 255.0
        rgb, alpha = color[:, :3], None
        if color.shape[1] == 4:
            alpha = color[:, 3] if with_alpha else None
            rgb = rgb * color[:, 3:] + background * (1.0 - color[:, 3:])
        return training_batch(rays_o, rays_d, rgb, background, view_ids, ix, iy, alpha)

    def colors(self, view_ids: Tensor, ix: Tensor, iy: Tensor) -> Tensor:
        """RGB(A) in [0, 1], [R, C] f32, of integer pixels."""
        return self.pixels[self._flat(view_ids, ix, iy)].float() / 255.0

    def alphas(self, view_ids: Tensor, ix: Tensor, iy: Tensor) -> Tensor:
        """Alpha in [0, 1], [R] f32, of integer pixels of RGBA images (:meth:`colors`' last channel,
        gathered alone)."""
        return self.pixels[self._flat(view_ids, ix, iy), 3].float() / 255.0

    def _flat(self, view_ids: Tensor, ix: Tensor, iy: Tensor) -> Tensor:
        """Rows of :attr:`pixels` of integer pixels (ix, iy) of views ``view_ids``."""
        return self.offsets[view_ids] + iy * self.widths[view_ids] + ix


def training_batch(
    rays_o: Tensor,
    rays_d: Tensor,
    rgb: Tensor,
    background: Tensor,
    view_ids: Tensor,
    ix: Tensor,
    iy: Tensor,
    alpha: Tensor | None = None,
) -> RayBatch:
    """A :class:`~nerf_lightning.data.ray_batch.RayBatch` of these rays; ``alpha`` only for images that
    carry it."""
    return RayBatch(rays_o, rays_d, rgb, background, view_ids, px=ix, py=iy, alpha=alpha)
