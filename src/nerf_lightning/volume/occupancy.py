"""Multi-cascade occupancy grid (instant-ngp): which cells of space the ray marcher samples.

State: ``density_grid`` float32 [C, G^3] (an exponential-max average of the field's density per
cell; negative = never seen by a training camera) and ``binaries`` bool [C, G, G, G] (occupied
cells). Cascade ``c`` covers ``[0.5 - 2^c/2, 0.5 + 2^c/2]^3``; ``C = log2(aabb_scale) + 1``. The
pure math lives in ``ops`` (``grid_ema_update``, ``grid_occupancy``, ...); this module decides
which cells to sample and when.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import torch
from torch import Tensor, nn

from ..config_keys import check_arguments
from ..config_schema import Formerly, Injected, MultipleOf, Note, PowerOfTwo, Range
from ..ops import Backend, as_backend

__all__ = ["OccupancyGrid", "all_reduce_max"]


class OccupancyGrid(nn.Module):
    """Occupancy grid with ``log2(aabb_scale) + 1`` cascades of ``resolution^3`` cells.

    Args:
        aabb_scale: power of two (1..128); the outer box is ``[0.5 - s/2, 0.5 + s/2]^3``.
        resolution: cells per side G (even, so the bitfield packs into whole bytes).
        ops: the step's :class:`~nerf_lightning.ops.Backend` (``model.net.backend``: ``build_renderer``
            passes the renderer's), a backend name (default ``"auto"``), or an ops namespace (tests).
        update_every: optimizer steps (reference steps of the training clock) between two updates
            during training (instant-ngp: 16).
        warmup_steps / decay / density_threshold: the defaults of :meth:`update` (instant-ngp: all
            cells during the first 256 steps, EMA decay 0.95, and the density of instant-ngp's minimum
            optical thickness 0.01 over its minimum step sqrt(3)/1024: 5.91).

    Buffers (saved in the state dict, moved with ``.to()``):
        density_grid: float32 [C, G^3], initialised to 0.
        binaries: bool [C, G, G, G], initialised to all True so early steps march everywhere.
    """

    density_grid: Tensor
    binaries: Tensor

    def __init__(
        self,
        aabb_scale: Annotated[
            int, PowerOfTwo(), Range(high=128), Injected("build_renderer: the capture's box")
        ] = 1,
        resolution: Annotated[
            int, Range(low=2), MultipleOf(2), Note("cells per side"), Formerly("model.grid_resolution")
        ] = 128,
        ops: Annotated[Any, Injected("build_renderer: model.net.backend; tests: an ops namespace")] = None,
        *,
        update_every: Annotated[int, Range(low=1), Formerly("model.grid_update_every")] = 16,
        warmup_steps: Annotated[int, Range(low=0), Formerly("model.grid_warmup_steps")] = 256,
        decay: Annotated[float, Range(low=0, high=1), Formerly("model.grid_decay")] = 0.95,
        density_threshold: Annotated[float, Range(low=0), Formerly("model.grid_threshold")] = 5.91,
    ) -> None:
        super().__init__()
        check_arguments(OccupancyGrid, locals())
        self.aabb_scale = int(aabb_scale)
        self.resolution = int(resolution)
        self.update_every = int(update_every)
        self.warmup_steps = int(warmup_steps)
        self.decay = float(decay)
        self.density_threshold = float(density_threshold)
        # A Backend holds a name only (modules cannot be deep-copied/pickled with the grid).
        self._ops = as_backend("auto" if ops is None else ops) if isinstance(ops, str | None) else ops
        c = int(math.log2(aabb_scale)) + 1
        g = self.resolution
        self.register_buffer("density_grid", torch.zeros(c, g**3, dtype=torch.float32))
        self.register_buffer("binaries", torch.ones(c, g, g, g, dtype=torch.bool))
        lo, hi = 0.5 - aabb_scale / 2, 0.5 + aabb_scale / 2
        # A buffer, not a tensor made per call: a host->device copy cannot run inside a CUDA graph.
        self.register_buffer("_aabb", torch.tensor([lo, lo, lo, hi, hi, hi]), persistent=False)
        #: threshold of the last update (None before the first), reused by ``sync_``.
        self.threshold: float | None = None

    # ------------------------------------------------------------------ properties
    @property
    def ops(self) -> Any:
        """The ops namespace (the :class:`~nerf_lightning.ops.Backend`'s, unless a namespace was given)."""
        return self._ops.ops if isinstance(self._ops, Backend) else self._ops

    @property
    def n_cascades(self) -> int:
        return self.density_grid.shape[0]

    @property
    def aabb(self) -> Tensor:
        """Outer box float32 [6] (xmin, ymin, zmin, xmax, ymax, zmax) on the grid's device."""
        return self._aabb.float()  # float32 even after module.half(); no copy otherwise

    def occupied_fraction(self) -> float:
        """Fraction of occupied cells over all cascades (host sync: for logging only)."""
        return float(self.binaries.float().mean().item())

    # ------------------------------------------------------------------ update
    @torch.no_grad()
    def update(
        self,
        step: int,
        density_fn: Callable[[Tensor], Tensor],
        *,
        warmup_steps: int | None = None,
        decay: float | None = None,
        threshold: float | None = None,
        n_samples_fraction: float = 0.25,
        chunk_size: int = 2**18,
        generator: torch.Generator | None = None,
        share: tuple[int, int] = (0, 1),
    ) -> None:
        """Re-estimate cell densities and recompute occupancy (instant-ngp's schedule).

        During warmup (``step < warmup_steps``) every cell of every cascade is sampled; afterwards,
        per cascade, ``n_samples_fraction * G^3`` uniformly random cells plus as many random cells
        among the currently occupied ones (with replacement; none for a cascade without occupied
        cells). No host synchronization. Each chosen cell is evaluated at a
        uniformly jittered position inside it; then ``ops.grid_ema_update`` (decay of all cells,
        max with the new samples) and ``ops.grid_occupancy`` (``density > min(threshold, mean)``).

        The grid stores density (not optical thickness as instant-ngp does), so the default
        ``threshold = 0.01 / (sqrt(3)/1024)`` is instant-ngp's minimum optical thickness 0.01 over
        the minimum step. instant-ngp scales the step (and so the thickness) by ``2^c`` in cascade
        c; with one density threshold for all cascades, outer cascades here keep slightly more cells.

        Args:
            step: global training step.
            density_fn: ``positions float32 [N, 3] -> density [N]`` (NGP space, no grad needed).
            warmup_steps: steps during which all cells are sampled (None: the grid's).
            decay: EMA decay of unsampled/previous values (None: the grid's).
            threshold: density threshold (see above; None: the grid's ``density_threshold``).
            n_samples_fraction: fraction of G^3 sampled uniformly (and again among occupied cells).
            chunk_size: positions per ``density_fn`` call.
            generator: optional torch.Generator (on the grid's device) for reproducibility.
            share: ``(index, count)``: evaluate this process's share of the cells, one of ``count``
                (the ranks of data parallelism). During warmup, every ``count``-th cell from ``index``;
                afterwards ``1 / count`` of each draw (rounded up), drawn by this process's own
                generator. Every process decays every cell, so :meth:`sync_`'s maximum over the
                processes is the grid that one process makes from all their cells: ``count`` processes
                together evaluate as many cells as one (not ``count`` times as many), each a
                ``count``-th of them.
        """
        index, count = share
        if not (count >= 1 and 0 <= index < count):
            raise ValueError(f"OccupancyGrid: share must be (index, count), 0 <= index < count; got {share}")
        warmup_steps = self.warmup_steps if warmup_steps is None else warmup_steps
        decay = self.decay if decay is None else decay
        threshold = self.density_threshold if threshold is None else threshold
        device = self.density_grid.device
        c_count, g3 = self.density_grid.shape
        if step < warmup_steps:
            indices = torch.arange(index, c_count * g3, count, device=device)
        else:
            n = max(1, -(-int(g3 * n_samples_fraction) // count))
            base = torch.arange(c_count, device=device)[:, None] * g3
            uniform = torch.randint(0, g3, (c_count, n), device=device, generator=generator)
            # Occupied cells by inverse CDF over the occupancy (no torch.nonzero: no host sync). A
            # cascade without occupied cells draws cell 0, whose sample is then zeroed (no effect on
            # a max-EMA of non-negative densities).
            cdf = _cascade_cdf(self.binaries.view(c_count, g3))
            u = torch.rand(c_count, n, device=device, generator=generator) * cdf[:, -1:]
            occupied = torch.searchsorted(cdf, u, right=True).clamp_(max=g3 - 1)
            indices = torch.cat([(uniform + base).reshape(-1), (occupied + base).reshape(-1)])
            has_occupied = (cdf[:, -1:] > 0).expand(c_count, n).reshape(-1)
            sample_mask = torch.cat([torch.ones_like(has_occupied), has_occupied])
        jitter = torch.rand(indices.shape[0], 3, device=device, generator=generator)
        positions = self.ops.grid_cell_positions(indices, jitter, self.resolution)
        densities = torch.cat(
            [
                density_fn(positions[i : i + chunk_size]).reshape(-1).float()
                for i in range(0, len(positions), chunk_size)
            ]
        )
        if step >= warmup_steps:
            densities = densities * sample_mask
        self.density_grid.copy_(self.ops.grid_ema_update(self.density_grid, indices, densities, decay))
        self.threshold = float(threshold)
        self.binaries.copy_(self.ops.grid_occupancy(self.density_grid, self.threshold))

    # ------------------------------------------------------------------ cameras
    @torch.no_grad()
    def mark_invisible_cells(
        self,
        c2w: Tensor,
        intrinsics: Tensor,
        widths: Tensor | Sequence[int],
        heights: Tensor | Sequence[int],
        near_plane: float = 0.0,
        chunk_size: int = 2**22,
    ) -> Tensor:
        """Give density -1 (never occupied, never updated) to cells no training camera sees.

        As instant-ngp (``mark_untrained_density_grid``), a cell counts as seen by a pinhole camera
        (distortion ignored; OpenCV camera axes: x right, y down, z forward) when its centre is in
        front of the camera (``z > near_plane``) and its bounding sphere (radius
        ``sqrt(3)/2 * cell size``) overlaps the image's x and y slabs
        ``[(0 - cx) z / fx, (W - cx) z / fx]`` (likewise y), i.e. conservatively. Seen cells that
        were negative are reset to 0; unseen cells get -1 and are cleared from ``binaries``.
        Call once before training, after the poses are known.

        Args:
            c2w: float [V, 3, 4] or [V, 4, 4] camera-to-world in NGP space.
            intrinsics: float [V, >=4] with fx, fy, cx, cy first (the ``Intrinsics.as_array`` layout).
            widths: [V] image widths in pixels.
            heights: [V] image heights in pixels.
            near_plane: minimum camera-space depth.
            chunk_size: cells x cameras per vectorized chunk.

        Returns:
            bool [C, G^3], which cells are seen.
        """
        device = self.density_grid.device
        if c2w.dim() != 3 or c2w.shape[1:] not in ((3, 4), (4, 4)):
            raise ValueError(
                f"mark_invisible_cells: c2w must be [V, 3, 4] or [V, 4, 4], got {tuple(c2w.shape)}"
            )
        v = c2w.shape[0]
        if intrinsics.dim() != 2 or intrinsics.shape[0] != v or intrinsics.shape[1] < 4:
            raise ValueError(
                f"mark_invisible_cells: intrinsics must be [V={v}, >=4] (fx, fy, cx, cy, ...), "
                f"got {tuple(intrinsics.shape)}"
            )
        rot = c2w[:, :3, :3].to(device=device, dtype=torch.float32)  # [V, 3, 3], columns = camera axes
        trans = c2w[:, :3, 3].to(device=device, dtype=torch.float32)  # [V, 3]
        k = intrinsics.to(device=device, dtype=torch.float32)
        fx, fy, cx, cy = k[:, 0], k[:, 1], k[:, 2], k[:, 3]
        w = torch.as_tensor(widths, dtype=torch.float32, device=device).reshape(v)
        h = torch.as_tensor(heights, dtype=torch.float32, device=device).reshape(v)

        c_count, g3 = self.density_grid.shape
        n_cells = c_count * g3
        seen = torch.empty(n_cells, dtype=torch.bool, device=device)
        cells_per_chunk = max(1, chunk_size // max(v, 1))
        for i0 in range(0, n_cells, cells_per_chunk):
            idx = torch.arange(i0, min(n_cells, i0 + cells_per_chunk), device=device)
            half = torch.full((idx.numel(), 3), 0.5, device=device)
            centres = self.ops.grid_cell_positions(idx, half, self.resolution)
            radius = (0.5 * math.sqrt(3.0) / self.resolution) * torch.ldexp(
                torch.ones(idx.numel(), device=device), idx // g3
            )
            # camera-space coordinates [N, V, 3]: (x - t) projected on the camera axes
            p = torch.einsum("nvi,vij->nvj", centres[:, None, :] - trans[None], rot)
            x, y, z = p.unbind(-1)
            r = radius[:, None]
            in_x = (x + r >= (0 - cx) * z / fx) & (x - r <= (w - cx) * z / fx)
            in_y = (y + r >= (0 - cy) * z / fy) & (y - r <= (h - cy) * z / fy)
            seen[idx] = ((z > near_plane) & in_x & in_y).any(dim=1)
        seen = seen.view(c_count, g3)
        self.density_grid.copy_(torch.where(seen, self.density_grid.clamp(min=0), -1.0))
        self.binaries &= seen.view_as(self.binaries)
        return seen

    # ------------------------------------------------------------------ distributed
    @torch.no_grad()
    def sync_(self, reduce_fn: Callable[[Tensor], object]) -> None:
        """Make all ranks hold the same grid.

        Args:
            reduce_fn: all-reduces a tensor with MAX in place (e.g.
                ``lambda t: torch.distributed.all_reduce(t, op=ReduceOp.MAX)``).

        ``density_grid`` is reduced, then ``binaries`` recomputed with the last update's threshold
        (before the first update, binaries stay all True on every rank, so they already agree).
        """
        reduce_fn(self.density_grid)
        if self.threshold is not None:
            self.binaries.copy_(self.ops.grid_occupancy(self.density_grid, self.threshold))


def all_reduce_max(tensor: Tensor) -> None:
    """The maximum over the ranks, in place: the reduction :meth:`OccupancyGrid.sync_` takes under
    DDP/FSDP."""
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)


def _cascade_cdf(binaries: Tensor) -> Tensor:
    """The running count of occupied cells along each cascade's row of ``binaries`` bool [C, G^3], as
    float32 [C, G^3] (exact up to 2^24 cells a row). One scan of all cascades as one row, less each row's
    start: on a GPU PyTorch scans several rows of millions of cells one row per thread block, about 1 ms a
    cascade on an H200 (docs/benchmarks/2026-12-04.md), against a small fraction of that for one row."""
    counts = torch.cumsum(binaries.reshape(-1), dim=0, dtype=torch.int64).view(binaries.shape)
    before = torch.cat([counts.new_zeros(1), counts[:-1, -1]])
    return (counts - before[:, None]).float()
