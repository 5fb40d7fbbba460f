"""Training views split over the ranks of data parallelism (``data.shard``).

With N ranks and sharding on, rank r holds only the pixels of its shard of the training views and
draws its rays from them. The shards are balanced by pixel count (:func:`balanced_shards`: largest
view first onto the lightest shard), not by view count.

What stays global: the ray sampler (its per-view statistics, all-reduced, and its view probabilities
``p`` over all training views), the per-view parameters (indexed by global view ids, which the batches
carry) and the training cameras. Rank r draws its ``n`` rays from ``p`` restricted to its shard,
``p_v / P_r`` with ``P_r`` the shard's mass. Every rank draws the same number of rays; so that the
combined step still follows ``p``, rank r's gradient is weighted by ``w_r = N * P_r`` before the
all-reduce averages it (:attr:`ShardDraw.weight`, applied by ``callbacks/grad_exchange.py``): the mean
gradient is then ``sum_r P_r E[grad | shard r] = E_p[grad]``. The weights average to 1 over the ranks;
with the uniform sampler and equal shards they are all exactly 1.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch import Tensor

from nerf_lightning.data.capture_kind import (
    CaptureKind,
    classify_pixels,
    kind_of_fraction,
    transparent_fraction,
)
from nerf_lightning.data.host_pixels import HostPixels
from nerf_lightning.data.masks import KeptPixels
from nerf_lightning.data.sampler import RaySampler, pixels_of
from nerf_lightning.ops import data_kernel

__all__ = [
    "ShardDraw",
    "balanced_shards",
    "classify_shards",
    "draw_pixels",
    "rank_and_world",
    "resolve_shard",
]

log = logging.getLogger("nerf_lightning.data.datamodule")


def resolve_shard(mode: bool | str, world: int) -> bool:
    """Whether the training views are sharded: ``auto`` whenever there is more than one rank
    (``mode``: ``data.shard``, checked by the DataModule)."""
    return world > 1 and (mode is True or mode == "auto")


def rank_and_world(trainer: object | None = None) -> tuple[int, int]:
    """This process's (rank, world size): the trainer's when attached, else torch.distributed's when
    initialized, else one process's."""
    if trainer is not None:
        return int(trainer.global_rank), int(trainer.world_size)  # type: ignore[attr-defined]
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def balanced_shards(
    pixel_counts: list[int], world: int, mode: bool | str = True, rank: int | None = None
) -> list[list[int]]:
    """The training views split into ``world`` shards of about equal pixel counts: views in decreasing
    pixel count, each onto the shard with the fewest pixels so far (ties: the lowest rank; equal views:
    the lowest index first). Each shard lists its views in increasing order. Deterministic: every rank
    computes the same split. ``mode`` (``data.shard``) off, or one rank: one shard of all views.
    ``rank`` 0 logs the split."""
    if not resolve_shard(mode, world):
        return [list(range(len(pixel_counts)))]
    if len(pixel_counts) < world:
        raise ValueError(
            f"data.shard: {len(pixel_counts)} training views cannot be split over {world} ranks "
            "(each rank needs at least one view; set data.shard=false)"
        )
    loads = [0] * world
    shards: list[list[int]] = [[] for _ in range(world)]
    for view in sorted(range(len(pixel_counts)), key=lambda v: (-pixel_counts[v], v)):
        lightest = min(range(world), key=lambda r: (loads[r], r))
        loads[lightest] += pixel_counts[view]
        shards[lightest].append(view)
    if rank == 0:
        log.info(
            "data.shard: %d training views over %d ranks: %s views, %s pixels",
            len(pixel_counts), world, "/".join(str(len(s)) for s in shards), "/".join(map(str, loads)),
        )  # fmt: skip
    return [sorted(s) for s in shards]


