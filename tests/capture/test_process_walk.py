"""``process`` on a synthetic walk around the embedded scene (``walk.py``): photos, then a video of them.

The recovered poses are compared with the true ones up to a similarity (Umeyama on the camera
centres): the rotation error of every camera < 1 degree, its centre error < 1 % of the scene radius
(the true cameras' distance from the scene centre). The renders are made once for the module (40
views, 192 px, a few seconds of rendering and about ten of structure from motion per run on two
idle cores). The training comparison (CPU preset, recovered against true poses) is a ``repro`` test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
from hydra.core.global_hydra import GlobalHydra
from walk import (
    FOCAL,
    LOOK_AT,
    N_VIEWS,
    SIZE,
    align,
    box_blur,
    encode_clip,
    render_walk,
    umeyama,
    write_true_capture,
)

from nerf_lightning.capture.sharpness import image_sharpness
from nerf_lightning.data.formats import load_capture
from nerf_lightning.run.config import compose_app_config

pytest.importorskip("pycolmap", reason="pycolmap is not installed: pip install 'nerf_lightning[process]'")
from nerf_lightning.apps.process import process  # noqa: E402

pytestmark = pytest.mark.slow

MAX_ROTATION_DEG = 1.0
MAX_CENTRE_ERROR = 0.01  # of the scene radius
#: sequential matching (a video) pairs each frame with its 10 successors only, so the loop around the
#: scene is never closed and the poses drift: 1.1-1.4 % of the radius at the far end of the loop
#: (exhaustive matching of the same frames: 0.64 %; docs/process.md)
MAX_CENTRE_ERROR_SEQUENTIAL = 0.02
#: a view may miss registration
MIN_REGISTERED = N_VIEWS - 1
#: a small camera model solves the small images best (OPENCV's eight parameters: 0.8 degrees off)
CAMERA = "camera_model=SIMPLE_RADIAL"
#: one thread makes COLMAP's extraction, matching and mapping reproducible (its seeds are fixed): on two
#: threads the video's worst rotation moved between runs (0.76 and 1.31 degrees seen); on one it is
#: 0.757 degrees in every run, under ATEN_CPU_CAPABILITY=default as under avx2 (docs/process.md)
THREADS = "sfm.num_threads=1"


def run_process(run_dir: Path, *overrides: str) -> dict:
    try:
        return process(compose_app_config("process", list(overrides), run_dir))
    finally:
        GlobalHydra.instance().clear()


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    root = tmp_path_factory.mktemp("walk")
    return root, render_walk(root / "photos")


@pytest.fixture(scope="module")
def photo_capture(walk) -> tuple[Path, dict]:
    root, _ = walk
    out = root / "capture"
    return out, run_process(root / "run_photos", f"images={root / 'photos'}", f"out={out}", CAMERA, THREADS)


def frame_poses(capture: Path) -> tuple[list[str], np.ndarray]:
    doc = json.loads((capture / "transforms.json").read_text())
    return [f["file_path"] for f in doc["frames"]], np.array([f["transform_matrix"] for f in doc["frames"]])


def test_photos_get_the_true_poses_up_to_a_similarity(walk, photo_capture) -> None:
    _, true = walk
    out, summary = photo_capture
    names, poses = frame_poses(out)
    assert summary["images"] == N_VIEWS and summary["registered"] >= MIN_REGISTERED
    assert len(summary["unregistered_images"]) == N_VIEWS - summary["registered"]
    assert summary["options"]["matcher"] == "exhaustive"  # auto: photos
    views = [int(Path(n).stem) for n in names]
    assert names == [f"images/{i:04d}.png" for i in views] and views == sorted(views)
    _, err = align(poses, true[views])
    print(f"photos: {err}, reprojection {summary['mean_reprojection_error_px']:.3f} px")
    assert err["rotation_max_deg"] < MAX_ROTATION_DEG, err
    assert err["centre_max"] < MAX_CENTRE_ERROR, err
    assert summary["mean_reprojection_error_px"] < 1.0


def test_the_capture_is_oriented_centred_and_scaled_as_colmap2nerf_does(walk, photo_capture) -> None:
    _, true = walk
    out, summary = photo_capture
    names, poses = frame_poses(out)
    true = true[[int(Path(n).stem) for n in names]]
    # up: the mean camera up vector (camera +y, OpenGL) is +z
    up = poses[:, :3, 1].mean(axis=0)
    assert up[2] / np.linalg.norm(up) > 0.9999
    # centre: the point the cameras look at (the scene's LOOK_AT) is the origin
    s, rot, t = umeyama(poses[:, :3, 3], true[:, :3, 3])
    target = (LOOK_AT - t) @ rot / s  # LOOK_AT in the capture's frame
    assert np.linalg.norm(target) < 0.01 * 4.0, target
    # scale: the cameras sit at a mean distance of 4 (colmap2nerf's "nerf sized")
    assert np.linalg.norm(poses[:, :3, 3], axis=1).mean() == pytest.approx(4.0, rel=1e-6)
    assert summary["camera_distance"]["mean"] == pytest.approx(4.0, rel=1e-6)
    # each camera looks at the centre (its -z axis), as the true ones look at LOOK_AT
    to_centre = -poses[:, :3, 3] / np.linalg.norm(poses[:, :3, 3], axis=1, keepdims=True)
    assert (np.einsum("vi,vi->v", to_centre, -poses[:, :3, 2]) > math.cos(math.radians(2.0))).all()


def test_the_loader_reads_the_capture_as_it_reads_fox(photo_capture) -> None:
    out, summary = photo_capture
    doc = json.loads((out / "transforms.json").read_text())
    fox_keys = {"camera_angle_x", "camera_angle_y", "fl_x", "fl_y", "k1", "k2", "p1", "p2", "cx", "cy", "w",
                "h", "aabb_scale", "frames"}  # fmt: skip
    assert set(doc) == fox_keys
    assert all(set(f) == {"file_path", "sharpness", "transform_matrix"} for f in doc["frames"])
    assert doc["aabb_scale"] == summary["aabb_scale"] and doc["aabb_scale"] in (1, 2, 4, 8, 16, 32, 64, 128)
    capture = load_capture(out, format="auto")
    assert capture.format == "ngp" and capture.scale == 0.33 and capture.aabb_scale == doc["aabb_scale"]
    assert len(capture.train) + len(capture.val) == summary["registered"]
    assert len(capture.val) == math.ceil(summary["registered"] / 8)
    intr = capture.train[0].intrinsics
    assert (intr.width, intr.height) == (SIZE, SIZE)
    assert intr.fx == pytest.approx(FOCAL, rel=0.01) and intr.fy == intr.fx
    assert (intr.cx, intr.cy) == (SIZE / 2, SIZE / 2)  # not refined by default
    # per-frame sharpness: the variance of the Laplacian of the stored image
    frame = doc["frames"][3]
    assert frame["sharpness"] == pytest.approx(image_sharpness(out / frame["file_path"]), rel=1e-9)
    # the images are the photos, byte for byte; COLMAP's model sits beside them
    assert (out / "images/0003.png").read_bytes() == (out.parent / "photos/0003.png").read_bytes()
    assert {p.name for p in (out / "colmap/sparse/0").iterdir()} >= {
        "cameras.bin",
        "images.bin",
        "points3D.bin",
    }
    assert not (out / "colmap/database.db").exists()  # keep_database=false
    assert json.loads((out / "process.json").read_text()) == json.loads(json.dumps(summary))
    assert not list(out.parent.glob(".capture.tmp-*"))


def test_the_model_process_kept_read_back_with_colmap_is_the_same_capture(walk, photo_capture) -> None:
    """``colmap=`` on the model the solve left in ``colmap/sparse/0``: the same transforms.json (within
    float precision) and summary, without a solve."""
    root, _ = walk
    out, summary = photo_capture
    again = root / "from_model"
    read = run_process(
        root / "run_model", f"colmap={out / 'colmap/sparse/0'}", f"images={root / 'photos'}", f"out={again}"
    )
    first, second = (json.loads((c / "transforms.json").read_text()) for c in (out, again))
    assert [f["file_path"] for f in second["frames"]] == [f["file_path"] for f in first["frames"]]
    for a, b in zip(first["frames"], second["frames"], strict=True):
        np.testing.assert_allclose(b["transform_matrix"], a["transform_matrix"], rtol=0, atol=1e-9)
        assert b["sharpness"] == a["sharpness"]
    assert {k: v for k, v in second.items() if k != "frames"} == {
        k: v for k, v in first.items() if k != "frames"
    }
    for key in ("registered", "aabb_scale", "points", "camera"):
        assert read[key] == summary[key], key
    assert read["mean_reprojection_error_px"] == pytest.approx(
        summary["mean_reprojection_error_px"], rel=1e-9
    )
    assert "seconds" in read and not any(k in read["seconds"] for k in ("features", "matching", "mapping"))


@pytest.fixture(scope="module")
def video_capture(walk) -> tuple[Path, dict]:
    """The walk as a clip: each view followed by a smeared copy of it (a frame of motion blur)."""
    root, _ = walk
    frames = []
    for i in range(N_VIEWS):
        img = iio.imread(root / "photos" / f"{i:04d}.png")
        frames += [img, box_blur(img)]
    clip = root / "walk.mp4"
    encode_clip(frames, clip)
    out = root / "from_video"
    summary = run_process(
        root / "run_video", f"video={clip}", f"out={out}", f"num_frames={N_VIEWS}", CAMERA, THREADS
    )
    return out, summary


def test_a_video_keeps_the_sharp_frames_and_gets_the_true_poses(walk, video_capture) -> None:
    _, true = walk
    out, summary = video_capture
    kept = summary["source"]["kept_frame_indices"]
    assert len(kept) == N_VIEWS
    assert all(i % 2 == 0 for i in kept), f"a blurred frame was kept: {kept}"
    assert summary["options"]["matcher"] == "sequential"  # auto: a video
    assert summary["registered"] >= MIN_REGISTERED
    names, poses = frame_poses(out)
    views = [kept[int(Path(n).stem.split("_")[1]) - 1] // 2 for n in names]
    assert views == sorted(views) and len(views) == summary["registered"]
    _, err = align(poses, true[views])
    print(f"video: {err}, reprojection {summary['mean_reprojection_error_px']:.3f} px")
    assert err["rotation_max_deg"] < MAX_ROTATION_DEG, err
    assert err["centre_max"] < MAX_CENTRE_ERROR_SEQUENTIAL, err
    doc = json.loads((out / "transforms.json").read_text())
    assert (doc["w"], doc["h"]) == (SIZE, SIZE)
    load_capture(out)


#: one short identical recipe for both trainings: the CPU preset with half its rays per step, fewer steps.
#: Measured alone on 2 idle cores (2026-12-07): recovered 19.68 dB, true 20.00 dB, a constant colour
#: 14.91 dB, 205 + 195 s of training (the preset's 2048 rays: 20.64 / 20.54 dB in 358 + 302 s)
TRAIN_STEPS = 400
RAYS_PER_STEP = 1024
SEED = 42
MAX_PSNR_GAP_DB = 1.0


@pytest.mark.repro
@pytest.mark.timeout(3600)  # two CPU trainings: about 7 minutes on 2 idle cores, 9 on busy ones
def test_training_on_the_recovered_poses_matches_training_on_the_true_ones(
    walk, photo_capture, tmp_path: Path
) -> None:
    import torch

    from benchmarks.capture_ab import run_variant

    torch.set_num_threads(2)
    _, true = walk
    out, _ = photo_capture
    names, poses = frame_poses(out)
    true_in_capture, _ = align(poses, true[[int(Path(n).stem) for n in names]])
    truth = write_true_capture(tmp_path / "true", out, dict(zip(names, true_in_capture, strict=True)))
    recipe = ["experiment=cpu", f"data.batch_size={RAYS_PER_STEP}"]
    recovered = run_variant(str(out), recipe, TRAIN_STEPS, SEED, tmp_path / "run_recovered")
    reference = run_variant(str(truth), recipe, TRAIN_STEPS, SEED, tmp_path / "run_true")
    report = (
        f"held-out PSNR: recovered poses {recovered['heldout_psnr']:.2f} dB, true poses "
        f"{reference['heldout_psnr']:.2f} dB over {recovered['views']} views ({TRAIN_STEPS} steps)"
    )
    print(report)
    assert recovered["views"] == reference["views"] >= N_VIEWS // 8
    assert abs(recovered["heldout_psnr"] - reference["heldout_psnr"]) < MAX_PSNR_GAP_DB, report
    assert reference["heldout_psnr"] > reference["constant_psnr"] + 3.0, report  # it did learn the scene
