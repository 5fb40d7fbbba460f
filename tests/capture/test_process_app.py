"""The ``process`` app around the structure from motion: what it writes, and every bad input.

Most tests stand a fake in for ``run_sfm`` (cameras on a ring, in an arbitrary world, as COLMAP
would return them), so that they run in a moment and without pycolmap; one runs the real solver on
photos that cannot be matched. Every bad input ends in one ``error: ...`` line and leaves ``out``
as it was, with no temporary folder beside it.
"""

from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from hydra.core.global_hydra import GlobalHydra
from PIL import Image
from rings import colmap_ring
from runs import fork_app

import nerf_lightning.apps.process as app
from nerf_lightning.capture.sfm import Camera, SfmResult
from nerf_lightning.data.formats import load_capture
from nerf_lightning.data.types import Intrinsics
from nerf_lightning.errors import EXIT_USER_ERROR, UserError
from nerf_lightning.run.config import compose_app_config


def _photos(folder: Path, n: int, size: tuple[int, int] = (48, 32)) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(n)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(
            folder / f"{i:03d}.jpg"
        )
    return folder


#: the world of the fake solves, turned against the capture's axes
TURN = np.array([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])


def _ring_colmap(n: int) -> list[np.ndarray]:
    """COLMAP-style camera-to-world (OpenCV axes) on a ring looking at a point, in a turned world."""
    return colmap_ring(n, TURN)


def _fake_sfm(unregistered: tuple[str, ...] = (), error: Exception | None = None, calls: list | None = None):
    def run_sfm(image_dir, names, work_dir, options, on_progress=None):
        if calls is not None:
            calls.append(options)
        if error is not None:
            raise error
        for stage in ("features", "matching", "mapping"):
            on_progress(stage, 1, 1)
        (Path(work_dir) / "sparse/0").mkdir(parents=True)
        (Path(work_dir) / "database.db").write_bytes(b"SQLite")
        w, h = Image.open(Path(image_dir) / names[0]).size
        kept = [n for n in names if n not in unregistered]
        poses = dict(zip(kept, _ring_colmap(len(kept)), strict=True))
        points = np.random.default_rng(0).normal(0.0, 0.5, (200, 3))
        return SfmResult(
            camera=Camera(
                "OPENCV",
                Intrinsics(
                    fx=40.0,
                    fy=41.0,
                    cx=w / 2,
                    cy=h / 2,
                    width=w,
                    height=h,
                    k1=0.01,
                    k2=-0.02,
                    p1=0.003,
                    p2=0.004,
                    model="opencv",
                ),
            ),  # fmt: skip
            cam_to_world=poses,
            points=points,
            mean_reprojection_error=0.5,
            registered=kept,
            unregistered=[n for n in names if n in unregistered],
            model_sizes=[len(kept)],
            seconds={"features": 1.0, "matching": 2.0, "mapping": 3.0},
        )

    return run_sfm


@pytest.fixture
def run(run, monkeypatch: pytest.MonkeyPatch):
    """The shared ``run`` (conftest.py) with a stand-in for pycolmap's import: the fake solvers need none."""
    monkeypatch.setattr(app, "import_pycolmap", lambda: types.SimpleNamespace(__version__="fake"))
    return run


def _nothing_written(out: Path) -> None:
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}.*")), list(out.parent.iterdir())


