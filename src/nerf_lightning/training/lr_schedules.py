"""Learning-rate schedules: instant-ngp's step decay, read on the training clock, with per-group factors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from nerf_lightning.config_keys import check_arguments
from nerf_lightning.config_schema import Injected, Range
from nerf_lightning.training.clock import StepsOrFraction, TrainingClock, steps_of


def ngp_exponential_decay(
    optimizer: Annotated[Optimizer, Injected("NeRFModule: its optimizer")],
    total_steps: Annotated[int, Injected("NeRFModule: the run's length in reference steps")],
    decay_start: StepsOrFraction = 0.5,
    decay_interval: StepsOrFraction = 0.15,
    decay_base: Annotated[float, Range(above=0, high=1)] = 0.33,
) -> LambdaLR:
    """instant-ngp's step decay: lr * decay_base ** floor((step - start) / interval) after ``start``.

    instant-ngp uses start 20k / interval 10k steps for a 35k-step run; here ``decay_start`` and
    ``decay_interval`` are fractions of ``total_steps`` (values > 1 are taken as step counts), so the
    same config works for a 1k-step CPU run and a 30k-step GPU run.
    """
    check_arguments(ngp_exponential_decay, locals())
    start = steps_of(decay_start, total_steps)
    interval = max(steps_of(decay_interval, total_steps), 1.0)

    def factor(step: int) -> float:
        if step < start:
            return 1.0
        return decay_base ** (int((step - start) // interval) + 1)

    return LambdaLR(optimizer, factor)


def on_clock(optimizer: Optimizer, clock: TrainingClock, scheduler: LRScheduler | None = None) -> LambdaLR:
    """``scheduler`` read on the training clock: optimizer step ``s`` runs with the schedule's factor at the
    clock's reference position of ``s``, times the batch rule's learning-rate factor there
    (``TrainingClock.lr_factor`` of the group's ``lr_part``, the warm-up included); no scheduler: the
    rule's factor alone.

    The schedule must be a :class:`~torch.optim.lr_scheduler.LambdaLR` (every schedule of this module is:
    its factor is a function of the step that can be read at any position) built on ``optimizer``, with
    ``total_steps`` in reference steps (``clock.total``)."""
    if scheduler is None:
        inner: list[Callable[[float], float]] = [lambda _: 1.0] * len(optimizer.param_groups)
    elif isinstance(scheduler, LambdaLR):
        inner = list(scheduler.lr_lambdas)
    else:
        raise ValueError(
            f"model.scheduler: batch_rule={clock.rule.name} reads the schedule at reference "
            f"positions, which needs a LambdaLR schedule (as training/lr_schedules.py makes); got "
            f"{type(scheduler).__name__}"
        )

    def on_positions(factor: Callable[[float], float], part: str | None) -> Callable[[int], float]:
        def at(step: int) -> float:
            position = clock.position(step)
            return factor(position) * clock.lr_factor(position, part)

        return at

    parts = [g.get("lr_part") for g in optimizer.param_groups]
    return LambdaLR(optimizer, [on_positions(f, part) for f, part in zip(inner, parts, strict=True)])


def exponential_lr_factor(
    lr: float, lr_final: float, decay_steps: float, total_steps: int
) -> Callable[[int], float]:
    """Factor of ``lr`` at each step: log-linear from 1 to ``lr_final / lr`` over ``decay_steps``
    (:func:`steps_of`), then constant (nerfstudio's ``ExponentialDecayScheduler``, which its camera
    optimizer uses); ``lr`` and ``lr_final`` > 0 (the caller's annotations)."""
    length = max(steps_of(decay_steps, total_steps), 1.0)
    ratio = float(lr_final) / float(lr)

    def factor(step: int) -> float:
        return ratio ** min(1.0, step / length)

    return factor


def with_group_lambdas(scheduler: LRScheduler, lambdas: dict[int, Callable[[int], float]]) -> LambdaLR:
    """The ``LambdaLR`` ``scheduler`` with its factor replaced for the parameter groups in ``lambdas``
    (group index -> factor per step); the other groups keep theirs.

    The per-view components (camera corrections) have their own schedule in the same optimizer; one
    ``LambdaLR`` with a factor per group keeps a single scheduler (state dict, Lightning's stepping).
    """
    if not isinstance(scheduler, LambdaLR):
        raise ValueError(
            "model.scheduler: the per-view parameter groups (model.net.camera_opt) need a LambdaLR schedule "
            f"(training/lr_schedules.py) to add their own learning-rate factor to, got "
            f"{type(scheduler).__name__}"
        )
    factors = [lambdas.get(i, fn) for i, fn in enumerate(scheduler.lr_lambdas)]
    # A fresh LambdaLR on the same optimizer: it keeps each group's ``initial_lr`` (set by the first
    # one) and sets the groups' learning rates to initial_lr * factor(0).
    return LambdaLR(scheduler.optimizer, factors)
