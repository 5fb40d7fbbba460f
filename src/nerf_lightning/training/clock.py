"""The training clock: a run's optimizer steps read as reference steps, the unit of every schedule.

A *reference step* is one optimizer step of one process drawing the reference batch
(``training/batch_rules.py``). Under a rule that counts rays, an optimizer step that draws k reference
batches moves every schedule by k reference steps, and the run ends after the optimizer steps that see
the rays of ``trainer.max_steps`` reference steps. k is counted from the configured batches, not
measured, so the clock needs no host sync and reads the same on every rank.

One :class:`TrainingClock` is shared by the DataModule and the model (through
``training/feedback.py``'s ``TrainingFeedback``); the model binds it to the world size when fitting
starts.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Annotated, Any

from nerf_lightning.config_schema import Note, Range
from nerf_lightning.training.batch_rules import BatchRule, per_device

__all__ = ["StepsOrFraction", "Tick", "TrainingClock", "steps_of"]

log = logging.getLogger(__name__)

_EPS = 1e-9  # positions are sums of float multiples of k; crossing tests allow this much rounding


#: a point or length of a schedule (a config key): read by :func:`steps_of`
StepsOrFraction = Annotated[float, Range(low=0), Note("a fraction of the run (<= 1) or a step count")]


def steps_of(value: float, total_steps: int) -> float:
    """A schedule length: a fraction of ``total_steps`` when <= 1, else a step count."""
    return value * max(int(total_steps), 1) if value <= 1 else float(value)


@dataclass(frozen=True)
class Tick:
    """One optimizer step on the clock: optimizer steps done after it, and the reference position before
    (``start``) and after it (``end``). Counting optimizer steps it is ``(step, step - 1, step)``."""

    step: int
    start: float
    end: float

    @classmethod
    def of_step(cls, step: int) -> Tick:
        """The tick of a clock that counts optimizer steps."""
        return cls(step, step - 1, step)

    def crossed(self, every: float, offset: float = 0.0) -> bool:
        """Whether the step passed a multiple of ``every`` (plus ``offset``): ``(start, end]`` holds one."""
        before = math.floor((self.start - offset) / every + _EPS)
        return math.floor((self.end - offset) / every + _EPS) > before

    def reached(self, point: float) -> bool:
        """Whether ``point`` lies in ``(start, end]``."""
        return self.start + _EPS < point <= self.end + _EPS


class TrainingClock:
    """Counts a run's optimizer steps in reference steps under a batch rule.

    Args:
        rule: the run's :class:`~nerf_lightning.training.batch_rules.BatchRule` (``batch_rule``);
            default ``per_device``.

    Before :meth:`bind` the clock counts optimizer steps of one process (``auto`` reads as
    ``per_device``, the same per-rank batch as either rule it resolves to).
    """

    def __init__(self, rule: BatchRule | None = None) -> None:
        self.configured = rule if rule is not None else per_device()
        self.rule = self.configured.resolve(self.configured.rank_multiple, 1)
        self.world_size = 1
        self.accumulate = 1
        #: the run's length in reference steps (``trainer.max_steps``), None when it has none
        self.total: int | None = None
        self.bound = False
        self._anchor = (0, 0.0)  # (optimizer step, reference position): where a resumed run continues

    def bind(self, world_size: int, accumulate: int = 1, max_steps: int | None = None) -> None:
        """Fix the world size, the gradient accumulation and the run's length (reference steps)."""
        self.world_size = max(1, int(world_size))
        self.accumulate = max(1, int(accumulate))
        k = self.configured.rank_multiple * self.world_size * self.accumulate
        self.rule = self.configured.resolve(k, self.world_size)
        if self.configured.auto:
            log.info("batch_rule=auto -> %s (%d ranks, %g reference batches a step)",
                     self.rule.name, self.world_size, k)  # fmt: skip
        self.total = int(max_steps) if max_steps is not None and max_steps > 0 else None
        self.bound = True
        self._anchor = (0, 0.0)

    # ------------------------------------------------------------------------------------ sizes
    @property
    def unit(self) -> str:
        return self.rule.unit

    @property
    def rank_multiple(self) -> float:
        """This rank's batch (ray slots, sample budget) as a multiple of the reference batch."""
        return self.rule.rank_multiple

    @property
    def splits_by_throughput(self) -> bool:
        """Whether the ranks' work follows their measured speed (``batch_rule=throughput``)."""
        return self.rule.split == "throughput"

    @property
    def k(self) -> float:
        """The batch of one optimizer step over all ranks, in reference batches."""
        return self.rule.rank_multiple * self.world_size * self.accumulate

    @property
    def rate(self) -> float:
        """Reference steps per optimizer step: k when the schedules count rays, else 1."""
        return self.k if self.unit == "rays" else 1.0

    @property
    def decay(self) -> tuple[float, float] | None:
        """The rule's learning-rate decay ``(start, interval)`` at this k; None: the configured schedule
        (always at k = 1)."""
        return self.rule.decay if self.k > 1.0 + _EPS else None

    @property
    def trivial(self) -> bool:
        """Whether the clock changes nothing: positions are optimizer steps and every learning-rate
        factor is 1 (every rule on one process with the reference batch)."""
        factors = (self.rule.lr_factor(self.k), self.rule.lr_factor(self.k, "mlp"))
        return self.rate == 1.0 and factors == (1.0, 1.0) and not self.shifted

    @property
    def shifted(self) -> bool:
        """Whether positions are offset from the optimizer steps: a run in rays resumed from a checkpoint
        written with another global batch (:meth:`load_state_dict`)."""
        step, position = self._anchor
        return abs(position - step) > _EPS

    # ---------------------------------------------------------------------------------- reading
    def position(self, step: int) -> float:
        """The reference position after ``step`` optimizer steps (an int when the clock counts steps). In
        rays it continues from the anchor of a resumed run."""
        if self.unit == "steps":
            return step
        anchor_step, anchor_position = self._anchor
        return anchor_position + (step - anchor_step) * self.k

    def tick(self, step: int) -> Tick:
        """The optimizer step that has just made the count ``step``."""
        if self.unit == "steps":
            return Tick.of_step(step)
        return Tick(step, self.position(step - 1), self.position(step))

    def lr_factor(self, position: float, part: str | None = None) -> float:
        """The rule's learning-rate factor at reference position ``position`` (the warm-up included), for
        the parameter group ``part`` (``"mlp"``: the MLPs' groups)."""
        target = self.rule.lr_factor(self.k, part)
        if target == 1.0:
            return target
        warmup = self.rule.lr_warmup
        share = 1.0 if warmup <= 0 else min(1.0, max(0.0, position) / warmup)
        return 1.0 + (target - 1.0) * share

    def steps_for(self, reference_steps: int) -> int:
        """Optimizer steps that cover ``reference_steps`` (at least one)."""
        return max(1, math.ceil(reference_steps / self.rate - _EPS))

    def optimizer_steps(self) -> int | None:
        """The run's length in optimizer steps when it differs from ``trainer.max_steps``, else None."""
        if self.total is None or (self.rate == 1.0 and not self.shifted):
            return None
        anchor_step, anchor_position = self._anchor
        return anchor_step + max(0, math.ceil((self.total - anchor_position) / self.rate - _EPS))

    # ------------------------------------------------------------------------------------ state
    def state_dict(self, step: int) -> dict[str, Any]:
        """What a checkpoint at optimizer step ``step`` keeps: where the run was in reference steps."""
        return {"step": int(step), "position": float(self.position(step)), "unit": self.unit, "k": self.k}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's position: a run resumed on another number of GPUs continues its
        schedules where it stopped. A checkpoint that counted rays (written on several ranks under
        ``auto``) keeps the run counting rays where it would count steps (one process)."""
        if self.unit == "steps" and state.get("unit") == "rays":
            self.rule = self.rule.counting_rays()
        if self.unit == "rays":
            self._anchor = (int(state["step"]), float(state["position"]))

    def summary(self) -> dict[str, Any]:
        """For ``metrics.json``: the rule, the ranks, k, the learning-rate factors and the unit."""
        return {
            "batch/rule": self.rule.name,
            "batch/world_size": self.world_size,
            "batch/k": self.k,
            "batch/lr_factor": self.rule.lr_factor(self.k),
            "batch/mlp_lr_factor": self.rule.lr_factor(self.k, "mlp"),
            "batch/decay": None if self.decay is None else list(self.decay),
            "batch/unit": self.unit,
        }

    def __repr__(self) -> str:
        return f"TrainingClock({self.rule.name}, world_size={self.world_size}, k={self.k:g}, {self.unit})"