def test_a_solve_becomes_a_capture_with_its_summary(tmp_path: Path, run, capsys) -> None:
    photos = _photos(tmp_path / "photos", 6)
    out = tmp_path / "capture"
    calls: list = []
    summary = run(f"images={photos}", f"out={out}", sfm=_fake_sfm(unregistered=("004.jpg",), calls=calls))
    assert calls[0].matcher == "exhaustive" and calls[0].camera_model == "OPENCV"  # the defaults

    assert summary["registered"] == 5 and summary["images"] == 6
    assert summary["unregistered_images"] == ["004.jpg"]
    doc = json.loads((out / "transforms.json").read_text())
    assert [f["file_path"] for f in doc["frames"]] == [f"images/00{i}.jpg" for i in (0, 1, 2, 3, 5)]
    assert [doc[k] for k in ("fl_x", "fl_y", "cx", "cy", "w", "h")] == [40.0, 41.0, 24.0, 16.0, 48, 32]
    assert [doc[k] for k in ("k1", "k2", "p1", "p2")] == [0.01, -0.02, 0.003, 0.004]
    assert doc["camera_angle_x"] == pytest.approx(2 * math.atan(48 / 80))
    assert sorted(p.name for p in (out / "images").iterdir()) == [f"00{i}.jpg" for i in range(6)]
    assert not (out / "colmap/database.db").exists() and (out / "colmap/sparse/0").is_dir()
    assert json.loads((out / "process.json").read_text())["registered"] == 5
    capture = load_capture(out)
    assert len(capture.train) + len(capture.val) == 5
    assert not list(tmp_path.glob(".capture.*"))  # no temporary folder left next to out

    printed = capsys.readouterr()
    assert "registered 5 of 6 images" in printed.out
    assert "mean reprojection error 0.500 px over 200 sparse points" in printed.out
    assert f"aabb_scale {summary['aabb_scale']}" in printed.out
    assert "cameras 4.00-4.00 from the scene centre" in printed.out
    assert f"next: python -m nerf_lightning.train data.path={out}" in printed.out
    warning = [line for line in printed.err.splitlines() if line.startswith("warning:")]
    assert warning == ["warning: 1 of 6 images did not register and are not in transforms.json: 004.jpg"]


def test_overwrite_replaces_a_capture_only_once_the_new_one_is_complete(tmp_path: Path, run) -> None:
    photos = _photos(tmp_path / "photos", 4)
    out = tmp_path / "capture"
    out.mkdir()
    (out / "old.txt").write_text("keep me")
    calls: list = []
    with pytest.raises(UserError, match=r"out=.*capture: exists and is not empty; .* overwrite=true"):
        run(f"images={photos}", f"out={out}", sfm=_fake_sfm(calls=calls))
    assert calls == []  # refused before any work
    with pytest.raises(RuntimeError, match="solver crashed"):
        run(
            f"images={photos}",
            f"out={out}",
            "overwrite=true",
            sfm=_fake_sfm(error=RuntimeError("solver crashed")),
        )
    assert [p.name for p in out.iterdir()] == ["old.txt"]  # a failed run leaves the old capture
    assert not list(tmp_path.glob(".capture.*"))
    run(f"images={photos}", f"out={out}", "overwrite=true", "keep_database=true", sfm=_fake_sfm())
    assert not (out / "old.txt").exists() and (out / "transforms.json").is_file()
    assert (out / "colmap/database.db").is_file()
    assert not list(tmp_path.glob(".capture.*"))
    # an empty folder is no obstacle
    empty = tmp_path / "empty"
    empty.mkdir()
    run(f"images={photos}", f"out={empty}", sfm=_fake_sfm())
    assert (empty / "transforms.json").is_file()


def test_a_video_is_matched_sequentially(tmp_path: Path, run) -> None:
    from walk import encode_clip

    rng = np.random.default_rng(0)
    frames = [
        np.repeat(np.repeat(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), 4, 0), 4, 1) for _ in range(8)
    ]
    encode_clip(frames, tmp_path / "clip.mp4", fps=8)
    calls: list = []
    summary = run(f"video={tmp_path / 'clip.mp4'}", f"out={tmp_path / 'cap'}", "num_frames=4",
                  sfm=_fake_sfm(calls=calls))  # fmt: skip
    assert calls[0].matcher == "sequential"
    assert summary["source"]["frames_in_clip"] == 8 and len(summary["source"]["kept_frame_indices"]) == 4
    assert sorted(p.name for p in (tmp_path / "cap/images").iterdir()) == [
        f"frame_0000{i}.jpg" for i in range(1, 5)
    ]


