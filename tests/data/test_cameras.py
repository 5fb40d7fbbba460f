"""Ray generation and projection: undistortion round trips, known projections, tensor helpers."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from nerf_lightning.data.cameras import (
    distort,
    intrinsics_tensor,
    pixel_rays,
    poses_tensor,
    project_points,
    undistort,
)
from nerf_lightning.data.formats import nerf_to_ngp
from nerf_lightning.data.types import Frame, Intrinsics

from .conftest import look_at_nerf

FOX_LIKE = {
    # fox's camera at full resolution (1080 x 1920) plus a k3 term so every coefficient is exercised.
    "opencv": [
        1375.52,
        1374.49,
        554.558,
        965.268,
        0.0578421,
        -0.0805099,
        0.01,
        0.0,
        -0.000980296,
        0.00015575,
    ],
    # A strongly barrel-distorted lens: Newton must still converge in the corners.
    "opencv_strong": [1375.52, 1374.49, 554.558, 965.268, -0.3, 0.1, 0.0, 0.0, 0.001, -0.002],
    "opencv_fisheye": [600.0, 600.0, 540.0, 960.0, 0.05, 0.01, -0.003, 0.0005, 0.0, 0.0],
    "pinhole": [1375.52, 1374.49, 554.558, 965.268, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
}


def _random_pose(gen: torch.Generator, dtype) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(3, 3, generator=gen, dtype=torch.float64))
    q = q * torch.sign(torch.linalg.det(q))
    t = torch.randn(3, 1, generator=gen, dtype=torch.float64)
    return torch.cat([q, t], dim=1).to(dtype)  # [3, 4]


@pytest.mark.parametrize("name", list(FOX_LIKE))
def test_pixel_rays_project_points_round_trip(name):
    model = name.replace("_strong", "")
    gen = torch.Generator().manual_seed(0)
    b = 4096
    k = torch.tensor(FOX_LIKE[name], dtype=torch.float64).expand(b, 10)
    c2w = _random_pose(gen, torch.float64).expand(b, 3, 4)
    px = torch.rand(b, generator=gen, dtype=torch.float64) * 1080
    py = torch.rand(b, generator=gen, dtype=torch.float64) * 1920
    # Include the four image corners, where distortion is largest.
    px[:4] = torch.tensor([0.0, 1080.0, 0.0, 1080.0], dtype=torch.float64)
    py[:4] = torch.tensor([0.0, 0.0, 1920.0, 1920.0], dtype=torch.float64)
    o, d = pixel_rays(c2w, k, px, py, model)
    assert o.shape == (b, 3) and d.shape == (b, 3)
    torch.testing.assert_close(torch.linalg.vector_norm(d, dim=-1), torch.ones(b, dtype=torch.float64))
    torch.testing.assert_close(o, c2w[:, :, 3])
    t = 0.2 + 5 * torch.rand(b, generator=gen, dtype=torch.float64)
    u, v, depth = project_points(o + d * t[:, None], c2w, k, model)
    assert (u - px).abs().max() < 1e-3 and (v - py).abs().max() < 1e-3
    # depth is camera-space z: the ray parameter times the z component of the camera-space direction.
    d_cam = (c2w[:, :, :3].transpose(1, 2) @ d[:, :, None])[:, :, 0]
    torch.testing.assert_close(depth, t * d_cam[:, 2])


@pytest.mark.parametrize("name", ["opencv", "opencv_strong", "opencv_fisheye"])
def test_float32_undistort_round_trip_below_1e3_px(name):
    model = name.replace("_strong", "")
    gen = torch.Generator().manual_seed(1)
    b = 20000
    k = torch.tensor(FOX_LIKE[name]).expand(b, 10)
    px, py = torch.rand(b, generator=gen) * 1080, torch.rand(b, generator=gen) * 1920
    x, y, z = undistort((px - k[:, 2]) / k[:, 0], (py - k[:, 3]) / k[:, 1], k, model)
    xd, yd = distort(x, y, z, k, model)
    assert (xd * k[:, 0] + k[:, 2] - px).abs().max() < 1e-3
    assert (yd * k[:, 1] + k[:, 3] - py).abs().max() < 1e-3


def test_opencv_distortion_matches_hand_computation():
    k = torch.tensor([[100.0, 100.0, 50.0, 40.0, 0.1, 0.01, 0.001, 0.0, 0.002, -0.003]], dtype=torch.float64)
    x, y = 0.3, -0.2
    r2 = x * x + y * y
    radial = 1 + 0.1 * r2 + 0.01 * r2**2 + 0.001 * r2**3
    xd = x * radial + 2 * 0.002 * x * y + -0.003 * (r2 + 2 * x * x)
    yd = y * radial + 0.002 * (r2 + 2 * y * y) + 2 * -0.003 * x * y
    gx, gy = distort(
        torch.tensor([x], dtype=torch.float64),
        torch.tensor([y], dtype=torch.float64),
        torch.ones(1, dtype=torch.float64),
        k,
        "opencv",
    )
    assert gx.item() == pytest.approx(xd, abs=1e-15) and gy.item() == pytest.approx(yd, abs=1e-15)
    # The ray through the distorted pixel has camera direction (x, y, 1) up to normalization.
    _, d = pixel_rays(
        torch.eye(4, dtype=torch.float64)[None],
        k,
        torch.tensor([100 * xd + 50]),
        torch.tensor([100 * yd + 40]),
        "opencv",
    )
    torch.testing.assert_close(d[0] / d[0, 2], torch.tensor([x, y, 1.0], dtype=torch.float64))


@pytest.mark.parametrize(
    ("point", "pixel"),
    [
        # r = 0.75, theta = atan(0.75) = 0.6435011 rad, theta_d = 0.6665157
        ((0.6, -0.45, 1.0), (319.9637797433843, -3.9719293011228274)),
        # a wide angle (theta = 73.8 degrees), where k3 and k4 matter
        ((0.9, 0.5, 0.3), (529.3452246842655, 332.0315178743007)),
    ],
)
def test_fisheye_distortion_matches_hand_computation(point, pixel):
    """OpenCV's fisheye model (cv::fisheye): theta = atan2(r, z), theta_d = theta (1 + k1 theta^2 +
    k2 theta^4 + k3 theta^6 + k4 theta^8), pixel = (fx theta_d / r x + cx, fy theta_d / r y + cy).
    Every coefficient differs in size and sign, so any two swapped move the pixel by pixels."""
    k1, k2, k3, k4 = 0.1, -0.04, 0.02, -0.007
    x, y, z = point
    r = math.hypot(x, y)
    theta = math.atan2(r, z)
    theta_d = theta * (1 + k1 * theta**2 + k2 * theta**4 + k3 * theta**6 + k4 * theta**8)
    u, v = 300.0 * theta_d / r * x + 160.0, 310.0 * theta_d / r * y + 120.0
    assert (u, v) == pytest.approx(pixel, abs=1e-9)  # the numbers above, written out once
    # through the project's whole chain: Intrinsics record -> [V, 10] rows -> forward model
    intr = Intrinsics(
        300.0, 310.0, 160.0, 120.0, 320, 240, k1=k1, k2=k2, k3=k3, k4=k4, model="opencv_fisheye"
    )
    k = intrinsics_tensor([Frame(Path("x.png"), np.eye(4), intr)]).double()
    pu, pv, depth = project_points(
        torch.tensor([point], dtype=torch.float64), torch.eye(4, dtype=torch.float64), k[0], "opencv_fisheye"
    )
    # (float32 intrinsics rows: ~1e-5 relative)
    assert (pu.item(), pv.item()) == pytest.approx((u, v), abs=2e-3) and depth.item() == z
    # and the ray through that pixel points at the camera-space point
    _, d = pixel_rays(
        torch.eye(4, dtype=torch.float64)[None],
        k,
        torch.tensor([u], dtype=torch.float64),
        torch.tensor([v], dtype=torch.float64),
        "opencv_fisheye",
    )
    expected = torch.tensor(point, dtype=torch.float64)
    torch.testing.assert_close(d[0], expected / expected.norm(), atol=1e-5, rtol=0)


def test_fisheye_beyond_90_degrees():
    # Equidistant fisheye without distortion terms: radius in normalized units equals the angle.
    k = torch.tensor([[100.0, 100.0, 0.0, 0.0, 0, 0, 0, 0, 0, 0]], dtype=torch.float64)
    _, d = pixel_rays(
        torch.eye(4, dtype=torch.float64)[None],
        k,
        torch.tensor([200.0]),
        torch.tensor([0.0]),
        "opencv_fisheye",
    )
    torch.testing.assert_close(d[0], torch.tensor([math.sin(2.0), 0.0, math.cos(2.0)], dtype=torch.float64))


def test_principal_point_ray_is_optical_axis():
    c2w = nerf_to_ngp(look_at_nerf([3.0, 0.0, 1.0], [0.0, 0.0, 0.0]), 0.33, [0.5, 0.5, 0.5])
    c2w_t = torch.tensor(c2w[:3], dtype=torch.float32)[None]
    k = torch.tensor(FOX_LIKE["opencv"])[None]
    o, d = pixel_rays(c2w_t, k, k[:, 2], k[:, 3], "opencv")
    # The NeRF origin maps to NGP (0.5, 0.5, 0.5); the camera looks straight at it.
    to_c = torch.tensor([0.5, 0.5, 0.5]) - o[0]
    torch.testing.assert_close(d[0], to_c / to_c.norm(), atol=1e-6, rtol=0)


def test_point_in_front_of_posed_camera_projects_where_expected():
    # NeRF camera at (0, -4, 0) looking at the origin with z up: camera x = world +x, camera down = -z.
    c2w = torch.tensor(nerf_to_ngp(look_at_nerf([0.0, -4.0, 0.0], [0.0, 0.0, 0.0]), 0.5, [0.5] * 3))
    k = torch.tensor([200.0, 210.0, 64.0, 48.0, 0, 0, 0, 0, 0, 0], dtype=torch.float64)
    # World point 0.25 right of and 0.1 above the origin (NeRF units), at depth 4 -> NGP via the same map.
    p_nerf = np.array([0.25, 0.0, 0.1])
    p_ngp = (p_nerf * 0.5 + 0.5)[[1, 2, 0]]
    u, v, z = project_points(torch.tensor(p_ngp)[None], c2w, k, "pinhole")
    assert u.item() == pytest.approx(64.0 + 200.0 * 0.25 / 4.0)
    assert v.item() == pytest.approx(48.0 - 210.0 * 0.1 / 4.0)  # above the centre -> smaller row
    assert z.item() == pytest.approx(4.0 * 0.5)  # depth in NGP units (scaled by 0.5)
    # Per-point matrices / intrinsics broadcast the same way.
    u2, v2, _ = project_points(torch.tensor(p_ngp)[None], c2w[None], k[None], "pinhole")
    assert (u2.item(), v2.item()) == (u.item(), v.item())


def test_tensor_helpers():
    frames = [
        Frame(
            Path(f"{i}.png"),
            np.diag([1.0, 1.0, 1.0, 1.0]) + i,
            Intrinsics(10.0 + i, 11.0, 5.0, 4.0, 10, 8, k1=0.1),
        )
        for i in range(3)
    ]
    k, p = intrinsics_tensor(frames), poses_tensor(frames)
    assert k.shape == (3, 10) and k.dtype == torch.float32
    assert p.shape == (3, 3, 4) and p.dtype == torch.float32
    assert k[2].tolist() == pytest.approx([12.0, 11.0, 5.0, 4.0, 0.1, 0, 0, 0, 0, 0])
    assert p[1, 0].tolist() == [2.0, 1.0, 1.0, 1.0]


def test_unknown_model_raises():
    with pytest.raises(ValueError, match="equirect"):
        pixel_rays(torch.eye(4)[None], torch.ones(1, 10), torch.zeros(1), torch.zeros(1), "equirect")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pixel_rays_on_cuda_matches_cpu():
    gen = torch.Generator().manual_seed(2)
    b = 1 << 16
    k = torch.tensor(FOX_LIKE["opencv"]).expand(b, 10)
    c2w = _random_pose(gen, torch.float32).expand(b, 3, 4)
    px, py = torch.rand(b, generator=gen) * 1080, torch.rand(b, generator=gen) * 1920
    o, d = pixel_rays(c2w, k, px, py, "opencv")
    oc, dc = pixel_rays(c2w.cuda(), k.cuda(), px.cuda(), py.cuda(), "opencv")
    assert dc.device.type == "cuda"
    torch.testing.assert_close(dc.cpu(), d, atol=1e-5, rtol=0)
    torch.testing.assert_close(oc.cpu(), o)


def test_undistortion_table_matches_newton_rays() -> None:
    """Training rays from the tabulated undistortion equal the exact Newton rays (fox-like lens)."""
    from nerf_lightning.data.cameras import UndistortionTable, pixel_rays

    torch.manual_seed(0)
    w, h = 270, 480
    k = torch.tensor([343.9, 343.6, 138.6, 241.3, 0.0578, -0.0805, 0.0, 0.0, -0.00098, 0.000156])
    intr = torch.stack([k, k * torch.tensor([1.01] * 4 + [1.0] * 6)])  # two distinct cameras
    widths, heights = torch.tensor([w, w]), torch.tensor([h, h])
    table = UndistortionTable(intr, widths, heights, "opencv")
    assert table.enabled and table.table.shape[0] == 2
    n = 4000
    view_ids = torch.randint(0, 2, (n,))
    px, py = torch.rand(n) * w, torch.rand(n) * h
    c2w = torch.eye(4)[None].repeat(2, 1, 1)
    c2w[1, :3, :3] = torch.linalg.qr(torch.randn(3, 3))[0]
    o_t, d_t = table.rays(c2w[view_ids], view_ids, px, py)
    o_n, d_n = pixel_rays(c2w[view_ids], intr[view_ids], px, py, model="opencv")
    torch.testing.assert_close(o_t, o_n)
    # angular error well below a thousandth of a pixel's angle (1 / fx rad)
    err = torch.linalg.vector_norm(d_t - d_n, dim=-1).max()
    assert err < 1e-3 / 343.0, err
    assert not UndistortionTable(
        intr[:, :4]
        .clone()
        .expand(2, 4)
        .contiguous()
        .new_zeros(2, 10)
        .add_(torch.tensor([300.0, 300, 100, 100] + [0.0] * 6)),
        widths,
        heights,
        "opencv",
    ).enabled
