"""Learning-rate schedules."""

from __future__ import annotations

from collections.abc import Callable

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from nerf_lightning.models.clock import TrainingClock


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


def on_clock(optimizer: Optimizer, clock: TrainingClock, scheduler: LRScheduler | None = None) -> LambdaLR:
    """``scheduler`` read on the training clock: optimizer step ``s`` runs with the schedule's factor at the
    clock's reference position of ``s``, times the batch rule's learning-rate factor there
    (``TrainingClock.lr_factor``, the warm-up included); no scheduler: the rule's factor alone.

    The schedule must be a :class:`~torch.optim.lr_scheduler.LambdaLR` (every schedule of this module is:
    its factor is a function of the step that can be read at any position) built on ``optimizer``, with
    ``total_steps`` in reference steps (``clock.total``)."""
    if scheduler is None:
        inner: list[Callable[[float], float]] = [lambda _: 1.0] * len(optimizer.param_groups)
    elif isinstance(scheduler, LambdaLR):
        inner = list(scheduler.lr_lambdas)
    else:
        raise ValueError(
            f"model.scheduler: data.batch_scaling={clock.rule.name} reads the schedule at reference "
            f"positions, which needs a LambdaLR schedule (as models/schedules.py makes); got "
            f"{type(scheduler).__name__}"
        )

    def on_positions(factor: Callable[[float], float]) -> Callable[[int], float]:
        def at(step: int) -> float:
            position = clock.position(step)
            return factor(position) * clock.lr_factor(position)

        return at

    return LambdaLR(optimizer, [on_positions(f) for f in inner])
