"""The training panel's text: rates with a unit that fits (as the progress bar), and what it says about
the held-out PSNR before the first validation (no server, no training)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from nerf_lightning.callbacks import throughput
from nerf_lightning.callbacks.throughput import ThroughputMonitor
from nerf_lightning.viewer.callback import ViewerCallback, next_validation_step
from nerf_lightning.viewer.status import TrainingStatus


@pytest.mark.parametrize(
    ("rays_per_s", "shown"),
    [
        (576.0, "rays/s 576"),
        (2375.2, "rays/s 2.38 k"),
        (12_300_000.0, "rays/s 12.3 M"),
        (999_700.0, "rays/s 1 M"),
    ],
)
def test_the_panel_shows_rays_per_s_with_a_unit_that_fits(rays_per_s: float, shown: str) -> None:
    text = TrainingStatus(step=10, rays_per_s=rays_per_s).markdown()
    assert text.endswith(shown), text


def _window(rays: float, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The progress bar's entries after one 50-step window of ``rays`` rays in 0.05 s (a clock of its own:
    no wait, and the rate the same on any machine)."""
    now = [100.0]
    monkeypatch.setattr(throughput, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    mon = ThroughputMonitor()
    trainer = SimpleNamespace(
        global_step=0, log_every_n_steps=50, world_size=1, is_global_zero=True, loggers=[],
        state=SimpleNamespace(fn="fit"), strategy=SimpleNamespace(root_device=torch.device("cpu")),
    )  # fmt: skip
    module = SimpleNamespace(rays_seen=torch.tensor(0.0), samples_seen=torch.tensor(0.0), device="cpu")
    mon.on_fit_start(trainer, module)
    mon.on_train_start(trainer, module)
    mon.on_train_epoch_start(trainer, module)
    now[0] += 0.05
    trainer.global_step = 50
    module.rays_seen += rays
    module.samples_seen += 40 * rays
    mon.on_train_batch_end(trainer, module, None, None, 49)
    return mon.progress_bar_metrics() | {"_rate": mon.latest["perf/rays_per_s"]}


def test_the_progress_bar_and_the_panel_format_the_rate_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    bar = _window(30.0, monkeypatch)  # a CPU's few hundred rays/s
    rate = bar["_rate"]
    assert rate == pytest.approx(600.0)  # 30 rays in 0.05 s
    assert bar["rays/s"] == "600"  # below 1000: no prefix, three digits
    assert TrainingStatus(step=50, rays_per_s=rate).markdown().endswith(f"rays/s {bar['rays/s']}")
    fast = _window(3.0e5, monkeypatch)  # millions per second
    assert fast["rays/s"].endswith(" M") and fast["samples/s"].endswith((" M", " G")), fast
    assert TrainingStatus(step=50, rays_per_s=fast["_rate"]).markdown().endswith(f"rays/s {fast['rays/s']}")


def test_before_the_first_validation_the_panel_says_when_it_comes() -> None:
    text = TrainingStatus(step=120, loss=0.01, train_psnr=24.314, first_val_step=1500).markdown()
    assert "training PSNR 24.31 dB (held-out PSNR at step 1,500)" in text, text
    assert "– dB" not in text
    text = TrainingStatus(step=0, first_val_step=5000).markdown()  # nothing logged yet
    assert "loss – · held-out PSNR at step 5,000  \n" in text, text
    text = TrainingStatus(step=6000, val_psnr=28.5, train_psnr=30.0, first_val_step=None).markdown()
    assert "held-out PSNR 28.50 dB" in text and "training PSNR" not in text, text


def _trainer(
    step: int,
    per_epoch: int = 500,
    every_epoch: int | None = 1000,
    every_batch: int | None = None,
    max_steps: int = 1500,
    accumulate: int = 1,
) -> SimpleNamespace:
    return SimpleNamespace(
        global_step=step,
        max_steps=max_steps,
        num_training_batches=per_epoch,
        check_val_every_n_epoch=every_epoch,
        val_check_batch=every_batch or per_epoch,
        accumulate_grad_batches=accumulate,
        enable_validation=True,
        _val_check_time_interval=None,
    )


def test_the_next_validation_step() -> None:
    assert next_validation_step(_trainer(0)) == 1500  # the CPU preset: only at the end
    # the default trainer: every 5 epochs of 1000 steps
    assert next_validation_step(_trainer(120, per_epoch=1000, every_epoch=5, max_steps=20000)) == 5000
    assert next_validation_step(_trainer(5000, per_epoch=1000, every_epoch=5, max_steps=20000)) == 10000
    assert next_validation_step(_trainer(9999, per_epoch=1000, every_epoch=5, max_steps=20000)) == 10000
    assert next_validation_step(_trainer(18000, per_epoch=1000, every_epoch=5, max_steps=19000)) == 19000
    # twice an epoch, at batches 40 and 80; every second epoch of 200 batches, accumulating 2 per step
    assert next_validation_step(_trainer(30, per_epoch=100, every_epoch=1, every_batch=40)) == 40
    assert next_validation_step(_trainer(85, per_epoch=100, every_epoch=1, every_batch=40)) == 140
    assert next_validation_step(_trainer(0, per_epoch=100, every_epoch=2, accumulate=2)) == 100
    assert next_validation_step(_trainer(700, per_epoch=100, every_epoch=None, every_batch=300)) == 900
    unsized = _trainer(10, max_steps=-1)
    unsized.num_training_batches = float("inf")
    assert next_validation_step(unsized) is None


def test_the_viewer_reads_the_training_psnr_and_the_next_validation() -> None:
    viewer = ViewerCallback()
    trainer = _trainer(120)
    trainer.callback_metrics = {"train/loss": torch.tensor(0.02), "train/psnr": torch.tensor(21.5)}
    status = viewer._status(trainer, SimpleNamespace(), "training")
    assert (status.train_psnr, status.first_val_step, status.val_psnr) == (21.5, 1500, None)
    trainer.callback_metrics["val/psnr"] = torch.tensor(27.25)
    status = viewer._status(trainer, SimpleNamespace(), "training")
    assert (status.val_psnr, status.first_val_step) == (27.25, None)
