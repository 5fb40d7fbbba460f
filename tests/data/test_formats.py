"""Capture loaders: instant-ngp, Blender and nerfstudio layouts, NeRF->NGP conversion, real fox."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

from nerf_lightning.data.formats import detect_format, load_capture, nerf_to_ngp, ngp_to_nerf
from nerf_lightning.data.types import Intrinsics

from .conftest import FOX_DIR, orbit_poses


def _centres(frames) -> np.ndarray:
    return np.stack([f.c2w[:3, 3] for f in frames])


def _looks_at(frames, point, max_deg: float) -> np.ndarray:
    """Angle (degrees) between each camera's +z (OpenCV forward, NGP space) and the direction to point."""
    fwd = np.stack([f.c2w[:3, 2] for f in frames])
    to_p = np.asarray(point) - _centres(frames)
    cos = (fwd * to_p).sum(1) / np.linalg.norm(fwd, axis=1) / np.linalg.norm(to_p, axis=1)
    ang = np.degrees(np.arccos(np.clip(cos, -1, 1)))
    return ang < max_deg


def test_nerf_to_ngp_matches_instant_ngp_formula():
    c2w = np.eye(4)
    c2w[:3, 3] = [1.0, 2.0, 3.0]
    out = nerf_to_ngp(c2w, 0.5, [0.5, 0.5, 0.5])
    # Flip camera y/z, t -> t * 0.5 + 0.5 = (1, 1.5, 2), then rows (x, y, z) -> (y, z, x).
    expected = np.array(
        [[0.0, -1.0, 0.0, 1.5], [0.0, 0.0, -1.0, 2.0], [1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]]
    )
    np.testing.assert_array_equal(out, expected)
    assert c2w[0, 3] == 1.0  # input untouched


def test_ngp_to_nerf_inverts_nerf_to_ngp():
    rng = np.random.default_rng(0)
    mats = []
    for _ in range(5):
        q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
        m = np.eye(4)
        m[:3, :3], m[:3, 3] = q, rng.normal(size=3) * 4
        mats.append(m)
    mats = np.stack(mats)
    back = ngp_to_nerf(nerf_to_ngp(mats, 0.33, [0.1, 0.5, 0.7]), 0.33, [0.1, 0.5, 0.7])
    np.testing.assert_allclose(back, mats, atol=1e-12)
    # NGP rotation stays orthonormal with det +1 (flip of two axes + cyclic permutation).
    r = nerf_to_ngp(mats, 0.33, [0.5] * 3)[:, :3, :3]
    np.testing.assert_allclose(np.linalg.det(r), 1.0, atol=1e-12)


def test_ngp_capture_intrinsics_split_and_poses(make_ngp):
    root = make_ngp(n=7, sharpness=[10.0 + i for i in range(7)])
    cap = load_capture(root, test_every=3)
    assert cap.format == "ngp" and detect_format(root) == "ngp"
    assert cap.aabb_scale == 2 and cap.scale == 0.33 and cap.offset == (0.5, 0.5, 0.5)
    assert not cap.has_alpha
    # Holdout by index in file order: 0, 3, 6 -> val.
    assert [f.image_path.name for f in cap.val] == ["0000.png", "0003.png", "0006.png"]
    assert [f.image_path.name for f in cap.train] == ["0001.png", "0002.png", "0004.png", "0005.png"]
    assert cap.train[0].sharpness == 11.0
    intr = cap.train[0].intrinsics
    assert intr == Intrinsics(
        fx=20.0,
        fy=21.0,
        cx=7.5,
        cy=6.25,
        width=16,
        height=12,
        k1=0.01,
        k2=-0.002,
        p1=0.0005,
        p2=-0.0003,
        model="opencv",
    )
    expected = nerf_to_ngp(orbit_poses(7)[1], 0.33, [0.5, 0.5, 0.5])
    np.testing.assert_allclose(cap.train[0].c2w, expected, atol=1e-12)
    # The orbit looks at the NeRF origin, which is the NGP point (0.5, 0.5, 0.5).
    assert _looks_at(cap.train + cap.val, [0.5, 0.5, 0.5], 1e-4).all()


def test_ngp_downscale_and_overrides(make_ngp):
    root = make_ngp(n=4)
    cap = load_capture(root, downscale=2, test_every=0, scale=0.5, offset=[0.0, 0.0, 0.0], aabb_scale=8)
    assert cap.val == [] and len(cap.train) == 4
    intr = cap.train[0].intrinsics
    assert (intr.width, intr.height) == (8, 6)
    assert intr.fx == pytest.approx(10.0) and intr.fy == pytest.approx(10.5)
    assert intr.cx == pytest.approx(3.75) and intr.cy == pytest.approx(3.125)
    assert cap.scale == 0.5 and cap.offset == (0.0, 0.0, 0.0) and cap.aabb_scale == 8
    # orbit radius 3, height 1 -> |t| = sqrt(10); scaled by 0.5 with no offset.
    np.testing.assert_allclose(np.linalg.norm(_centres(cap.train), axis=1), 0.5 * math.sqrt(10), rtol=1e-12)


