"""The training views' pixels one rank holds, and where they live (``data.shard``, ``data.storage``).

:class:`TrainingPixels` decodes the pixels of this rank's training views (all of them, or its shard
of the ``world`` ranks': ``data/shards.py``), puts them on the device or in pinned host memory
(``data/host_pixels.py``) and draws the step's training rays from them. Everything global stays with
the DataModule: the capture, the ray sampler (all views) and the training cameras. Loading again for
another (rank, world), as a resumed run with another world size does, re-shards.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nerf_lightning.data.formats import CaptureError
from nerf_lightning.data.host_pixels import HostPixels, place_views
from nerf_lightning.data.images import load_images
from nerf_lightning.data.masks import KeptPixels, load_masks
from nerf_lightning.data.ray_batch import RayBatch
from nerf_lightning.data.ray_batches import training_rays
from nerf_lightning.data.sampler import RaySampler
from nerf_lightning.data.shards import ShardDraw, balanced_shards
from nerf_lightning.data.types import Frame
from nerf_lightning.data.view_set import ViewSet
from nerf_lightning.training.feedback import TrainingFeedback

__all__ = ["TrainingPixels"]

log = logging.getLogger("nerf_lightning.data.datamodule")


class TrainingPixels:
    """This rank's training pixels: decoded by :meth:`load`, placed by :meth:`to`, drawn by :meth:`rays`.

    Args:
        frames: all training views of the capture (global view ids are indices into it).
        decode: ``downscale``, ``num_workers`` and ``cache_dir`` of ``data/images.load_images``.
        camera_model: the capture's camera model (the views' undistortion).
        feedback: the run's feedback, whose ``shard_weight`` the gradient exchange applies.
        origin: the capture's folder (error messages).
        shard / storage / storage_fraction: ``data.shard``, ``data.storage``, ``data.storage_fraction``
            (checked by the DataModule).
    """

    def __init__(
        self,
        frames: list[Frame],
        decode: dict[str, Any],
        camera_model: str,
        feedback: TrainingFeedback,
        origin: Path,
        *,
        shard: bool | str,
        storage: str,
        storage_fraction: float,
    ) -> None:
        self.frames = frames
        sizes = [f.intrinsics.downscaled(int(decode.get("downscale", 1))) for f in frames]
        #: all views' (widths, heights), int64 [V]: as their cameras say, once every view is loaded as
        #: decoded (a shard's must agree with its cameras')
        self.sizes = torch.tensor([i.width for i in sizes]), torch.tensor([i.height for i in sizes])
        self.shard_mode, self.storage, self.fraction = shard, storage, float(storage_fraction)
        self.decode, self.camera_model, self.feedback, self.origin = decode, camera_model, feedback, origin
        self.views: ViewSet | None = None
        #: this rank's shard (None: it holds every view) and its pixels on the host (None: on the device)
        self.shard: ShardDraw | None = None
        self.host: HostPixels | None = None
        #: all training views' kept pixels when the capture has masks (``data/masks.py``), else None
        self.kept: KeptPixels | None = None
        self._key: tuple[int, int] | None = None

    def load(self, rank: int, world: int) -> bool:
        """Decode the views rank ``rank`` of ``world`` holds (unless already held); False: nothing new.
        The caller places them again (:meth:`to`)."""
        widths, heights = self.sizes
        shards = balanced_shards((widths * heights).tolist(), world, mode=self.shard_mode, rank=rank)
        sharded = len(shards) > 1
        key = (rank, world) if sharded else (0, 1)
        if key == self._key:
            return False
        held = shards[rank if sharded else 0]
        self.views = self.host = None  # the previous views' pixels go before the new ones come
        images = load_images([self.frames[v] for v in held], **self.decode)
        index = torch.tensor(held, dtype=torch.int64)
        if not sharded:
            self.sizes = widths, heights = images.widths.clone(), images.heights.clone()
        if not (torch.equal(images.widths, widths[index]) and torch.equal(images.heights, heights[index])):
            raise CaptureError(f"{self.origin}: the images' sizes differ from those of their cameras")
        if self._key is None:  # the masks of every view: the sampler's distribution covers them all
            masks = load_masks(self.frames, **self.decode)
            if masks is not None:
                self.kept = KeptPixels.of_masks(masks, widths.tolist(), heights.tolist())
        self.views = ViewSet([self.frames[v] for v in held], images, self.camera_model)
        self.shard = ShardDraw(index, images.widths, images.heights, world, self.kept) if sharded else None
        self._share_weight()
        self._key = key
        return True

    def to(self, device: torch.device) -> None:
        """The views onto ``device``, their pixels too unless ``data.storage`` resolves to ``host``."""
        assert self.views is not None, "load() first"
        self.host = place_views(self.views, self.storage, self.fraction, device)
        if self.shard is not None:  # its weight tensor moves too: the gradient exchange reads the new one
            self.shard.to(torch.device("cpu") if self.host is not None else device)
        self._share_weight()

    def _share_weight(self) -> None:
        """The feedback's ``shard_weight``: this rank's shard's weight tensor where it now lies (None:
        not sharded). Its one writer."""
        self.feedback.shard_weight = self.shard.weight if self.shard is not None else None

    def rays(self, sampler: RaySampler, n_rays: int, **recipe: Any) -> RayBatch:
        """``n_rays`` training rays of this rank's views (``data/ray_batches.training_rays``; ``recipe``:
        its keyword arguments). Their ``view_ids`` are global training views."""
        assert self.views is not None, "load() first"
        return training_rays(self.views, sampler, n_rays, shard=self.shard, host=self.host, **recipe)

    @property
    def pixels(self) -> Tensor:
        """The held views' packed pixels, uint8 [P, C] (``data/images.py``)."""
        assert self.views is not None, "load() first"
        return self.views.pixels

    @property
    def device(self) -> torch.device:
        """Where the rays are computed (the cameras' device; the pixels may stay on the host)."""
        assert self.views is not None, "load() first"
        return self.views.poses.device

    @property
    def held_views(self) -> Tensor:
        """The global ids of the training views this rank holds, int64 [V_r]."""
        if self.shard is not None:
            return self.shard.views.cpu()
        return torch.arange(len(self.frames))

    @property
    def nbytes(self) -> int:
        """Bytes of the training pixels this rank holds (device or host)."""
        return self.pixels.numel() * self.pixels.element_size()