def _cases(tmp: Path) -> dict[str, tuple[list[str], str, object]]:
    """name -> (overrides, expected message pattern, fake solver or None)."""
    empty = tmp / "empty"
    empty.mkdir()
    garbage = tmp / "clip.mp4"
    garbage.write_bytes(b"\x00\x01 not a video" * 64)
    two = _photos(tmp / "two", 2)
    six = _photos(tmp / "six", 6)
    out = tmp / "capture"
    one_of_six = _fake_sfm(unregistered=("001.jpg", "002.jpg", "003.jpg", "004.jpg", "005.jpg"))
    return {
        "no images": ([f"images={empty}", f"out={out}"], r"images=.*empty: no photos", None),
        "no such folder": ([f"images={tmp / 'nope'}", f"out={out}"], r"images=.*nope: no such folder", None),
        "unreadable video": (
            [f"video={garbage}", f"out={out}"],
            r"video=.*clip\.mp4: cannot read it as a video",
            None,
        ),
        "no such video": (
            [f"video={tmp / 'gone.mp4'}", f"out={out}"],
            r"video=.*gone\.mp4: no such file",
            None,
        ),
        "fewer than 3 images": ([f"images={two}", f"out={out}"], r"2 photo\(s\); .* at least 3", None),
        "too few registered": (
            [f"images={six}", f"out={out}"],
            r"only 1 of 6 images registered \(min_registered=0\.5, at least 3\): "
            r"take photos with more overlap",
            one_of_six,
        ),
        "too few registered, sequential": (
            [f"images={six}", f"out={out}", "matcher=sequential"],
            r"only 1 of 6 images registered .*: try matcher=exhaustive",
            one_of_six,
        ),
        "neither source": ([f"out={out}"], r"neither of images= and video= given", None),
        "both sources": (
            [f"images={six}", f"video={garbage}", f"out={out}"],
            r"both of images= and video=",
            None,
        ),
        "out holds the input": ([f"images={six}", f"out={tmp}"], r"out=.*: holds the input", None),
        "out is a file": ([f"images={six}", f"out={garbage}"], r"out=.*clip\.mp4: is a file", None),
        "bad matcher": (
            [f"images={six}", f"out={out}", "matcher=vocab"],
            r"matcher=vocab: expected auto",
            None,
        ),
        "bad camera model": (
            [f"images={six}", f"out={out}", "camera_model=FISHEYE"],
            r"camera_model='FISHEYE'",
            None,
        ),
        "bad aabb_scale": (
            [f"images={six}", f"out={out}", "aabb_scale=3"],
            r"aabb_scale=3: expected auto or",
            None,
        ),
    }


CASES = [
    "no images", "no such folder", "unreadable video", "no such video", "fewer than 3 images",
    "too few registered", "too few registered, sequential", "neither source", "both sources",
    "out holds the input", "out is a file", "bad matcher", "bad camera model", "bad aabb_scale",
]  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_clear_error_and_writes_nothing(case: str, tmp_path: Path, run) -> None:
    overrides, pattern, sfm = _cases(tmp_path)[case]
    with pytest.raises(UserError, match=pattern):
        run(*overrides, sfm=sfm or _fake_sfm())
    if case not in ("out holds the input", "out is a file"):
        _nothing_written(tmp_path / "capture")
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_without_pycolmap_the_error_says_how_to_install_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pycolmap", None)  # `import pycolmap` raises ImportError
    photos = _photos(tmp_path / "photos", 3)
    try:
        cfg = compose_app_config("process", [f"images={photos}", f"out={tmp_path / 'cap'}"], tmp_path / "run")
        with pytest.raises(
            UserError,
            match=r"needs pycolmap, which is not installed: pip install 'nerf_lightning\[process\]'",
        ):
            app.process(cfg)
    finally:
        GlobalHydra.instance().clear()
    _nothing_written(tmp_path / "cap")


