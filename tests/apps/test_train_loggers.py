"""The loggers' close (``finish_loggers``: a W&B run's summary and exit status) gets the run's outcome:
status 0 and the final metrics after a finished run, status 3 (``EXIT_DIVERGED``) and no metrics after
a run that diverged. In the test process, with the loggers' close recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from runs import TINY_TRAIN

import nerf_lightning.apps.train as train_app
from nerf_lightning.errors import EXIT_DIVERGED, Diverged

STEPS = 6


@pytest.fixture
def closes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[dict[str, Any], int]]:
    """Every ``finish_loggers`` call of ``train``: (a copy of the metrics it got, its exit status)."""
    calls: list[tuple[dict[str, Any], int]] = []

    def record(loggers: Any, metrics: dict[str, Any] | None = None, exit_code: int = 0) -> None:
        calls.append((dict(metrics or {}), exit_code))

    monkeypatch.setattr(train_app, "finish_loggers", record)
    return calls


def _cfg(compose_cfg: Any, scene: Path, *extra: str) -> Any:
    return compose_cfg(*TINY_TRAIN, f"data.path={scene}", f"trainer.max_steps={STEPS}", *extra)


def test_a_finished_run_closes_its_loggers_with_status_0_and_its_metrics(
    compose_cfg: Any, tiny_scene: Path, closes: list[tuple[dict[str, Any], int]]
) -> None:
    metrics = train_app.train(_cfg(compose_cfg, tiny_scene))
    assert len(closes) == 1
    closed, status = closes[0]
    assert status == 0
    assert closed["steps"] == STEPS and closed == metrics


def test_a_diverged_run_closes_its_loggers_with_status_3(
    compose_cfg: Any, tiny_scene: Path, closes: list[tuple[dict[str, Any], int]]
) -> None:
    cfg = _cfg(compose_cfg, tiny_scene, "model.optimizer.lr=1e30", "trainer.log_every_n_steps=2")
    with pytest.raises(Diverged, match="training diverged"):
        train_app.train(cfg)
    assert closes == [({}, EXIT_DIVERGED)]
