"""The procedural synthetic scene: capture files, caching, image content, camera model, loader round trip."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import torch

from nerf_lightning.data import cameras, formats
from nerf_lightning.data.synthetic import (
    DISTORTION,
    GENERATOR_VERSION,
    SyntheticScene,
    camera_rays,
    distort,
    ensure_default_scene,
    generate_scene,
    look_at,
    main,
    orbit_poses,
    project,
    undistort,
)
from nerf_lightning.data.synthetic import generate as gen_mod

SMALL = {"n_views": 12, "width": 48, "height": 48, "supersample": 2}
#: the distorted capture is not square, so that swapped cx/cy or w/h would show


@pytest.fixture(scope="module")
def scene() -> SyntheticScene:
    return SyntheticScene()


@pytest.fixture(scope="module")
def small_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 undistorted views, 48x48, shared by the read-only tests."""
    return generate_scene(tmp_path_factory.mktemp("synth") / "small", **SMALL).parent


@pytest.fixture(scope="module")
def distorted_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_scene(
        tmp_path_factory.mktemp("synth") / "dist", **{**SMALL, "width": 56, "height": 44}, distortion=True
    ).parent


def _json(root: Path) -> dict:
    return json.loads((root / "transforms.json").read_text())


def _intr(doc: dict) -> tuple[float, ...]:
    return doc["fl_x"], doc["fl_y"], doc["cx"], doc["cy"]


def _dist(doc: dict) -> tuple[float, ...]:
    return doc["k1"], doc["k2"], doc["p1"], doc["p2"]


