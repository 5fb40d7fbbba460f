"""The batch rule and the training clock: how the batch grows with the GPUs, and what the schedules count.

Every schedule of a run (the learning-rate decay and warm-up, the occupancy-grid updates, the loss-weighted
sampler's windows, the resolution stages, the run's length, the epoch of validation) is written in
**reference steps**: optimizer steps of one process drawing ``data.batch_size`` ray slots with
``model.step.sample_budget`` samples, the batch every default was tuned at. A *batch rule*
(``data.batch_scaling``) says how big each rank's batch is and how the schedules read a step:

============== ===================== ========================= ============== ==============================
rule            batch of each rank    global batch (k x ref.)   learning rate  schedules count
============== ===================== ========================= ============== ==============================
per_device      ``batch_size``        k = N                     unchanged      optimizer steps
global          ``batch_size / N``    k = 1                     unchanged      optimizer steps (= rays)
throughput      by measured speed     k = N                     unchanged      optimizer steps
per_device_rays ``batch_size``        k = N                     unchanged      rays seen (grid: steps)
sqrt_lr         ``batch_size``        k = N                     x sqrt(k)      rays seen (grid: steps)
linear_lr       ``batch_size``        k = N                     x k            rays seen (grid: steps)
large_batch     ``batch_size``        k = N                     x k (MLPs:     rays seen (grid: steps),
                                                                x sqrt(k))     the decay from 70 %
============== ===================== ========================= ============== ==============================

``auto`` (the default) is :data:`AUTO_SEVERAL` (``large_batch``: ``linear_lr`` with the MLPs' rate at
x sqrt(k) and the learning-rate decay from 70 % of the run, every 10 %) on several ranks whose global batch
is at most :data:`AUTO_MAX_K` reference batches, else ``per_device``. Predicted from one GPU
(docs/batch_rule.md), ``large_batch`` reaches lego's 36.2 dB on 2 GPUs in 0.53x the 1-GPU time (runs
sized to end there, against 1.00x for ``per_device``; ``linear_lr`` does not end there in the same rays)
and trains fox at k = 2 at least as well as ``linear_lr``. On 4 GPUs it is fastest at k = 3, each rank
drawing 3/4 of the batch (``data.batch_multiple=0.75``): 0.32x with ``grad_exchange=bf16`` (0.35x at
k = 4); but fox at k = 3 ends 0.23 dB below k = 1 after 10k reference steps (seeds 1-3) and at k = 4
collapses in one seed of three (23 dB held out), so larger batches keep the schedules in steps. The
rules in rays keep the occupancy grid in optimizer steps
(:meth:`TrainingClock.grid_tick`; ``data.grid_unit=rays`` overrides): in rays it updates (and decays) k
times as often per optimizer step, and fox collapsed at k = 4. One GPU trains exactly as under
``per_device``.

(N ranks; ``data.batch_multiple=m`` multiplies every rank's batch and k by m, so one GPU with
``batch_multiple=N`` draws what N GPUs draw together; gradient accumulation multiplies k too.)

**Rays seen** (``unit="rays"``): an optimizer step that draws k reference batches over all ranks moves
every schedule by k reference steps, and the run ends after ``trainer.max_steps / k`` optimizer steps
(``max_steps`` counts reference steps), so the learning rate against the rays seen is the same on any
number of GPUs. k is counted from the configured batches, not measured: under a sample budget the rays
of a step adapt on the device, but every rank's budget is known on the host, so the clock needs no host
sync and reads the same on every rank.

A scaled learning rate (``sqrt_lr``, ``linear_lr``) ramps linearly from the base rate to the scaled one
over the first ``lr_warmup`` reference steps (Goyal et al.'s gradual warm-up). With ``lr_anneal`` it
returns linearly to the base rate from that point of the run to its end, so the scaled rate speeds the
early phase and the run ends at the step size of one GPU. ``mlp_lr_scaling`` gives the MLPs' parameter
groups a factor of their own (the hash table keeps the rule's). With k = 1 every rule is
the ``per_device`` rule: one GPU trains exactly as it does without one (:attr:`TrainingClock.trivial`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any

from nerf_lightning.models.schedules import steps_of

__all__ = [
    "AUTO_MAX_K", "AUTO_SEVERAL", "BETA_SCALINGS", "CHOICES", "LR_SCALINGS", "RULES", "BatchRule", "Tick",
    "TrainingClock", "resolve_rule", "scaled_lr",
]  # fmt: skip

log = logging.getLogger(__name__)

SPLITS = ("per_device", "global", "throughput")
LR_SCALINGS = ("none", "sqrt", "linear")
UNITS = ("steps", "rays")
BETA_SCALINGS = ("none", "power", "power_beta2")
_EPS = 1e-9  # positions are sums of float multiples of k; crossing tests allow this much rounding


@dataclass(frozen=True)
class BatchRule:
    """One row of the module docstring's table.

    Attributes:
        name: the ``data.batch_scaling`` value.
        split: ``per_device`` | ``global`` | ``throughput`` (how a rank's batch follows the world size).
        lr_scaling: ``none`` | ``sqrt`` | ``linear`` (the learning rate's factor of the global batch k).
        unit: ``steps`` | ``rays`` (what a reference step of the schedules is).
        beta_scaling: ``none`` | ``power`` | ``power_beta2`` (Adam's betas at global batch k: as
            configured, ``beta^k`` for both, or for the second moment's alone).
        grid_unit: ``steps`` (every rule's) | ``rays``: what the occupancy grid's ``update_every`` and
            ``warmup_steps`` count. Each update decays every cell's density, so in rays at k reference
            batches a step the grid forgets k times faster per optimizer step (fox collapses at k = 4).
        mlp_lr_scaling: the MLPs' learning-rate factor of k where it differs from the hash table's
            (``lr_scaling``); None: the same. Adam moves a table row about once per step it is touched,
            whatever the rays behind it, while the MLPs see every ray: k x suits the table, not them.
        decay: ``(start, interval)`` of the learning-rate decay (fractions of the run, as
            ``model.scheduler.decay_start`` / ``decay_interval``) at k > 1; None: the configured ones.
            k x the batch takes k x fewer optimizer steps over the same rays, and the high rate needs
            more of them before the decay than one GPU does.
    """

    name: str
    split: str
    lr_scaling: str
    unit: str
    beta_scaling: str = "none"
    grid_unit: str = "steps"
    mlp_lr_scaling: str | None = None
    decay: tuple[float, float] | None = None

    @property
    def grid(self) -> str:
        """The unit of the occupancy grid's schedule."""
        return self.grid_unit

    def rank_scale(self, world_size: int) -> float:
        """A rank's batch (ray slots and sample budget) as a multiple of the configured one."""
        return 1.0 / world_size if self.split == "global" else 1.0

    def global_multiple(self, world_size: int) -> float:
        """The batch of one optimizer step over all ranks, as a multiple of the configured one."""
        return world_size * self.rank_scale(world_size)

    def lr_factor(self, k: float) -> float:
        """The learning rate's factor at global batch ``k`` (after the warm-up)."""
        return scaled_lr(self.lr_scaling, k)

    def betas(self, betas: tuple[float, ...], k: float) -> tuple[float, ...]:
        """Adam's ``betas`` at global batch ``k``: ``power`` keeps each moment's horizon in rays;
        ``power_beta2`` only the second moment's (the gradient's scale), the momentum's stays in steps."""
        if self.beta_scaling == "power":
            return tuple(b**k for b in betas)
        if self.beta_scaling == "power_beta2":
            return (*betas[:1], *(b**k for b in betas[1:]))
        return tuple(betas)


def scaled_lr(scaling: str, k: float) -> float:
    """A learning-rate factor at global batch ``k``: ``none`` 1, ``sqrt`` sqrt(k), ``linear`` k."""
    return {"none": 1.0, "sqrt": math.sqrt(k), "linear": float(k)}[scaling]


#: ``large_batch``'s learning-rate decay: from 70 % of the run, every 10 % (the default: 50 %, every 15 %)
LATE_DECAY = (0.7, 0.1)

RULES: dict[str, BatchRule] = {
    r.name: r
    for r in (
        BatchRule("per_device", "per_device", "none", "steps"),
        BatchRule("global", "global", "none", "steps"),
        BatchRule("throughput", "throughput", "none", "steps"),
        BatchRule("per_device_rays", "per_device", "none", "rays"),
        BatchRule("sqrt_lr", "per_device", "sqrt", "rays"),
        BatchRule("linear_lr", "per_device", "linear", "rays"),
        BatchRule("large_batch", "per_device", "linear", "rays", mlp_lr_scaling="sqrt", decay=LATE_DECAY),
    )
}


#: ``data.batch_scaling=auto`` on several ranks up to a global batch of AUTO_MAX_K (else ``per_device``)
AUTO_SEVERAL = "large_batch"
AUTO_MAX_K = 2.0
#: every value of ``data.batch_scaling``
CHOICES = ("auto", *RULES)


def resolve_rule(
    name: str,
    lr_scaling: str | None = None,
    schedule_unit: str | None = None,
    beta_scaling: str | None = None,
    grid_unit: str | None = None,
) -> BatchRule:
    """The rule ``data.batch_scaling=name``, with ``data.lr_scaling`` / ``data.schedule_unit`` /
    ``data.beta_scaling`` / ``data.grid_unit`` overriding its learning-rate factor, schedule unit, Adam
    betas and the occupancy grid's unit when given (for measurements across the grid)."""
    if name not in RULES:
        raise ValueError(f"data.batch_scaling must be one of {tuple(RULES)}, got {name!r}")
    if lr_scaling is not None and lr_scaling not in LR_SCALINGS:
        raise ValueError(f"data.lr_scaling must be null or one of {LR_SCALINGS}, got {lr_scaling!r}")
    if schedule_unit is not None and schedule_unit not in UNITS:
        raise ValueError(f"data.schedule_unit must be null or one of {UNITS}, got {schedule_unit!r}")
    if beta_scaling is not None and beta_scaling not in BETA_SCALINGS:
        raise ValueError(f"data.beta_scaling must be null or one of {BETA_SCALINGS}, got {beta_scaling!r}")
    if grid_unit is not None and grid_unit not in UNITS:
        raise ValueError(f"data.grid_unit must be null or one of {UNITS}, got {grid_unit!r}")
    rule = RULES[name]
    if lr_scaling is None and schedule_unit is None and beta_scaling is None and grid_unit is None:
        return rule
    lr = lr_scaling or rule.lr_scaling
    unit = schedule_unit or rule.unit
    betas = beta_scaling or rule.beta_scaling
    grid = grid_unit or rule.grid_unit
    suffix = "" if betas == "none" else f",betas={betas}"
    suffix += "" if grid == rule.grid_unit else f",grid={grid}"
    name = f"{name}[lr={lr},unit={unit}{suffix}]"
    return replace(rule, name=name, lr_scaling=lr, unit=unit, beta_scaling=betas, grid_unit=grid)


@dataclass(frozen=True)
class Tick:
    """One optimizer step on the clock: optimizer steps done after it, and the reference position before
    (``start``) and after it (``end``). Under ``unit="steps"`` it is ``(step, step - 1, step)``."""

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
    """Counts a run's optimizer steps in reference steps (module docstring); one object shared by the
    DataModule (which makes it from ``data.*``), the model and, through them, every scheduled component.

    Args:
        rule: the batch rule, or its ``data.batch_scaling`` name (``"auto"`` included: module docstring,
            resolved by :meth:`bind` from the world size).
        batch_multiple: every rank draws this many times its rule's batch (``data.batch_multiple``).
        lr_warmup: reference steps over which a scaled learning rate ramps up from the base rate.
        lr_anneal: where the scaled learning rate starts returning linearly to the base rate, reached at
            the run's end: a fraction of ``trainer.max_steps`` (<= 1) or reference steps (> 1), the
            convention of the schedules; None: the scaled rate to the end.
        mlp_lr_scaling: the MLPs' learning-rate factor of k (``none`` | ``sqrt`` | ``linear``), where the
            hash table keeps the rule's; None: the rule's for every parameter. The model puts the MLPs in
            parameter groups of their own (``lr_part="mlp"``) when it is set.
        overrides: ``(data.lr_scaling, data.schedule_unit, data.beta_scaling, data.grid_unit)``, applied
            to a named rule as :func:`resolve_rule` does.

    :meth:`bind` (the model, when fitting starts) fixes the world size; before it the clock counts
    optimizer steps with k = ``batch_multiple`` (``auto`` reads as ``per_device`` until then: the same
    per-rank batch as the rule it resolves to).
    """

    def __init__(
        self,
        rule: BatchRule | str = "per_device",
        batch_multiple: float = 1.0,
        lr_warmup: float = 256,
        overrides: tuple[str | None, ...] = (),
        lr_anneal: float | None = None,
        mlp_lr_scaling: str | None = None,
    ) -> None:
        self.auto = rule == "auto"
        self._overrides = overrides
        if isinstance(rule, str):
            rule = self._named("per_device" if self.auto else rule)
        self.rule = rule
        if not batch_multiple > 0:
            raise ValueError(f"data.batch_multiple must be > 0, got {batch_multiple!r}")
        if not lr_warmup >= 0:
            raise ValueError(f"data.lr_warmup must be >= 0, got {lr_warmup!r}")
        if lr_anneal is not None and not lr_anneal >= 0:
            raise ValueError(f"data.lr_anneal must be null or >= 0, got {lr_anneal!r}")
        self.batch_multiple = float(batch_multiple)
        self.lr_warmup = float(lr_warmup)
        self.lr_anneal = None if lr_anneal is None else float(lr_anneal)
        if mlp_lr_scaling is not None and mlp_lr_scaling not in LR_SCALINGS:
            raise ValueError(
                f"data.mlp_lr_scaling must be null or one of {LR_SCALINGS}, got {mlp_lr_scaling!r}"
            )
        self._mlp_lr_scaling = mlp_lr_scaling
        self.world_size = 1
        self.accumulate = 1
        #: the run's length in reference steps (``trainer.max_steps``), None when it has none
        self.total: int | None = None
        self._anneal_start: float | None = None
        self.bound = False
        self._anchor = (0, 0.0)  # (optimizer step, reference position): where a resumed run continues

    # ------------------------------------------------------------------------------ configuration
    def bind(self, world_size: int, accumulate: int = 1, max_steps: int | None = None) -> None:
        """Fix the world size, the gradient accumulation and the run's length (reference steps)."""
        self.world_size = max(1, int(world_size))
        self.accumulate = max(1, int(accumulate))
        if self.auto:  # both candidates split per device, so k does not depend on which one
            several = self.world_size > 1 and self.k <= AUTO_MAX_K + _EPS
            self.rule = self._named(AUTO_SEVERAL if several else "per_device")
            capped = self.world_size > 1 and not several
            why = f"; above {AUTO_MAX_K:g} the schedules stay in steps" if capped else ""
            log.info(
                "data.batch_scaling=auto -> %s (world size %d, a global batch of %g reference batches%s)",
                self.rule.name, self.world_size, self.k, why,
            )  # fmt: skip
        self.total = int(max_steps) if max_steps is not None and max_steps > 0 else None
        if self.lr_anneal is not None and self.total is None:
            raise ValueError("data.lr_anneal needs a run length: set trainer.max_steps")
        #: where a scaled learning rate starts returning to the base rate (reference steps), None: never
        self._anneal_start = None if self.lr_anneal is None else steps_of(self.lr_anneal, self.total)
        self.bound = True
        self._anchor = (0, 0.0)

    def _named(self, name: str) -> BatchRule:
        """The rule ``name`` with this clock's ``data.*`` overrides (``lr_scaling``, ``schedule_unit``,
        ``beta_scaling``, ``grid_unit``)."""
        return resolve_rule(name, *self._overrides)

    @property
    def unit(self) -> str:
        return self.rule.unit

    @property
    def mlp_lr_scaling(self) -> str | None:
        """The MLPs' learning-rate factor of k (``data.mlp_lr_scaling``, else the rule's); None: the
        rule's factor for every parameter."""
        return self._mlp_lr_scaling or self.rule.mlp_lr_scaling

    @property
    def decay(self) -> tuple[float, float] | None:
        """The rule's learning-rate decay ``(start, interval)`` at this clock's k; None: the configured
        schedule (always on one GPU with the configured batch: k = 1 trains as ``per_device``)."""
        return self.rule.decay if self.k > 1.0 + _EPS else None

    @property
    def rank_scale(self) -> float:
        """This rank's batch (ray slots, sample budget) as a multiple of the configured batch."""
        return self.rule.rank_scale(self.world_size) * self.batch_multiple

    @property
    def k(self) -> float:
        """The global batch of one optimizer step, in reference batches."""
        return self.rule.global_multiple(self.world_size) * self.batch_multiple * self.accumulate

    @property
    def rate(self) -> float:
        """Reference steps per optimizer step: k when the schedules count rays, else 1."""
        return self.k if self.unit == "rays" else 1.0

    @property
    def trivial(self) -> bool:
        """Whether the clock changes nothing: positions are optimizer steps, the learning rate keeps its
        factor 1, Adam its configured betas and the occupancy grid counts optimizer steps (every rule on
        one process with the configured batch)."""
        return (
            self.rate == 1.0
            and self.rule.lr_factor(self.k) == 1.0
            and (self.mlp_lr_scaling is None or scaled_lr(self.mlp_lr_scaling, self.k) == 1.0)
            and (self.rule.beta_scaling == "none" or self.k == 1.0)
            and (self.rule.grid == self.unit or self.k == 1.0)
            and not self.shifted
        )

    @property
    def shifted(self) -> bool:
        """Whether positions are offset from the optimizer steps: a run in rays resumed from a checkpoint
        written with another global batch (:meth:`load_state_dict`)."""
        step, position = self._anchor
        return abs(position - step) > _EPS

    # ----------------------------------------------------------------------------------- reading
    def position(self, step: int, unit: str | None = None) -> float:
        """The reference position after ``step`` optimizer steps in ``unit`` (default: the rule's; an int
        when it counts steps). In rays it continues from the anchor of a resumed run in rays (a rule in
        steps keeps none: rays seen from the run's start)."""
        if (unit or self.unit) == "steps":
            return step
        anchor_step, anchor_position = self._anchor
        return anchor_position + (step - anchor_step) * self.k

    def tick(self, step: int, unit: str | None = None) -> Tick:
        """The optimizer step that has just made the count ``step``, in ``unit`` (default: the rule's)."""
        if (unit or self.unit) == "steps":
            return Tick.of_step(step)
        return Tick(step, self.position(step - 1, unit), self.position(step, unit))

    def grid_tick(self, step: int) -> Tick:
        """:meth:`tick` in the occupancy grid's unit (``data.grid_unit``)."""
        return self.tick(step, self.rule.grid)

    def lr_factor(self, position: float, part: str | None = None) -> float:
        """The rule's learning-rate factor at reference position ``position`` (warm-up and anneal
        included), for the parameter group ``part`` (``"mlp"``: the MLPs' groups under ``mlp_lr_scaling``;
        any other: the rule's factor)."""
        scaling = self.mlp_lr_scaling if part == "mlp" and self.mlp_lr_scaling else self.rule.lr_scaling
        target = scaled_lr(scaling, self.k)
        if target == 1.0:
            return target
        share = 1.0 if self.lr_warmup <= 0 else min(1.0, max(0.0, position) / self.lr_warmup)
        start, total = self._anneal_start, self.total
        if start is not None and total is not None and position > start:
            share *= max(0.0, (total - position) / max(total - start, _EPS))
        return 1.0 + (target - 1.0) * share

    def betas(self, betas: tuple[float, ...]) -> tuple[float, ...]:
        """Adam's configured ``betas`` under the rule at this clock's global batch."""
        return self.rule.betas(betas, self.k)

    def steps_for(self, reference_steps: int) -> int:
        """Optimizer steps that cover ``reference_steps`` (at least one)."""
        return max(1, math.ceil(reference_steps / self.rate - _EPS))

    def optimizer_steps(self) -> int | None:
        """The run's length in optimizer steps when it differs from ``trainer.max_steps``, else None."""
        if self.total is None or (self.rate == 1.0 and not self.shifted):
            return None
        anchor_step, anchor_position = self._anchor
        return anchor_step + max(0, math.ceil((self.total - anchor_position) / self.rate - _EPS))

    # ------------------------------------------------------------------------------------- state
    def state_dict(self, step: int) -> dict[str, Any]:
        """What a checkpoint at optimizer step ``step`` keeps: where the run was in reference steps."""
        return {"step": int(step), "position": float(self.position(step)), "unit": self.unit, "k": self.k}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's position: a run resumed with another number of GPUs (another k)
        continues its schedules where it stopped. Under ``auto`` a checkpoint that counted rays (written on
        several ranks) keeps the run counting rays where ``auto`` alone would count steps (one process):
        ``per_device_rays``, the same batch and learning rate as ``per_device`` there."""
        if self.auto and self.unit == "steps" and state.get("unit") == "rays":
            self.rule = self._named("per_device_rays")
        if self.unit == "rays":
            self._anchor = (int(state["step"]), float(state["position"]))

    def summary(self) -> dict[str, Any]:
        """For ``metrics.json``: the rule, the ranks, the global batch k, the learning-rate factor and the
        unit."""
        return {
            "batch/rule": self.rule.name,
            "batch/world_size": self.world_size,
            "batch/k": self.k,
            "batch/lr_scaling": self.rule.lr_scaling,
            "batch/lr_factor": self.rule.lr_factor(self.k),
            "batch/lr_anneal": self.lr_anneal,
            "batch/mlp_lr_scaling": self.mlp_lr_scaling,
            "batch/decay": None if self.decay is None else list(self.decay),
            "batch/unit": self.unit,
            "batch/beta_scaling": self.rule.beta_scaling,
            "batch/grid_unit": self.rule.grid,
        }

    def __repr__(self) -> str:
        return (
            f"TrainingClock(rule={self.rule.name}, world_size={self.world_size}, k={self.k:g}, "
            f"unit={self.unit}, lr_factor={self.rule.lr_factor(self.k):g})"
        )
