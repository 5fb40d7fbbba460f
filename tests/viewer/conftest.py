"""The viewer's tests: a `view` process on the shared short training, and helpers to talk to it.

Importable without viser (the viewer's package): the modules that need it skip at their top, the
fixtures below when they are asked for."""

from __future__ import annotations

import math
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch
from runs import fork_app

from nerf_lightning.run.restore import load_run
from nerf_lightning.video.camera_paths import camera_rays
from nerf_lightning.viewer.ports import next_free_port

if TYPE_CHECKING:
    from nerf_lightning.viewer.browser_camera import ViewCamera

#: the `view` process's frame sizes: small, for a CPU under load
MAX_SIZE, PREVIEW_SIZE = 48, 16


def wait_for_line(log: Path, pattern: str, proc, timeout_s: float) -> re.Match[str]:  # noqa: ANN001
    """The first line of ``log`` matching ``pattern``; fails when the process ends or time runs out."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        text = log.read_text() if log.exists() else ""
        if m := re.search(pattern, text, re.MULTILINE):
            return m
        if not proc.is_alive():
            pytest.fail(f"the process ended (exit {proc.exitcode}) before {pattern!r}:\n{text[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"no {pattern!r} within {timeout_s} s:\n{(log.read_text() if log.exists() else '')[-3000:]}")


def stop(proc, timeout_s: float = 20.0) -> int | None:  # noqa: ANN001
    """Ctrl-C, as a user stops the viewer; its stacks into its log, then SIGKILL, when it does not end in
    time."""
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGINT)
        proc.join(timeout_s)
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGUSR1)  # its stacks into its log (tests/runs.py: _fork_main)
        proc.join(2)
        proc.kill()
        proc.join(5)
    return proc.exitcode


class Scene:
    """The trained run's model and cameras, to render the frames the viewer should show."""

    def __init__(self, run_dir: Path) -> None:
        from nerf_lightning.viewer.scene import SceneInfo

        run = load_run(run_dir)
        self.capture = run.load_capture()
        self.info = SceneInfo.of(self.capture)
        self.model = run.build_model()
        self.background = torch.tensor(self.capture.eval_background, dtype=torch.float32)

    def view(self, i: int, canvas: tuple[int, int]) -> ViewCamera:
        """Training view ``i`` seen through a browser canvas of ``canvas`` (width, height) pixels."""
        from nerf_lightning.viewer.browser_camera import ViewCamera

        w, h = canvas
        return ViewCamera(self.info.poses[i], float(self.info.fov_y[i]), w / h, max(w, h))

    def render(self, cam: ViewCamera, side: int) -> dict[str, np.ndarray]:
        """What the model renders from ``cam`` at ``side`` px: rgb uint8 [H, W, 3], opacity [H, W]."""
        pinhole = cam.at(side)
        o, d = camera_rays(pinhole, torch.device("cpu"))
        with torch.no_grad():
            out = self.model.renderer.render_image(self.model.field, o, d, self.background)
        h, w = pinhole.height, pinhole.width
        rgb = (out["rgb"].reshape(h, w, 3).clamp(0, 1).numpy() * 255).round().astype(np.uint8)
        return {"rgb": rgb, "opacity": out["opacity"].reshape(h, w).numpy()}


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean()) / 255.0**2
    return -10.0 * math.log10(max(mse, 1e-12))


@pytest.fixture(scope="module")
def scene(trained_run) -> Scene:  # noqa: ANN001
    pytest.importorskip("viser")
    return Scene(trained_run[0])


@pytest.fixture(scope="module")
def viewer(trained_run, tmp_path_factory) -> Iterator[dict]:  # noqa: ANN001
    """A ``python -m nerf_lightning.view`` process on the shared run: its URL, folder, log and process.
    It listens on every interface (``host=0.0.0.0``): its printed URL carries the token it requires."""
    pytest.importorskip("viser")
    run_dir, _ = trained_run
    out = tmp_path_factory.mktemp("view")
    port = next_free_port("0.0.0.0", 7300 + os.getpid() % 1000)
    log = out / "view.log"
    proc = fork_app(
        "view", f"ckpt={run_dir}", "host=0.0.0.0", f"port={port}", f"max_size={MAX_SIZE}",
        f"preview_size={PREVIEW_SIZE}", f"hydra.run.dir={out}", cwd=out, log=log,
    )  # fmt: skip
    try:
        url = wait_for_line(log, r"^viewer: (http://\S+)", proc, 120).group(1)
        yield {"url": url, "port": port, "dir": out, "log": log, "proc": proc}
    finally:
        code = stop(proc)
    assert code == 0, log.read_text()[-2000:]
