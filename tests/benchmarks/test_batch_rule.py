"""The batch-rule prediction (``bench/batch_rule.py``) on made-up rows, its readers, and the step-time tool
(``bench/step_scaling.py``) run on the CPU. Expected numbers are worked out by hand in the comments."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import batch_rule, readers
from benchmarks.batch_rule import GradientSize, Network, predict, steps_to

NET = Network(busbw_gbs=400.0, latency_us=10.0, buckets=1, hbm_gbs=4000.0)
GRAD = {"grad_bytes": 40e6, "table_bytes": 39.9e6, "table_rows": 5_000_000, "table_features": 2}


def _step(scale: float, ms: float, touched: float) -> dict:
    return {"scene": "lego", "scale": scale, "step_ms": ms, "touched_fraction": touched, "status": "ok",
            "rays_per_step": 60000 * scale, "samples_per_step": 262144 * scale, **GRAD}  # fmt: skip


def _curve(k: int, lr: str, unit: str, crossing: float, final: float) -> dict:
    """A curve that is 36.0 dB one validation before ``crossing`` steps and 36.4 dB one after: 36.2 dB is
    reached exactly at ``crossing`` (halfway)."""
    pts = [[crossing - 100, 36.0], [crossing + 100, 36.4], [crossing + 300, final]]
    return {"scene": "lego", "k": k, "lr_scaling": lr, "unit": unit, "curve": [[1, 30.0], *pts],
            "psnr": final, "status": "ok", "id": f"b/lego_k{k}_{lr}"}  # fmt: skip


ROWS = [
    _step(1.0, 2.0, 0.5), _step(0.5, 1.2, 0.4), _step(0.25, 0.8, 0.3), _step(0.125, 0.6, 0.2),
    _curve(1, "none", "steps", 10000, 36.50),
    _curve(2, "sqrt", "rays", 5500, 36.45),
    _curve(4, "sqrt", "rays", 3000, 36.30),
    {"scene": "lego", "status": "failed", "curve": [[1, 40.0]], "k": 2, "lr_scaling": "linear",
     "unit": "rays"},
]  # fmt: skip


def test_steps_to_interpolates_the_first_crossing() -> None:
    pts = [(1000, 34.0), (2000, 35.0), (3000, 36.0), (4000, 35.0), (5000, 37.0)]
    assert steps_to(pts, 35.5) == 2500.0
    assert steps_to(pts, 36.5) == 4750.0  # the dip below does not count as reached
    assert steps_to(pts, 33.0) == 1000.0  # already above at the first validation
    assert steps_to(pts, 37.5) is None


def test_exchange_times_follow_the_ring_formula() -> None:
    grad = GradientSize(40e6, 39.9e6, 5_000_000, 2, 0.5)
    # 2 (N-1)/N x 40 MB / 400 GB/s + 10 us: N = 2 -> 0.1 + 0.01 ms, N = 8 -> 0.175 + 0.01 ms
    assert NET.exchange_ms("fp32", grad, 2) == pytest.approx(0.11)
    assert NET.exchange_ms("fp32", grad, 8) == pytest.approx(0.185)
    assert NET.exchange_ms("fp32", grad, 1) == 0.0
    # bf16: half the bytes (0.05 + 0.01) and the casts, 3 x 40 MB at 4000 GB/s = 0.03 ms
    assert NET.exchange_ms("bf16", grad, 2) == pytest.approx(0.09)
    # touched rows: an all-gather of 0.5 x 5e6 x (4 + 8) B = 30 MB, (N-1) x 30 MB / 400 GB/s + 10 us,
    # and the MLPs' 0.1 MB all-reduced (0.00025 + 0.01 ms)
    assert NET.exchange_ms("rows", grad, 2) == pytest.approx(0.075 + 0.01 + 0.00025 + 0.01)
    with pytest.raises(ValueError, match="exchange must be one of"):
        NET.exchange_ms("fp8", grad, 2)


def _pick(preds, n: int, rule: str, exchange: str = "fp32", target: float = 36.2):
    (p,) = [q for q in preds if (q.n, q.rule, q.exchange, q.target) == (n, rule, exchange, target)]
    return p


def test_prediction_multiplies_steps_by_the_step_and_exchange_times() -> None:
    preds = predict(ROWS, [2, 4, 8], NET)
    base = 10000 * 2.0 / 1e3  # the 1-GPU time: 20 s
    g2 = _pick(preds, 2, "global")  # k = 1's steps x (t(B/2) + fp32 exchange)
    assert (g2.steps, g2.step_ms, g2.sync_ms) == (pytest.approx(10000), 1.2, pytest.approx(0.11))
    assert g2.seconds == pytest.approx(10000 * 1.31e-3) and g2.ratio == pytest.approx(13.1 / base)
    s2 = _pick(preds, 2, "sqrt_lr")  # the k = 2 run's 5500 steps x (t(B) + exchange)
    assert s2.ratio == pytest.approx(5500 * 2.11e-3 / base) and s2.extrapolated_from is None
    s4 = _pick(preds, 4, "sqrt_lr")  # 3000 x (2.0 + 1.5 x 0.1 + 0.01) ms = 6.48 s
    assert s4.seconds == pytest.approx(6.48)
    # N = 8 from k = 4: reference steps 12000 against 10000 -> a = log(1.2) / log(4), 10000 x 8^a / 8 steps
    s8 = _pick(preds, 8, "sqrt_lr")
    steps8 = 10000 * 8 ** (math.log(1.2) / math.log(4)) / 8
    assert s8.extrapolated_from == 4 and s8.steps == pytest.approx(steps8)
    assert s8.seconds == pytest.approx(steps8 * (2.0 + 0.185) / 1e3)
    assert _pick(preds, 2, "global", "rows").sync_ms == pytest.approx(
        0.4 * 5e6 * 12 / 400e9 * 1e3 + 0.01 + 0.1e6 / 400e9 * 1e3 + 0.01
    )  # global's rank draws half the batch: its touched fraction (0.4)
    assert not [p for p in preds if p.rule == "linear_lr"]  # the failed run is no evidence
    # 35.5 dB: between step 1 (30 dB) and 9900 (36 dB) of the k = 1 run, 1 + 5.5 / 6 x 9899
    assert _pick(preds, 2, "global", target=35.5).steps == pytest.approx(1 + 5.5 / 6 * 9899)


def test_report_names_the_winner_and_the_final_psnr_change(tmp_path: Path) -> None:
    text, _ = batch_rule.report(ROWS, [2, 4], NET)
    # N = 2: sqrt_lr with bf16, 5500 x (2.0 + 0.09) ms = 11.495 s, 0.57x of 20 s (global: 0.65x and more)
    assert "N = 2: **sqrt_lr** (bf16) wins, 0.57x the 1-GPU time" in text
    assert "0.58x (11.6 s), -0.05 dB" in text  # fp32 at N = 2, and 36.45 against 36.50 dB at the end
    # a second seed of k = 2 crossing at the same step but ending at 36.35 dB: the mean, 36.40 dB, -0.10 dB
    seeds, _ = batch_rule.report([*ROWS, _curve(2, "sqrt", "rays", 5500, 36.35)], [2, 4], NET)
    assert "0.58x (11.6 s), -0.10 dB" in seeds
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    assert batch_rule.main(["--from", str(path), "--gpus", "2,4", "--json", str(tmp_path / "p.json")]) == 0
    assert any(p["rule"] == "global" for p in json.loads((tmp_path / "p.json").read_text()))
    assert batch_rule.main(["--from", str(tmp_path / "missing.jsonl")]) == 2
    (tmp_path / "empty.jsonl").write_text("\n")
    assert batch_rule.main(["--from", str(tmp_path / "empty.jsonl")]) == 1


def _sized(k: int, lr: str, unit: str, steps: int, final: float, anneal: float | None = None) -> dict:
    return {"scene": "lego", "k": k, "lr_scaling": lr, "unit": unit, "curve": [[steps - 1, final]],
            "psnr": final, "steps": steps, "lr_anneal": anneal, "status": "ok"}  # fmt: skip


def test_sized_runs_give_the_shortest_length_that_ends_at_the_target() -> None:
    assert batch_rule.length_to([(12000, 36.3), (10000, 36.1)], 36.2) == (pytest.approx(11000), "")
    assert batch_rule.length_to([(10000, 36.25), (12000, 36.4)], 36.2) == (10000, "<=")
    assert batch_rule.length_to([(10000, 35.0)], 36.2) == (None, "not reached")
    rows = [
        _step(1.0, 2.0, 0.5),
        # k = 1: 36.2 dB between 10k (36.0) and 14k (36.4: two seeds' mean) reference steps: 12000
        _sized(1, "none", "steps", 10000, 36.0), _sized(1, "none", "steps", 14000, 36.3),
        _sized(1, "none", "steps", 14000, 36.5),
        # k = 4 in rays: 2000 and 4000 optimizer steps are 8k and 16k reference steps; 36.2 dB at 3/4 of
        # the way from 8k (35.9) to 16k (36.3): 14000 reference steps, 3500 optimizer steps
        _sized(4, "linear", "rays", 2000, 35.9), _sized(4, "linear", "rays", 4000, 36.3),
        # the same rule annealed is a rule of its own; one length alone is not a sized group
        _sized(4, "linear", "rays", 2500, 36.5, anneal=0.5), _sized(4, "linear", "rays", 4000, 36.6, 0.5),
        _sized(2, "linear", "rays", 4000, 36.6),
    ]  # fmt: skip
    table = batch_rule.sized_table(rows, NET)
    # 3500 / 12000 = 0.29x the steps; x (2.0 + 0.16) / 2.0 (fp32 at N = 4: 1.5 x 0.1 + 0.01 ms) = 0.32x
    assert "| lego | 4 | linear_lr | 8k: 35.900, 16k: 36.300 | 36.2 dB | 14000 | 0.29x | 0.32x |" in table
    assert "| lego | 1 | per_device | 10k: 36.000, 14k: 36.400 | 36.2 dB | 12000 | 1.00x | 1.00x |" in table
    # 36.5 dB at the shortest annealed run (10k reference steps): an upper bound, 2500 / 12000
    annealed = "| lego | 4 | linear_lr, anneal 0.5 | 10k: 36.500, 16k: 36.600 | 36.2 dB | <=10000 | <=0.21x |"
    assert annealed in table
    # 35.5 dB: both k's shortest runs end above it (upper bounds), 2000 / 10000 optimizer steps: no bound
    assert "| lego | 4 | linear_lr | 8k: 35.900, 16k: 36.300 | 35.5 dB | <=8000 | ~0.20x | ~0.22x |" in table
    assert "| lego | 2 |" not in table
    assert batch_rule.sized_table(ROWS, NET) == "(no runs sized to several lengths)"


def test_a_global_batch_of_k_split_over_more_gpus_uses_the_step_at_k_over_n() -> None:
    # the rank's step at 3/4 of the batch, with the occupancy update's GPU time at 1 and 1/4 of its cells
    shared = {"grid_update_ms": {"1": 1.6, "2": 0.9, "4": 0.48}, "grid_update_every": 16, "grid_bytes": 16e6}
    rows = [
        _step(1.0, 2.0, 0.5), {**_step(0.75, 1.0, 0.5), **shared},
        _sized(1, "none", "steps", 10000, 36.0), _sized(1, "none", "steps", 14000, 36.4),  # 36.2 dB: 12000
        # k = 3 in rays: 3000 and 5000 optimizer steps are 9k and 15k reference steps; 36.2 dB at 3/4 of the
        # way from 35.9 to 36.3: 13500 reference steps, 4500 optimizer steps
        _sized(3, "linear", "rays", 3000, 35.9), _sized(3, "linear", "rays", 5000, 36.3),
    ]  # fmt: skip
    table = batch_rule.split_table(rows, [2, 4, 8], NET)
    # N = 4, each rank 3/4 of the batch: 1.0 ms less (1.6 - 0.48) / 16 = 0.07 ms of the shared update, plus
    # the grid's all-reduce (1.5 x 16 MB / 400 GB/s + 10 us = 0.07 ms) / 16 = 0.004375 ms: 0.934375 ms.
    # fp32 1.5 x 40 MB / 400 GB/s + 10 us = 0.16 ms: 4500 x 1.094375 / (12000 x 2.0) = 0.2052;
    # bf16 0.075 + 0.01 + 0.03 (casts) = 0.115 ms: 4500 x 1.049375 / 24000 = 0.1968
    assert "| lego | 3 | linear_lr | 4 | 36.2 dB | 13500 | 0.75 | 0.934 ms | fp32 | 0.205x |" in table
    assert "| lego | 3 | linear_lr | 4 | 36.2 dB | 13500 | 0.75 | 0.934 ms | bf16 | 0.197x |" in table
    # N = 2 is not more GPUs than k; N = 8 has no step row at 3/8; 35.5 dB: an upper bound only
    assert "| 2 | 36.2" not in table and "| 8 |" not in table and "35.5 dB" not in table
    assert batch_rule.split_table(rows[:1] + rows[2:], [4], NET).startswith("(no sized runs")
    # one rank, or a number of ranks whose share was not timed: the step alone
    assert batch_rule.rank_step_ms(rows[1], 1, NET) == 1.0 and batch_rule.rank_step_ms(rows[1], 8, NET) == 1.0
    assert batch_rule.rank_step_ms(rows[1], 2, NET) == pytest.approx(1.0 - 0.7 / 16 + (0.04 + 0.01) / 16)


def test_val_curve_reads_the_csv_and_the_rule(tmp_path: Path) -> None:
    (tmp_path / "metrics.json").write_text(json.dumps({
        "val/psnr": 36.3, "steps": 5000, "time/train_s": 50.0, "batch/k": 4.0, "batch/lr_scaling": "sqrt",
        "batch/unit": "rays", "batch/lr_anneal": 0.5, "batch/mlp_lr_scaling": "sqrt",
    }))  # fmt: skip
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "metrics.csv").write_text(
        "epoch,step,train/loss,val/psnr\n0,50,0.1,\n0,250,,35.0\n1,500,,36.0\n2,750,,36.4\n2,750,,36.3\n"
    )
    (row,) = readers.val_curve("lego", (35.5, 36.2))(tmp_path, tmp_path / "log")
    assert row["curve"] == [(250, 35.0), (500, 36.0), (750, 36.3)]  # the last value of a step
    assert (row["k"], row["lr_scaling"], row["unit"], row["psnr"]) == (4.0, "sqrt", "rays", 36.3)
    assert (row["lr_anneal"], row["mlp_lr_scaling"]) == (0.5, "sqrt")
    (curve,) = batch_rule.curves([row])
    assert curve.rule == "sqrt_lr, anneal 0.5, MLPs lr sqrt"
    assert "35.5 dB @375, 36.2 dB @667" in row["note"]  # 500 + 0.2 / 0.3 x 250
    # a decay other than the default config's, from the run's config or from the rule (batch/decay)
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text(
        "model:\n  scheduler:\n    decay_start: 0.7\n    decay_interval: 0.1\n    decay_base: 0.33\n"
    )
    (row,) = readers.val_curve("lego")(tmp_path, tmp_path / "log")
    assert batch_rule.curves([row])[0].rule == "sqrt_lr, anneal 0.5, MLPs lr sqrt, decay from 0.7 every 0.1"
    (tmp_path / ".hydra" / "config.yaml").write_text(
        "model:\n  scheduler:\n    decay_start: 0.5\n    decay_interval: 0.15\n    decay_base: 0.33\n"
    )
    assert readers.val_curve("lego")(tmp_path, tmp_path / "log")[0]["schedule"] is None
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    (tmp_path / "metrics.json").write_text(json.dumps({**metrics, "batch/decay": [0.7, 0.1]}))
    assert readers.val_curve("lego")(tmp_path, tmp_path / "log")[0]["schedule"] == "decay from 0.7 every 0.1"
    # Adam's betas from the rule, and gradients rounded by a callback of the run's config: rules of their own
    (tmp_path / "metrics.json").write_text(json.dumps({**metrics, "batch/beta_scaling": "power_beta2"}))
    (tmp_path / ".hydra" / "config.yaml").write_text(
        "callbacks:\n  lr_monitor:\n    _target_: x.LearningRateMonitor\n  rounded_gradients:\n"
        "    _target_: benchmarks.rounded_gradients.RoundedGradients\n"
    )
    (row,) = readers.val_curve("lego")(tmp_path, tmp_path / "log")
    assert (row["beta_scaling"], row["gradients"]) == ("power_beta2", "bf16")
    rule = "sqrt_lr, anneal 0.5, MLPs lr sqrt, betas power_beta2, bf16 gradients"  # no scheduler: no decay
    assert batch_rule.curves([row])[0].rule == rule
    (tmp_path / ".hydra" / "config.yaml").write_text("callbacks:\n  lr_monitor: null\n")
    assert readers.val_curve("lego")(tmp_path, tmp_path / "log")[0]["gradients"] is None
    (tmp_path / "csv" / "metrics.csv").write_text("epoch,step,val/psnr\n")
    with pytest.raises(ValueError, match="no val/psnr"):
        readers.val_curve("lego")(tmp_path, tmp_path / "log")


def test_step_scaling_runs_on_the_cpu_and_its_rows_feed_the_prediction(
    tiny_scene: Path, tmp_path: Path
) -> None:
    import torch

    from benchmarks import step_scaling

    tiny = [
        f"data.path={tiny_scene}", "data.batch_size=128", "model.net.step.sample_budget=2048",
        "model.net.renderer.occupancy.resolution=16",
        "model.net.field.encoding.n_levels=4", "model.net.field.encoding.log2_hashmap_size=10",
        "model.net.field.encoding.max_resolution=64", "model.net.renderer.step_size=0.0135",
        "model.net.renderer.max_samples_per_ray=64",
        "model.net.backend=torch",
    ]  # fmt: skip
    out = tmp_path / "step_scaling.json"
    threads = torch.get_num_threads()
    try:
        args = ["--device", "cpu", "--warmup", "2", "--steps", "2", "--scales", "1,0.5", "--json", str(out)]
        assert step_scaling.main([*args, "--", *tiny]) == 0
    finally:
        torch.set_num_threads(threads)
    rows = readers.step_scaling_json("lego")(tmp_path, tmp_path / "log")
    assert [r["part"] for r in rows] == ["@x1", "@x0.5"]
    full, half = rows
    budgets = (full["sample_budget"], half["sample_budget"], full["ray_slots"], half["ray_slots"])
    assert budgets == (2048, 1024, 128, 64)
    assert 0 < half["samples_per_step"] <= 1024 < full["samples_per_step"] <= 2048
    # the gradient: the 4-level table (2^10 rows at most per level, 2 features) and the MLPs, float32
    assert full["table_rows"] == sum(full["level_rows"]) and full["table_features"] == 2
    assert full["grad_bytes"] > full["table_bytes"] == full["table_rows"] * 2 * 4
    assert 0 < full["touched_fraction"] <= 1 and len(full["touched_per_level"]) == 4
    weighted = sum(f * n for f, n in zip(full["touched_per_level"], full["level_rows"], strict=True))
    assert full["touched_fraction"] == pytest.approx(weighted / full["table_rows"])
    # the occupancy grid that N ranks all-reduce: one cascade of 16^3 float32 cells, updated every 16 steps
    assert (full["grid_bytes"], full["grid_update_every"]) == (16**3 * 4, 16)
    assert step_scaling.main(["--device", "cpu", "--scales", "x"]) == 2


def _timed(
    world: int, rule: str, exchange: str, length: int, psnr: float, train_s: float, fixed: float | None = None
) -> dict:
    return {"scene": "lego", "world": world, "rule": rule, "exchange": exchange, "length": length,
            "psnr": psnr, "train_s": train_s, "fixed_s": fixed, "status": "ok"}  # fmt: skip


def test_measured_table_times_the_shortest_run_to_the_target_against_one_gpu() -> None:
    rows = [
        # one GPU, two seeds at 10k (mean 36.1 dB, 30 s) and one at 12k (36.3 dB, 34 s): 36.2 dB halfway,
        # at 11k, in 32 s; fixed costs 9, 11, 10 s: 10 s
        _timed(1, "per_device", "fp32", 10000, 36.0, 29.0, 9.0),
        _timed(1, "per_device", "fp32", 10000, 36.2, 31.0, 11.0),
        _timed(1, "per_device", "fp32", 12000, 36.3, 34.0, 10.0),
        # another rule on one GPU is not the baseline
        _timed(1, "large_batch", "fp32", 10000, 36.3, 100.0, 1.0),
        # 2 GPUs: 36.15 dB at 10k (16 s), 36.35 at 12k (18 s): 36.2 dB a quarter of the way, 10.5k, 16.5 s:
        # 16.5 / 32 = 0.52x; fixed cost 6 s (one run's reading), without it (16.5 - 6) / (32 - 10) = 0.48x
        _timed(2, "large_batch", "fp32", 10000, 36.15, 16.0, 6.0),
        _timed(2, "large_batch", "fp32", 12000, 36.35, 18.0),
        # already above at its shortest run: an upper bound, 15 s / 32 s; no fixed cost read
        _timed(2, "large_batch", "bf16", 10000, 36.25, 15.0),
        {"scene": "lego", "world": 2, "rule": "large_batch", "length": 10000, "status": "failed"},
        _curve(1, "none", "steps", 10000, 36.5),  # a curve row has no world: not a timed run
    ]
    table = batch_rule.measured_table(rows).splitlines()
    one = "| lego | 1 | per_device | fp32 | 10k: 36.100 dB / 30.0 s, 12k: 36.300 dB / 34.0 s |"
    two = "| lego | 2 | large_batch | fp32 | 10k: 36.150 dB / 16.0 s, 12k: 36.350 dB / 18.0 s |"
    assert f"{one} 36.2 dB | 32.0 s | 1.00x | 10.0 s | 1.00x |" in table
    assert f"{two} 36.2 dB | 16.5 s | 0.52x | 6.0 s | 0.48x |" in table
    assert f"{two} 35.5 dB | <=16.0 s | ~0.53x | 6.0 s | ~0.50x |" in table  # both upper bounds (1 GPU: 30 s)
    bf16 = "| lego | 2 | large_batch | bf16 | 10k: 36.250 dB / 15.0 s |"
    assert f"{bf16} 36.2 dB | <=15.0 s | <=0.47x | - | - |" in table
    assert batch_rule.measured_table(ROWS) == "(no runs timed on several GPUs)"


def test_fixed_cost_is_the_time_beyond_the_steady_rate() -> None:
    # 1000 steps in 3 s; windows of 100 steps: slow at first, 2.5 ms/step in the second half (the median of
    # 2.4, 2.5, 2.6, 2.5, 2.5): 3 - 1000 x 2.5 ms = 0.5 s
    windows = [(100, 8.0), (200, 3.0), (300, 2.5), (400, 2.5), (500, 2.5), (600, 2.4), (700, 2.5), (800, 2.6),
               (900, 2.5), (1000, 2.5)]  # fmt: skip
    assert readers.fixed_cost(windows, 1000, 3.0) == pytest.approx(0.5)
    assert readers.fixed_cost(windows[:3], 1000, 3.0) is None  # no window in the second half
    assert readers.fixed_cost([], 1000, 3.0) is None


def test_ddp_run_reads_the_ranks_rule_exchange_and_length(tmp_path: Path) -> None:
    (tmp_path / "metrics.json").write_text(json.dumps({
        "val/psnr": 36.25, "steps": 6000, "time/train_s": 19.5, "batch/world_size": 2,
        "batch/rule": "large_batch",
    }))  # fmt: skip
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text("grad_exchange: bf16\ntrainer:\n  max_steps: 12000\n")
    (row,) = readers.ddp_run("lego")(tmp_path, tmp_path / "log")
    assert (row["world"], row["rule"], row["exchange"], row["length"]) == (2, "large_batch", "bf16", 12000)
    assert row["fixed_s"] is None  # no csv/metrics.csv
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "metrics.csv").write_text(
        "step,perf/step_time_ms,train/loss\n1000,6.0,\n3000,3.0,\n4000,3.0,0.1\n5000,3.5,\n6000,3.0,\n"
    )
    # steady 3.0 ms (the median of 3.0, 3.5, 3.0 after step 3000): 19.5 - 6000 x 3 ms = 1.5 s
    assert readers.ddp_run("lego")(tmp_path, tmp_path / "log")[0]["fixed_s"] == pytest.approx(1.5)
    assert (row["psnr"], row["train_s"], row["scene"]) == (36.25, 19.5, "lego")
    assert row["note"].startswith("2 GPU, large_batch, bf16")
    (tmp_path / "metrics.json").write_text(json.dumps({"val/psnr": 36.25, "steps": 6000}))
    with pytest.raises(ValueError, match="batch/world_size"):
        readers.ddp_run("lego")(tmp_path, tmp_path / "log")
