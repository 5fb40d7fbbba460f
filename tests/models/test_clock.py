"""The batch rules and the training clock (``models/clock.py``), against values written out by hand.

The learning-rate checks follow tiny-cuda-nn's step decay as ``tests/models/test_schedules.py`` writes it:
optimizer step ``s`` runs with ``lr * base ** (floor((s - start) / interval) + 1)`` once ``s >= start``.
"""

from __future__ import annotations

import math

import pytest
import torch

from nerf_lightning.models.clock import RULES, Tick, TrainingClock, resolve_rule
from nerf_lightning.models.schedules import ngp_exponential_decay, on_clock


def _bound(
    rule: str, world: int = 1, multiple: float = 1, accumulate: int = 1, max_steps: int = 1000, **kw
) -> TrainingClock:
    clock = TrainingClock(rule, multiple, **kw)
    clock.bind(world, accumulate, max_steps=max_steps)
    return clock


@pytest.mark.parametrize(
    ("rule", "world", "rank_scale", "k", "rate", "lr_factor"),
    [
        ("per_device", 4, 1.0, 4, 1, 1.0),  # N x the rays, steps, lr as is (auto on one process)
        ("global", 4, 0.25, 1, 1, 1.0),  # one GPU's batch split in four
        ("throughput", 2, 1.0, 2, 1, 1.0),
        ("per_device_rays", 4, 1.0, 4, 4, 1.0),
        ("sqrt_lr", 4, 1.0, 4, 4, 2.0),
        ("linear_lr", 4, 1.0, 4, 4, 4.0),
        ("global", 1, 1.0, 1, 1, 1.0),
    ],
)
def test_each_rule_sizes_the_batch_lr_and_rate(rule, world, rank_scale, k, rate, lr_factor) -> None:
    clock = _bound(rule, world)
    assert (clock.rank_scale, clock.k, clock.rate) == (rank_scale, k, rate)
    assert clock.rule.lr_factor(clock.k) == lr_factor


def test_one_process_with_the_configured_batch_is_trivial_under_every_rule() -> None:
    for name in RULES:
        assert _bound(name).trivial, name
    assert _bound("per_device", world=8).trivial  # steps and lr as one GPU: nothing to change
    assert not _bound("per_device_rays", world=2).trivial
    assert not _bound("sqrt_lr", multiple=2).trivial
    assert _bound("per_device", accumulate=2).trivial  # accumulating in steps: as before


def test_batch_multiple_and_accumulation_multiply_k() -> None:
    clock = _bound("sqrt_lr", world=2, multiple=3, accumulate=2)
    assert (clock.rank_scale, clock.k, clock.rate) == (3.0, 12.0, 12.0)
    assert _bound("global", world=4, multiple=2).rank_scale == 0.5


def test_four_ranks_at_three_quarters_of_the_batch_train_three_reference_batches() -> None:
    """The 4-GPU recipe (``data.batch_scaling=large_batch data.batch_multiple=0.75``): each rank 3/4 of the
    batch, k = 3, the table's rate x 3 and the MLPs' x sqrt(3) after the warm-up, a 12k-reference-step run in
    4000 optimizer steps; ``auto`` at the same batch keeps ``per_device`` (k > 2)."""
    clock = _bound("large_batch", world=4, multiple=0.75, max_steps=12000)
    assert (clock.rank_scale, clock.k, clock.steps_for(12000)) == (0.75, 3.0, 4000)
    assert clock.lr_factor(10_000) == pytest.approx(3.0)
    assert clock.lr_factor(10_000, "mlp") == pytest.approx(3.0**0.5)
    assert _bound("auto", world=4, multiple=0.75).rule.name == "per_device"


def test_steps_tick_keeps_the_modulo_cadence_of_optimizer_steps() -> None:
    """Counting steps, a tick crosses ``every`` exactly at the steps ``step % every == 0`` (how the occupancy
    grid was scheduled before the clock), and each point is reached once."""
    clock = _bound("per_device", world=4)
    for step in range(1, 200):
        tick = clock.tick(step)
        assert (tick.start, tick.end) == (step - 1, step)
        assert tick.crossed(16) == (step % 16 == 0), step
        assert tick.reached(37) == (step == 37)
    assert isinstance(clock.position(5), int)


