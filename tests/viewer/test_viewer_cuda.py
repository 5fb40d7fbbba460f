"""``train viewer=on`` on a GPU: the viewer renders between the graphed (CUDA-graph) training steps under
the run's precision, and the run ends as without it. GPU only: ``pytest -m cuda tests/viewer``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("viser")

import torch
from runs import fork_app

from nerf_lightning.viewer.client import HeadlessClient
from nerf_lightning.viewer.ports import next_free_port

from .conftest import stop, wait_for_line

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():  # pragma: no cover - CPU CI
    pytest.skip("needs an NVIDIA GPU", allow_module_level=True)


def test_viewer_renders_between_graphed_steps(tiny_scene: Path, tmp_path: Path) -> None:
    # the browser ends the run once 3 frames came: a fixed 1500 steps are about 5 s of training on an
    # H100, about 3 bursts at the 0.08 budget, and the viewer closed before the third complete frame
    port = next_free_port("127.0.0.1", 7700 + os.getpid() % 1000)
    log = tmp_path / "train.log"
    proc = fork_app(
        "train", f"data.path={tiny_scene}", "logger=csv", "callbacks.progress_bar=null",
        "trainer.max_steps=1000000",
        "trainer.check_val_every_n_epoch=100000", "viewer=on", f"viewer.port={port}", "viewer.max_size=128",
        "viewer.refresh_every_s=0.2", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, log=log,
    )  # fmt: skip
    try:
        url = wait_for_line(log, r"^viewer: (http://\S+)  \(training", proc, 300).group(1)
        client = HeadlessClient(url)
        c2w = np.array([[0, 0, 1, -1.0], [-1, 0, 0, 0.5], [0, -1, 0, 0.5], [0, 0, 0, 1]])
        client.send_camera(c2w, 0.8, 160, 120)
        first = client.wait_complete(0, timeout_s=120)
        assert first.image.shape == (96, 128, 3)
        # re-rendered as it trains: the weights change between the frames
        assert client.wait_for(lambda c: c.completed >= 3, 120), (
            client.completed,
            client.status,
            log.read_text()[-3000:],
        )
        assert np.abs(client.last_complete.image.astype(np.float32) - first.image).max() > 0
        client.click("Stop training")
        proc.join(300)
        client.close()
    finally:
        code = stop(proc)
    assert code == 0, log.read_text()[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    print("viewer cuda run:", {k: metrics[k] for k in ("steps", "time/train_s", "viewer/render_s",
                                                      "viewer/refill_s", "viewer/bursts")})  # fmt: skip
    assert 0 < metrics["steps"] < 1000000 and metrics["viewer/render_s"] > 0 and metrics["viewer/bursts"] > 0
    # within the budget: bursts and refills at most 0.08 / 1.08 of the run, plus one bank and one chunk
    charged = metrics["viewer/render_s"] + metrics["viewer/refill_s"]
    assert charged < 0.08 * metrics["time/train_s"] + 0.3, charged
