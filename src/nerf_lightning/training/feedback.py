"""The seam between the training data and what trains on it: :class:`TrainingFeedback`.

The train app makes one around the run's training clock (``batch_rule``) and gives it to the
DataModule (``NeRFDataModule(feedback=...)``, which fills it in at ``setup``), to the model
(``NeRFModule(feedback=...)``) and to every callback whose constructor takes a ``feedback`` argument.
Through it the model says what its training step reads of a batch (the pixels' alpha), reports each
step's per-ray losses to the ray sampler and this rank's work share,
and the callbacks read the sampler's view probabilities and the capture, instead of reaching into the
DataModule through the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor

from nerf_lightning.training.clock import Tick, TrainingClock

__all__ = ["LossSampler", "TrainCameras", "TrainingFeedback"]


class LossSampler(Protocol):
    """What the feedback needs of a ray sampler (``data/sampler.py``'s ``RaySampler``)."""

    view_probs: Tensor

    def update(
        self, view_ids: Tensor, px: Tensor, py: Tensor, losses: Tensor, valid: Tensor | None = None
    ) -> None: ...

    def step(self, global_step: int | Tick) -> None: ...

    def view_probabilities(self) -> Tensor: ...


@dataclass(frozen=True)
class TrainCameras:
    """The training views' cameras, on the host: what the occupancy grid needs to mark the cells that
    no training camera sees."""

    poses: Tensor  # [V, 3, 4] NGP space
    intrinsics: Tensor  # [V, 10]
    widths: Tensor  # [V]
    heights: Tensor  # [V]


class TrainingFeedback:
    """What the model and the callbacks may know of the training data, and tell it.

    Args:
        clock: the run's training clock (``batch_rule``); default: one process's, ``per_device``.

    Before the DataModule's ``setup`` (or for a model trained without one) nothing is attached:
    the reports go nowhere and the reads return None.

    Each field has one writer (besides its initial value here); tests set ``alpha_targets`` directly,
    as the model would:

    - ``clock``: written here only (the train app's ``build_datamodule`` passes it); the object is
      bound to the world size by ``NeRFModule.setup``. Read by ``NeRFModule`` and ``NeRFDataModule``
      (both keep it as ``.clock``), :meth:`rays_per_step` and :attr:`splits_by_throughput`
      (``callbacks/load_balance.py``).
    - ``alpha_targets``: written by ``NeRFModule.__init__`` (``models/module.py``: the opacity loss is
      on). Read by ``NeRFDataModule.train_batch`` (``data/datamodule.py``).
    - ``work_scale``: written by ``NeRFModule.set_work_scale`` (called by ``callbacks/load_balance.py``'s
      ``LoadBalancer``) when the step has no sample budget to take the share. Read by
      :meth:`rays_per_step` (``NeRFDataModule.rays_per_step``).
    - ``capture``, ``cameras``, ``sampler``: written by :meth:`attach`, which ``NeRFDataModule.setup``
      calls (``data/datamodule.py``). ``capture`` is read by ``viewer/callback.py``; ``cameras`` by
      ``NeRFModule.on_fit_start`` (the occupancy grid's unseen cells); ``sampler`` by
      :meth:`report_losses` and :meth:`step` (``NeRFModule``'s training step and batch end),
      :meth:`view_probabilities` (``callbacks/sampler_monitor.py``) and ``callbacks/rank_state.py``.
    - ``shard_weight``: written by ``TrainingPixels._share_weight`` (``data/training_pixels.py``, after
      each ``load`` and ``to``). Read by ``callbacks/grad_exchange.py``'s ``GradientExchange``.
    """

    def __init__(self, clock: TrainingClock | None = None) -> None:
        self.clock = clock if clock is not None else TrainingClock()
        #: whether training batches carry the target pixels' ``alpha`` (RGBA images only): the model's
        #: opacity loss (``model.net.loss.alpha_weight``) reads it, and says so at construction (else no batch
        #: pays for the gather)
        self.alpha_targets = False
        #: this rank's share of the work under ``batch_rule=throughput`` (mean 1 over the ranks);
        #: the DataModule's rays per step follow it when the step has no sample budget
        self.work_scale = 1.0
        #: the capture (``data/types.py``'s ``Capture``: cameras, splits, scene box) once read
        self.capture: Any = None
        self.cameras: TrainCameras | None = None
        self.sampler: LossSampler | None = None
        #: this rank's gradient weight under ``data.shard`` (float32 [] on its device, rewritten in place
        #: by each draw: ``data/shards.py``), which the gradient exchange applies; None: not sharded
        self.shard_weight: Tensor | None = None

    def attach(self, capture: Any, cameras: TrainCameras, sampler: LossSampler) -> None:
        """Called by the DataModule's ``setup`` once the capture is read."""
        self.capture, self.cameras, self.sampler = capture, cameras, sampler

    def rays_per_step(self, batch_size: int) -> int:
        """This rank's rays per step for a configured ``batch_size``: as the batch rule's clock and
        :attr:`work_scale` say (scaled sizes are multiples of 1/64 of the batch, so that batch graphs
        are captured for at most ~100 distinct sizes)."""
        n = int(round(batch_size * self.clock.rank_multiple))
        if self.work_scale != 1.0:
            quantum = max(1, n // 64)
            n = max(quantum, int(round(n * self.work_scale / quantum)) * quantum)
        return n

    @property
    def splits_by_throughput(self) -> bool:
        """Whether the ranks' work is split by their measured speed (``batch_rule=throughput``)."""
        return self.clock.splits_by_throughput

    def report_losses(
        self, view_ids: Tensor, px: Tensor, py: Tensor, per_ray: Tensor, valid: Tensor | None = None
    ) -> None:
        """One training step's per-ray losses (detached) at the pixels the batch drew."""
        if self.sampler is not None:
            self.sampler.update(view_ids, px, py, per_ray, valid=valid)

    def step(self, tick: Tick) -> None:
        """After each optimizer step: the sampler's update cadence."""
        if self.sampler is not None:
            self.sampler.step(tick)

    def view_probabilities(self) -> Tensor | None:
        """The probability [V] with which a training ray comes from each view (None: no sampler yet)."""
        return self.sampler.view_probabilities() if self.sampler is not None else None
