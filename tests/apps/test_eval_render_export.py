"""The apps that work on a trained checkpoint: eval, render, export (on the shared short training)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from hydra.core.global_hydra import GlobalHydra

from nerf_lightning.apps.eval import evaluate
from nerf_lightning.apps.export import export
from nerf_lightning.apps.render import render_video
from nerf_lightning.data.formats import load_capture
from nerf_lightning.errors import UserError
from nerf_lightning.run.config import compose_app_config
from nerf_lightning.run.restore import load_run
from nerf_lightning.video.camera_paths import camera_rays, orbit_path, read_nerfstudio_path
from nerf_lightning.video.writer import turbo

pytestmark = pytest.mark.slow


@pytest.fixture
def app_cfg(tmp_path: Path):
    def _compose(app: str, *overrides: str, out: str = "out"):
        return compose_app_config(app, list(overrides), tmp_path / out)

    yield _compose
    GlobalHydra.instance().clear()


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    return -10.0 * math.log10(float(((a - b) ** 2).mean()))


# --------------------------------------------------------------------------------------------- eval
def test_eval_reproduces_the_training_psnr_and_writes_every_view(
    trained_run, tiny_scene: Path, app_cfg
) -> None:
    run_dir, train_metrics = trained_run
    cfg = app_cfg("eval", f"ckpt={run_dir}")  # a run folder: its last.ckpt
    doc = evaluate(cfg)
    out = Path(cfg.paths.output_dir)

    assert doc["split"] == "val" and doc["step"] == train_metrics["steps"]
    assert Path(doc["checkpoint"]) == run_dir / "checkpoints" / "last.ckpt"
    assert abs(doc["val/psnr"] - train_metrics["val/psnr"]) < 0.05, (
        doc["val/psnr"],
        train_metrics["val/psnr"],
    )
    assert abs(doc["val/ssim"] - train_metrics["val/ssim"]) < 1e-3
    assert json.loads((out / "metrics.json").read_text()) == json.loads(json.dumps(doc))

    # every held-out view (24 frames, every 8th held out): its prediction PNG matches the ground truth
    # at the PSNR eval reports for it (independent check: the PNG against the capture's own image)
    capture = load_capture(tiny_scene)
    assert [v["name"] for v in doc["views"]] == [f.image_path.stem for f in capture.val] and len(
        capture.val
    ) == 3
    for view, frame in zip(doc["views"], capture.val, strict=True):
        pred = iio.imread(out / view["image"]).astype(np.float64) / 255
        rgba = iio.imread(frame.image_path).astype(np.float64) / 255
        gt = rgba[..., :3] * rgba[..., 3:] + np.asarray(capture.eval_background) * (1 - rgba[..., 3:])
        assert pred.shape == gt.shape == (40, 40, 3)
        assert abs(_psnr(pred, gt) - view["psnr"]) < 0.1
        depth = iio.imread(out / f"views/{view['name']}_depth.png")
        assert depth.dtype == np.uint16 and depth.shape == (40, 40) and depth.max() == 65535


def test_eval_splits(trained_run, app_cfg) -> None:
    run_dir, _ = trained_run
    cfg = app_cfg(
        "eval",
        f"ckpt={run_dir}/checkpoints/last.ckpt",
        "split=train",
        "save_images=false",
        "++data.max_val_views=4",
        out="train_split",
    )
    doc = evaluate(cfg)
    assert doc["split"] == "train" and doc["n_views"] == 4 and "train/psnr" in doc
    assert not (Path(cfg.paths.output_dir) / "views").exists()
    with pytest.raises(UserError, match="no test split"):
        evaluate(app_cfg("eval", f"ckpt={run_dir}", "split=test", out="test_split"))
    with pytest.raises(UserError, match="ckpt=/nope: no such file"):
        evaluate(app_cfg("eval", "ckpt=/nope", out="missing"))


def test_eval_scores_as_many_final_evaluation_views_as_training(
    trained_run, tiny_scene: Path, app_cfg
) -> None:
    """split=auto is the final evaluation's views: at most data.max_test_views of them (3 held out here);
    split=val keeps data.max_val_views."""
    run_dir, _ = trained_run
    held_out = [f.image_path.stem for f in load_capture(tiny_scene).val]
    auto = evaluate(
        app_cfg("eval", f"ckpt={run_dir}", "save_images=false", "++data.max_test_views=2", out="a")
    )
    assert [v["name"] for v in auto["views"]] == [held_out[0], held_out[1]]  # 3 / 2: views 0 and 1.5 -> 1
    assert (auto["n_views"], auto["n_split_views"]) == (2, 3)
    val = evaluate(
        app_cfg(
            "eval", f"ckpt={run_dir}", "split=val", "save_images=false", "++data.max_test_views=2", out="v"
        )
    )
    assert [v["name"] for v in val["views"]] == held_out and val["n_split_views"] == 3


# ------------------------------------------------------------------------------------------- render
def test_render_writes_mp4s_with_the_requested_frames(trained_run, app_cfg) -> None:
    run_dir, _ = trained_run
    cfg = app_cfg(
        "render", f"ckpt={run_dir}", "frames=7", "fps=12", "width=36", "height=27", "camera_path=spiral"
    )
    info = render_video(cfg)
    out = Path(cfg.paths.output_dir)
    rgb = iio.imread(out / "rgb.mp4")
    depth = iio.imread(out / "depth.mp4")
    assert rgb.shape == depth.shape == (7, 28, 36, 3)  # odd heights are padded to even for H.264
    assert info["frames"] == 7 and info["render_fps"] > 0
    assert not list(out.glob(".*partial*"))
    import imageio.v2 as iio2

    with iio2.get_reader(out / "rgb.mp4", format="FFMPEG") as reader:
        assert reader.get_meta_data()["fps"] == pytest.approx(12)

    # frame 0 of the video is what the model renders from the path's first camera (H.264 aside)
    run = load_run(run_dir)
    model = run.build_model()
    capture = run.load_capture()
    cams = orbit_path(
        np.stack([f.c2w for f in capture.train]), 7, 36, 27, *_focal(capture, 27), kind="spiral"
    )
    o, d = camera_rays(cams[0], torch.device("cpu"))
    ref = model.renderer.render_image(model.field, o, d, torch.ones(3))["rgb"].reshape(27, 36, 3)
    assert _psnr(rgb[0, :27].astype(np.float64) / 255, ref.clamp(0, 1).numpy()) > 28


def _focal(capture, height: int) -> tuple[float, float]:
    f0 = capture.train[0].intrinsics
    fov = 2 * math.atan(0.5 * f0.height / f0.fy)
    fy = 0.5 * height / math.tan(fov / 2)
    return fy * f0.fx / f0.fy, fy


def test_orbit_circles_the_focus_point_at_the_training_distance() -> None:
    from nerf_lightning.video.camera_paths import look_at

    centre, up = np.array([0.4, 0.6, 0.5]), np.array([0.0, 0.0, 1.0])
    ring = []
    for a in np.linspace(0, 2 * np.pi, 12, endpoint=False):
        eye = centre + np.array([2 * np.cos(a), 2 * np.sin(a), 1.0])
        ring.append(look_at(eye, centre, up))
    cams = orbit_path(np.stack(ring), 30, 64, 48, 50.0, 50.0, kind="orbit")
    assert len(cams) == 30
    for cam in cams:
        eye = cam.c2w[:3, 3]
        assert np.linalg.norm(eye - centre) == pytest.approx(np.sqrt(5), rel=1e-6)
        assert (eye - centre) @ up == pytest.approx(1.0, rel=1e-6)
        # the centre projects to the image centre; image "up" (-y) points along world up
        p = cam.c2w[:3, :3].T @ (centre - eye)
        assert p[2] > 0 and abs(p[0]) < 1e-9 and abs(p[1]) < 1e-9
        assert (-cam.c2w[:3, 1]) @ up > 0
    np.testing.assert_allclose(cams[0].c2w[:3, 3], ring[0][:3, 3], atol=1e-9)  # starts at training view 0
    with pytest.raises(UserError, match="camera_path='circle'"):
        orbit_path(np.stack(ring), 3, 8, 8, 5.0, 5.0, kind="circle")


def test_nerfstudio_camera_path_lands_on_the_capture_cameras(tiny_scene: Path, tmp_path: Path) -> None:
    """A camera_path.json made of the capture's own transforms.json poses gives the training cameras."""
    from nerf_lightning.data.scene_space import SceneSpace

    doc = json.loads((tiny_scene / "transforms.json").read_text())
    capture = load_capture(tiny_scene, test_every=8)
    by_name = {f.image_path.name: f for f in capture.train}
    frames = [f for f in doc["frames"] if Path(f["file_path"]).name in by_name][:3]
    path = tmp_path / "camera_path.json"
    path.write_text(
        json.dumps(
            {
                "camera_type": "perspective",
                "render_width": 40,
                "render_height": 30,
                "fps": 24,
                "camera_path": [
                    {"camera_to_world": sum(f["transform_matrix"], []), "fov": 60} for f in frames
                ],
            }
        )
    )
    cams, fps = read_nerfstudio_path(path, SceneSpace.of(capture))
    assert fps == 24 and len(cams) == 3
    for cam, f in zip(cams, frames, strict=True):
        np.testing.assert_allclose(cam.c2w, by_name[Path(f["file_path"]).name].c2w, atol=1e-9)
        assert cam.fy == pytest.approx(15 / math.tan(math.radians(30)))
    path.write_text(
        json.dumps(
            {"camera_type": "equirectangular", "render_width": 4, "render_height": 2, "camera_path": []}
        )
    )
    with pytest.raises(UserError, match="camera_type 'equirectangular'"):
        read_nerfstudio_path(path, None)
    with pytest.raises(UserError, match="no such file"):
        read_nerfstudio_path(tmp_path / "missing.json", None)


