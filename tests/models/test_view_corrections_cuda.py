"""The budgeted training step with learned pose corrections and exposures on the GPU: captured as CUDA
graphs it equals eager execution (loss, the corrections' gradients, three optimizer steps that the graph
must see), and it never synchronizes with the host. GPU only: ``pytest -m cuda``."""

from __future__ import annotations

import functools
import importlib

import pytest
import torch

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():  # pragma: no cover - CPU CI
    pytest.skip("needs an NVIDIA GPU", allow_module_level=True)

from nerf_lightning.models.appearance import PerViewExposure  # noqa: E402
from nerf_lightning.models.camera_opt import CameraOptimizer  # noqa: E402
from nerf_lightning.models.field import NGPField  # noqa: E402
from nerf_lightning.models.train_step import autocast_for, capture, train_step  # noqa: E402
from tests.models.cuda_steps import step_with_views  # noqa: E402
from tests.nerf_modules import nerf_module  # noqa: E402
from tests.ray_batches import ray_batch  # noqa: E402

DEV = torch.device("cuda")
N_VIEWS = 12


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_graph_replay_with_pose_and_exposure_equals_eager_steps(precision) -> None:
    results = []
    for graphed in (False, True):
        step, cam, exposure, opt, args = step_with_views(seed=4)
        batch = ray_batch(*args)
        fn = capture(step, batch, precision, alias_gradients=True, share_inputs=True) if graphed else step
        losses, first_grads = [], None
        for _ in range(3):
            with autocast_for(precision):
                loss, per_ray, valid, stats = fn(ray_batch(*args))
            loss.backward()
            if first_grads is None:
                first_grads = [
                    t.grad.detach().clone() for t in (cam.adjustment, exposure.log_gain, exposure.offset)
                ]
            opt.step()  # the graph reads the parameters in place: the next replay must see the step
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss))
        results.append(
            (losses, first_grads, cam.adjustment.detach().clone(), exposure.log_gain.detach().clone())
        )
    (l_e, g_e, cam_e, exp_e), (l_g, g_g, cam_g, exp_g) = results
    assert l_g == pytest.approx(l_e, rel=2e-3)
    for name, a, b in zip(("camera", "log_gain", "offset"), g_g, g_e, strict=True):
        assert float(b.norm()) > 0, name
        assert float((a - b).norm() / b.norm()) < 5e-3, name
    assert float((cam_g - cam_e).norm() / cam_e.norm()) < 5e-3
    assert float((exp_g - exp_e).norm() / exp_e.norm()) < 5e-3


def test_graph_replay_with_the_opacity_loss_equals_eager_steps() -> None:
    """``alpha_weight`` adds the rays' target alpha as a static input of the captured step."""
    results = []
    for graphed in (False, True):
        step, _, _, _, (o, d, target, bg, view_ids) = step_with_views(seed=5)
        step.alpha_weight = 0.5
        alpha = torch.rand(o.shape[0], device=DEV, generator=torch.Generator(device=DEV).manual_seed(9))
        params = list(step.field.parameters())
        opt = torch.optim.Adam(params, lr=1e-2, eps=1e-15, fused=True)
        args = (o, d, target, bg, view_ids, alpha)
        batch = ray_batch(*args)
        fn = capture(step, batch, "32-true", alias_gradients=True, share_inputs=True) if graphed else step
        losses = []
        for _ in range(3):
            loss, *_ = fn(ray_batch(*args))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss))
            alpha.mul_(0.5)  # the next batch's alpha, written in place as the batch graph does
        results.append((losses, torch.cat([p.detach().reshape(-1) for p in params])))
    (l_e, w_e), (l_g, w_g) = results
    assert l_g == pytest.approx(l_e, rel=2e-3)
    assert float((w_g - w_e).norm() / w_e.norm()) < 5e-3


def test_step_with_pose_and_exposure_never_syncs_with_the_host() -> None:
    step, cam, exposure, opt, args = step_with_views()
    loss, *_ = step(ray_batch(*args))  # first call: extension load, cuBLAS handles
    loss.backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            with autocast_for("bf16-mixed"):
                loss, *_ = step(ray_batch(*args))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_the_position_gradient_runs_the_kernels_not_the_reference(monkeypatch) -> None:
    """With learned poses every op of the step stays on its CUDA kernel (a fall-back to the PyTorch
    reference would be correct but many times slower): no wrapper asks for its reference."""
    from nerf_lightning.ops.cuda import _support

    def refuse(op: str, why: str):
        raise AssertionError(f"ops.cuda.{op} fell back to the PyTorch reference: {why}")

    monkeypatch.setattr(_support, "reference_for", refuse)
    for name in ("compositing", "encoding", "grid", "losses", "marching", "mlp", "rays", "step"):
        wrappers = importlib.import_module(f"nerf_lightning.ops.cuda.{name}")
        monkeypatch.setattr(wrappers, "reference_for", refuse)
    step, cam, exposure, opt, args = step_with_views()
    with autocast_for("bf16-mixed"):
        loss, *_ = step(ray_batch(*args))
    loss.backward()
    assert float(cam.adjustment.grad.norm()) > 0


def test_module_builds_the_components_into_its_graphed_step() -> None:
    """NeRFModule hands its enabled components to the budgeted step (their parameters are the graph's)."""
    poses = torch.eye(4)[:3].expand(N_VIEWS, 3, 4).clone()
    poses[:, :, 3] = torch.randn(N_VIEWS, 3)
    module = nerf_module(
        field=functools.partial(NGPField),
        optimizer=functools.partial(torch.optim.Adam, lr=1e-2),
        step=functools.partial(train_step, sample_budget=1 << 16),
        camera_opt=functools.partial(CameraOptimizer, enabled=True),
        appearance=functools.partial(PerViewExposure, enabled=True),
        n_train_views=N_VIEWS,
        train_poses=poses,
    )
    names = {n for n, _ in module.train_step_fn.named_parameters()}
    assert {"camera_opt.adjustment", "appearance.log_gain"} <= names
