"""The batch rule: how the batch of one optimizer step grows with the ranks, and what the schedules count.

Every default of a run was tuned on one GPU drawing ``data.batch_size`` ray slots with
``model.net.step.sample_budget`` samples: one *reference batch*. On N ranks each rank draws one, so an
optimizer step sees k = N reference batches (times ``accumulate_grad_batches``). The rule says what
follows from that (the config group ``batch_rule``, docs/batch_rule.md):

============== ============================= ====================================== ====================
rule            each rank's batch             learning rate at k reference batches   schedules count
============== ============================= ====================================== ====================
per_device      the reference batch           unchanged                              optimizer steps
throughput      split by measured speed       unchanged                              optimizer steps
large_batch     the reference batch           hash table x k, MLPs x sqrt(k), ramped  rays seen; the lr
                                              up over 256 reference steps            decay from 70 %
auto            ``large_batch`` on several ranks up to k = 2, else ``per_device``
============== ============================= ====================================== ====================

*Rays seen*: a step of k reference batches moves every schedule (learning rate, the sampler's windows,
validation epochs, the run's length ``trainer.max_steps``) by k reference steps, so the schedule
against the rays is that of one GPU. The occupancy grid keeps its cadence in optimizer steps under
every rule (in rays it forgets k times faster per step, and fox collapsed at k = 4). On one process
with the reference batch every rule trains exactly as ``per_device`` (``TrainingClock.trivial``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

__all__ = ["AUTO_MAX_K", "BatchRule", "auto", "large_batch", "per_device", "throughput"]

#: ``auto`` takes ``large_batch`` up to this many reference batches per optimizer step: lego reaches
#: 36.2 dB on 2 GPUs in a predicted 0.53x the 1-GPU time; at k = 3 fox ends 0.23 dB below k = 1.
AUTO_MAX_K = 2.0
#: ``large_batch``'s learning-rate decay, (start, interval) as fractions of the run (the default
#: schedule's are 0.5 and 0.15): k x the batch takes k x fewer steps, and the high rate needs more of
#: them before the decay.
LATE_DECAY = (0.7, 0.1)
_SCALINGS = ("none", "sqrt", "linear")
_EPS = 1e-9


@dataclass(frozen=True)
class BatchRule:
    """One row of the module docstring's table.

    Attributes:
        name: the ``batch_rule`` choice.
        split: ``per_device`` (every rank draws the reference batch) or ``throughput`` (the ranks' work
            follows their measured speed, ``callbacks/load_balance.py``).
        lr_scaling: the hash table's learning-rate factor of k: ``none``, ``sqrt`` or ``linear``.
        mlp_lr_scaling: the MLPs' factor of k where it differs from the table's (Adam moves a table row
            about once per step it is touched, whatever the rays behind it; the MLPs see every ray);
            None: the table's.
        unit: ``steps`` or ``rays``: what the schedules count.
        decay: ``(start, interval)`` of the learning-rate decay at k > 1 (``model.scheduler``'s
            ``decay_start`` / ``decay_interval``); None: the configured ones.
        lr_warmup: reference steps over which a scaled learning rate ramps up from the base rate.
        rank_multiple: each rank's batch as a multiple of the reference batch (1 for every rule of
            the product; ``benchmarks/`` makes one GPU draw what N draw with N).
        auto: resolve to ``large_batch`` or ``per_device`` once the world size is known.
    """

    name: str
    split: str = "per_device"
    lr_scaling: str = "none"
    mlp_lr_scaling: str | None = None
    unit: str = "steps"
    decay: tuple[float, float] | None = None
    lr_warmup: float = 256.0
    rank_multiple: float = 1.0
    auto: bool = False

    def __post_init__(self) -> None:
        if self.split not in ("per_device", "throughput"):
            raise ValueError(f"batch_rule {self.name}: split is per_device or throughput, got {self.split!r}")
        for scaling in (self.lr_scaling, self.mlp_lr_scaling or "none"):
            if scaling not in _SCALINGS:
                raise ValueError(f"batch_rule {self.name}: a learning-rate scaling is one of {_SCALINGS}")
        if self.unit not in ("steps", "rays"):
            raise ValueError(f"batch_rule {self.name}: unit must be steps or rays, got {self.unit!r}")
        if not self.rank_multiple > 0 or not self.lr_warmup >= 0:
            raise ValueError(f"batch_rule {self.name}: rank_multiple must be > 0 and lr_warmup >= 0")

    def resolve(self, k: float, world_size: int) -> BatchRule:
        """The rule a run of ``world_size`` ranks at ``k`` reference batches per step trains under
        (``auto`` picks; every other rule is itself)."""
        if not self.auto:
            return self
        several = world_size > 1 and k <= AUTO_MAX_K + _EPS
        chosen = large_batch() if several else per_device()
        return replace(chosen, rank_multiple=self.rank_multiple, lr_warmup=self.lr_warmup)

    def lr_factor(self, k: float, part: str | None = None) -> float:
        """The learning-rate factor at ``k`` reference batches after the warm-up, for the parameter
        group ``part`` (``"mlp"``: the MLPs' groups)."""
        scaling = self.mlp_lr_scaling if part == "mlp" and self.mlp_lr_scaling else self.lr_scaling
        return {"none": 1.0, "sqrt": math.sqrt(k), "linear": float(k)}[scaling]

    def counting_rays(self) -> BatchRule:
        """This rule with the schedules in rays seen (a run resumed from a checkpoint that counted
        rays keeps counting them)."""
        return self if self.unit == "rays" else replace(self, name=f"{self.name} (in rays)", unit="rays")


def per_device() -> BatchRule:
    """Each rank draws the reference batch; learning rate and schedules unchanged (several GPUs take
    as many steps as one, with N times the rays)."""
    return BatchRule("per_device")


def throughput() -> BatchRule:
    """``per_device`` in total, split between the ranks in proportion to their measured speed (GPUs of
    unequal speed, ``callbacks/load_balance.py``)."""
    return BatchRule("throughput", split="throughput")


def large_batch() -> BatchRule:
    """The rule that wins on several ranks: the hash table's learning rate x k, the MLPs' x sqrt(k)
    (ramped up over 256 reference steps), the decay from 70 % of the run, every 10 %, and the
    schedules in rays seen."""
    return BatchRule("large_batch", lr_scaling="linear", mlp_lr_scaling="sqrt", unit="rays", decay=LATE_DECAY)


def auto() -> BatchRule:
    """``large_batch`` on several ranks up to :data:`AUTO_MAX_K` reference batches, else ``per_device``."""
    return BatchRule("auto", auto=True)
