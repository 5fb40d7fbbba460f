"""The batch rules and the training clock (``training/``), against values written out by hand.

The learning-rate checks follow tiny-cuda-nn's step decay as ``tests/training/test_lr_schedules.py``
writes it: optimizer step ``s`` runs with ``lr * base ** (floor((s - start) / interval) + 1)`` once
``s >= start``.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from nerf_lightning.training.batch_rules import BatchRule, auto, large_batch, per_device, throughput
from nerf_lightning.training.clock import Tick, TrainingClock
from nerf_lightning.training.lr_schedules import ngp_exponential_decay, on_clock

RULES = {"per_device": per_device, "throughput": throughput, "large_batch": large_batch, "auto": auto}


def _bound(
    rule: str | BatchRule, world: int = 1, accumulate: int = 1, max_steps: int = 1000, **changes
) -> TrainingClock:
    made = RULES[rule]() if isinstance(rule, str) else rule
    clock = TrainingClock(replace(made, **changes) if changes else made)
    clock.bind(world, accumulate, max_steps=max_steps)
    return clock


@pytest.mark.parametrize(
    ("rule", "world", "k", "rate", "lr", "mlp_lr"),
    [
        ("per_device", 4, 4, 1, 1.0, 1.0),  # N x the rays, steps and lr as one GPU's
        ("throughput", 2, 2, 1, 1.0, 1.0),
        ("large_batch", 4, 4, 4, 4.0, 2.0),  # the table x k, the MLPs x sqrt(k), rays seen
        ("large_batch", 1, 1, 1, 1.0, 1.0),
        ("auto", 2, 2, 2, 2.0, math.sqrt(2.0)),  # large_batch on two ranks
        ("auto", 4, 4, 1, 1.0, 1.0),  # per_device above 2 reference batches
    ],
)
def test_each_rule_sizes_k_the_rate_and_the_learning_rate(rule, world, k, rate, lr, mlp_lr) -> None:
    clock = _bound(rule, world)
    assert (clock.rank_multiple, clock.k, clock.rate) == (1.0, k, rate)
    # after the warm-up (256 reference steps)
    assert (clock.lr_factor(1e9), clock.lr_factor(1e9, "mlp")) == pytest.approx((lr, mlp_lr))


def test_one_process_with_the_reference_batch_is_trivial_under_every_rule() -> None:
    for name in RULES:
        assert _bound(name).trivial, name
    assert _bound("per_device", world=8).trivial  # steps and lr as one GPU: nothing to change
    assert _bound("per_device", accumulate=2).trivial  # accumulating in steps: as before
    assert not _bound("large_batch", world=2).trivial
    assert not _bound("large_batch", rank_multiple=2).trivial  # one GPU drawing two ranks' batch


def test_accumulation_and_the_rank_multiple_multiply_k() -> None:
    clock = _bound("large_batch", world=2, accumulate=2, rank_multiple=3)
    assert (clock.rank_multiple, clock.k, clock.rate) == (3.0, 12.0, 12.0)


def test_steps_tick_keeps_the_modulo_cadence_of_optimizer_steps() -> None:
    """Counting steps, a tick crosses ``every`` exactly at the steps ``step % every == 0``, and each point
    is reached once."""
    clock = _bound("per_device", world=4)
    for step in range(1, 200):
        tick = clock.tick(step)
        assert (tick.start, tick.end) == (step - 1, step)
        assert tick.crossed(16) == (step % 16 == 0), step
        assert tick.reached(37) == (step == 37)
    assert isinstance(clock.position(5), int)


def test_rays_tick_moves_k_reference_steps_per_optimizer_step() -> None:
    clock = _bound("large_batch", world=2, rank_multiple=1.5)  # k = 3
    assert [clock.position(s) for s in range(5)] == [0, 3, 6, 9, 12]
    # every 16 reference steps: crossed by the steps ending at 18 (16), 33 (32), 48 (48)
    assert [s for s in range(1, 20) if clock.tick(s).crossed(16)] == [6, 11, 16]
    assert [s for s in range(1, 20) if clock.tick(s).reached(16)] == [6]  # (15, 18] holds 16
    fast = _bound("large_batch", world=4, rank_multiple=8)  # k = 32: every step crosses once
    assert all(fast.tick(s).crossed(16) for s in range(1, 10))


def test_float_rounding_never_crosses_twice() -> None:
    tick_a, tick_b = Tick(1, 0.1 * 3, 0.6), Tick(2, 0.6, 0.1 * 9)  # 0.30000000000000004, 0.9000000000000001
    assert [tick_a.crossed(0.3), tick_b.crossed(0.3)] == [True, True]  # 0.6 and 0.9, once each
    assert Tick(3, 0.9000000000000001, 1.2).crossed(0.3) is True  # 1.2 only


def test_the_scaled_rate_ramps_up_from_the_base_rate_over_the_warmup() -> None:
    clock = _bound("large_batch", world=4, lr_warmup=100)  # table x 4, MLPs x 2
    assert [clock.lr_factor(p) for p in (0, 25, 50, 100, 400)] == [1.0, 1.75, 2.5, 4.0, 4.0]
    assert [clock.lr_factor(p, "mlp") for p in (0, 50, 100)] == [1.0, 1.5, 2.0]
    assert clock.lr_factor(400, "table") == 4.0


def test_the_run_length_and_epochs_count_reference_steps() -> None:
    clock = _bound("large_batch", world=4, max_steps=20000)
    assert clock.optimizer_steps() == 5000
    assert clock.steps_for(1000) == 250
    assert _bound("large_batch", world=3, max_steps=1000).steps_for(1000) == 334  # ceil: covers 1000
    assert _bound("per_device", world=4, max_steps=20000).optimizer_steps() is None  # max_steps as given
    assert TrainingClock(large_batch()).optimizer_steps() is None  # not bound: no length


def test_a_resumed_run_continues_its_position_with_another_world_size() -> None:
    """4 GPUs stopped at optimizer step 2500 (reference 10000); resumed on 2 GPUs the schedules go on from
    10000 and the run ends when the remaining 10000 reference steps are seen."""
    state = _bound("large_batch", world=4, max_steps=20000).state_dict(2500)
    assert state["position"] == 10000
    after = _bound("large_batch", world=2, max_steps=20000)
    after.load_state_dict(state)
    assert [after.position(s) for s in (2500, 2501, 2600)] == [10000, 10002, 10200]
    assert after.optimizer_steps() == 2500 + 5000


def test_a_run_in_rays_resumed_on_one_gpu_continues_at_its_position() -> None:
    """Written on 2 ranks at optimizer step 5000 (reference position 10000 of 20000), resumed on one
    process: the schedule reads position 10000 + (s - 5000), and the run ends at position 20000."""
    state = {"step": 5000, "position": 10000.0, "unit": "rays", "k": 2.0}
    for rule in ("auto", "per_device"):
        clock = _bound(rule, world=1, max_steps=20000)
        assert clock.trivial  # before the checkpoint: one process as always
        clock.load_state_dict(state)
        assert clock.unit == "rays" and clock.lr_factor(1e9) == 1.0, rule
        assert clock.position(6000) == 11000.0 and not clock.trivial, rule  # the scheduler reads positions
        assert clock.optimizer_steps() == 15000, rule  # 10000 more reference steps of k = 1
        assert clock.tick(5016).crossed(16) and clock.tick(5016).end == 10016.0
    steps = _bound("per_device", world=1, max_steps=20000)
    steps.load_state_dict({"step": 50, "position": 50, "unit": "steps", "k": 4.0})
    assert steps.position(60) == 60 and steps.trivial and steps.optimizer_steps() is None


def test_bad_rules_are_refused() -> None:
    with pytest.raises(ValueError, match="split"):
        BatchRule("x", split="global")
    with pytest.raises(ValueError, match="learning-rate scaling"):
        BatchRule("x", lr_scaling="cubic")
    with pytest.raises(ValueError, match="unit"):
        BatchRule("x", unit="epochs")
    with pytest.raises(ValueError, match="rank_multiple"):
        BatchRule("x", rank_multiple=0)


def _lrs(clock: TrainingClock, n_steps: int, total: int) -> list[float]:
    """The learning rate each optimizer step 0..n_steps-1 runs with, the schedule read on ``clock``."""
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1e-2)
    inner = ngp_exponential_decay(opt, total, decay_start=0.5, decay_interval=0.25, decay_base=0.1)
    sched = on_clock(opt, clock, inner)
    lrs = []
    for _ in range(n_steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def _decay(position: float) -> float:
    """lr of the schedule above at reference step ``position`` of a 400-step run: 1e-2 before 200,
    then x 0.1 at 200, 300 (start 0.5, interval 0.25 of 400)."""
    return 1e-2 if position < 200 else 1e-2 * 0.1 ** (math.floor((position - 200) / 100) + 1)


def test_the_schedule_against_rays_does_not_depend_on_the_world_size() -> None:
    """A rule in rays without a factor: lr at reference position p is the same on 1, 2 and 4 GPUs;
    large_batch multiplies it by its ramp towards k (40 reference steps of warm-up)."""
    in_rays = replace(per_device(), unit="rays")
    for world in (1, 2, 4):
        lrs = _lrs(_bound(in_rays, world=world, max_steps=400), 400 // world, 400)
        assert lrs == pytest.approx([_decay(s * world) for s in range(400 // world)], rel=1e-12), world
    lrs = _lrs(_bound("large_batch", world=4, max_steps=400, lr_warmup=40), 100, 400)
    ramp = [1 + (4 - 1) * min(1.0, 4 * s / 40) for s in range(100)]
    assert lrs == pytest.approx([_decay(4 * s) * r for s, r in zip(range(100), ramp, strict=True)], rel=1e-12)


def test_without_a_scheduler_the_rule_factor_alone() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    sched = on_clock(opt, _bound("large_batch", world=2, lr_warmup=0), None)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.2)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="LambdaLR"):
        on_clock(opt, _bound("large_batch", world=2), torch.optim.lr_scheduler.StepLR(opt, 10))


def test_auto_is_large_batch_on_two_ranks_and_per_device_otherwise() -> None:
    one = _bound("auto", world=1)
    assert one.rule.name == "per_device" and one.trivial  # one GPU exactly as before
    two = _bound("auto", world=2, max_steps=20000)
    assert two.rule.name == "large_batch" and two.decay == (0.7, 0.1)
    assert two.optimizer_steps() == 10000  # the run counts rays
    # a global batch above 2 reference batches keeps the schedules in steps (fox: -0.23 dB at k = 3)
    assert _bound("auto", world=4).rule.name == "per_device"
    assert _bound("auto", world=2, accumulate=2).rule.name == "per_device"
    assert TrainingClock(auto()).rule.name == "per_device"  # before bind: one process's batch


def test_large_batch_decays_later_and_reports_itself() -> None:
    four = _bound("large_batch", world=4)
    summary = four.summary()
    assert (four.decay, four.unit) == ((0.7, 0.1), "rays")
    assert summary["batch/decay"] == [0.7, 0.1] and summary["batch/mlp_lr_factor"] == 2.0
    assert (summary["batch/world_size"], summary["batch/k"], summary["batch/rule"]) == (4, 4.0, "large_batch")
    one = _bound("large_batch", world=1)
    assert one.trivial and one.decay is None and one.lr_factor(0, "mlp") == 1.0
