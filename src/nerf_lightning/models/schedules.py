"""Learning-rate schedules."""

from __future__ import annotations

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def ngp_exponential_decay(
    optimizer: Optimizer,
    total_steps: int,
    decay_start: float = 0.5,
    decay_interval: float = 0.15,
    decay_base: float = 0.33,
    warmup_steps: int = 0,
) -> LambdaLR:
    """instant-ngp's step decay: lr * decay_base ** floor((step - start) / interval) after ``start``.

    instant-ngp uses start 20k / interval 10k steps for a 35k-step run; here ``decay_start`` and
    ``decay_interval`` are fractions of ``total_steps`` (values > 1 are taken as step counts), so the
    same config works for a 1k-step CPU run and a 30k-step GPU run. ``warmup_steps`` ramps linearly.
    """
    total = max(int(total_steps), 1)
    start = decay_start if decay_start > 1 else decay_start * total
    interval = max(decay_interval if decay_interval > 1 else decay_interval * total, 1.0)

    def factor(step: int) -> float:
        ramp = min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0
        if step < start:
            return ramp
        return ramp * decay_base ** (int((step - start) // interval) + 1)

    return LambdaLR(optimizer, factor)
