"""The optimizer and learning-rate schedule of a :class:`~nerf_lightning.models.module.NeRFModule`:
parameter groups, the batch rule's decay, the per-view groups' own schedules, the training clock."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from nerf_lightning.training.clock import TrainingClock
from nerf_lightning.training.lr_schedules import on_clock, with_group_lambdas

__all__ = ["configure", "parameter_groups", "rule_decay"]

log = logging.getLogger(__name__)


def parameter_groups(module: Any, total_steps: int = 10_000) -> list[dict[str, Any]]:
    """The optimizer's parameter groups of ``module`` (a ``NeRFModule``): the field's hash table (named
    ``table``), the field's MLPs (``mlp``; the batch rule gives each part its own factor), then one group
    per enabled per-view component (its own learning rate and L2). The layout is the same under every
    rule and world size, so that a checkpoint resumes on any number of GPUs."""
    views = [c.parameter_group(total_steps).as_dict() for c in module.view_components]
    own = {id(p) for g in views for p in g["params"]}
    mlps = {id(p) for p in module.field.mlp_parameters()}
    params: list[nn.Parameter] = list(module.parameters())
    table = [p for p in params if id(p) not in own and id(p) not in mlps]
    mlp = [p for p in params if id(p) in mlps]
    field = [
        {"params": table, "name": "table", "lr_part": "table"},
        {"params": mlp, "name": "mlp", "lr_part": "mlp"},
    ]
    return [*(g for g in field if g["params"]), *views]


def rule_decay(clock: TrainingClock, scheduler_factory: Callable[..., Any] | None) -> dict[str, float]:
    """The batch rule's learning-rate decay (``TrainingClock.decay``) as the scheduler's keywords; none
    when the rule keeps the configured one. A scheduler without ``decay_start`` / ``decay_interval``
    keeps its own schedule, with a warning."""
    decay = clock.decay
    if decay is None or scheduler_factory is None:
        return {}
    accepts = inspect.signature(getattr(scheduler_factory, "func", scheduler_factory)).parameters
    if not {"decay_start", "decay_interval"} <= set(accepts):
        log.warning(
            "batch_rule=%s moves the learning-rate decay to %g of the run (every %g), but "
            "model.scheduler has no decay_start / decay_interval: it keeps its own schedule",
            clock.rule.name, *decay,
        )  # fmt: skip
        return {}
    log.info("batch_rule=%s: the learning-rate decay from %g of the run, every %g", clock.rule.name, *decay)
    return {"decay_start": decay[0], "decay_interval": decay[1]}


def configure(
    module: Any,
    optimizer_factory: Callable[..., torch.optim.Optimizer],
    scheduler_factory: Callable[..., Any] | None,
    clock: TrainingClock,
    total: int,
) -> dict[str, Any]:
    """``configure_optimizers``' result for ``module`` over ``total`` reference steps."""
    groups = parameter_groups(module, total)
    optimizer = optimizer_factory(params=groups)
    # the per-view groups come last; those with a schedule of their own replace the main factor
    components = module.view_components
    first = len(groups) - len(components)
    factors = [c.parameter_group(total).lr_lambda for c in components]
    own = {first + i: f for i, f in enumerate(factors) if f is not None}
    scheduler = None
    if scheduler_factory is not None:
        scheduler = scheduler_factory(
            optimizer=optimizer, total_steps=total, **rule_decay(clock, scheduler_factory)
        )
    if own:
        base = scheduler if scheduler is not None else torch.optim.lr_scheduler.LambdaLR(optimizer, _one)
        scheduler = with_group_lambdas(base, own)
    if not clock.trivial:
        scheduler = on_clock(optimizer, clock, scheduler)
    if scheduler is None:
        return {"optimizer": optimizer}
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _one(step: int) -> float:
    return 1.0