def _over_white(img: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """uint8 RGBA [H, W, 4] -> (rgb over white float [H, W, 3], alpha float [H, W])."""
    a = img[..., 3] / 255.0
    return img[..., :3] / 255.0 * a[..., None] + (1.0 - a[..., None]), a


# ------------------------------------------------------------------------------------------ files
def test_capture_layout(small_capture: Path) -> None:
    doc = _json(small_capture)
    w, h = SMALL["width"], SMALL["height"]
    assert (doc["w"], doc["h"]) == (w, h)
    assert doc["camera_angle_x"] == pytest.approx(2 * math.atan(w / (2 * doc["fl_x"])))
    assert doc["camera_angle_y"] == pytest.approx(2 * math.atan(h / (2 * doc["fl_y"])))
    assert (doc["cx"], doc["cy"]) == (w / 2, h / 2)
    assert _dist(doc) == (0.0, 0.0, 0.0, 0.0)
    assert doc["aabb_scale"] in (1, 2, 4, 8, 16, 32, 64, 128)
    assert doc["offset"] == [0.5, 0.5, 0.5]
    gen = doc["generator"]
    assert gen["version"] == GENERATOR_VERSION and gen["n_views"] == 12 and gen["seed"] == 0
    assert len(doc["frames"]) == 12
    for i, f in enumerate(doc["frames"]):
        assert f["file_path"] == f"images/{i:04d}.png"
        m = np.asarray(f["transform_matrix"])
        assert m.shape == (4, 4)
        np.testing.assert_allclose(m[:3, :3] @ m[:3, :3].T, np.eye(3), atol=1e-12)
        img = iio.imread(small_capture / f["file_path"])
        assert img.shape == (h, w, 4) and img.dtype == np.uint8
    # the whole scene lies in the unit cube after world * scale + offset
    lo, hi = np.asarray(gen["world_bounds"][:3]), np.asarray(gen["world_bounds"][3:])
    corners = np.array([[x, y, z] for x in (lo[0], hi[0]) for y in (lo[1], hi[1]) for z in (lo[2], hi[2])])
    ngp = corners * doc["scale"] + 0.5
    assert ngp.min() >= 0.0 and ngp.max() <= 1.0
    # no temporary directories are left next to the scene
    assert sorted(p.name for p in small_capture.parent.iterdir()) == ["small"]


def test_cache_reuses_and_regenerates(tmp_path: Path) -> None:
    params = {"n_views": 3, "width": 16, "height": 16, "supersample": 1}
    tf = generate_scene(tmp_path / "s", **params)
    img = tf.parent / "images" / "0002.png"
    stamps = (tf.stat().st_mtime_ns, img.stat().st_mtime_ns)
    assert generate_scene(tmp_path / "s", **params) == tf
    assert (tf.stat().st_mtime_ns, img.stat().st_mtime_ns) == stamps
    # different parameters regenerate in place; old images do not survive
    generate_scene(tmp_path / "s", **{**params, "n_views": 2, "seed": 1})
    doc = _json(tmp_path / "s")
    assert doc["generator"]["seed"] == 1 and len(doc["frames"]) == 2
    assert not img.exists()
    # overwrite=True regenerates even when parameters match
    before = tf.stat().st_mtime_ns
    generate_scene(tmp_path / "s", **{**params, "n_views": 2, "seed": 1}, overwrite=True)
    assert tf.stat().st_mtime_ns != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_interrupted_generation_leaves_old_scene(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    params = {"n_views": 2, "width": 16, "height": 16, "supersample": 1}
    tf = generate_scene(tmp_path / "s", **params)
    before = tf.read_text()
    calls = {"n": 0}
    real = gen_mod.render_view

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(gen_mod, "render_view", flaky)
    with pytest.raises(KeyboardInterrupt):
        generate_scene(tmp_path / "s", **{**params, "seed": 5})
    with pytest.raises(KeyboardInterrupt):
        calls["n"] = 0
        generate_scene(tmp_path / "fresh", **params)
    assert tf.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_bad_parameters_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="n_views"):
        generate_scene(tmp_path / "x", n_views=0)
    with pytest.raises(ValueError, match="supersample"):
        generate_scene(tmp_path / "x", n_views=1, width=8, height=8, supersample=0)


def test_cli_and_module_entry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--views", "2", "--width", "12", "--height", "10", "--supersample", "1"]
    assert main([str(tmp_path / "cli"), *args]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli" / "transforms.json")
    doc = _json(tmp_path / "cli")
    assert (doc["w"], doc["h"], len(doc["frames"])) == (12, 10, 2)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "nerf_lightning.data.synthetic",
            str(tmp_path / "mod"),
            "--views",
            "1",
            "--width",
            "8",
            "--height",
            "8",
            "--distortion",
            "--hard-views",
            "1",
            "--supersample",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    doc = _json(tmp_path / "mod")
    assert _dist(doc) == pytest.approx(DISTORTION)
    assert [f["kind"] for f in doc["frames"]] == ["orbit", "closeup"]


def test_ensure_default_scene_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert gen_mod.DEFAULT_SCENE["n_views"] >= 50  # the real default: >= 50 views, every 8th held out
    monkeypatch.setattr(
        gen_mod,
        "DEFAULT_SCENE",
        {**gen_mod.DEFAULT_SCENE, "n_views": 2, "width": 16, "height": 16, "supersample": 1},
    )
    out = ensure_default_scene(tmp_path)
    assert out == tmp_path / f"default-v{GENERATOR_VERSION}"
    stamp = (out / "transforms.json").stat().st_mtime_ns
    assert ensure_default_scene(tmp_path) == out
    assert (out / "transforms.json").stat().st_mtime_ns == stamp


# ---------------------------------------------------------------------------------------- content
def test_images_are_detailed(small_capture: Path) -> None:
    doc = _json(small_capture)
    for f in doc["frames"]:
        rgb, a = _over_white(iio.imread(small_capture / f["file_path"]))
        assert 0.12 < a.mean() < 0.75, f"foreground coverage {a.mean():.3f} of {f['file_path']}"
        assert a[0].max() == 0 and a[-1].max() == 0 and a[:, 0].max() == 0 and a[:, -1].max() == 0
        # anti-aliased silhouettes: fractional alpha exists
        assert ((a > 0.05) & (a < 0.95)).mean() > 0.01
        # high-frequency texture inside the objects (a flat-shaded scene gives ~0.01)
        inner = (a[:, 1:] > 0.99) & (a[:, :-1] > 0.99)
        grad = np.abs(np.diff(rgb, axis=1)).mean(-1)[inner].mean()
        assert grad > 0.05, f"mean |d/dx| {grad:.4f} of {f['file_path']}"
        # several distinct colours, not a two-tone image
        assert len(np.unique((rgb[a > 0.99] * 8).astype(int), axis=0)) > 25


def test_glossy_surfaces_are_view_dependent(scene: SyntheticScene) -> None:
    names = [o.name for o in scene.objects]
    ball = scene.objects[names.index("beach_ball")]
    assert scene.glossy[names.index("beach_ball")] and not scene.glossy[names.index("checker_box")]
    c, r = np.asarray(ball.center), ball.radius
    key = scene.KEY_DIR
    n = key + np.array([0.0, 0.0, 0.4])
    n /= np.linalg.norm(n)
    p = c + r * n
    mirror = 2 * (n @ key) * n - key  # viewer here sees the key light's highlight
    other = 2 * (n @ mirror) * n - mirror  # reflected about the normal: same n.v, no highlight
    other = (other + 0.6 * np.cross(n, other)) / np.linalg.norm(other + 0.6 * np.cross(n, other))
    eyes = np.stack([p + 2.5 * mirror, p + 2.5 * other])
    rgb, alpha, _, hit = scene.trace(eyes, p - eyes)
    np.testing.assert_allclose(hit, [p, p], atol=1e-9)  # same surface point, visible from both
    assert np.abs(rgb[0] - rgb[1]).max() > 0.2, rgb

    # a matte (Lambert) surface point has the same colour from any direction
    box = scene.objects[names.index("checker_box")]
    q = np.asarray(box.center) + box.rotation @ np.array([-box.half[0], 0.05, 0.03])
    nb = box.rotation @ np.array([-1.0, 0.0, 0.0])
    eyes = np.stack([q + 2.0 * (nb + np.array([0.0, 0.0, 0.5])), q + 2.0 * (nb + np.array([0.6, -0.8, 0.9]))])
    rgb, _, _, hit = scene.trace(eyes, q - eyes)
    np.testing.assert_allclose(hit, [q, q], atol=1e-9)
    np.testing.assert_allclose(rgb[0], rgb[1], atol=1e-12)


def test_trace_miss_and_depth(scene: SyntheticScene) -> None:
    o = np.array([[0.0, 0.0, 3.0], [0.0, 0.0, 3.0], [5.0, 5.0, 5.0]])
    d = np.array([[0.0, 0.0, -2.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    rgb, alpha, depth, hit = scene.trace(o, d)
    np.testing.assert_array_equal(alpha, [1.0, 0.0, 0.0])
    # straight down at the origin: the ground disc at z = 0 (nothing stands on the centre)
    assert depth[0] == pytest.approx(3.0) and np.allclose(hit[0], 0.0)
    assert np.isinf(depth[1:]).all() and np.isnan(hit[1:]).all() and (rgb[1:] == 0).all()
    assert 0.0 < rgb[0].min() and rgb[0].max() <= 1.0


# ----------------------------------------------------------------------------------- camera model
def test_undistort_inverts_distort() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-0.7, 0.7, (2, 500))  # beyond the corners of a 50 degree view
    xd, yd = distort(x, y, *DISTORTION)
    assert np.abs(xd - x).max() > 0.01  # the lens is not the identity
    xu, yu = undistort(xd, yd, *DISTORTION)
    np.testing.assert_allclose(np.stack([xu, yu]), np.stack([x, y]), atol=1e-12)


def test_look_at_centres_the_target() -> None:
    c2w = look_at(np.array([2.0, -1.0, 1.5]), np.array([0.1, 0.2, 0.3]))
    np.testing.assert_allclose(c2w[:3, :3].T @ c2w[:3, :3], np.eye(3), atol=1e-12)
    assert abs(c2w[2, 0]) < 1e-12  # no roll: camera x stays horizontal
    u, v = project(np.array([[0.1, 0.2, 0.3]]), c2w, 50.0, 50.0, 20.0, 15.0)
    np.testing.assert_allclose([u[0], v[0]], [20.0, 15.0], atol=1e-9)
    # camera y is up: a point above the target appears above the centre (smaller row)
    _, v_up = project(np.array([[0.1, 0.2, 0.5]]), c2w, 50.0, 50.0, 20.0, 15.0)
    assert v_up[0] < 15.0


def test_distorted_hits_project_back(distorted_capture: Path, scene: SyntheticScene) -> None:
    doc = _json(distorted_capture)
    rng = np.random.default_rng(1)
    for f in doc["frames"][:4]:
        c2w = np.asarray(f["transform_matrix"])
        uv = np.stack([rng.integers(0, doc["w"], 400) + 0.5, rng.integers(0, doc["h"], 400) + 0.5], 1)
        o, d = camera_rays(c2w, *_intr(doc), doc["w"], doc["h"], *_dist(doc), pixels=uv)
        _, alpha, _, hit = scene.trace(o, d)
        assert alpha.mean() > 0.1
        hit = hit[alpha > 0]
        u, v = project(hit, c2w, *_intr(doc), *_dist(doc))
        err = np.hypot(u - uv[alpha > 0, 0], v - uv[alpha > 0, 1])
        assert err.max() < 0.05
        # ...and ignoring the lens would put them elsewhere (the check has teeth)
        u0, v0 = project(hit, c2w, *_intr(doc))
        assert np.hypot(u0 - uv[alpha > 0, 0], v0 - uv[alpha > 0, 1]).max() > 0.15


def test_distorted_images_match_trace(distorted_capture: Path, scene: SyntheticScene) -> None:
    """A pixel of a written image agrees with tracing the distorted camera through that pixel."""
    doc = _json(distorted_capture)
    f = doc["frames"][3]
    img = iio.imread(distorted_capture / f["file_path"]).astype(np.float64) / 255.0
    o, d = camera_rays(np.asarray(f["transform_matrix"]), *_intr(doc), doc["w"], doc["h"], *_dist(doc))
    rgb, alpha, _, _ = scene.trace(o, d)
    alpha = alpha.reshape(doc["h"], doc["w"])
    rgb = rgb.reshape(doc["h"], doc["w"], 3)
    # compare where the written pixel is fully covered (supersampling blurs edges and textures a bit)
    full = img[..., 3] > 0.999
    np.testing.assert_array_equal(alpha[full], 1.0)
    assert np.median(np.abs(img[..., :3][full] - rgb[full])) < 0.05
    assert (alpha[img[..., 3] == 0] == 0).all()


def test_loader_round_trip(distorted_capture: Path, scene: SyntheticScene) -> None:
    """Rays of the project's loader + camera model hit the scene where the generator's camera says."""
    doc = _json(distorted_capture)
    cap = formats.load_capture(distorted_capture, downscale=1, test_every=8)
    assert len(cap.train) + len(cap.val) == SMALL["n_views"] and len(cap.val) == 2
    assert cap.has_alpha and cap.scale == doc["scale"] and tuple(cap.offset) == tuple(doc["offset"])
    frames = {int(Path(f.image_path).stem): f for f in cap.train + cap.val}
    rng = np.random.default_rng(2)
    for idx in (0, 5):  # one validation frame, one training frame
        frame, meta = frames[idx], doc["frames"][idx]
        c2w_nerf = np.asarray(meta["transform_matrix"])
        back = formats.ngp_to_nerf(frame.c2w, cap.scale, cap.offset)
        np.testing.assert_allclose(back, c2w_nerf, atol=1e-12)
        intr = frame.intrinsics
        assert intr.has_distortion and (intr.k1, intr.k2, intr.p1, intr.p2) == pytest.approx(DISTORTION)
        n = 300
        px = rng.integers(0, doc["w"], n) + 0.5
        py = rng.integers(0, doc["h"], n) + 0.5
        o_ngp, d_ngp = cameras.pixel_rays(
            torch.as_tensor(frame.c2w, dtype=torch.float64).expand(n, 4, 4),
            torch.as_tensor(intr.as_array(), dtype=torch.float64).expand(n, 10),
            torch.as_tensor(px),
            torch.as_tensor(py),
            model=intr.model,
        )
        # NGP -> world: undo the axis cycle (ngp = [y, z, x] of world), then the scale and offset
        o_w = (o_ngp.numpy()[:, [2, 0, 1]] - np.asarray(cap.offset)) / cap.scale
        d_w = d_ngp.numpy()[:, [2, 0, 1]]
        _, alpha, _, hit = scene.trace(o_w, d_w)
        assert alpha.mean() > 0.1
        m = alpha > 0
        u, v = project(hit[m], c2w_nerf, *_intr(doc), *_dist(doc))
        # float32 intrinsics rows (as_array) limit agreement to ~1e-5 px here; 0.05 px is the spec
        assert np.hypot(u - px[m], v - py[m]).max() < 0.05
        o_ref, d_ref = camera_rays(
            c2w_nerf, *_intr(doc), doc["w"], doc["h"], *_dist(doc), pixels=np.stack([px, py], 1)
        )
        _, alpha_ref, _, hit_ref = scene.trace(o_ref, d_ref)
        np.testing.assert_array_equal(alpha_ref, alpha)
        np.testing.assert_allclose(hit_ref[m], hit[m], atol=1e-4)


def test_orbit_covers_the_scene_and_holdout_is_spread() -> None:
    poses = orbit_poses(64, seed=0)
    eyes = poses[:, :3, 3]
    dist = np.linalg.norm(eyes - [0.0, 0.0, 0.25], axis=1)
    elev = np.degrees(np.arcsin((eyes[:, 2] - 0.25) / dist))
    assert 3.0 < dist.min() and dist.max() < 3.8
    assert 13.0 < elev.min() < 20.0 and 55.0 < elev.max() < 62.0
    az = np.sort(np.degrees(np.arctan2(eyes[:, 1], eyes[:, 0])) % 360)
    assert np.diff(np.r_[az, az[0] + 360]).max() < 20.0
    # the views the loader holds out (every 8th) surround the scene too
    az_val = np.sort(np.degrees(np.arctan2(eyes[::8, 1], eyes[::8, 0])) % 360)
    assert np.diff(np.r_[az_val, az_val[0] + 360]).max() < 120.0
    for c2w in poses:  # everything in frame, the look-at point near the centre
        u, v = project(
            np.array([[0.0, 0.0, 0.25], [1.2, 0.0, 0.0], [0.0, -1.2, 0.0]]), c2w, 1.0, 1.0, 0.0, 0.0
        )
        assert abs(u[0]) < 0.05 and abs(v[0]) < 0.05
        assert np.abs(np.r_[u, v]).max() < math.tan(math.radians(25.0))


def test_hard_views_are_close_ups(tmp_path: Path, scene: SyntheticScene) -> None:
    root = generate_scene(
        tmp_path / "hard", n_views=2, width=24, height=24, supersample=1, hard_views=4
    ).parent
    doc = _json(root)
    assert [f["kind"] for f in doc["frames"]] == ["orbit"] * 2 + ["closeup"] * 4
    box = np.asarray(scene.objects[1].center)
    for f in doc["frames"]:
        m = np.asarray(f["transform_matrix"])
        _, a = _over_white(iio.imread(root / f["file_path"]))
        if f["kind"] == "closeup":
            assert np.linalg.norm(m[:3, 3] - box) < 1.6 and m[2, 3] > 0.1
            assert a.mean() > 0.6  # mostly filled by nearby detailed surfaces
        else:
            assert np.linalg.norm(m[:3, 3] - box) > 2.5 and a.mean() < 0.6


def test_phone_rig_mirrors_the_fruit_capture(tmp_path: Path) -> None:
    """The phone rig writes the fruit capture's camera model and layout, and the loader reads it back
    so that its rays hit the scene where the generator's own projection says (lens, off-centre
    principal point and fx != fy included)."""
    torch = pytest.importorskip("torch")
    formats = pytest.importorskip("nerf_lightning.data.formats")
    cameras = pytest.importorskip("nerf_lightning.data.cameras")
    root = generate_scene(
        tmp_path / "phone", n_views=10, width=30, height=40, supersample=1, rig="phone"
    ).parent
    doc = _json(root)
    assert (doc["w"], doc["h"], doc["aabb_scale"]) == (30, 40, 32)
    assert doc["fl_x"] / doc["w"] == pytest.approx(627.79 / 605) and doc["fl_y"] / doc["w"] == pytest.approx(
        616.5 / 605
    )
    assert doc["cx"] / doc["w"] == pytest.approx(318.79 / 605) and doc["cy"] / doc["h"] == pytest.approx(
        395.33 / 806
    )
    assert _dist(doc) == gen_mod.PHONE_LENS
    img = iio.imread(root / doc["frames"][0]["file_path"])
    assert img.shape == (40, 30, 3)  # opaque RGB: no alpha tells where empty space is
    c2w = np.stack([np.asarray(f["transform_matrix"]) for f in doc["frames"]])
    eye = c2w[:, :3, 3] - gen_mod._LOOK_AT
    elevation = np.degrees(np.arcsin(eye[:, 2] / np.linalg.norm(eye, axis=1)))
    assert elevation.min() > 20 and elevation.max() < 76 and np.ptp(elevation) > 30
    cap = formats.load_capture(root, test_every=5)
    assert not cap.has_alpha and cap.aabb_scale == 32 and (len(cap.train), len(cap.val)) == (8, 2)
    frame = cap.val[1]
    intr = frame.intrinsics
    assert intr.model == "opencv" and (intr.width, intr.height) == (30, 40)
    idx = int(Path(frame.image_path).stem)
    scene = SyntheticScene(floor_radius=gen_mod.PHONE_FLOOR_RADIUS)
    rng = np.random.default_rng(4)
    px, py = rng.uniform(0, 30, 200), rng.uniform(0, 40, 200)
    o_ngp, d_ngp = cameras.pixel_rays(
        torch.as_tensor(frame.c2w).expand(200, 4, 4),
        torch.as_tensor(intr.as_array(), dtype=torch.float64).expand(200, 10),
        torch.as_tensor(px),
        torch.as_tensor(py),
        model=intr.model,
    )
    o_w = (o_ngp.numpy()[:, [2, 0, 1]] - np.asarray(cap.offset)) / cap.scale
    _, alpha, _, hit = scene.trace(o_w, d_ngp.numpy()[:, [2, 0, 1]])
    assert alpha.mean() > 0.8  # mostly floor and objects, some sky
    u, v = project(hit[alpha > 0], c2w[idx], *_intr(doc), *_dist(doc))
    np.testing.assert_allclose(u, px[alpha > 0], atol=1e-6)
    np.testing.assert_allclose(v, py[alpha > 0], atol=1e-6)


def test_fruit_bed_scene_is_the_phone_rig_over_a_plain_bed(tmp_path: Path) -> None:
    """``scene="fruit_bed"`` (issue 9's generated failure, :data:`FRUIT_FAILURE`) keeps the phone rig's
    cameras and files, is cached under its own key, and its views are mostly a near-white bed with the
    red apple in the middle (the property that makes the default hash grid memorize)."""
    kw = {**gen_mod.FRUIT_FAILURE, "n_views": 6, "supersample": 1}
    root = generate_scene(tmp_path / "fruit", **kw).parent
    doc = _json(root)
    assert doc["generator"]["scene"] == "fruit-bed-v1" and doc["generator"]["rig"] == "phone"
    assert (doc["w"], doc["h"], doc["aabb_scale"]) == (37, 50, 32) and _dist(doc) == gen_mod.PHONE_LENS
    phone = _json(generate_scene(tmp_path / "phone", **{**kw, "scene": "default"}).parent)
    for a, b in zip(doc["frames"], phone["frames"], strict=True):  # same cameras as the default scene
        np.testing.assert_array_equal(a["transform_matrix"], b["transform_matrix"])
    img = iio.imread(root / doc["frames"][0]["file_path"]).astype(np.float64) / 255.0
    bed = (img.min(axis=2) > 0.6) & (np.ptp(img, axis=2) < 0.1)  # bright and grey
    assert bed.mean() > 0.4
    centre = img[20:30, 14:23]
    assert (centre[..., 0] > centre[..., 1] + 0.2).mean() > 0.3  # the apple
    mtime = (root / "transforms.json").stat().st_mtime_ns
    generate_scene(tmp_path / "fruit", **kw)  # cached: same key, not re-rendered
    assert (root / "transforms.json").stat().st_mtime_ns == mtime
    with pytest.raises(ValueError, match="scene must be one of"):
        generate_scene(tmp_path / "x", scene="bed")
