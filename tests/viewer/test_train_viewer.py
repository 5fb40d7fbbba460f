"""``train viewer=on``: the live viewer renders between steps, pauses and stops the optimizer loop, survives
a browser that goes away; ``viewer=off`` (the default) imports nothing of viser."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("viser")

from runs import TINY_TRAIN, child_env, fork_app
from websockets.exceptions import InvalidStatus

from nerf_lightning.viewer.client import HeadlessClient
from nerf_lightning.viewer.ports import next_free_port

from .conftest import stop, wait_for_line

pytestmark = pytest.mark.slow

#: from x = -1 towards the unit cube, image up = +z: the scene's objects are in view
FRONT = np.array([[0, 0, 1, -1.0], [-1, 0, 0, 0.5], [0, -1, 0, 0.5], [0, 0, 0, 1]])
_STEP = r"\*\*(training|paused|stopping|finished)\*\* · step ([\d,]+)"


def _panel(client: HeadlessClient) -> tuple[str, int] | None:
    m = client.find_markdown(_STEP)
    return None if m is None else (m.group(1), int(m.group(2).replace(",", "")))


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _train_with_viewer(tiny_scene: Path, tmp_path: Path):  # noqa: ANN202 - (process, log, url)
    """A long training with ``viewer=on`` in a forked process, once its viewer listens."""
    port = next_free_port("127.0.0.1", 7600 + os.getpid() % 1000)
    log = tmp_path / "train.log"
    proc = fork_app(
        "train", f"data.path={tiny_scene}", *TINY_TRAIN, "trainer.max_steps=100000", "viewer=on",
        f"viewer.port={port}", "viewer.max_size=24", "viewer.preview_size=8", "viewer.refresh_every_s=0.5",
        "viewer.token=my-token", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, log=log,
    )  # fmt: skip
    try:
        url = wait_for_line(log, r"^viewer: (http://\S+)  \(training", proc, 180).group(1)
    except BaseException:
        stop(proc)
        raise
    assert url == f"http://localhost:{port}/?token=my-token"  # a token set, on the loopback too
    return proc, log, url


def _paused_at(client: HeadlessClient, proc, log: Path) -> int:  # noqa: ANN001
    """Pause from the page; the step the loop paused at (its log line), once the panel shows it."""
    client.click("Pause training")
    step = int(wait_for_line(log, r"viewer: training paused at step (\d+)", proc, 60).group(1))
    assert client.wait_for(lambda c: _panel(c) == ("paused", step), 60), _panel(client)
    return step


def test_pause_resume_stop_while_training(tiny_scene: Path, tmp_path: Path) -> None:
    proc, log, url = _train_with_viewer(tiny_scene, tmp_path)
    try:
        client = HeadlessClient(url)
        # from x = -1 towards the unit cube, image up = +z: the scene's objects are in view
        c2w = np.array([[0, 0, 1, -1.0], [-1, 0, 0, 0.5], [0, -1, 0, 0.5], [0, 0, 0, 1]])
        moved = c2w.copy()
        moved[1, 3] += 0.05
        client.send_camera(c2w, 0.8, 32, 24)
        assert client.wait_complete(0, timeout_s=120).image.shape == (18, 24, 3)
        # training goes on, the view is rendered again as the weights change
        assert client.wait_for(lambda c: c.completed >= 2, 120), client.status
        assert client.wait_for(lambda c: (_panel(c) or ("", 0))[1] > 0, 60)

        paused_at = _paused_at(client, proc, log)
        # the viewer still renders while paused, and the optimizer loop does not move meanwhile
        done = client.completed
        client.send_camera(moved, 0.8, 32, 24)
        client.wait_complete(done, timeout_s=120)
        assert _panel(client) == ("paused", paused_at)
        assert "training resumed" not in log.read_text()

        client.click("Resume training")
        assert client.wait_for(lambda c: (_panel(c) or ("", 0))[1] > paused_at, 60)
        left_at = _panel(client)[1]
        client._ws.close()  # the browser goes away without a goodbye: training carries on

        again = HeadlessClient(url)
        again.send_camera(c2w, 0.8, 32, 24)
        again.wait_complete(0, timeout_s=120)
        # the statistics are read inside the render bursts of an open page: the step moved on
        assert again.wait_for(lambda c: (_panel(c) or ("", 0))[1] > left_at, 60), (_panel(again), left_at)
        again.click("Stop training")
        proc.join(180)
        again.close()
    finally:
        code = stop(proc)
    assert code == 0, log.read_text()[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert paused_at < metrics["steps"] < 100000 and "val/psnr" in metrics
    assert metrics["viewer/paused_s"] > 0 and metrics["viewer/render_s"] > 0
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.timing
def test_a_paused_run_waits_without_a_busy_loop(tiny_scene: Path, tmp_path: Path) -> None:
    """While paused, the training process waits on an event: under 0.3 CPU s in 3 s of pause. It measures
    the process's CPU over a fixed window: meaningful on an idle machine (``make test-timing``)."""
    proc, log, url = _train_with_viewer(tiny_scene, tmp_path)
    try:
        client = HeadlessClient(url)
        # a page that shows a view (its controls all arrived), as a user pauses
        client.send_camera(FRONT, 0.8, 32, 24)
        client.wait_complete(0, timeout_s=120)
        paused_at = _paused_at(client, proc, log)
        cpu0 = _cpu_seconds(proc.pid)
        time.sleep(3.0)  # the window measured
        cpu_paused = _cpu_seconds(proc.pid) - cpu0
        assert _panel(client) == ("paused", paused_at)
        assert cpu_paused < 0.3, f"{cpu_paused:.2f} CPU s in 3 s of pause: a busy loop?"
        client.click("Stop training")
        proc.join(180)
        client.close()
    finally:
        code = stop(proc)
    assert code == 0, log.read_text()[-3000:]


