"""Fault injection for tests that train in other processes (`+callbacks.fault._target_=faults.RankFault`)."""

from __future__ import annotations

import time
from typing import Any

import lightning as L


class RankFault(L.Callback):
    """On global rank ``rank``, when optimizer step ``step`` starts: ``raise`` a RuntimeError, ``hang``
    (stop taking part in collectives while staying alive, as a rank stuck in I/O or a dead GPU does) or
    ``kill`` (SIGKILL: the OOM killer, a lost node)."""

    def __init__(self, rank: int = 1, step: int = 2, mode: str = "raise") -> None:
        self.rank, self.step, self.mode = rank, step, mode

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_rank == self.rank and trainer.global_step >= self.step:
            if self.mode == "hang":
                time.sleep(3600)
            if self.mode == "kill":
                import os
                import signal

                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"injected fault on rank {self.rank} at step {trainer.global_step}")


class SignalAt(L.Callback):
    """Sends this process ``signum`` (default SIGTERM, as ``timeout``, SLURM or Kubernetes do) when optimizer
    step ``step`` starts; Python runs the handler before the next bytecode, in the middle of that step."""

    def __init__(self, step: int = 2, signum: int = 15) -> None:
        self.step, self.signum = step, signum

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        import os

        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


class PoisonWeights(L.Callback):
    """Writes NaN into the first parameter of the model when optimizer step ``step`` starts (a training
    that diverges at a known step, whatever the learning rate)."""

    def __init__(self, step: int = 2) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        import torch

        if trainer.global_step == self.step:
            with torch.no_grad():
                next(pl_module.parameters()).fill_(float("nan"))


class SlowValidation(L.Callback):
    """Sleeps ``seconds`` after each validation batch (an eval that takes long enough to overlap another,
    or to be killed in the middle of its views)."""

    def __init__(self, seconds: float = 1.0) -> None:
        self.seconds = seconds

    def on_validation_batch_end(self, *args: Any, **kwargs: Any) -> None:
        time.sleep(self.seconds)


class RemoveFolderAt(L.Callback):
    """Deletes the folder ``folder`` (the run's own, as a user's ``rm -rf`` would) when optimizer step
    ``step`` starts."""

    def __init__(self, folder: str, step: int = 2) -> None:
        self.folder, self.step = folder, step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        import shutil

        if trainer.global_step == self.step:
            shutil.rmtree(self.folder)
