"""``benchmarks.host_loop`` in a real (tiny, CPU) training run: the stub's outputs, the loop's timing
written and printed, the real step restored afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra
from runs import TINY

from benchmarks import host_loop
from benchmarks.loop_profile import FILE
from nerf_lightning.data.ray_batch import RayBatch
from nerf_lightning.models.train_step import TrainStep


def test_the_stub_gives_every_parameter_a_zero_gradient() -> None:
    class Two(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Parameter(torch.ones(3, 2))
            self.b = torch.nn.Parameter(torch.ones(5))

    module = Two()
    index = torch.zeros(7, dtype=torch.int64)
    batch = RayBatch(rays_o=torch.zeros(7, 3), rays_d=torch.zeros(7, 3), rgb=torch.zeros(7, 3),
                     background=torch.ones(7, 3), view_ids=index, px=index, py=index)  # fmt: skip
    loss, per_ray, valid, stats = host_loop.stub_forward(module, batch)
    loss.backward()
    assert loss.item() == 0.0 and per_ray.shape == (7,) and bool(valid.all())
    assert stats.dtype == torch.float64 and stats.tolist() == [7.0, 0.0, 0.0, 0.0]
    assert torch.equal(module.a.grad, torch.zeros(3, 2)) and torch.equal(module.b.grad, torch.zeros(5))


def _probe(scene: Path, run_dir: Path, steps: int) -> int:
    overrides = [f"data.path={scene}", f"trainer.max_steps={steps}", *TINY, "data.batch_size=64",
                 "logger=csv", f"hydra.run.dir={run_dir}"]  # fmt: skip
    try:
        return host_loop.main(["--start", "4", "--steps", "4", "--", *overrides])
    finally:
        GlobalHydra.instance().clear()


def test_the_loop_is_timed_and_the_real_step_restored(
    tiny_scene: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = TrainStep.forward
    assert _probe(tiny_scene, tmp_path, 14) == 0
    assert TrainStep.forward is real
    result = json.loads((tmp_path / FILE).read_text())
    assert (result["start"], result["steps"]) == (4, 4) and result["wall_ms_per_step"] > 0
    assert f"host loop: {result['wall_ms_per_step']:.3f} ms a step" in capsys.readouterr().out
    # the stubbed step renders nothing: the profiled window never reaches the renderer
    assert not any("render_rays" in row[2] for row in result["cumulative"])


def test_a_run_too_short_for_the_window_exits_non_zero(
    tiny_scene: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _probe(tiny_scene, tmp_path, 6) == 1
    assert f"host_loop: no {FILE}" in capsys.readouterr().err
