"""Batch rules for measuring on one GPU what N GPUs do (research only; the product's rules are
``nerf_lightning/training/batch_rules.py``).

``imitated(rule, ranks)`` is the product rule ``rule`` with each rank drawing ``ranks`` reference batches:
one GPU then draws what ``ranks`` GPUs draw together, with the learning rate, the schedules and the run
length of that many GPUs. Their gradients are the same mean over the same number of rays (DDP averages
the ranks' means, one GPU takes the mean of one batch ``ranks`` times as large); only the ray order
differs. A training command selects it with :func:`overrides`.
"""

from __future__ import annotations

from dataclasses import replace

from nerf_lightning.training import batch_rules
from nerf_lightning.training.batch_rules import BatchRule

__all__ = ["imitated", "overrides"]

RULES = ("per_device", "large_batch", "throughput")


def imitated(rule: str = "large_batch", ranks: float = 2.0, lr_warmup: float | None = None) -> BatchRule:
    """``rule`` (a product rule's name; ``auto`` reads as the rule it picks on ``ranks`` GPUs) with each
    rank drawing ``ranks`` reference batches; ``lr_warmup`` overrides the rule's warm-up."""
    if rule == "auto":
        rule = "large_batch" if 1 < ranks <= batch_rules.AUTO_MAX_K else "per_device"
    if rule not in RULES:
        raise ValueError(f"benchmarks.batch_rules.imitated: rule is one of {RULES} or auto, got {rule!r}")
    made = getattr(batch_rules, rule)()
    warmup = made.lr_warmup if lr_warmup is None else float(lr_warmup)
    return replace(made, name=f"{rule}x{ranks:g}", rank_multiple=float(ranks), lr_warmup=warmup)


def overrides(rule: str, ranks: float) -> tuple[str, ...]:
    """The training command's overrides that train under :func:`imitated` ``(rule, ranks)``."""
    return (
        "batch_rule._target_=benchmarks.batch_rules.imitated",
        f"+batch_rule.rule={rule}",
        f"+batch_rule.ranks={ranks:g}",
    )
