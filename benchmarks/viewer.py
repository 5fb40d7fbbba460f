"""The viewer's speed: frames/s it serves, and what it costs a training run, without a browser.

    python -m benchmarks.viewer [--sizes 800,256] [--frames 20] [--out DIR] -- TRAIN OVERRIDES
    python -m benchmarks.viewer --ckpt RUN [--sizes 800,256] [--frames 20]

With training overrides (e.g. ``experiment=blender data.path=.devdata/lego``), in one script:

1. ``train`` with ``viewer=off``: the baseline;
2. the same run with ``viewer=on`` and one client connected that moves its camera every
   ``--move-every-s`` from the first step it sees to the end of the run (an orbit of the largest
   ``--sizes`` canvas: the viewer always has a preview or a refinement to render);
3. the trained run's checkpoint in ``python -m nerf_lightning.view``: for each size S of ``--sizes``,
   ``--frames`` camera moves on an SxS canvas, each waited for until its full-resolution frame is
   complete (the preview first when S is above the preview size): frames/s end to end (camera sent
   -> complete frame decoded) and the server's own render time per frame.

The training throughput of 1 and 2 is compared over the same optimizer steps, those while the client
was orbiting (from the first throughput window after the first step the client saw in the training
panel to the end): steps/s = 1000 / mean ``perf/step_time_ms`` of the throughput monitor's windows
(``csv/metrics.csv``, validation excluded), so that the start of the run (compilation, the graph
capture, the viewer starting, the client connecting) is in neither. The table's row gives both, their
ratio and the throughput lost against the issue's target (at most 10 %), with the viewer's own
account beside it (its bursts and refills from ``metrics.json``, as a share of the training time).

The client is ``viewer/client.py``: viser's websocket protocol, the path a browser's page takes.
``--ckpt`` runs step 3 alone. Prints a table and writes ``viewer_bench.json`` into ``--out``. Runs on
the CPU too, at small sizes (``--sizes 64,16 -- experiment=cpu trainer.max_steps=200``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from websockets.exceptions import ConnectionClosed

from benchmarks.readers import csv_points
from nerf_lightning.video.camera_paths import look_at
from nerf_lightning.viewer.client import HeadlessClient
from nerf_lightning.viewer.ports import next_free_port

_URL = re.compile(r"^viewer: (http://\S+)", re.MULTILINE)
_RENDER_S = re.compile(r"^frame \d+ · (\d+)x(\d+) · ([\d.]+) s")
_PANEL_STEP = r"\*\*training\*\* · step ([\d,]+)"
#: the issue's target: throughput lost with one browser open
TARGET_LOST = 0.10


def _start(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)


def _wait_url(proc: subprocess.Popen, log: Path, timeout_s: float) -> str:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if m := _URL.search(log.read_text()):
            return m.group(1)
        if proc.poll() is not None:
            raise RuntimeError(f"{log}: the process ended (exit {proc.returncode}) before the viewer started")
        time.sleep(0.2)
    raise RuntimeError(f"{log}: no viewer URL within {timeout_s} s")


class Orbit:
    """Cameras on a circle around where the viewer opened (its initial look-at point, around its up)."""

    def __init__(self, client: HeadlessClient, timeout_s: float = 30.0) -> None:
        keys = ("position", "look_at", "fov", "up")
        if not client.wait_for(lambda c: all(k in c.camera_set for k in keys), timeout_s):
            raise RuntimeError(f"the viewer sent no initial camera (got {sorted(client.camera_set)})")
        self.centre = client.camera_set["look_at"]
        self.up = client.camera_set["up"] / np.linalg.norm(client.camera_set["up"])
        self.offset = client.camera_set["position"] - self.centre
        self.fov = float(client.camera_set["fov"])

    def camera(self, degrees: float) -> np.ndarray:
        """The initial camera turned by ``degrees`` around the up axis through the look-at point."""
        a = math.radians(degrees)
        u = self.up
        rot = (
            math.cos(a) * np.eye(3)
            + math.sin(a) * np.cross(np.eye(3), u)
            + (1 - math.cos(a)) * np.outer(u, u)
        )
        return look_at(self.centre + rot @ self.offset, self.centre, u)


def measure_fps(url: str, sizes: list[int], frames: int, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """Frames/s of complete frames at each canvas size (see the module docstring, step 3)."""
    client = HeadlessClient(url)
    rows = []
    try:
        orbit = Orbit(client)
        angle = 0.0
        for size in sizes:
            client.send_camera(orbit.camera(angle), orbit.fov, size, size)  # warm-up (allocations, JIT)
            client.wait_complete(client.completed, timeout_s)
            render_s, start = [], time.perf_counter()
            for _ in range(frames):
                angle += 3.0
                done = client.completed
                client.send_camera(orbit.camera(angle), orbit.fov, size, size)
                frame = client.wait_complete(done, timeout_s)
                if m := _RENDER_S.match(client.status):
                    render_s.append(float(m.group(3)))
            total = time.perf_counter() - start
            h, w = frame.image.shape[:2]
            rows.append(
                {
                    "canvas": size,
                    "frame": f"{w}x{h}",
                    "frames": frames,
                    "fps": frames / total,
                    "render_ms": 1e3 * float(np.mean(render_s)) if render_s else float("nan"),
                }
            )
    finally:
        client.close()
    return rows


def _metrics(run_dir: Path) -> dict[str, Any]:
    m = json.loads((run_dir / "metrics.json").read_text())
    m["steps_per_s"] = m["steps"] / m["time/train_s"] if m.get("time/train_s") else float("nan")
    return m


def step_times(run_dir: Path) -> dict[int, float]:
    """The throughput monitor's windows of a run: {optimizer step at the window's end: ms per step}."""
    path = run_dir / "csv" / "metrics.csv"
    if not path.is_file():
        raise RuntimeError(f"{path}: missing (the benchmark needs logger=csv)")
    return dict(csv_points(path, "perf/step_time_ms"))


def compare_windows(off: dict[int, float], on: dict[int, float], after_step: int) -> dict[str, Any]:
    """steps/s of both runs over the windows that end after ``after_step`` in both (1000 / mean ms)."""
    steps = sorted(k for k in on.keys() & off.keys() if k > after_step)
    if len(steps) < 3:
        raise RuntimeError(
            f"only {len(steps)} throughput windows after step {after_step} in both runs: train longer "
            "(trainer.max_steps) or log more often (trainer.log_every_n_steps)"
        )
    off_rate = 1e3 / float(np.mean([off[k] for k in steps]))
    on_rate = 1e3 / float(np.mean([on[k] for k in steps]))
    return {
        "from_step": steps[0],
        "to_step": steps[-1],
        "windows": len(steps),
        "off_steps_per_s": off_rate,
        "on_steps_per_s": on_rate,
        "ratio": on_rate / off_rate,
        "lost": 1.0 - on_rate / off_rate,
    }


def _panel_step(client: HeadlessClient) -> int | None:
    m = client.find_markdown(_PANEL_STEP)
    return None if m is None else int(m.group(1).replace(",", ""))


def train_runs(
    overrides: list[str], out: Path, env: dict[str, str], move_every_s: float, canvas: int
) -> dict:
    """Steps 1 and 2 of the module docstring; returns both runs' numbers and their comparison."""
    # overwrite=true: a second benchmark into the same --out replaces its runs
    common = [sys.executable, "-m", "nerf_lightning.train", *overrides, "logger=csv", "overwrite=true"]
    result: dict[str, Any] = {}
    off = out / "train_viewer_off"
    proc = _start([*common, "viewer=off", f"hydra.run.dir={off}"], out / "train_viewer_off.log", env)
    if proc.wait() != 0:
        raise RuntimeError(f"{out / 'train_viewer_off.log'}: the viewer=off run failed")
    result["off"] = _metrics(off)

    on = out / "train_viewer_on"
    port = next_free_port("127.0.0.1", 7007)
    log = out / "train_viewer_on.log"
    proc = _start([*common, "viewer=on", f"viewer.port={port}", f"hydra.run.dir={on}"], log, env)
    client = HeadlessClient(_wait_url(proc, log, 600))
    moves, first_step, start = 0, None, time.perf_counter()
    try:
        orbit = Orbit(client)
        while proc.poll() is None and not client.closed:
            try:
                client.send_camera(orbit.camera(2.0 * moves), orbit.fov, canvas, canvas)
            except ConnectionClosed:  # training ended: the viewer closed with it
                break
            moves += 1
            if first_step is None and (step := _panel_step(client)):
                first_step = step
            time.sleep(move_every_s)
    finally:
        seconds = time.perf_counter() - start
        received, completed = len(client.frames), client.completed
        client.close()
    if proc.wait() != 0:
        raise RuntimeError(f"{log}: the viewer=on run failed")
    if first_step is None:
        raise RuntimeError(f"{log}: the client never saw a training step in the panel")
    result["on"] = _metrics(on)
    result["on"].update(
        camera_moves=moves, frames_received=received, frames_completed=completed,
        frames_per_s=received / seconds, orbit_from_step=first_step,
    )  # fmt: skip
    result["window"] = compare_windows(step_times(off), step_times(on), first_step)
    result["ckpt"] = str(on)
    return result