def test_downscale_not_a_multiple_scales_pixels_by_exactly_one_over_factor(make_ngp):
    # 605x806 (the fruit capture) at factor 4: the loader crops to 604x804 and averages 4x4 blocks,
    # so pixel coordinates scale by exactly 1/4 (151/605 and 201/806 would be off by up to 0.5 px).
    root = make_ngp(n=2, size=(605, 806), header={"fl_x": 627.8, "fl_y": 616.5, "cx": 318.8, "cy": 395.3})
    full = load_capture(root, test_every=0).train[0].intrinsics
    small = load_capture(root, downscale=4, test_every=0).train[0].intrinsics
    assert (small.width, small.height) == (151, 201)
    assert (small.fx, small.fy, small.cx, small.cy) == pytest.approx(
        (627.8 / 4, 616.5 / 4, 318.8 / 4, 395.3 / 4)
    )
    # a point seen at the far corner of the original lands at the same place of the 4x4 block average
    u_full, v_full = 600.0, 800.0
    x, y = (u_full - full.cx) / full.fx, (v_full - full.cy) / full.fy
    assert small.fx * x + small.cx == pytest.approx(u_full / 4) and small.fy * y + small.cy == pytest.approx(
        v_full / 4
    )


def test_ngp_camera_angle_and_per_frame_intrinsics(make_ngp):
    root = make_ngp(
        n=3,
        header={"fl_x": None, "fl_y": None, "cx": None, "cy": None, "camera_angle_x": 1.0},
        frame_extra={2: {"fl_x": 30.0, "w": 20, "h": 10, "cx": 9.0}},
        image_sizes={2: (20, 10)},
    )
    data = json.loads((root / "transforms.json").read_text())
    for k in ("fl_x", "fl_y", "cx", "cy"):
        del data[k]
    (root / "transforms.json").write_text(json.dumps(data))
    cap = load_capture(root, test_every=0)
    a, c = cap.train[0].intrinsics, cap.train[2].intrinsics
    fx = 0.5 * 16 / math.tan(0.5)
    assert a.fx == pytest.approx(fx) and a.fy == pytest.approx(fx)  # fy defaults to fx
    assert (a.cx, a.cy) == (8.0, 6.0)  # principal point defaults to the image centre
    assert (c.fx, c.fy, c.cx, c.cy, c.width, c.height) == (30.0, 30.0, 9.0, 5.0, 20, 10)


def test_ngp_scale_offset_from_json_and_pinhole(make_ngp):
    root = make_ngp(n=3, header={"scale": 0.2, "offset": [0.5, 0.4, 0.3], "k1": 0, "k2": 0, "p1": 0, "p2": 0})
    cap = load_capture(root, test_every=0)
    assert cap.scale == 0.2 and cap.offset == (0.5, 0.4, 0.3)
    assert cap.train[0].intrinsics.model == "pinhole"
    np.testing.assert_allclose(cap.train[0].c2w, nerf_to_ngp(orbit_poses(3)[0], 0.2, [0.5, 0.4, 0.3]))


def test_missing_images_skipped_with_one_warning(make_ngp):
    root = make_ngp(n=6, missing=(1, 4), strip_ext=True)
    with pytest.warns(UserWarning, match=r"skipped 2 of 6 frames") as rec:
        cap = load_capture(root, test_every=0)
    assert len([w for w in rec if "skipped" in str(w.message)]) == 1
    assert [f.image_path.name for f in cap.train] == ["0000.png", "0002.png", "0003.png", "0005.png"]


