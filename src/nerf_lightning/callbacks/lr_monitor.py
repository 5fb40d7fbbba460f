"""Lightning's learning-rate monitor that stays quiet without a logger (``logger=none``)."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import LearningRateMonitor as _LearningRateMonitor


class LearningRateMonitor(_LearningRateMonitor):
    """``lightning.pytorch.callbacks.LearningRateMonitor``, a no-op (not an error) when there is no logger."""

    _active = False

    def inert(self, trainer: L.Trainer) -> bool:
        """Nothing to log to (the train app then drops it: run/loop.py)."""
        return not trainer.loggers

    def on_train_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        self._active = bool(trainer.loggers)
        if self._active:
            super().on_train_start(trainer, *args, **kwargs)

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        if self._active:
            super().on_train_batch_start(trainer, *args, **kwargs)

    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        if self._active:
            super().on_train_epoch_start(trainer, *args, **kwargs)