def throughput_row(train: dict[str, Any], canvas: int) -> list[str]:
    """The training throughput with one client orbiting against viewer=off: a header and one row."""
    w, on = train["window"], train["on"]
    train_s = on.get("time/train_s") or float("nan")
    render, refill = on.get("viewer/render_s", float("nan")), on.get("viewer/refill_s", float("nan"))
    account = (
        f"{100 * render / train_s:.1f} % bursts + {100 * refill / train_s:.1f} % refills, "
        f"{on.get('viewer/bursts', float('nan')) / train_s:.1f} bursts/s"
    )
    verdict = "met" if w["lost"] <= TARGET_LOST else "NOT met"
    return [
        "| training, steps | viewer=off | viewer=on, 1 client orbiting | on/off | lost | target | "
        "the viewer's account | frames meanwhile |",
        f"| {w['from_step']:,}-{w['to_step']:,} ({w['windows']} windows) "
        f"| {w['off_steps_per_s']:.1f} steps/s | {w['on_steps_per_s']:.1f} steps/s ({canvas}x{canvas}) "
        f"| **{w['ratio']:.3f}** | "
        f"**{100 * w['lost']:.1f} %** | <= {100 * TARGET_LOST:.0f} % ({verdict}) | {account} | "
        f"{on['frames_received']} sent ({on['frames_per_s']:.1f}/s), {on.get('frames_completed', 0)} full |",
    ]


