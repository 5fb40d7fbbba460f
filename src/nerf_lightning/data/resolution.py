"""Dynamic training resolution (``data.resolution_schedule``): coarse images first, then full.

A schedule is a list of stages ``[start, factor]``. From ``start`` on, training rays are drawn at
image downscale ``factor`` (relative to the loaded training images, i.e. after ``data.downscale``):

* a ray goes through a random position inside a ``factor x factor`` block of full-resolution pixels
  (the full-resolution path's random sub-pixel position, scaled by the block; on average the block's
  centre), through the *same* camera model as every full-resolution ray: the position is a
  full-resolution pixel coordinate, so the principal point, the focal lengths and the lens
  distortion are exactly those of the camera (this equals the ray of the camera downscaled as
  ``Intrinsics.downscaled`` does, at the matching position of the small image);
* its target is the block's mean colour, i.e. a box-filtered image. For RGBA captures the block
  mean is taken of *premultiplied* colour and of alpha, so the target composited over the ray's
  background equals the mean of the block's pixels each composited over that background, exactly
  what the full-resolution path's target is for one pixel.

``start`` is an optimizer step (an integer, ``500``) or a fraction of ``trainer.max_steps`` (a
float, ``0.1``); the first stage starts at 0, starts strictly increase, factors are integers >= 1.
The stage is a function of ``trainer.global_step`` (a host integer, the same on every rank), so
every rank trains at the same resolution, and a resumed run continues in the stage of its
checkpoint's step. The fractions are resolved to steps once per run and checkpointed, so resuming
with a different ``trainer.max_steps`` keeps the boundaries the run started with.

The ray samplers are unchanged: they draw a full-resolution pixel, which picks its block (the
pixels of a partial block at the right/bottom edge, dropped by the crop, are no target in that
stage), and the loss-weighted sampler's per-view statistics and error map keep receiving
full-resolution pixels. Batch shapes are the same in every
stage; with ``data.cuda_graph`` each stage draws through its own graph, captured when the stage starts
(the previous stage's graph and block images are then freed).

Why: coarse images early give the hash grid's coarse levels and the occupancy grid a smooth start
(the box filter removes the high frequencies the fine levels cannot fit yet), as in the seeds'
recipe; the full-resolution stage then refines.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["BlockImages", "ResolutionSchedule", "block_means"]

KEY = "data.resolution_schedule"


def _error(msg: str) -> ValueError:
    return ValueError(f"{KEY}: {msg}")


def _as_factor(value: Any, i: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _error(f"stage {i}: the downscale factor must be an integer >= 1, got {value!r}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise _error(f"stage {i}: the downscale factor must be an integer >= 1, got {value!r}")
    if value < 1:
        raise _error(f"stage {i}: the downscale factor must be an integer >= 1, got {value!r}")
    return int(value)


def _as_start(value: Any, i: int) -> int | float:
    """An int step count (>= 0) or a float fraction of max_steps in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _error(f"stage {i}: the start must be a step (integer) or a fraction of trainer.max_steps "
                     f"(float in [0, 1]), got {value!r}")
    if isinstance(value, float):
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise _error(f"stage {i}: a fractional start must be in [0, 1] (a fraction of "
                         f"trainer.max_steps), got {value!r}; write a step count as an integer")
        return float(value)
    if value < 0:
        raise _error(f"stage {i}: the start step must be >= 0, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class ResolutionSchedule:
    """A validated ``data.resolution_schedule``: stages ``(start, factor)``, ``start`` an int step or a
    float fraction of ``max_steps``. Use :meth:`parse` (None / empty = off) and :meth:`resolve`."""

    stages: tuple[tuple[int | float, int], ...]

    @classmethod
    def parse(cls, spec: Any) -> ResolutionSchedule | None:
        """Validate a config value (a list of ``[start, factor]`` pairs, or None); errors name the key."""
        if spec is None:
            return None
        if isinstance(spec, (str, bytes)) or not isinstance(spec, Sequence):
            raise _error(f"expected a list of [start, factor] stages (or null = off), got {spec!r}")
        stages: list[tuple[int | float, int]] = []
        for i, stage in enumerate(spec):
            is_pair = isinstance(stage, Sequence) and not isinstance(stage, (str, bytes))
            items = list(stage) if is_pair else None
            if items is None or len(items) != 2:
                raise _error(f"stage {i}: expected a pair [start, factor], e.g. [0.1, 2], got {stage!r}")
            stages.append((_as_start(items[0], i), _as_factor(items[1], i)))
        if not stages:
            return None
        if stages[0][0] != 0:
            raise _error(f"the first stage must start at step 0, got {stages[0][0]!r}")
        # Starts of one kind must increase here already; mixed kinds are checked once resolved.
        for kind in (int, float):
            starts = [s for s, _ in stages if type(s) is kind]
            if any(b <= a for a, b in zip(starts, starts[1:], strict=False)):
                raise _error(f"stage starts must strictly increase, got {[s for s, _ in stages]}")
        return cls(tuple(stages))

    @property
    def uses_fractions(self) -> bool:
        return any(isinstance(s, float) and s != 0 for s, _ in self.stages)

    @property
    def factors(self) -> set[int]:
        return {k for _, k in self.stages}

    def as_list(self) -> list[list[int | float]]:
        """Plain data (for checkpoints)."""
        return [[s, k] for s, k in self.stages]

    def resolve(self, max_steps: int | None) -> tuple[tuple[int, int], ...]:
        """Stages as ``(start_step, factor)``, starts strictly increasing from 0.

        Raises:
            ValueError: a fraction without a positive ``max_steps``, or starts that do not increase
                once fractions are steps (naming ``data.resolution_schedule``).
        """
        if self.uses_fractions and (max_steps is None or max_steps <= 0):
            raise _error(f"fractional starts need a positive trainer.max_steps (got {max_steps}); "
                         "set trainer.max_steps or give the starts as step counts (integers)")
        out = tuple(
            (int(round(s * max_steps)) if isinstance(s, float) else int(s), k)  # type: ignore[operator]
            for s, k in self.stages
        )
        starts = [s for s, _ in out]
        if any(b <= a for a, b in zip(starts, starts[1:], strict=False)):
            raise _error(f"stage starts must strictly increase, got {self.as_list()} = steps {starts} "
                         f"with trainer.max_steps={max_steps}")
        return out


def factor_at(stages: Sequence[tuple[int, int]], step: int) -> int:
    """The downscale factor of optimizer step ``step`` (the last stage starting at or before it)."""
    factor = 1
    for start, k in stages:
        if start > step:
            break
        factor = k
    return factor


@dataclass
class BlockImages:
    """Box-filtered training images at one downscale factor, on the device of the full-res pixels.

    Attributes:
        factor: k.
        colors: [B, C] float32, views concatenated, each view row-major over its blocks: RGB
            premultiplied by alpha, then alpha (C = 4), or RGB (C = 3), each the mean of a k x k block.
        offsets: [V] int64 first block of each view in ``colors``.
        widths, heights: [V] int64 blocks per row / column (``W // k``, ``H // k``: a partial block
            at the right or bottom edge is dropped, as ``data.downscale`` crops).
    """

    factor: int
    colors: Tensor
    offsets: Tensor
    widths: Tensor
    heights: Tensor

    def gather(self, view_ids: Tensor, bx: Tensor, by: Tensor) -> Tensor:
        """[R, C] block colours of blocks (bx, by) of ``view_ids``."""
        flat = self.offsets[view_ids] + by * self.widths[view_ids] + bx
        return self.colors[flat]


def block_means(pixels: Tensor, offsets: Tensor, widths: Tensor, heights: Tensor, factor: int) -> BlockImages:
    """Box-filter packed uint8 images (``ImageSet`` layout) by ``factor`` on their own device.

    Runs once per factor at setup time (one small loop over views, host reads of the sizes are fine
    here)."""
    k = int(factor)
    c = int(pixels.shape[1])
    device = pixels.device
    w_host, h_host, off_host = widths.tolist(), heights.tolist(), offsets.tolist()
    bw = [w // k for w in w_host]
    bh = [h // k for h in h_host]
    counts = [a * b for a, b in zip(bw, bh, strict=True)]
    if min(counts) <= 0:
        raise _error(f"downscale factor {k} is larger than the smallest training image "
                     f"({min(w_host)} x {min(h_host)} px)")
    colors = torch.empty(sum(counts), c, dtype=torch.float32, device=device)
    starts = [0]
    for n in counts[:-1]:
        starts.append(starts[-1] + n)
    for v, (w, h, off) in enumerate(zip(w_host, h_host, off_host, strict=True)):
        img = pixels[off : off + w * h].view(h, w, c)[: bh[v] * k, : bw[v] * k].float() / 255.0
        if c == 4:
            img = torch.cat([img[..., :3] * img[..., 3:], img[..., 3:]], dim=-1)
        mean = img.reshape(bh[v], k, bw[v], k, c).mean(dim=(1, 3))
        colors[starts[v] : starts[v] + counts[v]] = mean.reshape(-1, c)
    return BlockImages(
        factor=k,
        colors=colors,
        offsets=torch.tensor(starts, dtype=torch.int64, device=device),
        widths=torch.tensor(bw, dtype=torch.int64, device=device),
        heights=torch.tensor(bh, dtype=torch.int64, device=device),
    )
