"""A browser stand-in: viser's websocket protocol spoken from Python, for benchmarks and tests on machines
without a browser.

It goes through the same server path as a browser: it connects with viser's version subprotocol, sends
``ViewerCameraMessage`` as the page does when its camera moves (pose, vertical field of view, canvas
size), clicks GUI buttons by label (``GuiUpdateMessage`` with ``value: True``), and decodes what the
server sends: the rendered frames (``BackgroundImageMessage``, JPEG) and the GUI's markdown (the
per-browser status line: ``frame N · WxH · S s`` once a frame is complete).

Server -> client frames (viser's wire format): 8 bytes decompressed size, 8 bytes compressed size
(little endian), a zstd-compressed msgpack ``{"messages": [...], ...}``, then raw binary buffers
(numpy arrays, which this client does not need). Client -> server: one msgpack message per frame.
"""

from __future__ import annotations

import io
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import viser
import zstandard
from viser import _messages as messages
from websockets.sync.client import connect

from nerf_lightning.viewer.browser_camera import wxyz_of

__all__ = ["Frame", "HeadlessClient"]

_STATUS = re.compile(r"^(waiting|preview|refining|frame) ")
_COMPLETE = re.compile(r"^frame (\d+) ")


@dataclass(frozen=True)
class Frame:
    """A frame the server sent: its arrival (``time.perf_counter``), its pixels and the status line then."""

    time: float
    image: np.ndarray
    status: str


def _with_arrays(obj: Any, buffers: list[bytes]) -> Any:
    """``obj`` with viser's binary placeholders (``{"__binary_index": i, "dtype": ...}``) as numpy arrays
    (flat: the message's other fields say the shape)."""
    if isinstance(obj, dict):
        if "__binary_index" in obj and "dtype" in obj:
            return np.frombuffer(buffers[obj["__binary_index"]], dtype=np.dtype(obj["dtype"]))
        return {k: _with_arrays(v, buffers) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_with_arrays(v, buffers) for v in obj]
    return obj


