"""Stop a diverged training run: NaN/inf loss or weights end it with one line and exit status 3.

A learning rate far too high (``model.optimizer.lr=1e30``) turns every weight into NaN or inf within
a few steps, yet the run would go on to the end, validate at a meaningless PSNR and exit 0. The
:class:`DivergenceGuard` (always on, added by ``nerf_lightning.train``) stops it instead — without a
host synchronization in the training step:

- each step, it keeps a reference to the step's loss, the detached copy Lightning already makes of
  it (no kernel, no copy, no sync);
- every ``check_every_n_steps`` optimizer steps (default: ``trainer.log_every_n_steps``, steps at which
  the loggers read device values anyway) it checks those losses and every weight on the device and
  reads one flag. The weights are part of it because a NaN field can leave a finite loss: under the
  sample budget no ray then has a valid sample and the step's loss is 0. A scan of the 2^19 x 16
  table costs tens of microseconds on a GPU, once per check;
- before every checkpoint is written (``last.ckpt``, the best, SLURM's ``hpc_ckpt``), before each
  validation and at the end of training it also checks every floating-point parameter and buffer
  (hash table, MLPs, occupancy grid): one read per checkpoint. A checkpoint with non-finite weights
  is never written, so ``last.ckpt`` keeps the last finite state.

A non-finite value raises :class:`~nerf_lightning.errors.Diverged` naming the first bad step (or
tensor) and suggesting a lower learning rate. Under DDP/FSDP every rank checks at the same steps and
the ranks agree on the verdict (one small all-reduce at those steps).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor

from nerf_lightning.errors import Diverged

__all__ = ["DivergenceGuard"]


class DivergenceGuard(L.Callback):
    """Raises :class:`Diverged` when the training loss or the model's weights stop being finite.

    Args:
        check_every_n_steps: optimizer steps between two checks of the recorded losses (``None``:
            ``trainer.log_every_n_steps``).
    """

    #: losses recorded without a check at most (a bound on memory with long accumulation)
    MAX_PENDING = 4096

    def __init__(self, check_every_n_steps: int | None = None) -> None:
        if check_every_n_steps is not None and check_every_n_steps < 1:
            raise ValueError(f"check_every_n_steps must be >= 1 or None, got {check_every_n_steps}")
        self.check_every_n_steps = check_every_n_steps
        self._losses: list[Tensor] = []
        self._steps: list[int] = []

    def _every(self, trainer: L.Trainer) -> int:
        return int(self.check_every_n_steps or trainer.log_every_n_steps or 50)

    # ------------------------------------------------------------------------------ hooks
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, Tensor):
            self._losses.append(loss)
            self._steps.append(int(trainer.global_step))
        stepped = (batch_idx + 1) % trainer.accumulate_grad_batches == 0
        due = stepped and trainer.global_step % self._every(trainer) == 0
        if due:
            self.check(trainer, pl_module, weights=True)
        elif len(self._losses) >= self.MAX_PENDING:
            self.check(trainer, pl_module, weights=False)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            self.check(trainer, pl_module, weights=True)

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            self.check(trainer, pl_module, weights=True, writing=True)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check(trainer, pl_module, weights=True)

    # ------------------------------------------------------------------------------ the check
    def check(
        self, trainer: L.Trainer, pl_module: L.LightningModule, weights: bool, writing: bool = False
    ) -> None:
        """Check the losses recorded since the last check (and, with ``weights``, every floating-point
        parameter and buffer); raise :class:`Diverged` on a non-finite value. One host read."""
        losses, steps = self._losses, self._steps
        self._losses, self._steps = [], []
        flags: list[Tensor] = []
        if losses:
            bad_losses = ~torch.isfinite(torch.stack([t.detach().float().reshape(()) for t in losses]))
            flags.append(bad_losses.any())
        tensors = _weights(pl_module) if weights else []
        flags += [~torch.isfinite(t.detach()).all() for _, t in tensors]
        if not flags:
            return
        bad = torch.stack([f.to(flags[0].device) for f in flags]).any().float()
        if trainer.world_size > 1:  # every rank stops, or none (rank 0 may be fine while rank 1 is not)
            bad = trainer.strategy.reduce(bad, reduce_op="max")
        if not bool(bad):  # the one host read
            return
        raise Diverged(self._message(trainer, pl_module, losses, steps, tensors, writing))

    def _message(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        losses: list[Tensor],
        steps: list[int],
        tensors: list[tuple[str, Tensor]],
        writing: bool,
    ) -> str:
        now = int(trainer.global_step)
        what, first_bad = f"training diverged at step {now}", now
        for loss, step in zip(losses, steps, strict=True):
            value = float(loss.detach().float())
            if not math.isfinite(value):
                shown = "NaN" if math.isnan(value) else f"{value:g}"
                what, first_bad = f"training diverged: the loss was {shown} at step {step}", step
                break
        else:
            names = non_finite(tensors)
            if names:
                what = f"training diverged: NaN/inf in {first_names(names)} at step {now}"
            elif trainer.world_size > 1:
                what = f"training diverged on another rank (checked at step {now})"
        notes = []
        if first_bad != now:  # how far the run went on: at most check_every_n_steps further
            max_steps = getattr(trainer, "max_steps", None)
            of = f" of {max_steps}" if max_steps and max_steps > 0 else ""
            notes.append(f"stopped at step {now}{of}")
        if writing:
            notes.append(
                "its checkpoint was not written" if notes else "the checkpoint of that step was not written"
            )
        return what + (f" ({'; '.join(notes)})" if notes else "") + f"; {_lr_advice(trainer)}"


def non_finite(named: list[tuple[str, Tensor]]) -> list[str]:
    """The names of the floating-point tensors of ``named`` that hold a NaN or an infinity (one host
    read for all of them)."""
    tensors = [(n, t) for n, t in named if isinstance(t, Tensor) and t.is_floating_point() and t.numel() > 0]
    if not tensors:
        return []
    flags = [~torch.isfinite(t.detach()).all() for _, t in tensors]
    read = torch.stack([f.to(flags[0].device) for f in flags]).cpu().tolist()
    return [name for (name, _), bad in zip(tensors, read, strict=True) if bad]


def first_names(names: list[str], shown: int = 3) -> str:
    """``a, b, c and 2 more``: the first ``shown`` of ``names`` for a one-line message."""
    rest = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {rest} more" if rest > 0 else "")


def _weights(pl_module: L.LightningModule) -> list[tuple[str, Tensor]]:
    """Every floating-point parameter and buffer of the module (what a checkpoint stores of it)."""
    named = itertools.chain(pl_module.named_parameters(), pl_module.named_buffers())
    return [(n, t) for n, t in named if t.is_floating_point() and t.numel() > 0]


def _lr_advice(trainer: L.Trainer) -> str:
    """``lower the learning rate (model.optimizer.lr=0.01 now), e.g. model.optimizer.lr=0.001``."""
    optimizers = getattr(trainer, "optimizers", None) or []
    if not optimizers:
        return "lower the learning rate (model.optimizer.lr)"
    group = optimizers[0].param_groups[0]
    lr = float(group.get("initial_lr", group.get("lr", 0.0)))
    suggestion = lr / 10 if lr <= 0.1 else 0.01  # 0.01: instant-ngp's
    return f"lower the learning rate (model.optimizer.lr={lr:g} now), e.g. model.optimizer.lr={suggestion:g}"
