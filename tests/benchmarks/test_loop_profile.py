"""``bench.loop_profile.LoopProfile`` in a real (tiny, CPU) training run: the window's timings and its
top functions, and a run too short for the window."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra
from runs import TINY

from benchmarks import readers
from benchmarks.loop_profile import FILE, LoopProfile
from nerf_lightning.run.config import compose_train_config

PROFILE = "+callbacks.loop_profile._target_=benchmarks.loop_profile.LoopProfile"


def _train(scene: Path, run_dir: Path, steps: int, *extra: str) -> None:
    from nerf_lightning.apps.train import train

    try:
        overrides = [f"data.path={scene}", f"trainer.max_steps={steps}", *TINY, "data.batch_size=64"]
        cfg = compose_train_config([*overrides, PROFILE, *extra], run_dir)
        train(cfg)
    finally:
        GlobalHydra.instance().clear()


def test_the_window_is_timed_then_profiled(tiny_scene: Path, tmp_path: Path) -> None:
    _train(tiny_scene, tmp_path, 16, "+callbacks.loop_profile.start=4", "+callbacks.loop_profile.steps=5",
           "+callbacks.loop_profile.top=60")  # fmt: skip
    result = json.loads((tmp_path / FILE).read_text())
    assert (result["start"], result["steps"]) == (4, 5)
    assert result["wall_ms_per_step"] > 0 and result["profiled_ms_per_step"] > 0
    assert len(result["own"]) == 60 and len(result["cumulative"]) == 60
    # the profiled steps ran the module's training step once each: it is among the top cumulative entries
    step = [r for r in result["cumulative"] if r[2].endswith(" training_step") and "module.py" in r[2]]
    assert step and step[0][1] == pytest.approx(1.0)
    own_ms = [r[0] for r in result["own"]]
    assert own_ms == sorted(own_ms, reverse=True)
    # the loop's outermost hook holds the whole step: far more than any one function's own time
    assert result["cumulative"][0][0] > 2 * own_ms[0]
    # as the benchmark runner reads it (experiment loop-profile)
    (row,) = readers.loop_profile_json(tmp_path, tmp_path / "log")
    assert row["loop_ms"] == result["wall_ms_per_step"]
    assert row["loop_steps_per_s"] == pytest.approx(1e3 / result["wall_ms_per_step"])
    assert row["profiled_ms"] == result["profiled_ms_per_step"]
    assert row["note"].startswith(f"{result['wall_ms_per_step']:.3f} ms/step in the loop")
    assert result["own"][0][2].split(" ", 1)[1] in row["note"]


def test_the_kernel_window_follows_under_torch_profiler(tiny_scene: Path, tmp_path: Path) -> None:
    _train(tiny_scene, tmp_path, 16, "+callbacks.loop_profile.start=4", "+callbacks.loop_profile.steps=3",
           "+callbacks.loop_profile.kernel_steps=4")  # fmt: skip
    gpu = json.loads((tmp_path / FILE).read_text())["gpu"]
    assert gpu["steps"] == 4 and gpu["wall_ms_per_step"] > 0
    # on a CPU: no kernels, no idle GPU, no synchronizing CUDA calls
    assert gpu["kernels_per_step"] == 0 and gpu["timeline"]["busy_ms"] == 0 and gpu["syncs"] == {}
    (row,) = readers.loop_profile_json(tmp_path, tmp_path / "log")
    assert row["gpu_kernel_ms"] == 0 and "0 kernels, 0.000 ms of kernel time" in row["note"]


def test_a_run_shorter_than_the_window_writes_nothing(
    tiny_scene: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        _train(tiny_scene, tmp_path, 8, "+callbacks.loop_profile.start=4", "+callbacks.loop_profile.steps=5")
    assert not (tmp_path / FILE).exists()
    assert "ended before optimizer step 14" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # the kernel window counts too: 4 + 2 x 2 + 4 > 8
        _train(tiny_scene, tmp_path, 8, "+callbacks.loop_profile.start=4", "+callbacks.loop_profile.steps=2",
               "+callbacks.loop_profile.kernel_steps=4")  # fmt: skip
    assert not (tmp_path / FILE).exists()
    assert "ended before optimizer step 12" in caplog.text


def test_bad_window_is_refused() -> None:
    with pytest.raises(ValueError, match="loop_profile: start >= 0, steps >= 1"):
        LoopProfile(start=10, steps=0)
