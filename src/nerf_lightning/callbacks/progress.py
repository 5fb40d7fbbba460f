"""Lightning's Rich progress bar, without reading the device during training steps."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar


class ProgressBar(RichProgressBar):
    """``RichProgressBar`` that never waits for the GPU while training.

    Lightning's bar converts every progress-bar metric, a device tensor, to a Python float at each
    refresh: a host synchronization every ``refresh_rate`` steps, which drains the queue of work the
    host had run ahead with. This bar reads Lightning's progress-bar metrics only when they change
    (after validation) and shows, besides them, the plain floats of every callback that offers
    ``progress_bar_metrics()`` (the throughput monitor: rays/s, samples/s, ms/step, GPU %).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._logged: dict[str, Any] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._logged = dict(super().get_metrics(trainer, pl_module))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        self._logged = dict(super().get_metrics(trainer, pl_module))  # once per validation

    @property
    def total_train_batches(self) -> int | float:
        """The batches of the current epoch up to the run's last step. Lightning's counts only the steps
        left from the epoch's first batch: a run resumed at batch 136 of an epoch of 500 with 364 steps
        to go counted 137..500 of 364; here 500 of 500."""
        trainer = self.trainer
        batches = trainer.num_training_batches
        if not (trainer.max_steps and trainer.max_steps > 0):
            return batches
        left = (trainer.max_steps - trainer.global_step) * trainer.accumulate_grad_batches
        done = trainer.fit_loop.epoch_loop.batch_progress.current.ready  # this epoch's, restored on resume
        return min(batches, done + left)

    def _get_train_description(self, current_epoch: int) -> str:
        # "Epoch 2/-2" without an epoch limit (max_epochs=-1: the run ends at trainer.max_steps)
        if self.trainer.max_epochs is not None and self.trainer.max_epochs < 0:
            return f"{f'Epoch {current_epoch}':{len(self.validation_description)}}"
        return super()._get_train_description(current_epoch)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        items = dict(self._logged) if trainer.training else dict(super().get_metrics(trainer, pl_module))
        for cb in trainer.callbacks:
            extra = getattr(cb, "progress_bar_metrics", None)
            if callable(extra):
                items.update(extra())
        return items
