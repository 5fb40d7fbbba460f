"""The training loop without Lightning's per-step work that a run has no use for (run/loop.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.profilers import SimpleProfiler
from runs import TINY_TRAIN

from nerf_lightning.callbacks.grad_exchange import GradientExchange
from nerf_lightning.callbacks.load_balance import LoadBalancer
from nerf_lightning.callbacks.lr_monitor import LearningRateMonitor
from nerf_lightning.callbacks.progress import ProgressBar
from nerf_lightning.callbacks.throughput import ThroughputMonitor
from nerf_lightning.run.loop import QuietProfiler, drop_inert_callbacks
from nerf_lightning.tracking.prometheus import PrometheusExporter


class _Seen(L.Callback):
    """What the trainer holds when fitting starts."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.types = [type(cb) for cb in trainer.callbacks]
        self.profiler = trainer.profiler
        self.bar = trainer.progress_bar_callback


def _fit(tiny_scene: Path, tmp_path: Path, *overrides: str, bar: bool = False) -> _Seen:
    from hydra.core.global_hydra import GlobalHydra

    from nerf_lightning.apps.train import train
    from nerf_lightning.run.config import compose_train_config

    seen = _Seen()
    base = [a for a in TINY_TRAIN if not (bar and a.startswith("callbacks.progress_bar="))]
    args = [*base, f"data.path={tiny_scene}", "trainer.max_steps=2", *overrides]
    torch.set_num_threads(1)
    try:
        train(compose_train_config(args, tmp_path), extra_callbacks=[seen])
    finally:
        GlobalHydra.instance().clear()
    return seen


def test_a_run_without_a_progress_bar_gets_none_of_lightnings_and_no_inert_callbacks(
    tiny_scene: Path, tmp_path: Path
) -> None:
    seen = _fit(tiny_scene, tmp_path / "a")  # TINY_TRAIN: callbacks.progress_bar=null, logger=csv
    assert seen.bar is None  # Lightning adds its RichProgressBar (refresh every step) unless told not to
    assert not any(issubclass(t, L.pytorch.callbacks.ProgressBar) for t in seen.types)
    assert isinstance(seen.profiler, QuietProfiler)
    # one process, no port, float32 exchange: inert; the throughput monitor and the csv logger's
    # learning-rate monitor work
    for inert in (PrometheusExporter, LoadBalancer, GradientExchange):
        assert inert not in seen.types
    assert ThroughputMonitor in seen.types and LearningRateMonitor in seen.types


def test_the_configured_bar_profiler_and_port_stay(tiny_scene: Path, tmp_path: Path) -> None:
    seen = _fit(
        tiny_scene,
        tmp_path / "b",
        "+trainer.profiler=simple",
        "callbacks.prometheus.port=0",
        "logger=none",
        bar=True,
    )
    assert isinstance(seen.bar, ProgressBar)
    assert isinstance(seen.profiler, SimpleProfiler)
    assert PrometheusExporter in seen.types
    assert LearningRateMonitor not in seen.types  # no logger to write to


def test_trainer_enable_progress_bar_false_removes_the_groups_bar(tiny_scene: Path, tmp_path: Path) -> None:
    seen = _fit(tiny_scene, tmp_path / "c", "+trainer.enable_progress_bar=false", bar=True)
    assert seen.bar is None and ProgressBar not in seen.types


def test_quiet_profiler_nests_and_records_nothing() -> None:
    p = QuietProfiler()
    with p.profile("outer"), p.profile("inner"):
        pass
    assert p.profile("a") is p.profile("b")
    assert p.summary() == ""


def _trainer(world_size: int, loggers: list[Any] | None = None) -> Any:
    return SimpleNamespace(world_size=world_size, loggers=loggers or [], callbacks=[])


@pytest.mark.parametrize(
    ("callback", "world_size", "loggers", "inert"),
    [
        (PrometheusExporter(port=None), 1, [], True),
        (PrometheusExporter(port=9400), 1, [], False),
        (LoadBalancer(), 1, [], True),
        (LoadBalancer(), 2, [], False),
        (GradientExchange("fp32"), 2, [], True),
        (GradientExchange("bf16"), 2, [], False),
        (GradientExchange("bf16"), 1, [], True),
        (LearningRateMonitor(), 1, [], True),
        (LearningRateMonitor(), 1, [object()], False),
    ],
)
def test_inert_callbacks_are_dropped_and_the_others_kept(
    callback: L.Callback, world_size: int, loggers: list[Any], inert: bool
) -> None:
    kept = ThroughputMonitor()
    trainer = _trainer(world_size, loggers)
    trainer.callbacks = [kept, callback]
    dropped = drop_inert_callbacks(trainer)
    assert dropped == ([callback] if inert else [])
    assert trainer.callbacks == ([kept] if inert else [kept, callback])


def test_the_module_sets_the_hook_name_without_nn_module_setattr(monkeypatch: pytest.MonkeyPatch) -> None:
    from nerf_lightning.models.module import NeRFModule

    calls: list[str] = []
    original = torch.nn.Module.__setattr__

    def counting(self: torch.nn.Module, name: str, value: Any) -> None:
        calls.append(name)
        original(self, name, value)

    module = NeRFModule.__new__(NeRFModule)  # the attribute path only: no field to build
    monkeypatch.setattr(torch.nn.Module, "__setattr__", counting)
    module.__dict__.update(_parameters={}, _buffers={}, _modules={})
    module._current_fx_name = "on_train_batch_end"
    assert calls == [] and module._current_fx_name == "on_train_batch_end"
    module.other = 1  # every other attribute still goes through nn.Module
    assert calls == ["other"]
