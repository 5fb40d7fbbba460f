"""Checkpoints that resume exactly and that rebuild the model on their own.

Two callbacks, both added by ``nerf_lightning.train``:

- :class:`LastCheckpoint` (config ``callbacks.last_checkpoint``): ``<run>/checkpoints/last.ckpt``
  every ``every_n_seconds`` of training (or every ``every_n_train_steps`` optimizer steps), after
  every validation during ``fit``, at the end of training and when SIGTERM stops training (at the
  end of the step it arrived in), always overwritten in place (written
  atomically by ``run.checkpoint_io.AtomicCheckpointIO``: a kill during the write leaves the
  previous file). It is a plain file, never a symlink (Lightning's ``save_last="link"`` is not
  used).
- :class:`RunState` (always on, not a config entry): stores in every checkpoint, under
  ``checkpoint["nerf_lightning"]``, the run's resolved config as plain data (``config``), the
  keyword arguments ``train`` added when instantiating (``instantiate_kwargs``, e.g. the capture's
  ``aabb_scale``), and what Lightning does not save but an exact resume needs: the RNG state and
  whether the checkpoint was taken in the middle of a batch's end-of-step hooks. See
  :func:`nerf_lightning.run.restore.load_run` for the reading side.

Why the mid-batch flag: Lightning calls the callbacks' ``on_train_batch_end`` (a step-triggered
checkpoint is written there) *before* the LightningModule's own ``on_train_batch_end`` (where
``NeRFModule`` updates the occupancy grid and steps the ray sampler). Such a checkpoint holds the
weights and optimizer after step N but the grid and sampler before their step-N update, and
Lightning resumes it as if batch N had completed. On resume :class:`RunState` therefore runs the
module's ``on_train_batch_end`` for batch N once, after restoring the RNG state of the moment the
checkpoint was taken, so the resumed run continues exactly as the uninterrupted one (bit for bit on
one CPU process; per-rank random streams are reseeded under DDP, see below).

Every value stored is a tensor, a number, a string, a list or a dict: the checkpoint loads with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from time import monotonic
from typing import Annotated, Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from nerf_lightning.config_keys import check_arguments
from nerf_lightning.config_schema import Note, Range
from nerf_lightning.lightning_compat import (
    batch_in_flight,
    epoch_batch_idx,
    forget_last_save,
    last_saved_step,
)
from nerf_lightning.utils.io import remove_stale_temporaries

__all__ = ["CHECKPOINT_KEY", "FORMAT_VERSION", "LastCheckpoint", "RunState"]

log = logging.getLogger(__name__)

#: key of our section in the checkpoint dict
CHECKPOINT_KEY = "nerf_lightning"
#: version of that section's layout
FORMAT_VERSION = 1


class LastCheckpoint(ModelCheckpoint):
    """``last.ckpt`` on a wall-clock (or step) cadence, after each validation and at the end of training.

    Why wall-clock by default: a write costs the same fraction of training on any device only when
    it is spaced in time. A fixed step count that suits a CPU writes a large file every few seconds
    on a fast GPU (``docs/checkpoints.md``).

    Args:
        dirpath: folder of ``last.ckpt`` (``<run>/checkpoints``).
        every_n_seconds: seconds of training between two writes (the work a crash can lose); the
            clock is read every ``check_every_n_steps`` optimizer steps, and under DDP rank 0's
            reading decides for all ranks (one small broadcast at those steps only: Lightning's own
            ``train_time_interval`` broadcasts at every step). ``None``: no time trigger.
        every_n_train_steps: a fixed number of optimizer steps between two writes instead; when
            set (> 0), it replaces the time trigger.
        check_every_n_steps: optimizer steps between two readings of the clock.
        **kwargs: other ``ModelCheckpoint`` arguments.
    """

    def __init__(
        self,
        dirpath: str,
        every_n_seconds: Annotated[float | None, Range(low=0), Note("null: no time trigger")] = 60.0,
        every_n_train_steps: Annotated[int | None, Range(low=0), Note("null: the time trigger")] = None,
        check_every_n_steps: Annotated[int, Range(low=1)] = 100,
        **kwargs: Any,
    ) -> None:
        check_arguments(LastCheckpoint, locals())
        kwargs.setdefault("save_on_train_epoch_end", False)
        steps = int(every_n_train_steps or 0)
        super().__init__(
            dirpath=dirpath,
            every_n_train_steps=steps,
            every_n_epochs=0,  # epoch ends are not a trigger: validation and the time/steps are
            save_top_k=0,
            monitor=None,
            save_last=True,
            enable_version_counter=False,  # resuming into the same folder overwrites last.ckpt
            **kwargs,
        )
        self.every_n_seconds = None if steps > 0 else every_n_seconds
        self.check_every_n_steps = int(check_every_n_steps)
        #: monotonic() of the last write (or of the start of training)
        self._last_write = 0.0
        #: global step of the last write made inside on_train_batch_end (before the module's hooks)
        self._mid_batch_step: int | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if trainer.is_global_zero and self.dirpath and Path(self.dirpath).is_dir():
            for tmp in remove_stale_temporaries(self.dirpath):
                log.info("removed %s (a checkpoint write interrupted by a crash)", tmp)

    @property
    def state_key(self) -> str:
        return self._generate_state_key(kind="last", every_n_train_steps=self._every_n_train_steps)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._last_write = monotonic()

    def _time_is_due(self, trainer: L.Trainer) -> bool:
        if self.every_n_seconds is None or trainer.global_step % self.check_every_n_steps != 0:
            return False
        if self._should_skip_saving_checkpoint(trainer):  # the same answer on every rank
            return False
        due = monotonic() - self._last_write >= self.every_n_seconds
        if trainer.world_size > 1:
            due = bool(trainer.strategy.broadcast(due))
        return due

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        super()._save_checkpoint(trainer, filepath)
        self._last_write = monotonic()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        super().on_train_batch_end(trainer, pl_module, *args)  # the step trigger, when set
        if self._time_is_due(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
        if last_saved_step(self) == trainer.global_step:
            self._mid_batch_step = trainer.global_step

    def _save_last_now(self, trainer: L.Trainer) -> None:
        # A write from on_train_batch_end of this same step predates the module's end-of-step
        # update (resumable, see RunState); now that the step is complete, write it again so that
        # eval/render/export of last.ckpt see exactly the model training ended with.
        if self._mid_batch_step == trainer.global_step and trainer.state.fn == TrainerFn.FITTING:
            forget_last_save(self)
        if not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
            self._mid_batch_step = None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save_last_now(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save_last_now(trainer)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        # SIGTERM (preemption, `timeout`, eviction): Lightning stops at the end of the current step
        # (or validation batch); write last.ckpt now, so that ckpt_path=last continues from here.
        if isinstance(exception, SIGTERMException) and trainer.state.fn == TrainerFn.FITTING:
            self._save_last_now(trainer)


class RunState(Callback):
    """Puts the run's config and resume state into every checkpoint; restores the state on resume.

    Args:
        config: the run's resolved config, plain data (``OmegaConf.to_container(cfg, resolve=True)``).
        instantiate_kwargs: per config node, the keyword arguments ``train`` passed to
            ``hydra.utils.instantiate`` besides the config (``{"model": {"aabb_scale": 4}}``).
        seed: the run's seed; under DDP, or when the world size changed, each rank's RNG is
            reseeded from (seed, rank, step) on resume instead of restored.
    """

    def __init__(
        self,
        config: dict[str, Any],
        instantiate_kwargs: dict[str, dict[str, Any]] | None = None,
        seed: int = 0,
    ) -> None:
        self.config = config
        self.instantiate_kwargs = instantiate_kwargs or {}
        self.seed = int(seed)
        self._resume: dict[str, Any] | None = None

    # ---------------------------------------------------------------------------- saving
    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        mid_batch_end = trainer.state.fn == TrainerFn.FITTING and batch_in_flight(trainer)
        rng: dict[str, Any] = {"torch": torch.get_rng_state()}
        if pl_module.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(pl_module.device)
        checkpoint[CHECKPOINT_KEY] = {
            "format": FORMAT_VERSION,
            "config": self.config,
            "instantiate_kwargs": self.instantiate_kwargs,
            "resume": {
                "world_size": int(trainer.world_size),
                "rng": rng,
                "replay_train_batch_end": bool(mid_batch_end),
                "batch_idx": epoch_batch_idx(trainer),
            },
        }

    # --------------------------------------------------------------------------- resuming
    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        section = checkpoint.get(CHECKPOINT_KEY) or {}
        self._resume = section.get("resume")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After NeRFModule.on_fit_start (which seeds each rank), before the first resumed batch.
        state, self._resume = self._resume, None
        if state is None:
            return
        if trainer.world_size == 1 and state.get("world_size") == 1:
            torch.set_rng_state(state["rng"]["torch"])
            if "cuda" in state["rng"] and pl_module.device.type == "cuda":
                torch.cuda.set_rng_state(state["rng"]["cuda"], pl_module.device)
        else:  # one saved stream cannot serve several ranks: distinct, reproducible per-rank streams
            torch.manual_seed((self.seed * 1_000_003 + trainer.global_step) * 1009 + trainer.global_rank)
        if state.get("replay_train_batch_end"):
            log.info("resume: finishing step %d (end-of-step hooks)", trainer.global_step)
            pl_module.on_train_batch_end(None, None, int(state["batch_idx"]))
