"""COLMAP's world -> the capture's, as colmap2nerf.py orients, centres and scales it; the aabb_scale rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nerf_lightning.capture.normalize import focus_point, normalization, suggest_aabb_scale


def _look_at_opengl(eye, target, up=(0.0, 0.0, 1.0)) -> np.ndarray:
    eye, target, up = (np.asarray(v, dtype=np.float64) for v in (eye, target, up))
    fwd = (target - eye) / np.linalg.norm(target - eye)
    right = np.cross(fwd, up)
    right /= np.linalg.norm(right)
    m = np.eye(4)
    m[:3, 0], m[:3, 1], m[:3, 2], m[:3, 3] = right, np.cross(right, fwd), -fwd, eye
    return m


def _rotation(axis, angle) -> np.ndarray:
    a = np.asarray(axis, dtype=np.float64) / np.linalg.norm(axis)
    k = np.array([[0, -a[2], a[1]], [a[2], 0, -a[0]], [-a[1], a[0], 0]])
    return np.eye(3) + math.sin(angle) * k + (1 - math.cos(angle)) * k @ k


TARGET = np.array([0.3, -0.2, 0.5])


def _ring(n: int = 24) -> np.ndarray:
    """NeRF poses, z up, at distances 2.5-3.5 and heights 0.8-1.6, all looking at TARGET."""
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        a = 2 * math.pi * i / n
        r, h = rng.uniform(2.5, 3.5), rng.uniform(0.8, 1.6)
        out.append(_look_at_opengl(TARGET + [r * math.cos(a), r * math.sin(a), h], TARGET))
    return np.stack(out)


def _to_colmap(c2w_gl: np.ndarray, rot: np.ndarray, scale: float, shift: np.ndarray) -> np.ndarray:
    """The same cameras as COLMAP would return them: an arbitrary world (p -> scale R p + shift) and
    OpenCV camera axes (y down, z forward)."""
    out = np.array(c2w_gl, copy=True)
    out[:, :3, :3] = rot @ out[:, :3, :3]
    out[:, :3, 3] = scale * out[:, :3, 3] @ rot.T + shift
    out[:, :3, 1:3] *= -1
    return out


def test_an_arbitrary_colmap_world_comes_out_up_centred_and_scaled() -> None:
    truth = _ring()
    rot = _rotation([0.3, -1.0, 0.4], 2.2)
    colmap = _to_colmap(truth, rot, 0.137, np.array([5.0, -3.0, 11.0]))
    norm = normalization(colmap)
    poses = norm.poses(colmap)

    # up: the mean camera up vector is +z
    up = poses[:, :3, 1].mean(axis=0)
    assert up / np.linalg.norm(up) == pytest.approx([0, 0, 1], abs=1e-9)
    # centre: TARGET, where every optical axis meets, is the origin
    target_colmap = 0.137 * rot @ TARGET + np.array([5.0, -3.0, 11.0])
    assert norm.points(target_colmap[None])[0] == pytest.approx([0, 0, 0], abs=1e-9)
    # scale: the mean distance of the cameras from the centre is 4
    dist = np.linalg.norm(poses[:, :3, 3], axis=1)
    assert dist.mean() == pytest.approx(4.0)
    true_dist = np.linalg.norm(truth[:, :3, 3] - TARGET, axis=1)
    assert dist == pytest.approx(4.0 * true_dist / true_dist.mean())
    # the result is the true ring turned as a whole (one rotation for every camera), the one that
    # takes the true cameras' mean up vector to +z (the cameras look down at the target, so that
    # vector leans a little off the true world's z)
    rel = poses[:, :3, :3] @ np.swapaxes(truth[:, :3, :3], 1, 2)
    assert rel == pytest.approx(np.broadcast_to(rel[0], rel.shape), abs=1e-9)
    true_up = truth[:, :3, 1].mean(axis=0)
    assert rel[0] @ (true_up / np.linalg.norm(true_up)) == pytest.approx([0, 0, 1], abs=1e-9)
    # OpenGL cameras: each looks down its -z axis, at the origin
    look = -poses[:, :3, 2]
    assert np.einsum("vi,vi->v", look, -poses[:, :3, 3] / dist[:, None]) == pytest.approx(np.ones(len(poses)))
    # the 4x4 matrix is the same map as points()
    p = np.array([[1.0, 2.0, 3.0], [-4.0, 0.5, 2.0]])
    assert (p @ norm.matrix[:3, :3].T + norm.matrix[:3, 3]) == pytest.approx(norm.points(p))


def test_focus_point_is_where_the_axes_meet_in_front_of_the_cameras() -> None:
    a = _look_at_opengl([3.0, 0.0, 0.0], [0.0, 0.0, 0.0])
    b = _look_at_opengl([0.0, 3.0, 0.0], [0.0, 0.0, 0.0])
    assert focus_point(np.stack([a, b])) == pytest.approx([0, 0, 0], abs=1e-9)
    # cameras facing away from each other: the axes' closest points lie behind both cameras, so
    # they are clamped to the cameras themselves (colmap2nerf.py: t <= 0 along the backward axis)
    c = _look_at_opengl([1.0, 0.0, 0.0], [3.0, 0.0, 1.0])
    d = _look_at_opengl([-1.0, 0.0, 0.0], [-3.0, 1.0, 0.0])
    assert focus_point(np.stack([c, d])) == pytest.approx([0, 0, 0], abs=1e-9)
    # parallel axes (forward-facing): no pair counts, the mean camera position
    e = _look_at_opengl([0.0, 0.0, 0.0], [0.0, 5.0, 0.0])
    f = _look_at_opengl([2.0, 0.0, 0.0], [2.0, 5.0, 0.0])
    assert focus_point(np.stack([e, f])) == pytest.approx([1.0, 0.0, 0.0])


def test_aabb_scale_is_the_smallest_power_of_two_holding_95_percent_of_the_points() -> None:
    # NGP space: p * 0.33 + 0.5, box [0.5 - a/2, 0.5 + a/2]: a point with max |coordinate| m is inside
    # when 0.66 m <= a
    def points_at(m: float, n: int = 100) -> np.ndarray:
        p = np.zeros((n, 3))
        p[:, 1] = m
        return p

    assert suggest_aabb_scale(points_at(1.5)) == 1  # 0.99
    assert suggest_aabb_scale(points_at(1.6)) == 2  # 1.056
    assert suggest_aabb_scale(points_at(-11.0)) == 8  # 7.26
    assert suggest_aabb_scale(points_at(1e4)) == 128  # instant-ngp's largest
    assert suggest_aabb_scale(np.zeros((0, 3))) == 1
    # 4 far outliers among 100 points do not count, 6 do
    assert suggest_aabb_scale(np.concatenate([points_at(1.0, 96), points_at(300.0, 4)])) == 1
    assert suggest_aabb_scale(np.concatenate([points_at(1.0, 94), points_at(300.0, 6)])) == 128