def test_rays_tick_moves_k_reference_steps_per_optimizer_step() -> None:
    clock = _bound("per_device_rays", world=2, multiple=1.5)  # k = 3
    assert [clock.position(s) for s in range(5)] == [0, 3, 6, 9, 12]
    # every 16 reference steps: crossed by the steps ending at 18 (16), 33 (32), 48 (48)
    crossed = [s for s in range(1, 20) if clock.tick(s).crossed(16)]
    assert crossed == [6, 11, 16]
    assert [s for s in range(1, 20) if clock.tick(s).reached(256 / 16)] == [6]  # (15, 18] holds 16
    # more reference steps per optimizer step than the cadence: every step crosses once
    fast = _bound("per_device_rays", world=4, multiple=8)  # k = 32
    assert all(fast.tick(s).crossed(16) for s in range(1, 10))


def test_float_rounding_never_crosses_twice() -> None:
    tick_a, tick_b = Tick(1, 0.1 * 3, 0.6), Tick(2, 0.6, 0.1 * 9)  # 0.30000000000000004, 0.9000000000000001
    assert [tick_a.crossed(0.3), tick_b.crossed(0.3)] == [True, True]  # 0.6 and 0.9, once each
    assert Tick(3, 0.9000000000000001, 1.2).crossed(0.3) is True  # 1.2 only


def test_lr_factor_ramps_from_the_base_rate_over_the_warmup() -> None:
    clock = _bound("sqrt_lr", world=4, lr_warmup=100)  # target factor sqrt(4) = 2
    assert [clock.lr_factor(p) for p in (0, 25, 50, 100, 400)] == [1.0, 1.25, 1.5, 2.0, 2.0]
    assert _bound("linear_lr", world=2, lr_warmup=0).lr_factor(0) == 2.0
    assert _bound("per_device_rays", world=8).lr_factor(0) == 1.0


def test_lr_anneal_returns_the_scaled_rate_to_the_base_rate_by_the_run_end() -> None:
    """linear_lr at k = 4 (target 4), 1000 reference steps, warm-up 100, anneal from half the run: the
    factor is 4 from 100 to 500, then 1 + 3 x (1000 - p) / 500, 1 at the end; 500 reference steps as a
    count are the same point."""
    for anneal in (0.5, 500):
        clock = _bound("linear_lr", world=4, max_steps=1000, lr_warmup=100, lr_anneal=anneal)
        factors = [clock.lr_factor(p) for p in (50, 100, 500, 750, 900, 1000, 1200)]
        assert factors == pytest.approx([2.5, 4.0, 4.0, 2.5, 1.6, 1.0, 1.0]), anneal
    # without it the factor holds; a rule without a factor is unchanged
    assert _bound("linear_lr", world=4, max_steps=1000, lr_warmup=0).lr_factor(1000) == 4.0
    assert _bound("per_device_rays", world=4, max_steps=1000, lr_anneal=0.5).lr_factor(900) == 1.0
    with pytest.raises(ValueError, match="data.lr_anneal needs a run length"):
        TrainingClock("linear_lr", 4, lr_anneal=0.5).bind(1, max_steps=None)
    with pytest.raises(ValueError, match="data.lr_anneal must be null or >= 0"):
        TrainingClock("linear_lr", 4, lr_anneal=-1)


def test_mlp_lr_scaling_sets_the_factor_of_the_mlp_groups_only() -> None:
    """k = 4: linear_lr gives x 4 to every group, with mlp_lr_scaling=sqrt x 2 to the MLPs' (after a
    warm-up of 100 reference steps: x 1.5 at 50); even under per_device (no factor of its own) the MLPs'
    factor makes the clock non-trivial."""
    clock = _bound("linear_lr", world=4, lr_warmup=100, mlp_lr_scaling="sqrt")
    assert [clock.lr_factor(50), clock.lr_factor(50, "mlp"), clock.lr_factor(400, "mlp")] == [2.5, 1.5, 2.0]
    assert clock.lr_factor(400) == clock.lr_factor(400, "table") == 4.0
    steps = _bound("per_device", world=4, lr_warmup=0, mlp_lr_scaling="linear")
    assert (steps.lr_factor(0), steps.lr_factor(0, "mlp"), steps.trivial) == (1.0, 4.0, False)
    assert _bound("per_device", world=4, mlp_lr_scaling="none").trivial
    with pytest.raises(ValueError, match="data.mlp_lr_scaling must be null or one of"):
        TrainingClock("linear_lr", 4, mlp_lr_scaling="cubic")


