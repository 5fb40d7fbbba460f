"""The process app stopped during the real structure from motion, and what a killed run leaves behind.

- SIGTERM while pycolmap extracts features: before, glog's handler (installed by ``import pycolmap``)
  printed COLMAP's native stack dump, killed the process with status 143 and left the hidden
  ``.<out>.tmp-*`` build folder. Now: one ``error:`` line, status 143, no build folder, no solver
  process left.
- Ctrl-C (SIGINT) at the same point: one line and status 130, no traceback.
- A build folder left by a run killed with SIGKILL is removed by the next run into the same ``out``;
  the build folder of a run that is still working is left alone.
"""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import signal
import sqlite3
import subprocess
import sys
import time
import types
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
from hydra.core.global_hydra import GlobalHydra
from PIL import Image
from runs import child_env
from test_process_app import _fake_sfm, _photos

import nerf_lightning.apps.process as app
from nerf_lightning.errors import EXIT_CTRL_C, EXIT_INTERRUPTED
from nerf_lightning.run.config import compose_app_config
from nerf_lightning.run.folder_lock import claim_folder


def _noise_photos(folder: Path, n: int = 24) -> Path:
    """Textured photos that keep the feature extraction busy for several seconds on two cores."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)).save(folder / f"{i:03d}.jpg")
    return folder


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status  # a zombie has ended


def _keypoint_rows(database: Path) -> int:
    """Images whose keypoints COLMAP has written to ``database`` so far (0 while it cannot be read: its
    tables not made yet, or busy)."""
    try:
        with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=0.1)) as con:
            return int(con.execute("SELECT COUNT(*) FROM keypoints").fetchone()[0])
    except sqlite3.Error:
        return 0


def _stop_during_features(tmp_path: Path, signum: int) -> tuple[int | None, str, list[int]]:
    """Start the app on the real solver, send ``signum`` once features are being extracted; (exit
    status, stderr, the solver processes that ran).

    A fresh interpreter, not a child forked from the test process: one that has imported pycolmap
    already carries the signal handler it installs, and would hide what the app does about it."""
    if importlib.util.find_spec("pycolmap") is None:
        pytest.skip("pycolmap is not installed: pip install 'nerf_lightning[process]'")
    photos = _noise_photos(tmp_path / "photos")
    err = tmp_path / "stderr.txt"
    argv = [f"images={photos}", f"out={tmp_path / 'cap'}", f"hydra.run.dir={tmp_path / 'run'}"]
    with err.open("wb") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nerf_lightning.process", *argv],
            cwd=tmp_path, env=child_env(), stdout=subprocess.DEVNULL, stderr=err_file,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        # inside the native extraction: the first image's keypoints are in, 23 more images to go
        while not any(_keypoint_rows(db) for db in tmp_path.glob(".cap.tmp-*/colmap/database.db")):
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()[-3000:]
            time.sleep(0.1)
        assert proc.poll() is None, err.read_text()[-3000:]
        solvers = _children(proc.pid)
        proc.send_signal(signum)
        code = proc.wait(60)
    finally:
        proc.kill()
        proc.wait()
    return code, err.read_text(), solvers


def _nothing_left(tmp_path: Path, solvers: list[int]) -> None:
    assert not (tmp_path / "cap").exists()
    assert not list(tmp_path.glob(".cap.*")), list(tmp_path.iterdir())
    # the solver and multiprocessing's resource tracker, which ends once its parent has gone
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in solvers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert solvers and not any(_alive(pid) for pid in solvers)


@pytest.mark.slow
def test_sigterm_during_the_native_solve_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    code, stderr, solvers = _stop_during_features(tmp_path, signal.SIGTERM)
    assert code == EXIT_INTERRUPTED, stderr[-3000:]
    assert stderr.strip().splitlines() == [
        "error: process stopped by SIGTERM before it finished; no partial output is left"
    ], stderr[-3000:]
    _nothing_left(tmp_path, solvers)


@pytest.mark.slow
def test_ctrl_c_during_the_native_solve_is_one_line_and_exit_130(tmp_path: Path) -> None:
    code, stderr, solvers = _stop_during_features(tmp_path, signal.SIGINT)
    assert code == EXIT_CTRL_C, stderr[-3000:]
    assert stderr.strip().splitlines() == [
        "error: process stopped by Ctrl-C before it finished; no partial output is left"
    ], stderr[-3000:]
    _nothing_left(tmp_path, solvers)


def _hold(folder: str, ready) -> None:  # noqa: ANN001 - a multiprocessing Event
    claim_folder(Path(folder))
    ready.set()
    time.sleep(300)


def _builder(folder: Path) -> mp.Process:
    """A process that holds ``folder`` as its build folder (as a running process app does)."""
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    proc = ctx.Process(target=_hold, args=(str(folder), ready), daemon=True)
    proc.start()
    assert ready.wait(30)
    return proc


def test_the_build_folder_of_a_killed_run_is_removed_by_the_next_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "cap"
    dead, live = tmp_path / ".cap.tmp-killed", tmp_path / ".cap.tmp-working"
    for folder in (dead, live):
        folder.mkdir()
        (folder / "images").mkdir()
        (folder / "images" / "000.jpg").write_bytes(b"\xff" * 1000)
    killed = _builder(dead)
    os.kill(killed.pid, signal.SIGKILL)  # as a run killed with SIGKILL: its folder stays
    killed.join()
    working = _builder(live)
    try:
        monkeypatch.setattr(app, "import_pycolmap", lambda: types.SimpleNamespace(__version__="fake"))
        monkeypatch.setattr(app, "run_sfm", _fake_sfm())
        photos = _photos(tmp_path / "photos", 4)
        try:
            app.process(compose_app_config("process", [f"images={photos}", f"out={out}"], tmp_path / "run"))
        finally:
            GlobalHydra.instance().clear()
        assert not dead.exists()  # the killed run's leftovers
        assert (live / "images" / "000.jpg").is_file()  # a live builder's folder is not touched
        assert (out / "transforms.json").is_file()
        assert not (out / ".lock").exists()  # the build's own lock is not part of the capture
        assert sorted(p.name for p in tmp_path.glob(".cap.*")) == [live.name]
    finally:
        working.kill()
        working.join()