def test_sigterm_while_paused_stops_the_run_with_143(tiny_scene: Path, tmp_path: Path) -> None:
    """A paused run still honours SIGTERM (a scheduler's stop): exit 143 and a last.ckpt of that step.
    It listens on every interface: the printed URL carries a token generated for it."""
    import signal

    port = next_free_port("0.0.0.0", 7650 + os.getpid() % 1000)
    log = tmp_path / "train.log"
    proc = fork_app(
        "train", f"data.path={tiny_scene}", *TINY_TRAIN, "trainer.max_steps=100000", "viewer=on",
        "viewer.host=0.0.0.0", f"viewer.port={port}", "viewer.max_size=16", "viewer.preview_size=8",
        f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, log=log,
    )  # fmt: skip
    try:
        url = wait_for_line(log, r"^viewer: (http://\S+)  \(training", proc, 180).group(1)
        assert re.fullmatch(rf"http://localhost:{port}/\?token=[A-Za-z0-9_-]{{32}}", url), url
        with pytest.raises(InvalidStatus):  # without it: refused
            HeadlessClient(f"http://localhost:{port}", timeout_s=10)
        client = HeadlessClient(url)
        client.send_camera(
            np.array([[0, 0, 1, -1.0], [-1, 0, 0, 0.5], [0, -1, 0, 0.5], [0, 0, 0, 1]]), 0.8, 16, 12
        )
        client.click("Pause training")
        assert client.wait_for(lambda c: (_panel(c) or ("",))[0] == "paused", 60)
        os.kill(proc.pid, signal.SIGTERM)
        proc.join(120)
        client.close()
    finally:
        code = stop(proc)
    assert code == 143, log.read_text()[-3000:]
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()


def test_viewer_off_imports_no_viser(tiny_scene: Path, tmp_path: Path) -> None:
    """The default run (viewer=off) in a fresh interpreter: viser never imported."""
    script = (
        "import sys, runpy\n"
        "sys.argv = ['nerf_lightning.train', *sys.argv[1:]]\n"
        "from nerf_lightning.train import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "print('viser imported:', any(m == 'viser' or m.startswith('viser.') for m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, f"data.path={tiny_scene}", *TINY_TRAIN, "trainer.max_steps=4",
         "trainer.check_val_every_n_epoch=1000", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"^viser imported: False$", out.stdout, re.MULTILINE), out.stdout[-2000:]