def _keyframe(matrix: list[float] | None = None, fov: float = 50) -> dict:
    return {"camera_to_world": sum(np.eye(4).tolist(), []) if matrix is None else matrix, "fov": fov}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"camera_path": [_keyframe([float("nan")] * 16)]}, r"camera_path\[0\]: .*NaN or inf"),
        ({"render_width": 0}, "render_width x render_height is 0x30; expected >= 1 pixel each"),
        ({"render_height": -30}, "render_width x render_height is 40x-30"),
        ({"camera_path": [_keyframe([0.0] * 16)]}, r"camera_path\[0\]: .*not a camera pose"),
        ({"camera_path": [_keyframe(fov=0)]}, r"camera_path\[0\]: `fov` is 0; expected"),
        ({"fps": -24}, "`fps` is -24; expected a number > 0"),
        ({"camera_path": {"0": _keyframe()}}, "`camera_path` is a JSON object; expected a list with one"),
        ({"camera_path": []}, "`camera_path` is empty; expected one entry per frame"),
    ],
)
def test_camera_path_files_that_cannot_make_a_video(tmp_path: Path, edit: dict, message: str) -> None:
    doc = {
        "camera_type": "perspective",
        "render_width": 40,
        "render_height": 30,
        "camera_path": [_keyframe()],
        **edit,
    }
    path = tmp_path / "camera_path.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=f"^{re.escape(str(path))}: {message}"):
        read_nerfstudio_path(path, None)