class ShardDraw:
    """Rank ``rank``'s draws from its shard ``views`` (global ids, increasing) of the training views.

    Args:
        views: int64 [V_r], the shard's global view ids; its local view ``i`` is global ``views[i]``.
        widths, heights: int64 [V_r], the shard's image sizes.
        world: the number of ranks (the gradient weight is ``world * P_r``).
        kept: all training views' kept pixels under masks (``data/masks.py``); the shard draws only those.
    """

    def __init__(
        self, views: Tensor, widths: Tensor, heights: Tensor, world: int, kept: KeptPixels | None = None
    ) -> None:
        self.views, self.widths, self.heights, self.world = views, widths, heights, int(world)
        self.kept = kept.subset(views) if kept is not None else None
        #: this rank's gradient weight ``world * P_r``, float32 [] on the draw's device, rewritten in
        #: place by every :meth:`sample` (the gradient hook and a batch graph keep reading one tensor)
        self.weight = torch.ones((), dtype=torch.float32, device=views.device)

    def to(self, device: torch.device) -> ShardDraw:
        self.views, self.widths, self.heights = (
            t.to(device) for t in (self.views, self.widths, self.heights)
        )
        self.weight = self.weight.to(device)
        if self.kept is not None:
            self.kept = self.kept.to(device)
        return self

    @torch.no_grad()
    def sample(self, view_probs: Tensor, n_rays: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``n_rays`` pixels of the shard drawn from ``view_probs`` (float64 [V], all training views)
        restricted to it, pixels uniform inside their view; no host sync.

        Returns (global view ids, local view ids, px, py), int64 [n_rays] each."""
        probs = view_probs.to(self.views.device).index_select(0, self.views)
        mass = probs.sum()
        cdf = torch.cumsum(probs, 0) / mass
        cdf[-1:].fill_(1.0)
        self.weight.copy_(mass * self.world)
        u = torch.rand(3, n_rays, device=cdf.device, dtype=torch.float64)
        kernel = data_kernel("sample_pixels", u, cdf) if self.kept is None else None
        if kernel is not None:
            local, px, py = kernel(u, cdf, self.widths, self.heights, 1)
        else:
            local, px, py = pixels_of(cdf, self.widths, self.heights, u, self.kept)
        return self.views[local], local, px, py


def classify_shards(pixels: Tensor) -> CaptureKind:
    """:func:`~nerf_lightning.data.capture_kind.classify_pixels` of all ranks' shards together (every rank
    decides the same recipe): the transparent fractions, weighted by pixel count, are all-reduced."""
    if pixels.shape[1] == 3 or not (dist.is_available() and dist.is_initialized()):
        return classify_pixels(pixels)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    n = float(pixels.shape[0])
    counts = torch.tensor([transparent_fraction(pixels) * n, n], dtype=torch.float64, device=device)
    dist.all_reduce(counts)
    return kind_of_fraction(float(counts[0] / counts[1]))


def draw_pixels(
    sampler: RaySampler, shard: ShardDraw | None, host: HostPixels | None, n_rays: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """A step's ``n_rays`` training pixels on the device: (global view ids, this rank's local view ids,
    px, py, their uint8 values when gathered on the host else None). ``shard``: from this rank's shard
    (else all views); ``host``: drawn on the host from its copy of the sampler's distribution."""
    if host is None and shard is None:
        view_ids, px, py = sampler.sample(n_rays)
        return view_ids, view_ids, px, py, None
    if host is None:
        assert shard is not None
        return (*shard.sample(sampler.view_probs, n_rays), None)
    probs = host.host_probs(sampler.view_probs if shard is not None else sampler.cdf)
    if shard is not None:
        _, local, px, py = shard.sample(probs, n_rays)
    else:  # the sampler's own draw, on the host
        u = torch.rand(3, n_rays, dtype=torch.float64)
        kept = None if sampler.kept is None else host.kept_of(sampler.kept)
        local, px, py = pixels_of(probs, host.widths, host.heights, u, kept)
    local, px, py, pixels = host.gather(local, px, py)
    view_ids = local if shard is None else shard.views.to(local.device)[local]
    return view_ids, local, px, py, pixels