def test_the_run_length_and_epochs_count_reference_steps() -> None:
    clock = _bound("sqrt_lr", world=4, max_steps=20000)
    assert clock.optimizer_steps() == 5000
    assert clock.steps_for(1000) == 250
    assert _bound("sqrt_lr", world=3, max_steps=1000).steps_for(1000) == 334  # ceil: the epoch covers 1000
    assert _bound("per_device", world=4, max_steps=20000).optimizer_steps() is None  # max_steps as given
    assert TrainingClock("sqrt_lr").optimizer_steps() is None  # not bound: no length


def test_a_resumed_run_continues_its_position_with_another_world_size() -> None:
    """4 GPUs stopped at optimizer step 2500 (reference 10000); resumed on 2 GPUs the schedules go on from
    10000 and the run ends when the remaining 10000 reference steps are seen."""
    before = _bound("per_device_rays", world=4, max_steps=20000)
    state = before.state_dict(2500)
    assert state["position"] == 10000
    after = _bound("per_device_rays", world=2, max_steps=20000)
    after.load_state_dict(state)
    assert [after.position(s) for s in (2500, 2501, 2600)] == [10000, 10002, 10200]
    assert after.optimizer_steps() == 2500 + 5000


def test_unknown_rules_and_overrides_are_refused() -> None:
    with pytest.raises(ValueError, match="data.batch_scaling must be one of"):
        resolve_rule("sqrt")
    with pytest.raises(ValueError, match="data.lr_scaling"):
        resolve_rule("per_device", lr_scaling="cubic")
    with pytest.raises(ValueError, match="data.schedule_unit"):
        resolve_rule("per_device", schedule_unit="epochs")
    with pytest.raises(ValueError, match="data.batch_multiple"):
        TrainingClock("per_device", batch_multiple=0)
    rule = resolve_rule("per_device", lr_scaling="sqrt", schedule_unit="rays")
    assert (rule.split, rule.lr_scaling, rule.unit) == ("per_device", "sqrt", "rays")
    assert resolve_rule("sqrt_lr") is RULES["sqrt_lr"]


