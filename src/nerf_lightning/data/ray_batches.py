"""The batches a DataModule hands the model: training rays drawn from a sampler, whole held-out views.

Both are built on the data's device without a host sync: a training batch is a
:class:`~nerf_lightning.data.ray_batch.RayBatch`, a view's batch the dict ``data/datamodule.py`` documents.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor

from nerf_lightning.data.capture_kind import CaptureKind
from nerf_lightning.data.host_pixels import HostPixels
from nerf_lightning.data.ray_batch import RayBatch
from nerf_lightning.data.sampler import RaySampler
from nerf_lightning.data.shards import ShardDraw, draw_pixels
from nerf_lightning.data.view_set import ViewSet

__all__ = ["image_batch", "resolve_recipe", "training_rays"]

log = logging.getLogger(__name__)

def resolve_recipe(kind: CaptureKind, pixel_jitter: bool | str) -> bool:
    """``data.pixel_jitter`` as configured; ``auto``: renders train through the pixel centres (nerfacc's
    lego recipe), photographs through random points of their pixels (instant-ngp), as ``kind`` (from the
    training images) says."""
    jitter = (not kind.is_render) if pixel_jitter == "auto" else bool(pixel_jitter)
    log.info(
        "capture kind: %s (%s); training rays through %s, over random backgrounds",
        kind.kind,
        kind.reason,
        "random points of their pixels" if jitter else "the pixel centres",
    )
    return jitter


def training_rays(
    views: ViewSet,
    sampler: RaySampler,
    n_rays: int,
    *,
    pixel_jitter: bool,
    with_alpha: bool,
    shard: ShardDraw | None = None,
    host: HostPixels | None = None,
) -> RayBatch:
    """Draw ``n_rays`` training rays of ``views`` on their device (no host sync), each over a random
    background colour (as instant-ngp): the target is its pixel composited over that colour, so
    leftover transparency is charged and the field renders the same over whatever background
    evaluation uses. On renders this beat training over the evaluation background
    (docs/benchmarks/2026-12-07.md); on opaque photographs the colour never shows.

    Args:
        pixel_jitter: rays through uniformly random points of their pixels (a photograph's pixel
            integrates light over its area); else through the pixel centres, where evaluation renders.
        with_alpha: the batch carries the target pixels' ``alpha`` (RGBA images).
        shard: ``views`` are this rank's shard of the training views (``data.shard``), drawn from the
            sampler's distribution restricted to them; the batch's ``view_ids`` stay global.
        host: ``views``' pixels held on the host (``data.storage=host``), gathered there.
    """
    view_ids, local, ix, iy, pixels = draw_pixels(sampler, shard, host, n_rays)
    device = views.poses.device
    if pixel_jitter:
        ux = torch.rand(n_rays, device=device)
        uy = torch.rand(n_rays, device=device)
    else:
        ux = uy = torch.full((n_rays,), 0.5, device=device)
    background = torch.rand(n_rays, 3, device=device)
    if pixels is not None:
        px, py = ix.float() + ux, iy.float() + uy
        batch = views.batch(local, ix, iy, px, py, background, with_alpha, pixels=pixels)
    else:
        batch = views.train_rays(local, ix, iy, ux, uy, background, with_alpha=with_alpha)
    return batch.replace(view_ids=view_ids)


def image_batch(views: ViewSet, view: int, eval_background: Tensor, train_view: int) -> dict[str, Any]:
    """All pixels of ``views``' view ``view`` (row-major, through the pixel centres), composited over
    ``eval_background``; ``alpha`` is 1 on RGB images; ``keep`` (bool, only for views of a capture with
    masks) marks the pixels that score. ``train_view``: the frame's index among the training views, or
    -1."""
    device = views.pixels.device
    h, w = int(views.heights[view]), int(views.widths[view])
    iy, ix = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij")
    ix, iy = ix.reshape(-1), iy.reshape(-1)
    view_ids = torch.full_like(ix, view)
    background = eval_background.expand(ix.shape[0], 3)
    rays = views.batch(view_ids, ix, iy, ix.float() + 0.5, iy.float() + 0.5, background, with_alpha=True)
    alpha = torch.ones_like(ix, dtype=torch.float32) if rays.alpha is None else rays.alpha
    out = {**rays.tensors(), "alpha": alpha, "height": h, "width": w, "view": view, "train_view": train_view}
    if views.keep is not None:
        start = int(views.offsets[view])
        out["keep"] = views.keep[start : start + h * w]
    return out