@pytest.mark.parametrize("doc", ["[]", "3", '"orbit"'])
def test_a_camera_path_file_that_is_no_object_is_one_line(tmp_path: Path, doc: str) -> None:
    path = tmp_path / "camera_path.json"
    path.write_text(doc)
    kind = {"[]": "list", "3": "number", '"orbit"': "string"}[doc]
    with pytest.raises(UserError) as err:
        read_nerfstudio_path(path, None)
    assert str(err.value) == (
        f"{path}: a JSON {kind}; expected nerfstudio's camera_path.json, an object with `render_width`, "
        "`render_height` and a `camera_path` list"
    )


@pytest.mark.parametrize("save_frames", [False, True])
def test_sigterm_during_a_render_leaves_no_video_and_exits_143(
    trained_run, app_cfg, monkeypatch, capsys, save_frames: bool
) -> None:
    import os
    import signal

    import nerf_lightning.apps.render as render_app
    from nerf_lightning.apps.entry import _raise_interrupted
    from nerf_lightning.errors import EXIT_INTERRUPTED, user_errors

    run_dir, _ = trained_run
    size = ["frames=4", "width=16", "height=16"]
    cfg = app_cfg("render", f"ckpt={run_dir}", *size, f"save_frames={save_frames}")
    real_rays, calls = render_app.camera_rays, []

    def rays_then_sigterm(cam, device):
        calls.append(1)
        if len(calls) == 3:  # a real SIGTERM in the middle of the video
            os.kill(os.getpid(), signal.SIGTERM)
        return real_rays(cam, device)

    monkeypatch.setattr(render_app, "camera_rays", rays_then_sigterm)
    previous = signal.signal(signal.SIGTERM, _raise_interrupted("render"))  # what the entry point installs
    try:
        with pytest.raises(SystemExit) as exit_info, user_errors():
            render_app.render_video(cfg)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert exit_info.value.code == EXIT_INTERRUPTED and len(calls) == 3
    out = Path(cfg.paths.output_dir)
    assert not out.exists() or sorted(p.name for p in out.rglob("*")) == []  # two frames were rendered
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: render stopped by SIGTERM before it finished; no partial output is left"
    ]


