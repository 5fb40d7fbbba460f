"""Per-rank compute speed under DDP: imbalance warning, work split by speed (batch_rule=throughput).

Under data parallelism every rank waits for the slowest at each gradient all-reduce, so wall-clock
step times are equal and hide a slow rank (an older GPU, a shared node, thermal throttling). This
callback times what each rank computes before it can wait: the forward pass of the training step
(batch start to ``on_before_backward``; CUDA events on a GPU, read once per window so that the step
never waits for the device). Every ``every_n_steps`` optimizer steps the per-rank times are
gathered and:

- logged as ``perf/rank{r}/forward_ms`` and ``perf/forward_imbalance`` (slowest / fastest);
- if the imbalance exceeds ``warn_imbalance`` (20 %), ONE warning names the slow rank;
- under ``batch_rule=throughput`` each rank's work share (mean 1 over the ranks,
  ``NeRFModule.set_work_scale``) is moved towards equal forward times at every window, so a slower
  rank gets less work and every rank's step takes about as long.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any

import lightning as L
import torch

from nerf_lightning.config_keys import check_arguments
from nerf_lightning.config_schema import Injected, Range
from nerf_lightning.training.feedback import TrainingFeedback

log = logging.getLogger(__name__)


class LoadBalancer(L.Callback):
    """See the module docstring.

    Args:
        every_n_steps: optimizer steps per measurement window.
        warn_imbalance: relative forward-time spread above which one warning is printed.
        momentum: damping of each share update (0: move all the way to equal times at once).
        min_share / max_share: bounds of a rank's work share (the model's headroom caps it too).
        feedback: the run's :class:`~nerf_lightning.training.feedback.TrainingFeedback` (the train
            app passes it): whether ``batch_rule=throughput`` splits the work. None: it does not.
    """

    def __init__(
        self,
        every_n_steps: Annotated[int, Range(low=1)] = 25,
        warn_imbalance: Annotated[float, Range(low=0)] = 0.2,
        momentum: Annotated[float, Range(low=0, below=1)] = 0.5,
        min_share: Annotated[float, Range(above=0, high=1)] = 0.25,
        max_share: Annotated[float, Range(low=1)] = 1.5,
        feedback: Annotated[TrainingFeedback | None, Injected("the train app: the run's feedback")] = None,
    ) -> None:
        check_arguments(LoadBalancer, locals())
        self.feedback = feedback
        self.every_n_steps = int(every_n_steps)
        self.warn_imbalance = float(warn_imbalance)
        self.momentum = float(momentum)
        self.min_share, self.max_share = float(min_share), float(max_share)
        self.share = 1.0
        self.imbalance = 1.0
        self.imbalances: list[float] = []
        self._warned = False
        self._pending: list[tuple[Any, Any]] = []  # CUDA event pairs of this window
        self._seconds = 0.0
        self._steps = 0
        self._t0: float | None = None
        self._start: Any = None

    def _active(self, trainer: L.Trainer) -> bool:
        return trainer.world_size > 1

    def inert(self, trainer: L.Trainer) -> bool:
        """One process has no ranks to compare (the train app then drops it: run/loop.py)."""
        return not self._active(trainer)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if not self._active(trainer):
            return
        if pl_module.device.type == "cuda":
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Any) -> None:
        if not self._active(trainer):
            return
        if self._start is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((self._start, end))
            self._start = None
        elif self._t0 is not None:
            self._seconds += time.perf_counter() - self._t0
            self._t0 = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if not self._active(trainer):
            return
        self._steps += 1
        step = trainer.global_step
        if step == 0 or step % self.every_n_steps != 0 or self._steps < self.every_n_steps:
            return
        for start, end in self._pending:  # one sync per window
            end.synchronize()
            self._seconds += start.elapsed_time(end) / 1e3
        self._pending.clear()
        local = torch.tensor(
            [self._seconds, self._steps, self.share], dtype=torch.float64, device=pl_module.device
        )
        record = trainer.strategy.all_gather(local.to(pl_module.device)).reshape(trainer.world_size, 3).cpu()
        self._seconds, self._steps = 0.0, 0
        self._update(trainer, pl_module, record)

    def _update(self, trainer: L.Trainer, pl_module: L.LightningModule, record: torch.Tensor) -> None:
        """``record`` [W, 3]: per rank (forward seconds, steps, share) of the window."""
        seconds, steps, shares = record[:, 0].clamp_min(1e-9), record[:, 1].clamp_min(1.0), record[:, 2]
        per_step = seconds / steps
        self.imbalance = float(per_step.max() / per_step.min().clamp_min(1e-12))
        self.imbalances.append(self.imbalance)
        metrics = {f"perf/rank{r}/forward_ms": float(per_step[r]) * 1e3 for r in range(record.shape[0])}
        metrics["perf/forward_imbalance"] = self.imbalance
        if trainer.is_global_zero:
            for lg in trainer.loggers:
                lg.log_metrics(metrics, step=trainer.global_step)
        by_throughput = self.feedback is not None and self.feedback.splits_by_throughput
        if self.imbalance - 1.0 > self.warn_imbalance and not self._warned and not by_throughput:
            self._warned = True
            if trainer.is_global_zero:
                slow = int(per_step.argmax())
                log.warning(
                    "rank %d computes its step %.2fx slower than the fastest rank; every rank waits for it. "
                    "Check that the GPUs match and are not shared, or set batch_rule=throughput "
                    "to give each rank work in proportion to its speed.",
                    slow,
                    self.imbalance,
                )
        if by_throughput and hasattr(pl_module, "set_work_scale"):
            # Every rank computes the same new split from the gathered record: each share moves by
            # (mean time / its time)^(1 - momentum), then the shares are renormalized to mean 1.
            # Multiplicative steps on the times themselves converge whatever the per-step overhead.
            new = shares * (per_step.mean() / per_step) ** (1.0 - self.momentum)
            new = (new / new.mean()).clamp(self.min_share, self.max_share)
            self.share = float(new[trainer.global_rank])
            pl_module.set_work_scale(self.share)

    def summary(self) -> dict[str, float]:
        """For ``metrics.json`` (under DDP): the forward-time imbalance of the first window and the
        median of the last three."""
        if not self.imbalances:
            return {}
        recent = sorted(self.imbalances[-3:])  # median of the last windows: one noisy window is not news
        return {
            "perf/forward_imbalance": recent[len(recent) // 2],
            "perf/forward_imbalance_first": self.imbalances[0],
        }