def test_no_warning_when_all_images_exist(make_ngp):
    root = make_ngp(n=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_capture(root)


def test_min_sharpness_filter(make_ngp):
    root = make_ngp(n=6, sharpness=[5.0, 50.0, 4.0, 60.0, 70.0, 1.0])
    cap = load_capture(root, test_every=0, min_sharpness=10.0)
    assert sorted(f.sharpness for f in cap.train) == [50.0, 60.0, 70.0]


def test_fisheye_flag(make_ngp):
    root = make_ngp(n=2, header={"is_fisheye": True, "k3": 0.01, "k4": 0.001})
    intr = load_capture(root, test_every=0).train[0].intrinsics
    assert intr.model == "opencv_fisheye"
    assert (intr.k1, intr.k2, intr.k3, intr.k4, intr.p1, intr.p2) == (0.01, -0.002, 0.01, 0.001, 0.0, 0.0)


def test_blender_capture(blender_capture):
    assert detect_format(blender_capture) == "blender"
    cap = load_capture(blender_capture, test_every=3)  # test_every ignored: split files decide
    assert cap.format == "blender"
    assert (len(cap.train), len(cap.val), len(cap.test)) == (4, 2, 3)
    assert cap.has_alpha and cap.eval_background == (1.0, 1.0, 1.0)
    assert cap.aabb_scale == 1 and cap.scale == 0.33 and cap.offset == (0.5, 0.5, 0.5)
    assert cap.val[1].image_path.name == "r_1.png" and cap.val[1].image_path.parent.name == "val"
    intr = cap.train[0].intrinsics
    f = 0.5 * 10 / math.tan(0.5 * 0.6911112070083618)
    assert (intr.width, intr.height, intr.cx, intr.cy, intr.model) == (10, 10, 5.0, 5.0, "pinhole")
    assert intr.fx == pytest.approx(f) and intr.fy == pytest.approx(f)
    np.testing.assert_allclose(np.linalg.norm(_centres(cap.train) - 0.5, axis=1), 0.33 * math.sqrt(17))


def test_nerfstudio_normalized_into_unit_cube(make_nerfstudio):
    rng = np.random.default_rng(3)
    rot, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    rot *= np.sign(np.linalg.det(rot))
    root = make_nerfstudio(n=9, rot=rot, shift=(5.0, -2.0, 7.0), s=2.5)
    assert detect_format(root) == "nerfstudio"
    cap = load_capture(root, test_every=4)
    assert cap.format == "nerfstudio" and cap.aabb_scale == 4
    assert (len(cap.train), len(cap.val)) == (6, 3)
    frames = cap.train + cap.val
    pos = _centres(frames)
    # Cameras inside the unit cube, touching its boundary (largest coordinate scaled to 1 -> 0.5).
    assert pos.min() >= -1e-9 and pos.max() <= 1 + 1e-9
    assert np.abs(pos - 0.5).max() == pytest.approx(0.5)
    # Centred on the orbit target (the point closest to all optical axes): every camera looks at it.
    assert _looks_at(frames, [0.5, 0.5, 0.5], 1e-3).all()
    # Oriented: mean camera up (-y in OpenCV camera) is NGP +y, as the orbit's world up.
    up = -np.stack([f.c2w[:3, 1] for f in frames]).mean(0)
    np.testing.assert_allclose(up / np.linalg.norm(up), [0.0, 1.0, 0.0], atol=1e-9)
    intr = frames[0].intrinsics
    assert intr.model == "opencv" and (intr.k3, intr.k4) == (0.0005, -0.0001)


def test_nerfstudio_fisheye_pinhole_and_explicit_split(make_nerfstudio):
    root = make_nerfstudio(n=4, camera_model="OPENCV_FISHEYE")
    intr = load_capture(root).train[0].intrinsics
    assert intr.model == "opencv_fisheye" and (intr.p1, intr.p2) == (0.0, 0.0) and intr.k4 == -0.0001
    names = [f"images/frame_{i:05d}.png" for i in range(4)]
    root = make_nerfstudio(
        n=4, camera_model="PINHOLE", extra={"train_filenames": names[:3], "val_filenames": names[3:]}
    )
    cap = load_capture(root)
    assert [f.image_path.name for f in cap.val] == ["frame_00003.png"] and len(cap.train) == 3
    assert cap.train[0].intrinsics.model == "pinhole" and not cap.train[0].intrinsics.has_distortion


def test_format_override(make_nerfstudio):
    root = make_nerfstudio(n=3)
    cap = load_capture(root / "transforms.json", format="ngp", test_every=0)
    assert cap.format == "ngp" and cap.scale == 0.33


@pytest.mark.fox
@pytest.mark.skipif(not (FOX_DIR / "transforms.json").is_file(), reason="needs ../shared/data/fox")
def test_real_fox_capture():
    with pytest.warns(UserWarning, match=r"skipped 17 of 67 frames") as rec:
        cap = load_capture(FOX_DIR, downscale=8)
    assert len([w for w in rec if "skipped" in str(w.message)]) == 1
    frames = cap.train + cap.val
    assert len(frames) == 50 and len(cap.val) == 7
    assert cap.aabb_scale == 4 and cap.format == "ngp"
    intr = frames[0].intrinsics
    assert (intr.width, intr.height) == (135, 240)
    assert (intr.k1, intr.k2, intr.p1, intr.p2) == (0.0578421, -0.0805099, -0.000980296, 0.00015575)
    assert intr.model == "opencv"
    assert intr.fx == pytest.approx(1375.52 / 8) and intr.cx == pytest.approx(554.558 / 8)
    pos = _centres(frames)
    lo, hi = np.array(cap.aabb[:3]), np.array(cap.aabb[3:])
    assert ((pos > lo) & (pos < hi)).all()
    # Correct NeRF->NGP conversion: the cameras look towards the unit cube centre.
    assert _looks_at(frames, [0.5, 0.5, 0.5], 20.0).all()  # every camera is within 16 degrees
