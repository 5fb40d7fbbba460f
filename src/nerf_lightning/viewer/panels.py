"""The viewer's GUI panels besides the scene toggles: training (statistics, pause/resume, stop) and the
camera-path editor (keyframes from the browser's camera -> ``camera_path.json``).

GUI callbacks run on viser's threads: they only change state (under the panel's lock) or write a
file; anything that touches the model runs in the render loop (``viewer/server.py``).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import viser

from nerf_lightning.errors import UserError
from nerf_lightning.viewer.browser_camera import c2w_of, wxyz_of
from nerf_lightning.viewer.keyframes import Keyframe, nerfstudio_camera_path, write_camera_path
from nerf_lightning.viewer.scene import SceneInfo
from nerf_lightning.viewer.status import TrainingStatus

__all__ = ["CameraPathPanel", "TrainingPanel"]

log = logging.getLogger(__name__)


class TrainingPanel:
    """Training statistics, a pause/resume button and a stop button.

    ``paused`` and ``stop_requested`` are read by the training loop (``viewer/callback.py``); the
    pause is a :class:`threading.Event` it waits on (no busy loop)."""

    def __init__(self, server: viser.ViserServer, on_change: Callable[[], None]) -> None:
        self.resumed = threading.Event()
        self.resumed.set()
        self.stop_requested = False
        self._on_change = on_change
        with server.gui.add_folder("Training", order=0):
            self.stats = server.gui.add_markdown(TrainingStatus(step=0).markdown())
            self.pause = server.gui.add_button("Pause training", icon=viser.Icon.PLAYER_PAUSE)
            self.stop = server.gui.add_button(
                "Stop training", color="red", hint="end training now: the run validates and saves as usual"
            )
        self.pause.on_click(lambda _: self.toggle_pause())
        self.stop.on_click(lambda _: self.request_stop())

    @property
    def paused(self) -> bool:
        return not self.resumed.is_set()

    def toggle_pause(self) -> None:
        if self.paused:
            self.resumed.set()
            self.pause.label, self.pause.icon = "Pause training", viser.Icon.PLAYER_PAUSE
        else:
            self.resumed.clear()
            self.pause.label, self.pause.icon = "Resume training", viser.Icon.PLAYER_PLAY
        self._on_change()

    def request_stop(self) -> None:
        self.stop_requested = True
        self.resumed.set()  # a paused loop wakes up to stop
        self.pause.disabled = self.stop.disabled = True
        self._on_change()

    def show(self, status: TrainingStatus) -> None:
        self.stats.content = status.markdown()

    def finished(self, status: TrainingStatus) -> None:
        self.show(status)
        self.pause.disabled = self.stop.disabled = True
        self.resumed.set()


class CameraPathPanel:
    """Keyframes from the browser's camera, shown as orange frustums joined by the path, exported as a
    nerfstudio ``camera_path.json`` into ``export_dir`` (and offered to the browser as a download).

    ``render_command`` is the ``render`` command line without its ``camera_path=`` (shown after an export).
    """

    def __init__(
        self, server: viser.ViserServer, info: SceneInfo, export_dir: Path, render_command: str
    ) -> None:
        self.server = server
        self.info = info
        self.export_dir = Path(export_dir)
        self.render_command = render_command
        self.keyframes: list[Keyframe] = []
        self._lock = threading.Lock()
        self._nodes: list = []
        w0, h0 = info.sizes[0]
        with server.gui.add_folder("Camera path", expand_by_default=False):
            self.add = server.gui.add_button(
                "Add keyframe", hint="the current view becomes the next keyframe"
            )
            self.remove = server.gui.add_button("Remove last keyframe")
            self.clear = server.gui.add_button("Clear keyframes")
            self.seconds = server.gui.add_number("Seconds", 4.0, min=0.1, step=0.5)
            self.fps = server.gui.add_number("FPS", 30, min=1, max=240, step=1)
            self.width = server.gui.add_number("Width", int(w0), min=16, max=8192, step=1)
            self.height = server.gui.add_number("Height", int(h0), min=16, max=8192, step=1)
            self.loop = server.gui.add_checkbox("Loop", False)
            self.filename = server.gui.add_text("File", "camera_path.json")
            self.export = server.gui.add_button("Export camera path", icon=viser.Icon.DOWNLOAD)
            self.summary = server.gui.add_markdown("no keyframes")
        self.add.on_click(lambda event: self.add_keyframe(event.client))
        self.remove.on_click(lambda _: self._edit(lambda k: k[:-1]))
        self.clear.on_click(lambda _: self._edit(lambda k: []))
        self.loop.on_update(lambda _: self._redraw())
        self.export.on_click(lambda event: self.export_path(event.client))

    def add_keyframe(self, client: viser.ClientHandle | None) -> None:
        if client is None:
            return
        cam = client.camera
        key = Keyframe(c2w_of(cam.wxyz, cam.position), math.degrees(float(cam.fov)))
        self._edit(lambda k: [*k, key])

    def _edit(self, change) -> None:  # noqa: ANN001 - list -> list
        with self._lock:
            self.keyframes = list(change(self.keyframes))
        self._redraw()

    def _redraw(self) -> None:
        with self._lock:
            keys = list(self.keyframes)
        for node in self._nodes:
            node.remove()
        self._nodes = []
        aspect = float(self.width.value) / float(self.height.value)
        scale = 0.1 * max(self.info.camera_distance, 1e-3)
        for i, k in enumerate(keys):
            self._nodes.append(
                self.server.scene.add_camera_frustum(
                    f"/camera_path/keyframe_{i:03d}", fov=math.radians(k.fov_deg), aspect=aspect, scale=scale,
                    thickness=0.015 * scale, color=(255, 120, 0), wxyz=wxyz_of(k.c2w), position=k.c2w[:3, 3],
                )
            )  # fmt: skip
        if len(keys) >= 2:
            points = np.stack([k.c2w[:3, 3] for k in keys])
            self._nodes.append(
                self.server.scene.add_spline_catmull_rom(
                    "/camera_path/spline", points, curve_type="centripetal", closed=bool(self.loop.value),
                    thickness=0.005 * scale, color=(255, 120, 0),
                )
            )  # fmt: skip
        self.summary.content = f"{len(keys)} keyframe{'s' if len(keys) != 1 else ''}"

    def export_path(self, client: viser.ClientHandle | None) -> Path | None:
        """Write the camera path; returns its file (None when it could not be written: said in the panel)."""
        with self._lock:
            keys = list(self.keyframes)
        name = Path(str(self.filename.value).strip() or "camera_path.json").name
        path = self.export_dir / (name if name.endswith(".json") else f"{name}.json")
        try:
            doc = nerfstudio_camera_path(
                keys, self.info.space, int(self.width.value), int(self.height.value),
                float(self.fps.value), float(self.seconds.value), bool(self.loop.value),
            )  # fmt: skip
            write_camera_path(path, doc)
        except (UserError, OSError) as err:
            self.summary.content = f"**not exported**: {err}"
            return None
        command = f"{self.render_command} camera_path={path}"
        self.summary.content = (
            f"{len(keys)} keyframes -> {len(doc['camera_path'])} frames, written to `{path}`  \n"
            f"render it: `{command}`"
        )
        log.info("camera path written to %s; render it: %s", path, command)
        print(f"camera path: {path}  (render: {command})", flush=True)
        if client is not None:
            client.send_file_download(path.name, path.read_bytes())
        return path
