"""The training batch: one typed bundle of rays, their targets and where they come from.

:class:`RayBatch` is what the DataModule hands the training step (``on_after_batch_transfer``), what the
data side's CUDA graph writes every step (``data/batch_graphs.py``: the same tensors, overwritten in
place) and what :class:`~nerf_lightning.models.train_step.TrainStep` takes. Every field is a tensor of
the batch's ``R`` rays on one device; an optional field is None when the run does not draw it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["RayBatch"]


@dataclass(frozen=True)
class RayBatch:
    """``R`` training rays (frozen: a step never rebinds a field; :meth:`replace` makes a new batch).

    Lightning moves it as a whole through :meth:`to` (a frozen dataclass is refused by
    ``apply_to_collection``, an object with ``to`` is moved by it).
    """

    #: float32 [R, 3]: ray origins, NGP space (the scene in the unit cube, ``data/scene_space.py``)
    rays_o: Tensor
    #: float32 [R, 3]: unit ray directions, NGP space
    rays_d: Tensor
    #: float32 [R, 3] in [0, 1]: the target colour of each ray's pixel, linear in the image's values;
    #: RGBA images composited over :attr:`background`
    rgb: Tensor
    #: float32 [R, 3] in [0, 1]: the colour behind each ray (training: a random colour per ray)
    background: Tensor
    #: int64 [R]: each ray's training view, global over the ranks (index into the capture's training
    #: frames: the per-view parts' rows and the sampler's views)
    view_ids: Tensor
    #: int64 [R]: the column of the full-resolution pixel the ray goes through (the sampler's cell)
    px: Tensor
    #: int64 [R]: its row
    py: Tensor
    #: float32 [R] in [0, 1]: the target pixels' alpha, drawn only when the opacity loss reads it
    #: (``TrainingFeedback.alpha_targets``) on images that carry alpha; else None
    alpha: Tensor | None = None

    @property
    def n_rays(self) -> int:
        """``R``, the rays of the batch."""
        return int(self.rays_o.shape[0])

    @property
    def device(self) -> torch.device:
        return self.rays_o.device

    def replace(self, **fields: Tensor | None) -> RayBatch:
        """This batch with ``fields`` replaced (the others are the same tensors, not copies)."""
        return dataclasses.replace(self, **fields)

    def to(self, device: torch.device | str, non_blocking: bool = False, **kwargs: Any) -> RayBatch:
        """Every tensor on ``device`` (Lightning's batch transfer calls it)."""
        return self.map(lambda t: t.to(device, non_blocking=non_blocking, **kwargs))

    def map(self, fn: Any) -> RayBatch:
        """``fn`` applied to every tensor field (None fields stay None)."""
        moved = {name: None if t is None else fn(t) for name, t in self.tensors().items()}
        return dataclasses.replace(self, **moved)

    def rows(self, start: int, stop: int) -> RayBatch:
        """Rays ``start:stop`` (views of this batch's tensors)."""
        return self.map(lambda t: t[start:stop])

    def tensors(self) -> dict[str, Tensor | None]:
        """``{field name: tensor or None}`` in field order (the same tensors)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
