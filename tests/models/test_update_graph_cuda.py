"""The training step with its optimizer update as one CUDA graph (``models/update_graph.py``) on the GPU: its
replays equal eager steps (losses, weights, Adam's state, a learning-rate schedule that changes between
replays), a batch in other tensors is copied in, and a replay with the schedule's step never synchronizes
with the host. GPU only: ``pytest -m cuda``."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():  # pragma: no cover - CPU CI
    pytest.skip("needs an NVIDIA GPU", allow_module_level=True)

from torch.optim.lr_scheduler import LambdaLR  # noqa: E402

from nerf_lightning.models.train_step import autocast_for  # noqa: E402
from nerf_lightning.models.update_graph import capture_update  # noqa: E402
from tests.models.cuda_steps import step_with_views  # noqa: E402
from tests.ray_batches import ray_batch  # noqa: E402

STEPS = 6
#: the rates of step_with_views' three groups (field, poses, exposure)
RATES = [1e-2, 1e-3, 1e-2]


def _setup(seed: int = 0):
    """The step with learned poses and exposures (their parameters are the graph's too), its fused Adam and a
    schedule that halves the rates every 2 steps: replays must read the rate the schedule set, not a
    captured value."""
    step, _, _, opt, rays = step_with_views(seed)
    return step, opt, LambdaLR(opt, lambda s: 0.5 ** (s // 2)), rays


def _eager(step, opt, batch, precision):
    with autocast_for(precision):
        loss, *_ = step(batch)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def _train(graphed: bool, precision: str, copy_inputs: bool = False):
    step, opt, schedule, rays = _setup(seed=3)
    losses, update = [], None
    for i in range(STEPS):
        batch = ray_batch(*rays)
        if graphed and i > 0:  # the first update is eager: it allocates Adam's state
            if update is None:
                update = capture_update(step, opt, batch, precision, share_inputs=True)
            fed = ray_batch(*(t.clone() for t in rays)) if copy_inputs else batch
            loss, *_ = update(fed)
        else:
            loss = _eager(step, opt, batch, precision)
        schedule.step()
        losses.append(float(loss))
    params = list(step.parameters())
    weights = torch.cat([p.detach().reshape(-1) for p in params])
    moments = torch.cat([opt.state[p]["exp_avg_sq"].reshape(-1) for p in params])
    return losses, weights, moments, [float(g["lr"]) for g in opt.param_groups]


def _close(a: torch.Tensor, b: torch.Tensor, rel: float) -> bool:
    return float((a - b).norm() / b.norm()) < rel


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_replays_of_the_update_graph_equal_eager_steps(precision: str) -> None:
    eager, graphed = _train(False, precision), _train(True, precision)
    assert graphed[0] == pytest.approx(eager[0], rel=2e-3)
    assert _close(graphed[1], eager[1], 5e-3)
    assert _close(graphed[2], eager[2], 2e-2)
    assert graphed[3] == pytest.approx(eager[3], rel=1e-6) == [rate * 0.125 for rate in RATES]


def test_a_batch_in_other_tensors_is_copied_into_the_graph() -> None:
    shared, copied = _train(True, "32-true"), _train(True, "32-true", copy_inputs=True)
    assert copied[0] == pytest.approx(shared[0], rel=1e-5)
    assert _close(copied[1], shared[1], 1e-5)


def test_a_replay_and_the_schedule_step_never_sync_with_the_host() -> None:
    step, opt, schedule, rays = _setup()
    batch = ray_batch(*rays)
    _eager(step, opt, batch, "bf16-mixed")
    update = capture_update(step, opt, batch, "bf16-mixed", share_inputs=True)
    update(batch)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            update(batch)
            schedule.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
