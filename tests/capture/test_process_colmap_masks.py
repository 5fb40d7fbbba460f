"""``process colmap=MODEL images=FOLDER`` (poses someone already solved) and ``process masks=FOLDER``.

The COLMAP models are written here as COLMAP's text format (cameras, images with their observations,
points3D with their tracks) from cameras on a ring and random points, and converted to the binary
format with pycolmap. The round trip: a solve (a fake that leaves this model in ``colmap/sparse/0``
and returns the ring's numbers) makes a capture; ``colmap=`` on the kept model makes the same one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from rings import colmap_ring
from runs import fork_app

from nerf_lightning.capture.photos import list_photos
from nerf_lightning.capture.sfm import Camera, SfmResult
from nerf_lightning.data.formats import load_capture
from nerf_lightning.data.types import Intrinsics
from nerf_lightning.errors import EXIT_USER_ERROR, UserError

pycolmap = pytest.importorskip(
    "pycolmap", reason="pycolmap is not installed: pip install 'nerf_lightning[process]'"
)

W, H = 48, 32
#: OPENCV: fx fy cx cy k1 k2 p1 p2
OPENCV = (40.0, 41.0, 24.0, 16.0, 0.01, -0.02, 0.003, 0.004)


def _photos(folder: Path, n: int, size: tuple[int, int] = (W, H)) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(n)
    names = [f"{i:03d}.png" for i in range(n)]
    for name in names:
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(folder / name)
    return names


def _quat(r: np.ndarray) -> np.ndarray:
    """(w, x, y, z) of a rotation matrix (COLMAP's order)."""
    w = math.sqrt(max(0.0, 1.0 + r[0, 0] + r[1, 1] + r[2, 2])) / 2
    x = math.copysign(math.sqrt(max(0.0, 1.0 + r[0, 0] - r[1, 1] - r[2, 2])) / 2, r[2, 1] - r[1, 2])
    y = math.copysign(math.sqrt(max(0.0, 1.0 - r[0, 0] + r[1, 1] - r[2, 2])) / 2, r[0, 2] - r[2, 0])
    z = math.copysign(math.sqrt(max(0.0, 1.0 - r[0, 0] - r[1, 1] + r[2, 2])) / 2, r[1, 0] - r[0, 1])
    return np.array([w, x, y, z])


def _nums(values) -> str:
    return " ".join(repr(float(v)) for v in values)


def _write_model(folder: Path, names: list[str], cameras: dict[int, tuple[str, tuple[float, ...]]],
                 camera_of: list[int], points: np.ndarray) -> list[np.ndarray]:  # fmt: skip
    """A COLMAP text model of ``names`` on the ring; returns their camera-to-world matrices."""
    folder.mkdir(parents=True, exist_ok=True)
    poses = colmap_ring(len(names))
    (folder / "cameras.txt").write_text(
        "".join(f"{cid} {model} {W} {H} {_nums(p)}\n" for cid, (model, p) in cameras.items())
    )
    tracks: dict[int, list[tuple[int, int]]] = {j: [] for j in range(len(points))}
    lines = []
    for i, (name, c2w, cid) in enumerate(zip(names, poses, camera_of, strict=True)):
        w2c = np.linalg.inv(c2w)
        q, t = _quat(w2c[:3, :3]), w2c[:3, 3]
        fx, fy, cx, cy = cameras[cid][1][:4] if cameras[cid][0] != "SIMPLE_PINHOLE" else (
            cameras[cid][1][0], cameras[cid][1][0], *cameras[cid][1][1:3])  # fmt: skip
        obs = []
        for j, p in enumerate(points):
            x = w2c[:3, :3] @ p + t
            u, v = fx * x[0] / x[2] + cx, fy * x[1] / x[2] + cy
            if x[2] > 0 and 0 <= u < W and 0 <= v < H:
                tracks[j].append((i + 1, len(obs)))
                obs.append(f"{_nums((u, v))} {j + 1}")
        lines.append(f"{i + 1} {_nums(q)} {_nums(t)} {cid} {name}\n{' '.join(obs)}\n")
    (folder / "images.txt").write_text("".join(lines))
    (folder / "points3D.txt").write_text(
        "".join(
            f"{j + 1} {_nums(p)} 128 128 128 0.5 {' '.join(f'{a} {b}' for a, b in tracks[j])}\n"
            for j, p in enumerate(points)
            if len(tracks[j]) >= 2
        )
    )
    return poses


def _points() -> np.ndarray:
    return np.random.default_rng(1).normal(0.0, 0.3, (80, 3))


def _binary(text: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    pycolmap.Reconstruction(str(text)).write_binary(str(dest))
    return dest


def _solve_leaving(model: Path, poses: list[np.ndarray], names: list[str]):
    """A solve that leaves ``model`` (binary) as its sparse/0 and returns the ring's own numbers."""
    error = float(pycolmap.Reconstruction(str(model)).compute_mean_reprojection_error())

    def run_sfm(image_dir, image_names, work_dir, options, on_progress=None):
        _binary(model, Path(work_dir) / "sparse" / "0")
        fx, fy, cx, cy, k1, k2, p1, p2 = OPENCV
        intr = Intrinsics(
            fx=fx, fy=fy, cx=cx, cy=cy, width=W, height=H, k1=k1, k2=k2, p1=p1, p2=p2, model="opencv"
        )
        points = np.array([p.xyz for p in pycolmap.Reconstruction(str(model)).points3D.values()])
        return SfmResult(
            camera=Camera("OPENCV", intr), cam_to_world=dict(zip(names, poses, strict=True)), points=points,
            mean_reprojection_error=error, registered=list(names), unregistered=[], model_sizes=[len(names)],
            seconds={"features": 1.0, "matching": 1.0, "mapping": 1.0},
        )  # fmt: skip

    return run_sfm


def test_a_solve_read_back_with_colmap_is_the_same_capture(tmp_path: Path, run, capsys) -> None:
    names = _photos(tmp_path / "photos", 8)
    poses = _write_model(tmp_path / "text", names, {1: ("OPENCV", OPENCV)}, [1] * 8, _points())
    model = _binary(tmp_path / "text", tmp_path / "bin")
    solved = run(
        f"images={tmp_path / 'photos'}", f"out={tmp_path / 'a'}", sfm=_solve_leaving(model, poses, names)
    )
    capsys.readouterr()
    for source in (tmp_path / "a" / "colmap" / "sparse" / "0", tmp_path / "text"):  # binary, then text
        out = tmp_path / f"from_{source.name}"
        read = run(f"colmap={source}", f"images={tmp_path / 'photos'}", f"out={out}")
        first, second = (json.loads((c / "transforms.json").read_text()) for c in (tmp_path / "a", out))
        assert {k: v for k, v in second.items() if k != "frames"} == {
            k: v for k, v in first.items() if k != "frames"
        }
        assert [f["file_path"] for f in second["frames"]] == [f"images/{n}" for n in names]
        for a, b in zip(first["frames"], second["frames"], strict=True):
            assert set(b) == set(a) == {"file_path", "sharpness", "transform_matrix"}
            np.testing.assert_allclose(b["transform_matrix"], a["transform_matrix"], rtol=0, atol=1e-9)
            assert b["sharpness"] == a["sharpness"]
        for key in ("registered", "points", "aabb_scale", "camera", "camera_distance"):
            assert (
                read[key] == pytest.approx(solved[key], rel=1e-9)
                if key == "camera_distance"
                else read[key] == solved[key]
            )
        assert read["mean_reprojection_error_px"] == pytest.approx(
            solved["mean_reprojection_error_px"], rel=1e-9
        )
        assert read["source"]["colmap"] == str(source) and read["options"] is None
        printed = capsys.readouterr().out
        assert "registered 8 of 8 images" in printed and "no structure from motion" in printed


def test_a_model_of_two_cameras_gets_per_frame_intrinsics(tmp_path: Path, run) -> None:
    names = _photos(tmp_path / "photos", 6)
    cams = {1: ("PINHOLE", (40.0, 41.0, 24.0, 16.0)), 2: ("SIMPLE_PINHOLE", (55.0, 23.0, 15.0))}
    _write_model(tmp_path / "model", names, cams, [1, 2, 1, 2, 1, 2], _points())
    run(f"colmap={tmp_path / 'model'}", f"images={tmp_path / 'photos'}", f"out={tmp_path / 'c'}")
    doc = json.loads((tmp_path / "c" / "transforms.json").read_text())
    assert doc["fl_x"] == 40.0 and doc["fl_y"] == 41.0  # the first image's camera on top
    assert [f.get("fl_x") for f in doc["frames"]] == [None, 55.0, None, 55.0, None, 55.0]
    capture = load_capture(tmp_path / "c", test_every=0)
    got = [(f.intrinsics.fx, f.intrinsics.fy, f.intrinsics.cx, f.intrinsics.cy) for f in capture.train]
    assert got == [(40.0, 41.0, 24.0, 16.0), (55.0, 55.0, 23.0, 15.0)] * 3


def _line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_what_a_colmap_model_cannot_give_is_one_line_and_writes_nothing(tmp_path: Path, run) -> None:
    names = _photos(tmp_path / "photos", 6)
    _write_model(tmp_path / "model", names, {1: ("OPENCV", OPENCV)}, [1] * 6, _points())
    images, out = f"images={tmp_path / 'photos'}", f"out={tmp_path / 'out'}"

    (tmp_path / "photos" / "004.png").unlink()
    (tmp_path / "photos" / "001.png").unlink()
    with pytest.raises(UserError) as err:
        run(f"colmap={tmp_path / 'model'}", images, out)
    assert _line(err) == (
        f"images={tmp_path / 'photos'}: 2 of the 6 images of the COLMAP model are not there "
        "(001.png, 004.png); "
        "pass the folder the model was solved from"
    )
    _photos(tmp_path / "photos", 6)

    fisheye = tmp_path / "fisheye"
    _write_model(fisheye, names, {1: ("OPENCV", OPENCV)}, [1] * 6, _points())
    text = (fisheye / "cameras.txt").read_text().replace("OPENCV", "FULL_OPENCV").strip() + " 0 0 0 0\n"
    (fisheye / "cameras.txt").write_text(text)
    with pytest.raises(UserError) as err:
        run(f"colmap={fisheye}", images, out)
    assert _line(err).startswith(
        f"colmap={fisheye}: camera 1 is a FULL_OPENCV camera, which transforms.json cannot hold"
    )

    with pytest.raises(UserError) as err:
        run(f"colmap={tmp_path / 'photos'}", images, out)
    assert "no COLMAP model there; expected a sparse model folder with cameras, images and points3D" in _line(
        err
    )

    with pytest.raises(UserError) as err:
        run(
            f"colmap={tmp_path / 'model'}", f"images={tmp_path / 'photos'}", "downscale=1", out, "video=x.mp4"
        )
    assert "both of images= and video= given" in _line(err)

    other = tmp_path / "small"
    _photos(other, 6, size=(24, 16))
    with pytest.raises(UserError) as err:
        run(f"colmap={tmp_path / 'model'}", f"images={other}", out)
    assert _line(err).startswith(
        f"images={other}: 000.png is 24x16 but its camera in the COLMAP model is for 48x32"
    )
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_the_entry_point_refuses_a_missing_model_with_one_line_and_status_2(tmp_path: Path) -> None:
    _photos(tmp_path / "photos", 3)
    err = tmp_path / "stderr.txt"
    proc = fork_app("process", f"colmap={tmp_path / 'none'}", f"images={tmp_path / 'photos'}",
                    f"out={tmp_path / 'out'}", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
                    log=tmp_path / "stdout.txt", err_log=err)  # fmt: skip
    proc.join(timeout=120)
    assert proc.exitcode == EXIT_USER_ERROR
    lines = err.read_text().strip().splitlines()
    assert "Traceback" not in err.read_text()
    assert lines[-1].startswith(f"error: colmap={tmp_path / 'none'}: no such folder")


def _masks_case(tmp_path: Path) -> tuple[list[str], Path]:
    names = _photos(tmp_path / "photos", 6)
    _write_model(tmp_path / "model", names, {1: ("OPENCV", OPENCV)}, [1] * 6, _points())
    masks = tmp_path / "masks"
    masks.mkdir()
    moved = np.zeros((H, W), dtype=bool)
    moved[4:10, 6:20] = True  # rows 4-9, columns 6-19
    Image.fromarray(np.where(moved, 0, 255).astype(np.uint8)).save(
        masks / "001.png"
    )  # nerfstudio: 0 = ignore
    Image.fromarray(np.where(moved, 255, 0).astype(np.uint8)).save(masks / "dynamic_mask_003.png")  # ngp
    return names, masks


def test_masks_are_copied_into_the_capture_and_listed_in_its_frames(tmp_path: Path, run) -> None:
    names, masks = _masks_case(tmp_path)
    photos = f"images={tmp_path / 'photos'}"
    summary = run(
        f"colmap={tmp_path / 'model'}", photos, f"masks={masks}", f"out={tmp_path / 'c'}", "downscale=2"
    )
    doc = json.loads((tmp_path / "c" / "transforms.json").read_text())
    assert [f.get("mask_path") for f in doc["frames"]] == [
        None,
        "masks/001.png",
        None,
        "masks/003.png",
        None,
        None,
    ]
    assert summary["masks"] == 2
    for name in ("001.png", "003.png"):
        written = np.asarray(Image.open(tmp_path / "c" / "masks" / name))
        expected = np.full((H // 2, W // 2), 255, dtype=np.uint8)
        expected[2:5, 3:10] = 0  # every 2 x 2 block touching rows 4-9, columns 6-19
        assert np.array_equal(written, expected), name
    frames = load_capture(tmp_path / "c", test_every=0).train
    assert [f.mask_kind for f in frames if f.mask_path is not None] == ["keep", "keep"]


def test_a_mask_of_another_size_or_without_an_image_is_one_line(tmp_path: Path, run) -> None:
    _, masks = _masks_case(tmp_path)
    args = (
        f"colmap={tmp_path / 'model'}",
        f"images={tmp_path / 'photos'}",
        f"masks={masks}",
        f"out={tmp_path / 'c'}",
    )
    Image.fromarray(np.zeros((H, W), dtype=np.uint8)).save(masks / "dynamic_mask_lamp.png")
    with pytest.raises(UserError) as err:
        run(*args)
    assert (
        _line(err)
        == f"masks={masks}: dynamic_mask_lamp.png is the mask of an image lamp.* that images= does not hold"
    )
    (masks / "dynamic_mask_lamp.png").unlink()
    Image.fromarray(np.zeros((H // 2, W), dtype=np.uint8)).save(masks / "002.png")
    with pytest.raises(UserError) as err:
        run(*args)
    assert (
        _line(err) == f"masks={masks}: 002.png is 48x16 but its image 002.png is 48x32; a mask must have its "
        "image's size"
    )
    assert not (tmp_path / "c").exists()


def test_instant_ngp_masks_beside_the_photos_are_found_and_are_not_photos(tmp_path: Path, run) -> None:
    names = _photos(tmp_path / "photos", 6)
    _write_model(tmp_path / "model", names, {1: ("OPENCV", OPENCV)}, [1] * 6, _points())
    moved = np.zeros((H, W), dtype=np.uint8)
    moved[:3, :5] = 255  # 15 pixels to ignore
    Image.fromarray(moved).save(tmp_path / "photos" / "dynamic_mask_002.png")
    summary = run(f"colmap={tmp_path / 'model'}", f"images={tmp_path / 'photos'}", f"out={tmp_path / 'c'}")
    assert summary["masks"] == 1 and summary["registered"] == 6
    assert sorted(p.name for p in (tmp_path / "c" / "images").iterdir()) == names
    assert [p.name for p in list_photos(tmp_path / "photos")] == names  # what a solve would be given
    written = np.asarray(Image.open(tmp_path / "c" / "masks" / "002.png"))
    assert int((written == 0).sum()) == 15 and int((written == 255).sum()) == H * W - 15
