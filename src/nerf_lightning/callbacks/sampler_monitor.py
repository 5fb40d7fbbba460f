"""The ray sampler's per-view probabilities on the loggers (how hard each training view is)."""

from __future__ import annotations

import math
from typing import Annotated, Any

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger

from nerf_lightning.config_keys import check_arguments
from nerf_lightning.config_schema import Injected, Range
from nerf_lightning.training.feedback import TrainingFeedback


class SamplerMonitor(L.Callback):
    """Logs the ray sampler's ``view_probabilities()`` every ``every_n_steps`` and at the end.

    Scalars for every logger: ``sampler/view_prob_min``, ``sampler/view_prob_max`` and
    ``sampler/effective_views`` (``exp(entropy)``: V when uniform, 1 when one view takes all the rays).
    W&B also gets ``sampler/view_probabilities`` as a histogram and, at the end of training, a bar chart
    (table ``view | probability``). The probabilities are identical on every rank (the sampler syncs
    them), so rank 0 logs; the read is one small device->host copy, outside the hot path.

    Args:
        every_n_steps: optimizer steps between logs (0: only at the end of training).
        feedback: the run's :class:`~nerf_lightning.training.feedback.TrainingFeedback` (the train
            app passes it), through which the sampler is read. None: nothing is logged.
    """

    def __init__(
        self,
        every_n_steps: Annotated[int, Range(low=1)] = 500,
        feedback: Annotated[TrainingFeedback | None, Injected("the train app: the run's feedback")] = None,
    ) -> None:
        check_arguments(SamplerMonitor, locals())
        self.every_n_steps = int(every_n_steps)
        self.feedback = feedback

    def _probs(self) -> torch.Tensor | None:
        probs = self.feedback.view_probabilities() if self.feedback is not None else None
        return probs.detach().to("cpu", torch.float64) if probs is not None else None

    @staticmethod
    def stats(probs: torch.Tensor) -> dict[str, float]:
        """Summary scalars of a probability vector ``[V]`` (float, sums to 1)."""
        p = probs.clamp_min(0)
        p = p / p.sum().clamp_min(1e-30)
        entropy = float(-(p * p.clamp_min(1e-30).log()).sum())
        return {"sampler/view_prob_min": float(p.min()), "sampler/view_prob_max": float(p.max()),
                "sampler/effective_views": math.exp(entropy)}

    def _log(self, trainer: L.Trainer, final: bool) -> None:
        if not trainer.is_global_zero:
            return
        probs = self._probs()
        if probs is None or probs.numel() == 0:
            return
        step = trainer.global_step
        for lg in trainer.loggers:
            lg.log_metrics(self.stats(probs), step=step)
            if isinstance(lg, WandbLogger):
                self._log_wandb(lg, probs, step, final)

    @staticmethod
    def _log_wandb(lg: Any, probs: torch.Tensor, step: int, final: bool) -> None:
        import wandb

        values = probs.tolist()
        payload: dict[str, Any] = {"sampler/view_probabilities": wandb.Histogram(values)}
        if final:
            table = wandb.Table(data=[[i, v] for i, v in enumerate(values)], columns=["view", "probability"])
            payload["sampler/view_probabilities_final"] = wandb.plot.bar(
                table, "view", "probability", title="view-sampling probabilities")
        lg.log_metrics(payload, step=step)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if self.every_n_steps > 0 and step > 0 and step % self.every_n_steps == 0:
            self._log(trainer, final=False)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer, final=True)
