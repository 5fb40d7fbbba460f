"""The viewer: a viser server that shows the field rendered from each browser's camera.

Rendering happens only in :meth:`ViewerServer.render`, called by whoever owns the model: the ``view``
app's loop (:meth:`ViewerServer.serve_forever`) or the training loop between two optimizer steps
(``viewer/callback.py``), with a time budget. viser's threads only record what changed (a camera, a
setting, a button) and wake the loop.

Per browser: when its camera changes, a preview (longer side ``preview_size`` px) is rendered and
sent, then the full resolution (the canvas's size, at most ``max_size`` px on its longer side) in
chunks of rays sized to ``chunk_s`` seconds each, with the rendered rows shown over the scaled-up
preview every ``progress_every_s``; a new camera abandons the render at the next chunk. While
training, a finished view is rendered again once the weights have changed and ``refresh_every_s``
has passed, so the browser sees the scene sharpen. Each browser's panel shows the state of its frame
("frame N · WxH · S s" once complete).

Several browsers share the render loop (round robin, a chunk each). A browser that does not take its
frames (a slow link, a tab that stopped reading) gets none rendered while it is behind
(``viewer/link.py``): its frames are dropped, never queued, and it costs the loop nothing until it
catches up and gets the latest view. Beyond the loopback the server requires a token
(``viewer/access.py``), carried by :attr:`ViewerServer.url`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import viser
from torch import Tensor

from nerf_lightning.errors import UserError
from nerf_lightning.mesh.extract import occupied_cells
from nerf_lightning.viewer.access import TokenGate, gated, viewer_token
from nerf_lightning.viewer.browser_camera import ViewCamera, wxyz_of
from nerf_lightning.viewer.link import behind_limit, bytes_in_flight
from nerf_lightning.viewer.panels import CameraPathPanel, TrainingPanel
from nerf_lightning.viewer.ports import check_port
from nerf_lightning.viewer.progressive import OUTPUTS, ChunkSizer, ImageRender, composite
from nerf_lightning.viewer.scene import SceneInfo, SceneWidgets
from nerf_lightning.viewer.status import TrainingStatus
from nerf_lightning.volume.renderer import Renderer

__all__ = ["RenderSource", "ViewerServer"]

log = logging.getLogger(__name__)


@dataclass
class RenderSource:
    """What the viewer renders with: the model's renderer and field, the background [3] on ``device``,
    rays per renderer call (memory) and a context for each call (the trainer's autocast, say)."""

    renderer: Renderer
    field: Any
    background: Tensor
    device: torch.device
    chunk: int = 1 << 16
    context: Callable[[], AbstractContextManager] = nullcontext

    def render(self, rays_o: Tensor, rays_d: Tensor) -> dict[str, Tensor]:
        with self.context():
            return self.renderer.render_image(self.field, rays_o, rays_d, self.background, chunk=self.chunk)


@dataclass(eq=False)
class _Browser:
    """One connected browser: its camera, the frame being rendered for it and its status line."""

    handle: viser.ClientHandle
    status: Any
    camera: ViewCamera | None = None
    version: int = 0  # bumped by every change that needs a new frame
    job_version: int = -1
    job_model: int = -1  # the model version the frame was started at
    job_started: float = 0.0
    preview: ImageRender | None = None
    full: ImageRender | None = None
    coarse: ImageRender | None = None  # shown below the rows of `full` not rendered yet
    near_far: tuple[float, float] | None = None
    last_sent: float = 0.0
    frames: int = 0
    sent: int = 0  # pictures sent (previews, progress and complete frames)
    behind: bool = False  # its link holds frames it has not taken: nothing is rendered for it
    dropped: int = 0  # times it was found behind with a frame to render
    sizes: tuple[int, int] = field(default=(0, 0))


class ViewerServer:
    """The viewer's server and render loop (see the module docstring).

    Args:
        info: the capture's cameras and boxes.
        source: the renderer, field and background to render with.
        host, port: where to listen (``127.0.0.1``: this machine only; over SSH tunnel the port).
        token: the token a browser must bring (None: one generated per launch beyond the loopback,
            none on it); ``token_key`` names the setting in its error.
        key_prefix: where the host and port keys live, for their errors (``viewer.`` in the train app).
        max_size: longest side of a full-resolution frame (px); the canvas's own size when smaller.
        preview_size: longest side of the frame shown while the camera moves (px).
        export_dir: where camera paths are written.
        render_command: the ``render`` command for an exported path (without ``camera_path=``).
        training: show the training panel (statistics, pause/resume, stop).
        chunk_s: target seconds of one chunk of rays.
    """

    def __init__(
        self,
        info: SceneInfo,
        source: RenderSource,
        *,
        host: str = "127.0.0.1",
        port: int = 7007,
        token: str | None = None,
        token_key: str = "token",
        key_prefix: str = "",
        max_size: int = 1024,
        preview_size: int = 256,
        export_dir: str | Path = ".",
        render_command: str = "python -m nerf_lightning.render ckpt=RUN",
        training: bool = False,
        chunk_s: float = 0.02,
        progress_every_s: float = 0.5,
        refresh_every_s: float = 1.0,
        cells_every_s: float = 10.0,
        jpeg_quality: int = 90,
        label: str = "nerf_lightning",
    ) -> None:
        check_port(
            host, port, key_prefix
        )  # sizes and the port's range: checked by the view app's or viewer.* keys
        self.token = viewer_token(host, token, token_key)
        self.info = info
        self.source = source
        self.progress_every_s = float(progress_every_s)
        self.refresh_every_s = float(refresh_every_s)
        self.cells_every_s = float(cells_every_s)
        self.jpeg_quality = int(jpeg_quality)
        gpu = source.device.type == "cuda"
        # at least 16k / 4k rays a chunk: smaller calls cost more than they render (marching setup)
        self.sizer = ChunkSizer(chunk_s, 2e6 if gpu else 2e4, min_rays=16384 if gpu else 4096)
        self.model_version = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._browsers: dict[int, _Browser] = {}
        self._turn = 0
        self._cells_model = -1
        self._cells_time = -math.inf
        self._closed = False
        self.frames_sent = 0

        self.gate = TokenGate(self.token, port)
        with gated(self.gate):
            self.viser = viser.ViserServer(host=host, port=port, label=label, verbose=False)
        self.port = self.viser.get_port()
        if port and self.port != port:  # taken between the check and the bind: viser moved on
            self.viser.stop()
            raise UserError(
                f"{key_prefix}port={port}: {host}:{port} was taken just now; "
                f"pass {key_prefix}port={self.port}"
            )
        if not self.gate.installed:  # fail closed: never serve beyond the loopback without the check
            self.viser.stop()
            raise RuntimeError(
                "viewer: this viser starts its server differently; the token check is not in place"
            )
        self.gate.cookie = f"nerf_lightning_viewer_{self.port}"  # port 0: the one bound
        query = f"/?token={self.token}" if self.token else ""
        self.url = f"http://{'localhost' if host in ('127.0.0.1', '0.0.0.0') else host}:{self.port}{query}"
        self.viser.gui.configure_theme(control_width="medium")
        self.training = TrainingPanel(self.viser, self._wake.set) if training else None
        with self.viser.gui.add_folder("Render"):
            self.output = self.viser.gui.add_dropdown("Output", OUTPUTS, initial_value="rgb")
            self.max_size = self.viser.gui.add_slider(
                "Max resolution", min=16, max=max(16, int(max_size)), step=8, initial_value=int(max_size)
            )
            self.preview_size = self.viser.gui.add_slider(
                "Preview resolution", min=8, max=max(16, int(max_size)), step=8,
                initial_value=min(int(preview_size), int(max_size)),
            )  # fmt: skip
        for widget in (self.output, self.max_size, self.preview_size):
            widget.on_update(lambda _: self._invalidate())
        self.scene = SceneWidgets(self.viser, info, self.jump_to)
        self.scene.show_cells.on_update(lambda _: self._wake.set())
        self.camera_path = CameraPathPanel(self.viser, info, Path(export_dir), render_command)
        self._set_initial_camera()
        self.viser.on_client_connect(self._connect)
        self.viser.on_client_disconnect(self._disconnect)

    # ------------------------------------------------------------------------ browsers
    def _set_initial_camera(self) -> None:
        """New browsers open at training view 0, with its field of view and its up direction."""
        c2w = self.info.poses[0]
        forward = c2w[:3, 2]
        along = float((self.info.focus - c2w[:3, 3]) @ forward)
        distance = along if along > 1e-3 else self.info.camera_distance
        cam = self.viser.initial_camera
        cam.position = c2w[:3, 3]
        cam.look_at = c2w[:3, 3] + forward * distance
        cam.up = -c2w[:3, 1]
        cam.fov = float(self.info.fov_y[0])

    def _connect(self, client: viser.ClientHandle) -> None:
        status = client.gui.add_markdown("waiting for the first frame", order=-1)
        browser = _Browser(client, status)
        with self._lock:
            self._browsers[client.client_id] = browser
        client.camera.on_update(lambda cam: self._camera_changed(browser, cam))
        self._camera_changed(browser, client.camera)  # the camera it connected with

    def _disconnect(self, client: viser.ClientHandle) -> None:
        with self._lock:
            self._browsers.pop(client.client_id, None)

    def _camera_changed(self, browser: _Browser, cam: viser.CameraHandle) -> None:
        try:
            new = ViewCamera.from_viser(cam.wxyz, cam.position, cam.fov, cam.image_width, cam.image_height)
        except (AssertionError, ValueError):  # no camera message yet
            return
        with self._lock:
            if new.same_as(browser.camera):
                return
            browser.camera = new
            browser.version += 1
        self._wake.set()

    def _invalidate(self) -> None:
        """A setting changed: every browser needs a new frame."""
        with self._lock:
            for b in self._browsers.values():
                b.version += 1
        self._wake.set()

    def jump_to(self, client: viser.ClientHandle | None, view: int) -> None:
        """Move ``client``'s camera to training view ``view`` (its pose and field of view)."""
        if client is None or not 0 <= view < len(self.info.poses):
            return
        c2w = self.info.poses[view]
        with client.atomic():
            client.camera.fov = float(self.info.fov_y[view])
            client.camera.wxyz = wxyz_of(c2w)
            client.camera.position = c2w[:3, 3]

    @property
    def n_browsers(self) -> int:
        with self._lock:
            return len(self._browsers)

    # --------------------------------------------------------------------- render loop
    def model_changed(self) -> None:
        """The weights changed (a training step): finished views are rendered again in time."""
        self.model_version += 1

    def _needs_work(self, b: _Browser, now: float) -> bool:
        if b.camera is None:
            return False
        if b.job_version != b.version or b.full is None or not b.full.done:
            due = True
        else:
            due = b.job_model != self.model_version and now - b.job_started >= self.refresh_every_s
        return due and not self._is_behind(b)

    def _is_behind(self, b: _Browser) -> bool:
        """Whether ``b``'s link still holds more than about two of its frames (logged when it changes)."""
        side = int(self.max_size.value)
        behind = bytes_in_flight(self.viser, b.handle.client_id) > behind_limit(side * side)
        if behind != b.behind:
            b.behind = behind
            state = (
                "is not taking its frames: they are dropped until it catches up" if behind else "caught up"
            )
            log.info("viewer: browser %s %s", b.handle.client_id, state)
        b.dropped += behind
        return behind

    def browser_stats(self) -> list[dict[str, int | bool]]:
        """Per connected browser: pictures sent, complete frames, whether it is behind, drops."""
        with self._lock:
            browsers = list(self._browsers.values())
        return [
            {
                "id": b.handle.client_id,
                "sent": b.sent,
                "frames": b.frames,
                "behind": b.behind,
                "dropped": b.dropped,
            }
            for b in browsers
        ]

    def _cells_due(self, now: float) -> bool:
        if not self.scene.wants_cells:
            return self.scene.cells is not None and self.scene.cells.visible
        return self._cells_model != self.model_version and now - self._cells_time >= self.cells_every_s

    def has_work(self) -> bool:
        now = time.perf_counter()
        with self._lock:
            browsers = list(self._browsers.values())
        return self._cells_due(now) or any(self._needs_work(b, now) for b in browsers)

    def _next_browser(self, now: float) -> _Browser | None:
        with self._lock:
            browsers = list(self._browsers.values())
        for k in range(len(browsers)):  # round robin: every browser gets chunks
            b = browsers[(self._turn + k) % len(browsers)]
            if self._needs_work(b, now):
                self._turn = (self._turn + k + 1) % len(browsers)
                return b
        return None

    @torch.no_grad()
    def render(self, budget_s: float) -> float:
        """Render for about ``budget_s`` seconds (at least one chunk when there is work); returns the
        seconds spent. Use it from the thread that owns the model."""
        start = time.perf_counter()
        deadline = start + budget_s
        if self._cells_due(start):
            self._update_cells(start)
        while True:
            now = time.perf_counter()
            if now >= deadline and now > start:
                break
            b = self._next_browser(now)
            if b is None:
                break
            self._advance(b, max(deadline - now, 0.0))
            if time.perf_counter() >= deadline:
                break
        return time.perf_counter() - start

    def _advance(self, b: _Browser, remaining_s: float) -> None:
        now = time.perf_counter()
        with self._lock:
            cam, version = b.camera, b.version
        assert cam is not None
        full_side = max(8, min(int(self.max_size.value), cam.canvas_side or int(self.max_size.value)))
        preview_side = min(int(self.preview_size.value), full_side)
        if b.job_version != version:  # a new view: preview first
            b.job_version, b.job_model, b.job_started = version, self.model_version, now
            b.preview = (
                ImageRender(cam.at(preview_side), self.source.device) if preview_side < full_side else None
            )
            b.full, b.coarse, b.near_far = None, None, None
        elif b.full is not None and b.full.done:  # the same view after training steps: render it again
            b.coarse, b.full = b.full, None
            b.preview, b.job_model, b.job_started = None, self.model_version, now
        if b.preview is not None and not b.preview.done:
            target = b.preview
        else:
            if b.full is None:
                b.full = ImageRender(cam.at(full_side), self.source.device)
                b.coarse = b.coarse or b.preview
            target = b.full
        t0 = time.perf_counter()
        rays = target.advance(self.source.render, self.sizer.rays_for(remaining_s))
        self.sizer.record(rays, time.perf_counter() - t0)
        if target is b.preview:
            if target.done:
                self._send(b, target, None, f"preview {target.camera.width}x{target.camera.height}")
            return
        if target.done:
            b.frames += 1
            cam_ = target.camera
            self._send(
                b, target, None, f"frame {b.frames} · {cam_.width}x{cam_.height} · {target.render_s:.2f} s"
            )
        elif time.perf_counter() - b.last_sent >= self.progress_every_s:
            pct = 100 * target.done_rays // target.n_rays
            self._send(
                b, target, b.coarse, f"refining {target.camera.width}x{target.camera.height} · {pct} %"
            )

    def _send(self, b: _Browser, image: ImageRender, coarse: ImageRender | None, status: str) -> None:
        picture, near_far = composite(str(self.output.value), image, coarse, b.near_far)
        if image.done:
            b.near_far = near_far if b.near_far is None else b.near_far
        try:
            b.handle.scene.set_background_image(picture, format="jpeg", jpeg_quality=self.jpeg_quality)
            b.status.content = status
        except Exception as err:  # noqa: BLE001 - a browser that went away must not stop the loop
            log.debug("viewer: could not send a frame to browser %s: %s", b.handle.client_id, err)
        b.last_sent = time.perf_counter()
        b.sent += 1
        self.frames_sent += 1

    def _update_cells(self, now: float) -> None:
        self._cells_model, self._cells_time = self.model_version, now
        if not self.scene.wants_cells:
            self.scene.hide_cells()
            return
        grid = self.source.renderer.occupancy
        centres, cascades = occupied_cells(grid)
        self.scene.set_cells(centres.cpu().numpy(), cascades.cpu().numpy(), 1.0 / grid.resolution)

    # ------------------------------------------------------------------------- loops
    def wait(self, timeout_s: float) -> None:
        """Sleep until something changes (a camera, a setting, a button) or ``timeout_s`` passes."""
        self._wake.wait(timeout_s)
        self._wake.clear()

    def serve_forever(self, max_seconds: float | None = None, slice_s: float = 0.1) -> None:
        """Render whenever there is work, until :meth:`close` or ``max_seconds`` (None: forever)."""
        end = math.inf if max_seconds is None else time.perf_counter() + max_seconds
        while not self._closed and time.perf_counter() < end:
            self._wake.clear()
            if self.has_work():
                self.render(slice_s)
            else:
                self.wait(min(0.25, max(end - time.perf_counter(), 0.0)))

    def show_training(self, status: TrainingStatus) -> None:
        if self.training is not None:
            self.training.show(status)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._wake.set()
            self.viser.stop()