def test_sigterm_during_an_eval_leaves_no_views_and_names_the_folder(
    trained_run, app_cfg, monkeypatch, capsys
) -> None:
    import os
    import signal

    from nerf_lightning.apps import eval as eval_app
    from nerf_lightning.errors import EXIT_INTERRUPTED, user_errors

    run_dir, _ = trained_run
    cfg = app_cfg("eval", f"ckpt={run_dir}")
    out = Path(cfg.paths.output_dir)
    real_end, seen = eval_app.ViewWriter.on_validation_batch_end, []

    def end_then_sigterm(self, *args, **kwargs):
        real_end(self, *args, **kwargs)  # the view's images are written
        seen.append(1)
        if len(seen) == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # Lightning's handler: the loop stops after this view

    monkeypatch.setattr(eval_app.ViewWriter, "on_validation_batch_end", end_then_sigterm)
    with pytest.raises(SystemExit) as exit_info, user_errors():
        eval_app.evaluate(cfg)
    assert exit_info.value.code == EXIT_INTERRUPTED and len(seen) == 2
    assert not out.exists() or sorted(p.name for p in out.rglob("*")) == []
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: eval stopped by SIGTERM before it finished; no metrics.json and no views/ were written into "
        f"{out}: run the same command again"
    ]


def test_turbo_colour_map() -> None:
    c = turbo(np.array([0.0, 0.5, 1.0]))
    assert c.dtype == np.uint8
    assert tuple(c[0]) == (35, 23, 27)  # dark blue-black end
    assert c[1, 1] > 200 and c[1, 1] > c[1, 0] and c[1, 1] > c[1, 2]  # green middle
    assert c[2, 0] > c[2, 1] > c[2, 2]  # red end


# ------------------------------------------------------------------------------------------- export
def test_export_mesh_and_point_cloud(trained_run, app_cfg) -> None:
    trimesh = pytest.importorskip("trimesh")

    run_dir, _ = trained_run
    cfg = app_cfg(
        "export",
        "what=mesh",
        f"ckpt={run_dir}",
        "resolution=80",
        "format=ply",
        "pointcloud=true",
        "num_points=5000",
        "pointcloud_downscale=2",
        "bake_views=0",  # head-on vertex colours (the view-averaged bake: tests/mesh/test_export_asset.py)
    )
    info = export(cfg)
    out = Path(cfg.paths.output_dir)
    mesh = trimesh.load(out / "mesh.ply", process=False)
    assert isinstance(mesh, trimesh.Trimesh)
    assert len(mesh.faces) >= 10_000 and len(mesh.faces) == info["faces"]
    colors = mesh.visual.vertex_colors
    assert colors.shape == (len(mesh.vertices), 4) and colors[:, :3].std() > 5  # textured, not one colour
    # capture space: the default scene's objects (radius 1.2 around the origin, height ~0.8) and ground
    lo, hi = mesh.bounds
    assert np.all(lo > -2.0) and np.all(hi < 2.0), mesh.bounds
    cloud = trimesh.load(out / "pointcloud.ply", process=False)
    assert 1000 < len(cloud.vertices) <= 5000
    # the point cloud (rendered depths) lies on the mesh (marching cubes of the density)
    from scipy.spatial import cKDTree

    nearest_vertex = cKDTree(mesh.vertices).query(cloud.vertices)[0]
    assert np.median(nearest_vertex) < 0.1  # ~3 voxels of the 80-cell grid over the ~2.4-wide scene

    ngp_args = ("what=mesh", f"ckpt={run_dir}", "resolution=48", "format=ply", "space=ngp", "bake_views=0")
    ngp = export(app_cfg("export", *ngp_args, out="ngp"))
    m = trimesh.load(ngp["mesh"], process=False)
    assert np.all(m.bounds[0] >= -1e-6) and np.all(m.bounds[1] <= 1 + 1e-6)  # NGP: inside the unit cube
    with pytest.raises(UserError, match="no surface at threshold"):
        export(
            app_cfg("export", "what=mesh", f"ckpt={run_dir}", "resolution=16", "threshold=1e9", out="none")
        )
