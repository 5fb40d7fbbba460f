"""instant-ngp's ``Ema`` optimizer as a Lightning callback, for the A/B of issue 64: the field renders with
an exponential moving average of its weights while it trains with the weights themselves.

    python -m nerf_lightning.train ... +callbacks.weight_ema._target_=benchmarks.weight_ema.WeightEMA \
        [+callbacks.weight_ema.decay=0.95]

tiny-cuda-nn's ``EmaOptimizer`` (``include/tiny-cuda-nn/optimizers/ema.h``, which instant-ngp's
``configs/nerf/base.json`` wraps around Adam with ``decay`` 0.95) keeps, after every optimizer step k,
``ema_k = decay * ema_{k-1} + (1 - decay) * w_k`` from ``ema_0 = 0``, divided by ``1 - decay**k`` (the
debiasing), and hands those weights to inference. This callback does the same for the field's parameters:
it updates the average after each optimizer step and swaps it into the field for every validation and
test pass (the final evaluation of the train app included), then swaps the trained weights back.

A research tool: the checkpoints keep the trained weights (``eval`` of a checkpoint renders without the
average), so a run's own final evaluation is the number to read.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import Tensor

__all__ = ["WeightEMA"]


class WeightEMA(L.Callback):
    """Render with the debiased exponential moving average of the field's weights (``decay`` per step)."""

    def __init__(self, decay: float = 0.95) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"callbacks.weight_ema.decay: expected a number in (0, 1), got {decay!r}")
        self.decay = float(decay)
        self.steps = 0
        self._average: list[Tensor] | None = None  # float32, not debiased
        self._trained: list[Tensor] | None = None  # the trained weights while the average renders

    @staticmethod
    def _weights(pl_module: L.LightningModule) -> list[Tensor]:
        return [p.detach() for p in pl_module.field.parameters()]

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches != 0:
            return  # only after a real optimizer step
        weights = self._weights(pl_module)
        if self._average is None:
            self._average = [torch.zeros_like(w, dtype=torch.float32) for w in weights]
        self.steps += 1
        with torch.no_grad():  # avg += (1 - decay) * (w - avg): one multi-tensor launch, no host sync
            torch._foreach_lerp_(self._average, [w.float() for w in weights], 1.0 - self.decay)

    def averaged(self) -> list[Tensor]:
        """The debiased average of each field parameter (float32)."""
        if self._average is None:
            raise RuntimeError("WeightEMA: no optimizer step has run yet")
        scale = 1.0 / (1.0 - self.decay**self.steps)
        return [avg * scale for avg in self._average]

    def _swap_in(self, pl_module: L.LightningModule) -> None:
        if self._average is None or self._trained is not None:
            return
        weights = self._weights(pl_module)
        self._trained = [w.clone() for w in weights]
        with torch.no_grad():
            for w, avg in zip(weights, self.averaged(), strict=True):
                w.copy_(avg)  # in place: a captured CUDA graph keeps reading the same tensors

    def _swap_out(self, pl_module: L.LightningModule) -> None:
        if self._trained is None:
            return
        with torch.no_grad():
            for w, trained in zip(self._weights(pl_module), self._trained, strict=True):
                w.copy_(trained)
        self._trained = None

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._swap_in(pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._swap_out(pl_module)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._swap_in(pl_module)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._swap_out(pl_module)

    def summary(self) -> dict[str, float]:
        """``metrics.json``: the decay and the steps averaged."""
        return {"weight_ema/decay": self.decay, "weight_ema/steps": float(self.steps)}
