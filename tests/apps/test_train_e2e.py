"""End to end: `train()` on a small generated scene learns (PSNR rises by a real margin), writes outputs,
follows the configured learning-rate schedule, and its checkpoint restores what it trained."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import lightning as L
import pytest
import torch
from runs import TINY

from nerf_lightning.apps.train import train
from nerf_lightning.run.config import compose_train_config


def instant_ngp_lr(step: int, lr: float, total: int, sched) -> float:
    """tiny-cuda-nn's ExponentialDecay at 0-based optimizer step ``step`` (fractions of the run when <= 1),
    times a linear warm-up ``min(1, (step + 1) / warmup_steps)`` when one is configured."""
    start = sched.decay_start * total if sched.decay_start <= 1 else sched.decay_start
    interval = sched.decay_interval * total if sched.decay_interval <= 1 else sched.decay_interval
    warmup = sched.get("warmup_steps", 0) or 0
    ramp = min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
    decays = 0 if step < start else math.floor((step - start) / interval) + 1
    return lr * ramp * sched.decay_base**decays


@pytest.mark.slow
def test_training_raises_psnr_and_writes_run_outputs(
    tiny_scene: Path, trained_run: tuple[Path, dict[str, float]], compose_cfg, tmp_path: Path
) -> None:
    # the 120-step run is the session's shared `trained_run` (conftest.py; eval/render/export use it too)
    scene = tiny_scene
    torch.set_num_threads(2)
    untrained = train(compose_cfg(f"data.path={scene}", "trainer.max_steps=0", *TINY))
    cfg = compose_cfg(f"data.path={scene}", "trainer.max_steps=120", *TINY)  # the trained run's config
    run_dir, metrics = trained_run

    assert metrics["steps"] == 120
    assert metrics["val/psnr"] > untrained["val/psnr"] + 6.0, (untrained["val/psnr"], metrics["val/psnr"])
    assert metrics["val/psnr"] > 17.0
    assert 0.0 < metrics["val/ssim"] <= 1.0
    assert metrics["train/rays_per_s"] > 0 and metrics["train/samples_per_s"] > metrics["train/rays_per_s"]
    written = json.loads((run_dir / "metrics.json").read_text())
    assert written["val/psnr"] == pytest.approx(metrics["val/psnr"])
    # held-out PSNR is the mean of the per-view PSNRs listed next to it; no test split: final = val
    per_view = written["val/per_view"]
    assert per_view["image"] == ["0000.png", "0008.png", "0016.png"]
    assert written["val/psnr"] == pytest.approx(sum(per_view["psnr"]) / 3, abs=1e-4)
    # instant-ngp's metric of the same views (over black in linear RGB) next to the headline one
    assert written["val/psnr_ngp"] == pytest.approx(sum(per_view["psnr_ngp"]) / 3, abs=1e-4)
    assert written["val/psnr_ngp"] != pytest.approx(written["val/psnr"], abs=1e-3)
    # and over black in sRGB (the ground truth of run.py --nerf_compatibility), a third number
    assert written["val/psnr_black"] == pytest.approx(sum(per_view["psnr_black"]) / 3, abs=1e-4)
    assert written["val/psnr_black"] != pytest.approx(written["val/psnr_ngp"], abs=1e-3)
    assert written["eval/split"] == "val" and written["eval/psnr"] == pytest.approx(written["val/psnr"])
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert list((run_dir / "val").glob("*.png")), "validation render missing"

    # The learning rate of every logged step (the project's LR monitor, CSV logger) is the configured
    # instant-ngp step decay over trainer.max_steps: at 120 steps it decays at 60, 78, 96 and 114.
    with (run_dir / "csv" / "metrics.csv").open() as f:
        logged = {
            int(r["step"]): float(r["lr-Adam/table"]) for r in csv.DictReader(f) if r.get("lr-Adam/table")
        }
    assert {9, 59, 69, 79, 99, 119} <= set(logged), sorted(logged)
    lr0 = cfg.model.optimizer.lr
    for step, lr in logged.items():
        assert lr == pytest.approx(instant_ngp_lr(step, lr0, 120, cfg.model.scheduler), rel=1e-6), step
    assert logged[119] < 0.02 * lr0  # four decays by 0.33

    # The checkpoint restores what was trained: resuming from last.ckpt (the documented `ckpt_path=`)
    # into a fresh module gives the same occupancy grid and renders the held-out views to the same PSNR.
    # (weights_only=True: what Lightning uses to resume; no pickled objects in the checkpoint)
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 120
    restored = train(
        compose_train_config(
            [
                f"data.path={scene}",
                "trainer.max_steps=120",
                f"ckpt_path={run_dir}/checkpoints/last.ckpt",
                *TINY,
            ],
            tmp_path / "restored",
        )
    )
    assert restored["steps"] == 120
    assert restored["model/occupied_fraction"] == metrics["model/occupied_fraction"] < 0.9
    assert restored["val/psnr"] == pytest.approx(metrics["val/psnr"], abs=0.01)
    assert restored["val/ssim"] == pytest.approx(metrics["val/ssim"], abs=1e-4)


@pytest.mark.slow
def test_budgeted_training_learns_and_adapts_its_ray_count(tiny_scene: Path, compose_cfg) -> None:
    """The GPU default (a fixed sample budget, static shapes) on the CPU reference path."""
    scene = tiny_scene
    torch.set_num_threads(2)
    budget = [
        "model.net.step.sample_budget=3072",
        "model.net.step.march_budget=8192",
        "model.net.step.n_rays_init=128",
    ]
    untrained = train(compose_cfg(f"data.path={scene}", "trainer.max_steps=0", *TINY, *budget))
    rays = _RayCount()
    metrics = train(
        compose_cfg(f"data.path={scene}", "trainer.max_steps=80", *TINY, *budget), [rays, _GraphedLikeStep()]
    )
    assert metrics["steps"] == 80
    assert metrics["val/psnr"] > untrained["val/psnr"] + 3.0, (untrained["val/psnr"], metrics["val/psnr"])
    # the ray count grew as the occupancy grid emptied (at most the 1024 ray slots), and the steps
    # filled the sample budget (3072 rendered samples, at least as many marched) within the marching
    # budget (8192)
    assert rays.counts[0] < 128 < rays.counts[-1] <= 1024, rays.counts
    # the throughput counters are plain sums: no autograd history kept alive from step to step
    assert not any(rays.counters_with_history), rays.counters_with_history.index(True)
    steps_s = metrics["time/train_s"] / 80
    marched_per_step = metrics["train/samples_per_s"] * steps_s
    assert 0.8 * 3072 < marched_per_step <= 8192, marched_per_step


class _GraphedLikeStep(L.Callback):
    """Makes the CPU step return what the CUDA-graphed one returns on a GPU: ``make_graphed_callables``
    hands back every float output as requiring grad, the statistics too."""

    class _Wrapped:
        def __init__(self, fn) -> None:
            self.fn = fn

        def __getattr__(self, name: str):
            return getattr(self.fn, name)

        def __call__(self, *args):
            loss, per_ray, valid, stats = self.fn(*args)
            return loss, per_ray + 0.0 * loss, valid, stats + 0.0 * loss

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.unowned.step = self._Wrapped(pl_module.train_step_fn)


class _RayCount(L.Callback):
    """The budgeted step's ray count after each optimizer step."""

    def __init__(self) -> None:
        self.counts: list[int] = []
        self.counters_with_history: list[bool] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        self.counts.append(int(pl_module.train_step_fn.n_active))
        counters = (pl_module.rays_seen, pl_module.samples_seen)
        self.counters_with_history.append(any(c.requires_grad or c.grad_fn is not None for c in counters))
