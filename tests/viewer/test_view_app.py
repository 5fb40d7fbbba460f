"""``python -m nerf_lightning.view``: a real viewer process, driven through viser's protocol (the headless
client: the same server path as a browser), its errors, and camera paths that ``render`` renders."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest

pytest.importorskip("viser")

from hydra.core.global_hydra import GlobalHydra
from runs import fork_app
from websockets.exceptions import InvalidStatus

from nerf_lightning.apps.render import render_video
from nerf_lightning.run.config import compose_app_config
from nerf_lightning.viewer.client import HeadlessClient

from .conftest import MAX_SIZE, psnr, wait_for_line

pytestmark = pytest.mark.slow

CANVAS = (64, 48)  # the client's canvas: frames of 48x36 (max_size 48), previews of 16x12


def _app_error(tmp_path: Path, name: str, *argv: str) -> tuple[int, str]:
    log, err = tmp_path / f"{name}.log", tmp_path / f"{name}.err"
    proc = fork_app("view", *argv, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, log=log, err_log=err)
    proc.join(120)
    assert not proc.is_alive()
    return proc.exitcode, err.read_text()


def _error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, trained_run) -> None:
    code, err = _app_error(tmp_path, "missing", "ckpt=/nowhere/run")
    assert code == 2 and "ckpt=/nowhere/run: no such file" in _error_line(err)
    truncated = tmp_path / "truncated.ckpt"  # a copy still in progress
    whole = (trained_run[0] / "checkpoints" / "last.ckpt").read_bytes()
    truncated.write_bytes(whole[: len(whole) // 2])
    code, err = _app_error(tmp_path, "truncated", f"ckpt={truncated}")
    assert code == 2 and f"{truncated}: not a readable checkpoint" in _error_line(err)
    with socket.socket() as holder:  # a port in use: named, with a free one to use instead
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, err = _app_error(tmp_path, "port", f"ckpt={trained_run[0]}", f"port={port}")
    line = _error_line(err)
    assert code == 2 and f"port={port}: 127.0.0.1:{port} is already in use" in line and "pass port=" in line
    code, err = _app_error(tmp_path, "size", f"ckpt={trained_run[0]}", "max_size=4")
    assert code == 2 and _error_line(err).startswith("error: max_size=4: expected")


def test_frames_follow_the_camera(viewer, scene) -> None:
    # no GPU here: the app says it renders on the CPU at a low resolution
    assert "no GPU: the viewer renders on the CPU at a low resolution" in viewer["log"].read_text()
    client = HeadlessClient(viewer["url"])
    try:
        cam0 = scene.view(0, CANVAS)
        client.send_camera(cam0.c2w, cam0.fov_y, *CANVAS)
        first = client.wait_complete(0, timeout_s=120)
        assert client.frames[0].image.shape == (12, 16, 3)  # the preview comes first
        assert first.image.shape == (36, 48, 3) and first.status.startswith("preview")
        assert client.status.startswith("frame 1 · 48x36")
        # what the browser is sent is the model's render from that camera (JPEG aside)
        expected0 = scene.render(cam0, MAX_SIZE)["rgb"]
        assert psnr(first.image, expected0) > 30
        assert first.image.std() > 10  # not a blank frame

        cam5 = scene.view(5, CANVAS)
        client.send_camera(cam5.c2w, cam5.fov_y, *CANVAS)
        moved = client.wait_complete(1, timeout_s=120)
        assert psnr(moved.image, scene.render(cam5, MAX_SIZE)["rgb"]) > 30
        assert np.abs(moved.image.astype(float) - first.image).mean() > 5  # a different picture

        client.set_value("Output", "accumulation")
        acc = client.wait_complete(2, timeout_s=120).image.astype(float)
        assert np.abs(acc[..., 0] - acc[..., 2]).max() < 12  # grey
        assert np.abs(acc[..., 0] - scene.render(cam5, MAX_SIZE)["opacity"] * 255).mean() < 4
        client.set_value("Output", "rgb")
    finally:
        client._ws.close()  # a browser tab closed without a goodbye: the server carries on

    again = HeadlessClient(viewer["url"])
    try:
        again.send_camera(cam0.c2w, cam0.fov_y, *CANVAS)
        assert psnr(again.wait_complete(0, timeout_s=120).image, expected0) > 30
    finally:
        again.close()


def test_the_printed_url_carries_the_token_that_opens_the_viewer(viewer) -> None:
    """On host=0.0.0.0 the app prints a URL with a token of this launch; only that token opens it."""
    printed = wait_for_line(viewer["log"], r"^viewer: (\S+)", viewer["proc"], 10).group(1)
    m = re.fullmatch(rf"http://localhost:{viewer['port']}/\?token=([A-Za-z0-9_-]{{32}})", printed)
    assert m and printed == viewer["url"], printed
    for url in (
        f"http://localhost:{viewer['port']}",
        f"http://localhost:{viewer['port']}/?token=x{m.group(1)}",
    ):
        with pytest.raises(InvalidStatus) as refused:
            HeadlessClient(url, timeout_s=10)
        assert refused.value.response.status_code == 403
    HeadlessClient(printed).close()


def test_four_browsers_at_once_each_get_their_own_view(viewer, scene) -> None:
    """Four browsers on four cameras at the same time: each gets complete frames of its own camera."""
    views = (0, 5, 10, 15)
    clients = [HeadlessClient(viewer["url"]) for _ in views]
    try:
        cams = [scene.view(i, CANVAS) for i in views]
        for client, cam in zip(clients, cams, strict=True):
            client.send_camera(cam.c2w, cam.fov_y, *CANVAS)
        frames = [client.wait_complete(0, timeout_s=180) for client in clients]
    finally:
        for client in clients:
            client.close()
    for frame, cam in zip(frames, cams, strict=True):
        expected = scene.render(cam, MAX_SIZE)["rgb"]
        assert frame.image.shape == (36, 48, 3) and psnr(frame.image, expected) > 30
    # four different pictures: no browser was sent another's view
    others = [psnr(frames[i].image, frames[j].image) for i in range(4) for j in range(4) if i != j]
    assert max(others) < 25, others


def test_camera_path_export_renders_with_the_render_app(viewer, scene, trained_run, tmp_path: Path) -> None:
    client = HeadlessClient(viewer["url"])
    keys = [scene.view(0, CANVAS), scene.view(5, CANVAS)]
    try:
        for i, cam in enumerate(keys):
            client.send_camera(cam.c2w, cam.fov_y, *CANVAS)
            client.wait_complete(i, timeout_s=120)  # the server has this camera now
            client.click("Add keyframe")
            assert client.wait_for(lambda c, n=i + 1: c.find_markdown(rf"^{n} keyframes?$") is not None, 10)
        for label, value in (("Seconds", 0.3), ("FPS", 10), ("Width", 32), ("Height", 24)):
            client.set_value(label, value)
        client.click("Export camera path")
        assert client.wait_for(lambda c: c.find_markdown(r"written to `(.+?)`") is not None, 30)
        path = Path(client.find_markdown(r"written to `(.+?)`").group(1))
    finally:
        client.close()
    assert path == viewer["dir"] / "camera_path.json"
    doc = json.loads(path.read_text())
    assert len(doc["camera_path"]) == 3 and (doc["render_width"], doc["render_height"]) == (32, 24)
    wait_for_line(viewer["log"], r"^camera path: .*camera_path\.json", viewer["proc"], 10)

    run_dir, _ = trained_run
    try:
        cfg = compose_app_config(
            "render", [f"ckpt={run_dir}", f"camera_path={path}", "depth=false"], tmp_path / "render"
        )
        info = render_video(cfg)
    finally:
        GlobalHydra.instance().clear()
    assert info["frames"] == 3 and (info["width"], info["height"]) == (32, 24)
    frames = iio.imread(tmp_path / "render" / "rgb.mp4")
    # first and last frame: the keyframes' views at the path's size (H.264 aside)
    for frame, cam in ((frames[0], keys[0]), (frames[-1], keys[1])):
        cam = type(cam)(cam.c2w, cam.fov_y, 32 / 24, 32)
        assert psnr(frame, scene.render(cam, 32)["rgb"]) > 25


def test_scene_widgets_and_jumping_to_a_training_camera(viewer, scene) -> None:
    from nerf_lightning.mesh.extract import occupied_cells

    client = HeadlessClient(viewer["url"])
    try:
        cam = scene.view(0, CANVAS)
        client.send_camera(cam.c2w, cam.fov_y, *CANVAS)
        client.wait_complete(0, timeout_s=120)
        frustums = sorted(n for n in client.scene if n.startswith("/training_cameras/"))
        assert len(frustums) == len(scene.info.poses) == len(scene.capture.train)
        assert client.scene["/scene_box/unit_cube"]["props"]["dimensions"] == [1.0, 1.0, 1.0]

        client.click_node(frustums[3])  # a click on a camera jumps there: pose and field of view
        pose = scene.info.poses[3]

        def at_camera_3(c: HeadlessClient) -> bool:
            """The pose comes as several messages (fov, look-at, position, look-at): all of them in."""
            got = c.camera_set
            if not {"fov", "position", "look_at"} <= set(got):
                return False
            look = got["look_at"] - got["position"]
            return (
                got["fov"] == pytest.approx(scene.info.fov_y[3])
                and np.allclose(got["position"], pose[:3, 3], atol=1e-6)
                and np.allclose(look / np.linalg.norm(look), pose[:3, 2], atol=1e-6)
            )

        assert client.wait_for(at_camera_3, 30), client.camera_set

        client.set_value("Training cameras", False)
        assert client.wait_for(lambda c: not any(c.scene[n].get("visible", True) for n in frustums), 30)

        client.set_value("Occupied cells", True)
        assert client.wait_for(lambda c: "/occupancy/cells" in c.scene, 60)
        points = client.scene["/occupancy/cells"]["props"]["points"].reshape(-1, 3).astype(np.float64)
        centres, _ = occupied_cells(scene.model.renderer.occupancy)
        assert 0 < len(points) == len(centres)
        np.testing.assert_allclose(np.sort(points, axis=0), np.sort(centres.numpy(), axis=0), atol=2e-3)
        client.set_value("Occupied cells", False)
        assert client.wait_for(lambda c: not c.scene["/occupancy/cells"].get("visible", True), 30)
        client.set_value("Training cameras", True)
    finally:
        client.close()


def test_the_benchmark_client_measures_frames_per_second(viewer) -> None:
    """bench.viewer's frames/s loop against the real app (its numbers come from the GPU machine)."""
    from benchmarks.viewer import measure_fps

    rows = measure_fps(viewer["url"], [32], frames=2)
    assert rows[0]["frame"] == "32x32" and rows[0]["fps"] > 0 and rows[0]["render_ms"] > 0
