"""``grad_exchange=bf16``'s rounding of the gradient on one process, for quality A/Bs without N GPUs."""

from __future__ import annotations

import lightning as L
import torch


class RoundedGradients(L.Callback):
    """Rounds every gradient to bfloat16 and back before the optimizer step: what ``grad_exchange=bf16``
    does to the gradient the optimizer sees, on one process (one GPU drawing N ranks' batch through
    ``benchmarks/batch_rules.py``), so that its effect on quality can be measured without N GPUs.

    DDP's hook rounds each rank's share of the mean and then their bfloat16 sum; this rounds the mean
    once, the same relative error (2^-9) at N = 2 up to one more rounding. Added to a run with
    ``+callbacks.rounded_gradients._target_=benchmarks.rounded_gradients.RoundedGradients``."""

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.copy_(p.grad.to(torch.bfloat16))
