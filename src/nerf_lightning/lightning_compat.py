"""Every use of Lightning's private internals, in one place (``pyproject.toml`` pins the range they hold in).

Lightning's public API covers what this project needs except a few things measured to matter; each is
wrapped here, with why, and ``tests/test_lightning_compat.py`` checks each against the installed
Lightning, so an upgrade that moves one fails there, by name, instead of somewhere in a training run.

- :class:`FastHookNames`: Lightning sets ``_current_fx_name`` on the module around every hook call.
- :func:`logs_this_step`: whether the loggers write this step (``trainer._logger_connector``).
- :func:`set_max_steps`: the run's length in optimizer steps once training started
  (``fit_loop.epoch_loop.max_steps``).
- :func:`throttle_sigterm_broadcast`: the cross-rank SIGTERM check every N steps
  (``_TrainingEpochLoop._broadcast_sigterm_tensor``).
- :func:`batch_in_flight` / :func:`epoch_batch_idx`: where the epoch loop stands, for exact resume
  (``fit_loop.epoch_loop.batch_progress`` / ``batch_idx``).
- :func:`last_saved_step` / :func:`forget_last_save`: the step ``ModelCheckpoint`` last wrote
  (``_last_global_step_saved``).
- :func:`validates_by_time`: whether ``val_check_interval`` is a duration (``_val_check_time_interval``).
- :func:`slurm_detection_off`: ``trainer.validate(ckpt_path=None)`` would load a SLURM ``hpc_ckpt``.
- :func:`count_optimizer_step`: an optimizer step replayed in a CUDA graph counted as Lightning's manual loop
  counts one (``LightningOptimizer._on_before_step`` / ``_on_after_step``).
- :func:`align_step_counts`: the step counts of automatic and manual optimization kept equal across a
  resume (``fit_loop.epoch_loop.automatic_optimization`` / ``manual_optimization``' progress).

``run/checkpoint_callbacks.py`` also overrides ``ModelCheckpoint``'s protected methods
(``_save_checkpoint``, ``_save_last_checkpoint``, ...), the extension points its subclasses use.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.plugins.environments import SLURMEnvironment

__all__ = [
    "FastHookNames",
    "align_step_counts",
    "count_optimizer_step",
    "batch_in_flight",
    "epoch_batch_idx",
    "forget_last_save",
    "last_saved_step",
    "logs_this_step",
    "set_max_steps",
    "slurm_detection_off",
    "throttle_sigterm_broadcast",
    "validates_by_time",
]


class FastHookNames:
    """Mixin for a ``LightningModule`` (listed before it): Lightning sets ``_current_fx_name`` before and
    after every hook it calls, about 36 times a training step, and ``nn.Module.__setattr__`` first
    searches the parameters, buffers and submodules each time. That host time sets the loop's pace below
    the full batch; a hook's name is none of those, so it is set directly."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_current_fx_name":
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)


def count_optimizer_step(optimizer: LightningOptimizer) -> None:
    """Count one optimizer step that ran outside ``LightningOptimizer.step`` (replayed in a CUDA graph) under
    manual optimization: the manual loop's hooks around a step advance ``global_step``."""
    optimizer._on_before_step()
    optimizer._on_after_step()


def align_step_counts(trainer: L.Trainer) -> None:
    """Set both of Lightning's optimizer-step counts, automatic optimization's and manual optimization's, to
    the larger. ``global_step`` reads the one of the module's current kind, and a checkpoint holds both: a
    run resumed under the other kind would otherwise start again at step 0."""
    loop: Any = trainer.fit_loop.epoch_loop
    automatic, manual = loop.automatic_optimization, loop.manual_optimization
    counts = (automatic.optim_progress.optimizer.step, manual.optim_step_progress)
    steps = max(int(progress.total.completed) for progress in counts)
    for progress in counts:
        progress.total.ready = max(int(progress.total.ready), steps)
        progress.total.completed = steps


def logs_this_step(trainer: L.Trainer | None) -> bool:
    """Whether the loggers write this step. ``LightningModule.log`` costs a host->device copy (a sync)
    every call, so the training step logs only on the steps that are written. True when unknown."""
    connector = getattr(trainer, "_logger_connector", None)
    return bool(getattr(connector, "should_update_logs", True))


def set_max_steps(trainer: L.Trainer, steps: int) -> None:
    """End the running fit after ``steps`` optimizer steps (``Trainer.max_steps`` is read-only; the
    epoch loop holds the value the loop checks)."""
    trainer.fit_loop.epoch_loop.max_steps = int(steps)


def throttle_sigterm_broadcast(trainer: L.Trainer, every_n_steps: int) -> None:
    """Run Lightning's cross-rank SIGTERM check every ``every_n_steps`` optimizer steps, not every step.

    Lightning 2.x broadcasts a flag from rank 0 before each training batch under DDP/FSDP and reads it
    back with ``.item()``: a host sync per step, so the host can never queue the next step while the
    GPUs run this one. The check is kept (a SIGTERM stops all ranks together) on steps that every rank
    shares, so the collective stays matched."""
    loop: Any = trainer.fit_loop.epoch_loop
    original = getattr(type(loop), "_broadcast_sigterm_tensor", None)
    if original is None or every_n_steps <= 1:
        return

    def throttled() -> None:
        if trainer.global_step % every_n_steps == 0:
            original(loop)

    loop._broadcast_sigterm_tensor = throttled


def batch_in_flight(trainer: L.Trainer) -> bool:
    """Whether the current training batch was processed but its step is not complete (a checkpoint
    written from ``on_train_batch_end``)."""
    progress = trainer.fit_loop.epoch_loop.batch_progress.current
    return progress.processed > progress.completed


def epoch_batch_idx(trainer: L.Trainer) -> int:
    """The epoch loop's batch index."""
    return int(trainer.fit_loop.epoch_loop.batch_idx)


def last_saved_step(callback: ModelCheckpoint) -> int:
    """The global step ``callback`` last wrote a checkpoint at (-1 after :func:`forget_last_save`)."""
    return int(callback._last_global_step_saved)


def forget_last_save(callback: ModelCheckpoint) -> None:
    """Make ``callback`` write again at a step it already wrote (it skips a step it has saved)."""
    callback._last_global_step_saved = -1


def validates_by_time(trainer: Any) -> bool:
    """Whether the trainer validates after a duration (``val_check_interval`` as a time), not after a
    number of batches."""
    return getattr(trainer, "_val_check_time_interval", None) is not None


@contextmanager
def slurm_detection_off() -> Iterator[None]:
    """Lightning treats the process as a SLURM job for the duration as if it were not one.

    Under SLURM, ``trainer.validate(ckpt_path=None)`` loads the run's newest ``hpc_ckpt_<n>.ckpt`` (what a
    requeued job resumed from) instead of the weights in memory."""
    with mock.patch.object(SLURMEnvironment, "detect", staticmethod(lambda: False)):
        yield
