"""The monitoring callbacks' arithmetic without training: throughput, sampler statistics, LR monitor."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.callbacks import LearningRateMonitor as LightningLearningRateMonitor
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from nerf_lightning.callbacks.lr_monitor import LearningRateMonitor
from nerf_lightning.callbacks.sampler_monitor import SamplerMonitor
from nerf_lightning.callbacks.throughput import ThroughputMonitor


def test_throughput_window_metrics_aggregate_ranks() -> None:
    mon = ThroughputMonitor(per_rank=True)
    # [rays, samples, seconds, steps, util %, peak GB, used GB] for two ranks
    record = torch.tensor([[1000.0, 50000.0, 2.0, 10.0, 80.0, 1.5, 3.0],
                           [1000.0, 30000.0, 4.0, 10.0, 60.0, 2.5, 3.5]], dtype=torch.float64)
    m = mon._window_metrics(record)
    assert m["perf/rays_per_s"] == pytest.approx(500.0 + 250.0)  # sum of the ranks' rates
    assert m["perf/samples_per_s"] == pytest.approx(25000.0 + 7500.0)
    assert m["perf/samples_per_ray"] == pytest.approx(40.0)
    assert m["perf/step_time_ms"] == pytest.approx(400.0)  # the slowest rank
    assert m["gpu/utilization"] == pytest.approx(70.0) and m["gpu/mem_peak_gb"] == 2.5
    assert m["perf/rank1/samples_per_s"] == pytest.approx(7500.0) and m["gpu/rank0/utilization"] == 80.0
    cpu = mon._window_metrics(torch.tensor([[10.0, 20.0, 1.0, 2.0, -1.0, -1.0, -1.0]], dtype=torch.float64))
    assert "gpu/utilization" not in cpu and "perf/rank0/samples_per_s" not in cpu
    assert cpu["perf/step_time_ms"] == pytest.approx(500.0)


def test_throughput_summary_counts_this_sessions_steps_after_a_resume() -> None:
    """Lightning restores a checkpoint's global step after ``on_fit_start``: a run resumed at step 120
    that trains 10 more steps reports steps = 130 and the time per step over those 10."""
    mon = ThroughputMonitor()
    trainer = SimpleNamespace(global_step=0, log_every_n_steps=50, state=SimpleNamespace(fn="fit"),
                              strategy=SimpleNamespace(root_device=torch.device("cpu")))
    module = SimpleNamespace(rays_seen=torch.tensor(0.0), samples_seen=torch.tensor(0.0))
    mon.on_fit_start(trainer, module)
    trainer.global_step = 120  # the loops' state is restored here
    mon.on_train_start(trainer, module)
    nothing_trained = mon.summary()  # no rate of zero steps (a resumed run that had nothing to train)
    assert nothing_trained["steps"] == 120
    rates = {"perf/step_time_ms", "train/rays_per_s", "train/samples_per_s", "train/samples_per_ray"}
    assert not rates & set(nothing_trained)
    mon.on_train_epoch_start(trainer, module)
    time.sleep(0.01)
    trainer.global_step = 130
    module.rays_seen += 10 * 64
    mon.on_validation_start(trainer, module)  # stops the training clock
    out = mon.summary()
    assert out["steps"] == 130 and out["time/train_s"] >= 0.01
    assert out["perf/step_time_ms"] == pytest.approx(out["time/train_s"] / 10 * 1e3)
    assert out["train/rays_per_s"] == pytest.approx(640 / out["time/train_s"])


def test_throughput_train_time_adds_up_over_a_resume() -> None:
    """A run trained 0.05 s, checkpointed mid-training (its clock running) and resumed for 0.02 s:
    ``time/train_s`` is the whole, ``time/train_s_this_process`` the resumed part."""
    trainer = SimpleNamespace(global_step=0, log_every_n_steps=50, state=SimpleNamespace(fn="fit"),
                              strategy=SimpleNamespace(root_device=torch.device("cpu")))
    module = SimpleNamespace(rays_seen=torch.tensor(0.0), samples_seen=torch.tensor(0.0))
    first = ThroughputMonitor()
    t0 = time.perf_counter()  # before the monitor's clock starts: an upper bound of what it counts
    first.on_fit_start(trainer, module)
    first.on_train_start(trainer, module)
    first.on_train_epoch_start(trainer, module)
    time.sleep(0.05)
    saved = first.state_dict()  # a last.ckpt written while training
    assert 0.05 <= saved["train_s"] <= time.perf_counter() - t0
    resumed = ThroughputMonitor()
    resumed.load_state_dict(saved)
    trainer.global_step = 100
    resumed.on_fit_start(trainer, module)
    resumed.on_train_start(trainer, module)
    resumed.on_train_epoch_start(trainer, module)
    time.sleep(0.02)
    trainer.global_step = 110
    resumed.on_train_epoch_end(trainer, module)
    out = resumed.summary()
    this = out["time/train_s_this_process"]
    assert 0.02 <= this < 0.5
    assert out["time/train_s"] == pytest.approx(saved["train_s"] + this)
    assert out["perf/step_time_ms"] == pytest.approx(this / 10 * 1e3)  # this process's 10 steps
    assert resumed.state_dict()["train_s"] == pytest.approx(out["time/train_s"])  # the next checkpoint's


def test_sampler_stats() -> None:
    uniform = SamplerMonitor.stats(torch.full((8,), 1 / 8))
    assert uniform["sampler/effective_views"] == pytest.approx(8.0)
    peaked = SamplerMonitor.stats(torch.tensor([1.0, 0.0, 0.0, 0.0]))
    assert peaked["sampler/effective_views"] == pytest.approx(1.0)
    assert (peaked["sampler/view_prob_min"], peaked["sampler/view_prob_max"]) == (0.0, 1.0)
    half = SamplerMonitor.stats(torch.tensor([0.5, 0.5, 0.0]))
    assert half["sampler/effective_views"] == pytest.approx(2.0)
    # unnormalized weights are normalized first: exp(entropy) of (1/4, 1/4, 1/2) is 2^1.5
    skewed = SamplerMonitor.stats(torch.tensor([1.0, 1.0, 2.0]))
    assert skewed["sampler/effective_views"] == pytest.approx(2**1.5)
    assert (skewed["sampler/view_prob_min"], skewed["sampler/view_prob_max"]) == pytest.approx((0.25, 0.5))


def test_lr_monitor_is_a_noop_without_logger() -> None:
    # a trainer with no loggers and nothing else: any use of it beyond `loggers` would raise
    trainer = SimpleNamespace(loggers=[])
    with pytest.raises(MisconfigurationException, match="has no logger"):
        LightningLearningRateMonitor().on_train_start(trainer)  # what the subclass exists to avoid
    monitor = LearningRateMonitor(logging_interval="step")
    monitor.on_train_start(trainer)
    monitor.on_train_epoch_start(trainer)
    monitor.on_train_batch_start(trainer, None, None, 0)
    assert not monitor._active
    # (with a logger it logs: tests/test_train_e2e.py reads its lr-Adam/table column back from the CSV log)