class HeadlessClient:
    """A viewer connection without a browser (see the module docstring). ``url``: ``http://host:port``."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        ws_url = "ws" + url[len("http") :] if url.startswith("http") else url
        self._ws = connect(
            ws_url,
            subprotocols=[f"viser-v{viser.__version__}"],  # type: ignore[list-item]
            max_size=None,
            compression=None,
            open_timeout=timeout_s,
        )
        self._cond = threading.Condition()
        self.frames: list[Frame] = []
        self.status = ""
        #: complete frames so far (the status's ``frame N``) and the last of them
        self.completed = 0
        self.last_complete: Frame | None = None
        self.markdown: dict[str, str] = {}
        self.inputs: dict[str, str] = {}  # GUI input label -> uuid (buttons, numbers, dropdowns, ...)
        #: scene nodes by name: {"type", "props" (numpy arrays decoded), "visible"}
        self.scene: dict[str, dict[str, Any]] = {}
        #: what the server last set this browser's camera to (``position``, ``look_at``, ``up``, ``fov``)
        self.camera_set: dict[str, Any] = {}
        self.closed = False
        self._thread = threading.Thread(target=self._receive, name="viewer-client", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------ receiving
    def _receive(self) -> None:
        dctx = zstandard.ZstdDecompressor()
        try:
            while True:
                data = self._ws.recv()
                if not isinstance(data, bytes) or len(data) < 16:
                    continue
                size = int.from_bytes(data[:8], "little")
                compressed = int.from_bytes(data[8:16], "little")
                inner = dctx.decompress(data[16 : 16 + compressed], max_output_size=size)
                doc = msgspec.msgpack.decode(inner)
                buffers, offset = [], 16 + compressed
                for length in doc.get("binaryBufferLengths", ()):
                    offset += (8 - offset % 8) % 8  # each buffer starts 8-byte aligned
                    buffers.append(data[offset : offset + length])
                    offset += length
                for msg in doc["messages"]:
                    self._handle(_with_arrays(msg, buffers))
        except Exception:  # noqa: BLE001 - closed (by either side): the waits below time out or see it
            pass
        finally:
            with self._cond:
                self.closed = True
                self._cond.notify_all()

    def _handle(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        with self._cond:
            if kind == "BackgroundImageMessage" and msg.get("rgb_data"):
                import imageio.v3 as iio

                image = iio.imread(io.BytesIO(msg["rgb_data"]))
                self.frames.append(Frame(time.perf_counter(), image[..., :3], self.status))
            elif kind == "GuiMarkdownMessage":
                self._set_markdown(msg["uuid"], msg["props"].get("_markdown", ""))
            elif kind == "GuiUpdateMessage":
                updates = msg.get("updates", {})
                if "_markdown" in updates:
                    self._set_markdown(msg["uuid"], updates["_markdown"])
                if "label" in updates:
                    for label, uuid in list(self.inputs.items()):
                        if uuid == msg["uuid"]:
                            del self.inputs[label]
                    self.inputs[updates["label"]] = msg["uuid"]
            elif kind == "SetCameraPositionMessage":
                self.camera_set["position"] = np.asarray(msg["position"], dtype=np.float64)
            elif kind == "SetCameraLookAtMessage":
                self.camera_set["look_at"] = np.asarray(msg["look_at"], dtype=np.float64)
            elif kind == "SetCameraUpDirectionMessage":
                self.camera_set["up"] = np.asarray(msg["position"], dtype=np.float64)  # viser's field name
            elif kind == "SetCameraFovMessage":
                self.camera_set["fov"] = float(msg["fov"])
            elif kind == "SetSceneNodeVisibilityMessage":
                self.scene.setdefault(msg["name"], {})["visible"] = bool(msg["visible"])
            elif kind == "RemoveSceneNodeMessage":
                self.scene.pop(msg["name"], None)
            elif "name" in msg and isinstance(msg.get("props"), dict):
                self.scene[msg["name"]] = {"type": kind, "props": msg["props"], "visible": True}
            elif (
                str(kind).startswith("Gui") and isinstance(msg.get("props"), dict) and "label" in msg["props"]
            ):
                self.inputs[msg["props"]["label"]] = msg["uuid"]
            else:
                return
            self._cond.notify_all()

    def _set_markdown(self, uuid: str, content: str) -> None:
        self.markdown[uuid] = content
        if _STATUS.match(content):
            self.status = content
            done = _COMPLETE.match(content)
            if done and int(done.group(1)) > self.completed and self.frames:
                # a frame's status is sent after its image: the frame just received is the complete one
                self.completed, self.last_complete = int(done.group(1)), self.frames[-1]

    # -------------------------------------------------------------------------- sending
    def _send(self, message: messages.Message) -> None:
        self._ws.send(msgspec.msgpack.encode(message.as_serializable_dict()))

    def send_camera(
        self, c2w: np.ndarray, fov_y: float, width: int, height: int, look_at: np.ndarray | None = None
    ) -> None:
        """Move this browser's camera: NGP-space OpenCV camera-to-world [4, 4], vertical fov (radians),
        canvas size in pixels."""
        c2w = np.asarray(c2w, dtype=np.float64)
        target = c2w[:3, 3] + c2w[:3, 2] if look_at is None else np.asarray(look_at, dtype=np.float64)
        self._send(
            messages.ViewerCameraMessage(
                wxyz=tuple(float(v) for v in wxyz_of(c2w)),  # type: ignore[arg-type]
                position=tuple(float(v) for v in c2w[:3, 3]),  # type: ignore[arg-type]
                fov=float(fov_y),
                near=0.01,
                far=1000.0,
                image_height=int(height),
                image_width=int(width),
                look_at=tuple(float(v) for v in target),  # type: ignore[arg-type]
                up_direction=tuple(float(v) for v in -c2w[:3, 1]),  # type: ignore[arg-type]
            )
        )

    def set_value(self, label: str, value: Any, timeout_s: float = 10.0) -> None:
        """Set the GUI input labelled ``label`` as the page does (waits until the server has sent it)."""
        with self._cond:
            if not self._cond.wait_for(lambda: label in self.inputs or self.closed, timeout_s) or self.closed:
                raise TimeoutError(f"viewer: no GUI input {label!r} (have: {sorted(self.inputs)})")
            uuid = self.inputs[label]
        self._send(messages.GuiUpdateMessage(uuid, {"value": value}))

    def click_node(self, name: str) -> None:
        """Click the scene node ``name`` (a training camera's frustum, say) as the page does."""
        self._send(
            messages.SceneNodeClickMessage(
                name=name, instance_index=None, ray_origin=(0.0, 0.0, 0.0), ray_direction=(0.0, 0.0, 1.0),
                screen_pos=(0.5, 0.5), modifier=None,
            )
        )  # fmt: skip

    def click(self, label: str, timeout_s: float = 10.0) -> None:
        """Click the GUI button labelled ``label``."""
        self.set_value(label, True, timeout_s)

    def find_markdown(self, pattern: str) -> re.Match[str] | None:
        """The first GUI markdown matching ``pattern`` (``re.search``), as a match."""
        with self._cond:
            for content in self.markdown.values():
                if m := re.search(pattern, content):
                    return m
        return None

    # -------------------------------------------------------------------------- waiting
    def wait_for(self, predicate: Any, timeout_s: float) -> bool:
        """Wait until ``predicate(self)`` holds (checked whenever something arrives)."""
        with self._cond:
            return bool(self._cond.wait_for(lambda: predicate(self) or self.closed, timeout_s)) and predicate(
                self
            )

    def wait_complete(self, after: int, timeout_s: float = 30.0) -> Frame:
        """The next complete frame once more than ``after`` frames are complete (``completed`` before
        the camera was sent)."""
        if not self.wait_for(lambda c: c.completed > after, timeout_s):
            raise TimeoutError(f"viewer: no complete frame within {timeout_s} s (status: {self.status!r})")
        assert self.last_complete is not None
        return self.last_complete

    def close(self) -> None:
        self._ws.close()
        self._thread.join(timeout=5)
