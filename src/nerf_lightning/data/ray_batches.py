"""The batches a DataModule hands the model: training rays drawn from a sampler, whole held-out views.

Both are built on the data's device without a host sync; the keys are the ones
``data/datamodule.py`` documents.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor

from nerf_lightning.data.capture_kind import CaptureKind
from nerf_lightning.data.host_pixels import HostPixels
from nerf_lightning.data.sampler import RaySampler
from nerf_lightning.data.shards import ShardDraw, draw_pixels
from nerf_lightning.data.view_set import ViewSet

__all__ = ["image_batch", "resolve_recipe", "training_rays"]

log = logging.getLogger(__name__)

def resolve_recipe(kind: CaptureKind, pixel_jitter: bool | str, train_background: str) -> tuple[bool, str]:
    """``(pixel_jitter, train_background)`` as configured; ``auto``: renders train through the pixel
    centres over the evaluation background (nerfacc's lego recipe), photographs through random points
    of their pixels over random colours (instant-ngp), as ``kind`` (from the training images) says."""
    jitter = (not kind.is_render) if pixel_jitter == "auto" else bool(pixel_jitter)
    auto_background = "eval" if kind.is_render else "random"
    background = auto_background if train_background == "auto" else train_background
    log.info(
        "capture kind: %s (%s); training rays through %s, over %s",
        kind.kind,
        kind.reason,
        "random points of their pixels" if jitter else "the pixel centres",
        "random backgrounds" if background == "random" else "the evaluation background",
    )
    return jitter, background


def training_rays(
    views: ViewSet,
    sampler: RaySampler,
    n_rays: int,
    *,
    pixel_jitter: bool,
    eval_background: Tensor | None,
    with_alpha: bool,
    shard: ShardDraw | None = None,
    host: HostPixels | None = None,
) -> dict[str, Any]:
    """Draw ``n_rays`` training rays of ``views`` on their device (no host sync).

    Args:
        pixel_jitter: rays through uniformly random points of their pixels (a photograph's pixel
            integrates light over its area); else through the pixel centres, where evaluation renders.
        eval_background: the colour under every ray, float32 [3]; ``None``: a random colour per ray
            (as instant-ngp: on opaque RGB targets leftover transparency is penalized, so the field
            learns to be opaque and renders the same over whatever background evaluation uses).
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
    if eval_background is None:
        background = torch.rand(n_rays, 3, device=device)
    else:
        background = eval_background.expand(n_rays, 3).contiguous()
    if pixels is not None:
        px, py = ix.float() + ux, iy.float() + uy
        batch = views.batch(local, ix, iy, px, py, background, with_alpha, pixels=pixels)
    else:
        batch = views.train_rays(local, ix, iy, ux, uy, background, with_alpha=with_alpha)
    batch["view_ids"] = view_ids
    return batch


def image_batch(views: ViewSet, view: int, eval_background: Tensor, train_view: int) -> dict[str, Any]:
    """All pixels of ``views``' view ``view`` (row-major, through the pixel centres), composited over
    ``eval_background``; ``alpha`` is 1 on RGB images. ``train_view``: the frame's index among the
    training views, or -1."""
    device = views.pixels.device
    h, w = int(views.heights[view]), int(views.widths[view])
    iy, ix = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij")
    ix, iy = ix.reshape(-1), iy.reshape(-1)
    view_ids = torch.full_like(ix, view)
    background = eval_background.expand(ix.shape[0], 3)
    batch = views.batch(view_ids, ix, iy, ix.float() + 0.5, iy.float() + 0.5, background, with_alpha=True)
    alpha = batch.pop("alpha", None)
    alpha = torch.ones_like(ix, dtype=torch.float32) if alpha is None else alpha
    return {**batch, "alpha": alpha, "height": h, "width": w, "view": view, "train_view": train_view}
