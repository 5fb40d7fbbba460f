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

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        items = dict(self._logged) if trainer.training else dict(super().get_metrics(trainer, pl_module))
        for cb in trainer.callbacks:
            extra = getattr(cb, "progress_bar_metrics", None)
            if callable(extra):
                items.update(extra())
        return items