def test_photos_that_do_not_match_fail_with_advice_from_the_real_solver(tmp_path: Path) -> None:
    pytest.importorskip("pycolmap", reason="pycolmap is not installed: pip install 'nerf_lightning[process]'")
    photos = _photos(tmp_path / "noise", 4, size=(96, 96))  # independent noise: nothing in common
    out = tmp_path / "capture"
    try:
        cfg = compose_app_config("process", [f"images={photos}", f"out={out}"], tmp_path / "run")
        with pytest.raises(
            UserError, match=r"no reconstruction: none of the 4 images|only \d of 4 images registered"
        ):
            app.process(cfg)
    finally:
        GlobalHydra.instance().clear()
    _nothing_written(out)


def test_the_entry_point_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    log, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    argv = [f"images={empty}", f"out={tmp_path / 'cap'}", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = fork_app("process", *argv, cwd=tmp_path, log=log, err_log=err)
    proc.join(60)
    assert proc.exitcode == EXIT_USER_ERROR
    lines = err.read_text().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: images=") and "no photos" in lines[0], lines
    assert "error: images=" in (tmp_path / "run/process.log").read_text()
    _nothing_written(tmp_path / "cap")


def test_sigterm_during_the_solve_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import signal
    import time

    photos = _photos(tmp_path / "photos", 3)
    started = tmp_path / "started"

    def slow_sfm(image_dir, names, work_dir, options, on_progress=None):
        started.write_text("solving")
        time.sleep(60)

    # the forked child inherits the patched module: its solve blocks until the signal comes
    monkeypatch.setattr(app, "run_sfm", slow_sfm)
    monkeypatch.setattr(app, "import_pycolmap", lambda: types.SimpleNamespace(__version__="fake"))
    log, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    argv = [f"images={photos}", f"out={tmp_path / 'cap'}", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = fork_app("process", *argv, cwd=tmp_path, log=log, err_log=err)
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert started.exists(), err.read_text()
    assert list(tmp_path.glob(".cap.tmp-*")), "the capture is being built next to out"
    os.kill(proc.pid, signal.SIGTERM)
    proc.join(30)
    assert proc.exitcode == 143, err.read_text()
    assert "stopped by SIGTERM" in err.read_text()
    _nothing_written(tmp_path / "cap")


def test_a_full_disk_names_the_file_written_into_out(tmp_path: Path, run, monkeypatch) -> None:
    """shutil's copy names its source first: the photo read, not the file that found no space."""
    import errno
    import shutil

    import nerf_lightning.capture.photos as photos_module

    photos, out = _photos(tmp_path / "photos", 4), tmp_path / "capture"
    real_copy = shutil.copyfile

    def copy_onto_a_full_disk(src, dst, *args, **kwargs):
        if Path(src).name == "002.jpg":
            raise OSError(errno.ENOSPC, "No space left on device", str(src), None, str(dst))
        return real_copy(src, dst, *args, **kwargs)

    monkeypatch.setattr(photos_module.shutil, "copyfile", copy_onto_a_full_disk)
    with pytest.raises(UserError) as err:
        run(f"images={photos}", f"out={out}", sfm=_fake_sfm())
    assert str(err.value) == (
        f"{out / 'images' / '002.jpg'}: no space left on device; free space there or write elsewhere "
        "(out=...)"
    )
    _nothing_written(out)


@pytest.mark.parametrize("where", ["through a file", "read-only"])
def test_an_out_that_cannot_be_written_is_named_before_any_work(where: str, tmp_path: Path, run) -> None:
    import os

    if where == "read-only" and os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder")
    photos, parent = _photos(tmp_path / "photos", 3), tmp_path / "parent"
    if where == "through a file":
        parent.write_text("a file")
    else:
        parent.mkdir(mode=0o555)
    out = parent / "capture"
    try:
        with pytest.raises(UserError) as err:
            run(f"images={photos}", f"out={out}", sfm=_fake_sfm())
    finally:
        if parent.is_dir():
            parent.chmod(0o755)
    cause = "not a directory" if where == "through a file" else "permission denied"
    advice = "choose a folder you can write (out=...)"
    assert str(err.value) == f"out={out}: cannot write there ({cause}); {advice}"
    assert not out.exists() and ".tmp-" not in str(err.value)
