"""Lightning's file loggers with what a run of ours needs: CSV continued on resume, TensorBoard images."""

from __future__ import annotations

import csv
from typing import Any

from lightning.pytorch.loggers import CSVLogger as _LightningCSVLogger
from lightning.pytorch.loggers import TensorBoardLogger as _LightningTensorBoardLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter as _LightningCSVWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

__all__ = ["CSVLogger", "TensorBoardLogger"]


class _AppendingCSVWriter(_LightningCSVWriter):
    """Lightning's CSV writer, except that an existing ``metrics.csv`` (a resumed run's folder) is
    continued instead of deleted: its header is taken over and new rows are appended."""

    def _check_log_dir_exists(self) -> None:
        if not self._fs.isfile(self.metrics_file_path):
            return
        with self._fs.open(self.metrics_file_path, "r", newline="") as f:
            header = next(csv.reader(f), [])
        self.metrics_keys = sorted(header)


class CSVLogger(_LightningCSVLogger):
    """Lightning's ``CSVLogger`` (``logger=csv``) whose ``metrics.csv`` survives a resume in the same
    folder (``ckpt_path=last`` / ``resume=auto``): rows of the earlier process stay, new rows follow (the
    steps between the checkpoint and the crash appear twice, the later rows being the resumed run's)."""

    @property
    @rank_zero_experiment
    def experiment(self) -> _LightningCSVWriter:
        if self._experiment is not None:
            return self._experiment
        self._fs.makedirs(self.root_dir, exist_ok=True)
        self._experiment = _AppendingCSVWriter(log_dir=self.log_dir)
        return self._experiment


class TensorBoardLogger(_LightningTensorBoardLogger):
    """Lightning's ``TensorBoardLogger`` plus ``log_image`` (the validation panels), like W&B's logger."""

    @rank_zero_only
    def log_image(self, key: str, images: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Log HxWx3 uint8/float images (numpy arrays or tensors) under ``key`` (``key/i`` when several)."""
        import numpy as np

        for i, image in enumerate(images):
            array = image.detach().cpu().numpy() if hasattr(image, "detach") else np.asarray(image)
            tag = key if len(images) == 1 else f"{key}/{i}"
            self.experiment.add_image(tag, array, global_step=step, dataformats="HWC")
