"""The camera-pose corrections as a component: the exponential maps, the rays they move, the gauge that
keeps the cameras in the given poses' frame, the refined poses and the group's learning-rate schedule."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nerf_lightning.models.camera_opt import CameraOptimizer, se3_left_jacobian_apply, so3_exp


def _skew(w: torch.Tensor) -> torch.Tensor:
    k = torch.zeros(*w.shape[:-1], 3, 3, dtype=w.dtype)
    k[..., 0, 1], k[..., 0, 2], k[..., 1, 2] = -w[..., 2], w[..., 1], -w[..., 0]
    return k - k.transpose(-1, -2)


def _poses(n: int, seed: int = 0) -> torch.Tensor:
    """``n`` cameras on a sphere around (0.5, 0.5, 0.5), NGP space [n, 3, 4] (rotation from a QR)."""
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, 3, 3, generator=g, dtype=torch.float64))
    q = q * torch.linalg.det(q)[:, None, None]  # proper rotations
    centres = 0.5 + torch.nn.functional.normalize(torch.randn(n, 3, generator=g, dtype=torch.float64), dim=-1)
    return torch.cat([q, centres[:, :, None]], dim=-1).float()


def test_exponential_maps_equal_the_matrix_exponential() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 3, generator=g, dtype=torch.float64) * 0.8
    w[:8] *= torch.logspace(-9, -2, 8, dtype=torch.float64)[:, None]  # through the series' range
    w[8] = 0.0
    # either side of the switch to the series (|w| = 1e-3): the series' leading terms must be right
    for i, size in enumerate((0.9e-3, 0.999e-3, 1.001e-3, 1.1e-3, 0.01, 0.05)):
        w[9 + i] = w[9 + i] / w[9 + i].norm() * size
    rho = torch.randn(64, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(so3_exp(w), torch.linalg.matrix_exp(_skew(w)), rtol=0, atol=1e-14)
    twist = torch.zeros(64, 4, 4, dtype=torch.float64)
    twist[:, :3, :3], twist[:, :3, 3] = _skew(w), rho
    torch.testing.assert_close(
        se3_left_jacobian_apply(w, rho), torch.linalg.matrix_exp(twist)[:, :3, 3], rtol=0, atol=5e-15
    )


def test_rotation_gradient_at_zero_is_the_cross_product() -> None:
    """d(R(w) v)/dw at w = 0 is -[v]x (d(w x v)/dw); finite, not the 0/0 of the closed form."""
    v = torch.tensor([0.3, -1.2, 0.7], dtype=torch.float64)
    jac = torch.autograd.functional.jacobian(lambda w: so3_exp(w) @ v, torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(jac, -_skew(v), rtol=0, atol=1e-14)


def test_rays_turn_about_the_camera_centre_and_the_centre_moves() -> None:
    poses = _poses(3)
    cam = CameraOptimizer(3, poses, enabled=True, gauge="none")
    w = torch.tensor([0.0, 0.0, math.radians(10.0)])
    with torch.no_grad():
        cam.adjustment[1] = torch.cat([w, torch.tensor([0.01, -0.02, 0.03])])
    g = torch.Generator().manual_seed(1)
    d = torch.nn.functional.normalize(torch.randn(5, 3, generator=g), dim=-1)
    o = poses[1, :, 3].expand(5, 3)
    o2, d2 = cam(torch.ones(5, dtype=torch.long), o, d)
    torch.testing.assert_close(o2, o + torch.tensor([0.01, -0.02, 0.03]))  # SO3xR3: t = rho
    c, s = math.cos(math.radians(10.0)), math.sin(math.radians(10.0))
    rz = torch.tensor([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
    torch.testing.assert_close(d2, d @ rz.T, rtol=0, atol=1e-6)
    o0, d0 = cam(torch.zeros(5, dtype=torch.long), o, d)  # view 0 has no correction
    assert torch.equal(o0, o) and torch.allclose(d0, d, atol=1e-7)


def test_gauge_removes_a_global_similarity_and_keeps_a_single_view_correction() -> None:
    """Corrections that move every camera by one small rotation about a point, a translation and a
    scale (and the scene with them: nothing to see in the images) are removed; one camera's own
    correction is nearly untouched; the projection is idempotent."""
    poses = _poses(12, seed=2)
    centres = poses[:, :, 3].double()
    cam = CameraOptimizer(12, poses, enabled=True)
    w_g = torch.tensor([0.01, -0.02, 0.015], dtype=torch.float64)
    pivot, tau, s = (
        torch.tensor([0.2, 0.9, 0.4], dtype=torch.float64),
        torch.tensor([1e-3, 2e-3, -1e-3]),
        0.01,
    )
    t = torch.linalg.cross(w_g.expand(12, 3), centres - pivot) + tau + s * (centres - pivot)
    global_move = torch.cat([w_g.expand(12, 3), t], dim=-1)
    with torch.no_grad():
        cam.adjustment.copy_(global_move)
    assert float(cam.corrections().detach().abs().max()) < 1e-7  # float32 storage of a 0.02 move
    one = torch.zeros(12, 6, dtype=torch.float64)
    one[5] = torch.tensor([0.02, 0.01, -0.03, 0.004, -0.002, 0.003])
    with torch.no_grad():
        cam.adjustment.copy_(one + global_move)
    kept = cam.corrections().detach()
    assert float((kept - one).norm() / one.norm()) < 0.35  # 12 views: most of it is not gauge
    with torch.no_grad():
        cam.adjustment.copy_(kept)
    torch.testing.assert_close(cam.corrections().detach(), kept, rtol=0, atol=1e-8)  # idempotent
    none = CameraOptimizer(12, poses, enabled=True, gauge="none")
    with torch.no_grad():
        none.adjustment.copy_(global_move)
    torch.testing.assert_close(none.corrections(), global_move.float().double(), rtol=0, atol=0)


def test_refined_poses_compose_the_correction_on_the_given_pose() -> None:
    poses = _poses(4, seed=3)
    cam = CameraOptimizer(4, poses, enabled=True, gauge="none", mode="SE3")
    x = torch.tensor([0.05, -0.1, 0.2, 0.01, 0.02, -0.03])
    with torch.no_grad():
        cam.adjustment[2] = x
    twist = torch.zeros(4, 4, dtype=torch.float64)
    twist[:3, :3], twist[:3, 3] = _skew(x[:3].double()), x[3:].double()
    t = torch.linalg.matrix_exp(twist)
    refined = cam.refined_poses(poses)
    want = poses[2].double().clone()
    want[:, :3] = t[:3, :3] @ want[:, :3]
    want[:, 3] = want[:, 3] + t[:3, 3]
    torch.testing.assert_close(refined[2], want, rtol=0, atol=1e-6)
    torch.testing.assert_close(refined[0], poses[0].double(), rtol=0, atol=0)


def test_state_loads_into_a_module_built_without_poses() -> None:
    """eval / render rebuild the model from the checkpoint alone: the gauge comes with the state."""
    poses = _poses(6, seed=4)
    trained = CameraOptimizer(6, poses, enabled=True)
    with torch.no_grad():
        trained.adjustment.normal_(0.0, 0.01)
    rebuilt = CameraOptimizer(6, None, enabled=True)
    rebuilt.load_state_dict(trained.state_dict())
    torch.testing.assert_close(rebuilt.corrections(), trained.corrections(), rtol=0, atol=0)
    assert float((trained.corrections() - trained.adjustment.double()).detach().abs().max()) > 1e-4


def test_group_learning_rate_decays_log_linearly_after_a_warmup() -> None:
    cam = CameraOptimizer(
        2, _poses(2), enabled=True, lr=1e-3, lr_final=1e-5, decay_steps=0.5, warmup_steps=10
    )
    group = cam.parameter_group(total_steps=400)
    assert group.as_dict()["lr"] == 1e-3 and group.as_dict()["weight_decay"] == 1e-4
    f = group.lr_lambda
    assert f(0) == pytest.approx(0.1 * 0.01 ** (0 / 200))
    assert f(9) == pytest.approx(0.01 ** (9 / 200))
    assert f(100) == pytest.approx(0.1)  # half-way through the decay: 1e-3 -> 1e-4
    assert f(200) == pytest.approx(0.01) and f(399) == pytest.approx(0.01)


def test_bad_settings_are_named() -> None:
    with pytest.raises(ValueError, match="model.net.camera_opt.mode"):
        CameraOptimizer(2, enabled=True, mode="SE2")
    with pytest.raises(ValueError, match="model.net.camera_opt.enabled"):
        CameraOptimizer(2, enabled="sometimes")
    with pytest.raises(ValueError, match="number of training views"):
        CameraOptimizer(0, enabled=True)
    assert CameraOptimizer(3, enabled="auto", photograph=True).enabled
    assert not CameraOptimizer(3, enabled="auto", photograph=False).enabled
    assert np.isfinite(CameraOptimizer(1, _poses(1), enabled=True).gauge.numpy()).all()
