"""The training feedback: the one way from the model and the callbacks to the data side."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from nerf_lightning.apps.train import instantiate_group
from nerf_lightning.callbacks.sampler_monitor import SamplerMonitor
from nerf_lightning.data.sampler import LossWeightedRaySampler
from nerf_lightning.training.batch_rules import throughput
from nerf_lightning.training.clock import Tick, TrainingClock
from nerf_lightning.training.feedback import TrainCameras, TrainingFeedback


def _cameras(n: int) -> TrainCameras:
    return TrainCameras(torch.zeros(n, 3, 4), torch.zeros(n, 10), torch.full((n,), 8), torch.full((n,), 8))


def test_an_unattached_feedback_takes_reports_and_reads_nothing() -> None:
    feedback = TrainingFeedback()
    feedback.report_losses(torch.zeros(2, dtype=torch.long), torch.zeros(2), torch.zeros(2), torch.ones(2))
    feedback.step(Tick.of_step(0))
    assert feedback.view_probabilities() is None
    assert feedback.cameras is None and feedback.capture is None
    assert not feedback.splits_by_throughput
    assert TrainingFeedback(TrainingClock(throughput())).splits_by_throughput


def test_reported_losses_reach_the_attached_sampler() -> None:
    sampler = LossWeightedRaySampler([8, 8], [8, 8], warmup_steps=0, update_every=1, uniform_floor=0.0)
    feedback = TrainingFeedback()
    feedback.attach(capture=None, cameras=_cameras(2), sampler=sampler)  # type: ignore[arg-type]
    assert torch.allclose(feedback.view_probabilities(), torch.tensor([0.5, 0.5]))
    view_ids = torch.tensor([0, 0, 1, 1])
    px = py = torch.tensor([1, 2, 3, 4])
    feedback.report_losses(view_ids, px, py, torch.tensor([1.0, 1.0, 0.0, 0.0]))
    feedback.step(Tick.of_step(0))
    probs = feedback.view_probabilities()
    assert probs[0] > 0.9 > probs[1]  # the view with the loss now draws almost every ray


def test_the_train_app_hands_the_feedback_only_to_callbacks_that_take_it() -> None:
    feedback = TrainingFeedback()
    group = OmegaConf.create({
        "monitor": {"_target_": f"{SamplerMonitor.__module__}.SamplerMonitor", "every_n_steps": 3},
        "lr": {"_target_": "nerf_lightning.callbacks.lr_monitor.LearningRateMonitor"},
    })
    monitor, lr = instantiate_group(group, feedback=feedback)
    assert isinstance(monitor, SamplerMonitor) and monitor.feedback is feedback
    assert not hasattr(lr, "feedback")