def print_report(report: dict[str, Any], ckpt: str) -> None:
    """The table of a ``viewer_bench.json`` document."""
    print(f"viewer benchmark ({report['device']}, {report['date']}); checkpoint {ckpt}")
    for row in report["fps"]:
        print(
            f"  canvas {row['canvas']:>4d}px: frame {row['frame']:>9s}  {row['fps']:6.2f} frames/s "
            f"end to end  (render {row['render_ms']:.1f} ms/frame)"
        )
    if "train" in report:
        off, on = report["train"]["off"], report["train"]["on"]
        lost = 100 * (1 - on["steps_per_s"] / off["steps_per_s"])
        print(
            f"  whole runs: viewer=off {off['steps_per_s']:.1f} steps/s, viewer=on with a client "
            f"{on['steps_per_s']:.1f} steps/s ({lost:+.1f} % lost; the start of the run included)"
        )
        psnr_off, psnr_on = off.get("val/psnr", float("nan")), on.get("val/psnr", float("nan"))
        print(f"  val/psnr: off {psnr_off:.2f} dB, on {psnr_on:.2f} dB")
        if "window" in report["train"]:
            print()
            print("\n".join(throughput_row(report["train"], max(report["sizes"]))))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    overrides: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, overrides = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.viewer", description=__doc__.split("\n")[0]
    )
    p.add_argument("--ckpt", help="measure the view app on this run folder or .ckpt only (no training)")
    p.add_argument("--sizes", default="800,256", help="canvas sizes (px, square) for frames/s")
    p.add_argument("--frames", type=int, default=20, help="camera moves per size")
    p.add_argument("--move-every-s", type=float, default=0.05, help="camera moves while training")
    p.add_argument("--out", default="outputs/bench/viewer")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name(0)
        if torch.cuda.is_available()
        else platform.processor() or "cpu",
        "sizes": sizes,
        "overrides": overrides,
    }
    ckpt = args.ckpt
    if ckpt is None:
        if not overrides:
            p.error("give training overrides after -- (or --ckpt RUN)")
        report["train"] = train_runs(overrides, out, env, args.move_every_s, max(sizes))
        ckpt = report["train"]["ckpt"]
    port = next_free_port("127.0.0.1", 7007)
    log = out / "view.log"
    view = [f"ckpt={ckpt}", f"port={port}", f"max_size={max(sizes)}", f"hydra.run.dir={out / 'view'}"]
    cmd = [sys.executable, "-m", "nerf_lightning.view", *view]
    proc = _start(cmd, log, env)
    try:
        report["fps"] = measure_fps(_wait_url(proc, log, 600), sizes, args.frames)
    finally:
        proc.send_signal(2)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    (out / "viewer_bench.json").write_text(json.dumps(report, indent=2) + "\n")

    print_report(report, ckpt)
    print(f"  -> {out / 'viewer_bench.json'}")


if __name__ == "__main__":
    main()