def _lrs(clock: TrainingClock, n_steps: int, total: int) -> list[float]:
    """The learning rate each optimizer step 0..n_steps-1 runs with, the schedule read on ``clock``."""
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1e-2)
    inner = ngp_exponential_decay(
        opt, total_steps=total, decay_start=0.5, decay_interval=0.25, decay_base=0.1
    )
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
    """The per-device rule in rays: lr at reference position p is the same on 1, 2 and 4 GPUs; sqrt_lr
    multiplies it by its ramp towards sqrt(k) (40 reference steps of warm-up)."""
    for world in (1, 2, 4):
        lrs = _lrs(_bound("per_device_rays", world=world, max_steps=400), 400 // world, 400)
        assert lrs == pytest.approx([_decay(s * world) for s in range(400 // world)], rel=1e-12), world
    lrs = _lrs(_bound("sqrt_lr", world=4, max_steps=400, lr_warmup=40), 100, 400)
    ramp = [1 + (2 - 1) * min(1.0, 4 * s / 40) for s in range(100)]
    assert lrs == pytest.approx([_decay(4 * s) * r for s, r in zip(range(100), ramp, strict=True)], rel=1e-12)


def test_without_a_scheduler_the_rule_factor_alone() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    sched = on_clock(opt, _bound("linear_lr", world=2, lr_warmup=0), None)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.2)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="LambdaLR"):
        on_clock(opt, _bound("linear_lr", world=2), torch.optim.lr_scheduler.StepLR(opt, 10))


def test_auto_is_large_batch_on_two_ranks_and_per_device_otherwise() -> None:
    one = _bound("auto", world=1)
    assert one.rule is RULES["per_device"] and one.trivial  # one GPU exactly as before
    assert _bound("auto", world=1, multiple=2).rule is RULES["per_device"]  # k = 2 in steps, lr x 1
    two = _bound("auto", world=2, max_steps=20000, lr_warmup=0)
    assert two.rule is RULES["large_batch"]
    assert (two.k, two.rate, two.lr_factor(0), two.lr_factor(0, "mlp")) == (2.0, 2.0, 2.0, math.sqrt(2.0))
    assert two.decay == (0.7, 0.1)
    assert two.optimizer_steps() == 10000  # the run counts rays
    # a global batch above 2 reference batches keeps the schedules in steps (fox collapsed at k = 4 in rays)
    assert _bound("auto", world=4).rule is RULES["per_device"]
    assert _bound("auto", world=2, accumulate=2).rule is RULES["per_device"]
    assert _bound("auto", world=2, multiple=2).rule is RULES["per_device"]
    sqrt = TrainingClock("auto", overrides=("sqrt", None))  # data.lr_scaling still overrides the factor
    sqrt.bind(2)
    assert (sqrt.rule.split, sqrt.rule.lr_scaling, sqrt.rule.unit, sqrt.lr_factor(1e9)) == (
        "per_device", "sqrt", "rays", math.sqrt(2.0),
    )  # fmt: skip
    unbound = TrainingClock("auto", 2)
    assert unbound.rule is RULES["per_device"] and unbound.rank_scale == 2.0  # the batch before bind


def test_a_run_in_rays_resumed_on_one_gpu_continues_at_its_position() -> None:
    """Written on 2 ranks at optimizer step 5000 (reference position 10000 of 20000), resumed on one
    process: the lr schedule reads position 10000 + (s - 5000), and the run ends at position 20000."""
    state = {"step": 5000, "position": 10000.0, "unit": "rays", "k": 2.0}
    for rule in ("auto", "per_device_rays"):
        clock = _bound(rule, world=1, max_steps=20000)
        assert clock.trivial  # before the checkpoint: one process as always
        clock.load_state_dict(state)
        assert clock.unit == "rays" and clock.rule.lr_factor(clock.k) == 1.0, rule
        assert clock.position(6000) == 11000.0 and not clock.trivial, rule  # the scheduler reads positions
        assert clock.optimizer_steps() == 15000, rule  # 10000 more reference steps of k = 1
        assert clock.tick(5016).crossed(16) and clock.tick(5016).end == 10016.0
    steps = _bound("per_device", world=1, max_steps=20000)  # a rule in steps stays in steps
    steps.load_state_dict(state)
    assert steps.position(6000) == 6000 and steps.trivial and steps.optimizer_steps() is None


def test_power_betas_forget_per_ray_as_the_reference_steps_do() -> None:
    """``data.beta_scaling=power`` at k = 4: Adam's moments decay per step by what 4 reference steps
    decay them (0.9^4 = 0.6561, 0.99^4 = 0.96059601); ``none`` and k = 1 leave the configured betas."""
    power = (None, None, "power")
    clock = _bound("linear_lr", world=4, overrides=power)
    assert clock.betas((0.9, 0.99)) == pytest.approx((0.6561, 0.96059601), abs=1e-12)
    assert clock.summary()["batch/beta_scaling"] == "power"
    assert _bound("linear_lr", world=4).betas((0.9, 0.99)) == (0.9, 0.99)
    assert _bound("per_device_rays", multiple=2, overrides=power).betas((0.5,)) == (0.25,)
    one = _bound("per_device", overrides=power)
    assert one.betas((0.9, 0.99)) == (0.9, 0.99) and one.trivial
    assert not _bound("per_device", world=2, overrides=power).trivial  # steps, lr x 1, betas^2
    with pytest.raises(ValueError, match="data.beta_scaling"):
        resolve_rule("linear_lr", beta_scaling="cube")


def test_power_beta2_scales_the_second_moment_alone() -> None:
    """``data.beta_scaling=power_beta2`` at k = 4: beta2 0.99 -> 0.99^4 = 0.96059601, beta1 stays 0.9
    (the momentum's horizon in optimizer steps); k = 1 keeps both."""
    beta2 = (None, None, "power_beta2")
    clock = _bound("large_batch", world=4, overrides=beta2)
    assert clock.betas((0.9, 0.99)) == pytest.approx((0.9, 0.96059601), abs=1e-12)
    assert clock.betas((0.9, 0.99))[0] == 0.9
    assert clock.summary()["batch/beta_scaling"] == "power_beta2"
    assert _bound("large_batch", world=2, overrides=beta2).betas((0.9, 0.99)) == pytest.approx((0.9, 0.9801))
    assert _bound("per_device", overrides=beta2).betas((0.9, 0.99)) == (0.9, 0.99)


def test_the_rules_in_rays_keep_the_grid_in_optimizer_steps() -> None:
    """``per_device_rays`` at k = 4: the grid updates every 16 optimizer steps (steps 16, 32, ...) and its
    warm-up ends at optimizer step 256, as under ``per_device``, while the other schedules count rays
    (every 4 optimizer steps cross 16 reference steps). ``data.grid_unit=rays`` puts the grid in rays."""
    clock = _bound("per_device_rays", multiple=4)
    ticks = [clock.grid_tick(s) for s in range(1, 65)]
    assert [t.step for t in ticks if t.crossed(16)] == [16, 32, 48, 64]
    assert (ticks[15].start, ticks[15].end) == (15, 16)
    assert [s for s in range(1, 65) if clock.tick(s).crossed(16)] == list(range(4, 65, 4))
    assert clock.summary()["batch/grid_unit"] == "steps" and clock.summary()["batch/unit"] == "rays"
    assert clock.rule.name == "per_device_rays" and not clock.trivial
    assert all(RULES[r].grid == "steps" for r in ("sqrt_lr", "linear_lr", "per_device"))
    # the grid in rays moves k reference steps a step, under any rule
    rays = (None, None, None, "rays")
    assert _bound("per_device_rays", multiple=4, overrides=rays).grid_tick(3) == Tick(3, 8.0, 12.0)
    assert "grid=rays" in _bound("linear_lr", multiple=4, overrides=rays).rule.name
    in_rays = _bound("per_device", world=2, overrides=(None, None, None, "rays"))
    assert in_rays.grid_tick(5) == Tick(5, 8.0, 10.0) and in_rays.tick(5) == Tick(5, 4, 5)
    assert not in_rays.trivial and _bound("per_device", overrides=(None, None, None, "rays")).trivial
    with pytest.raises(ValueError, match="data.grid_unit"):
        resolve_rule("linear_lr", grid_unit="epochs")


def test_large_batch_scales_the_table_by_k_the_mlps_by_sqrt_k_and_decays_later() -> None:
    """At 4 reference batches (no warm-up): the hash table x 4, the MLPs x 2, the decay from 70 % of the
    run every 10 %; data.mlp_lr_scaling still overrides the MLPs' factor; with k = 1 nothing changes."""
    four = _bound("large_batch", world=4, lr_warmup=0)
    assert (four.lr_factor(0), four.lr_factor(0, "mlp"), four.decay) == (4.0, 2.0, (0.7, 0.1))
    assert four.unit == "rays"
    assert four.summary()["batch/decay"] == [0.7, 0.1] and four.summary()["batch/mlp_lr_scaling"] == "sqrt"
    assert four.summary()["batch/world_size"] == 4 and four.summary()["batch/k"] == 4.0
    assert _bound("large_batch", multiple=2).summary()["batch/world_size"] == 1  # k = 2 on one process
    assert _bound("large_batch", world=4, lr_warmup=0, mlp_lr_scaling="none").lr_factor(0, "mlp") == 1.0
    one = _bound("large_batch", world=1)
    assert one.trivial and one.decay is None and one.lr_factor(0, "mlp") == 1.0
    # an override of the rule's factor or unit keeps its MLP factor and decay
    swapped = resolve_rule("large_batch", lr_scaling="sqrt")
    assert (swapped.lr_scaling, swapped.mlp_lr_scaling, swapped.decay) == ("sqrt", "sqrt", (0.7, 0.1))
