"""The viewer under load: a browser that stops reading costs the training loop nothing and holds no growing
queue (its frames are dropped, not queued).

The training loop is real CPU work (an MLP's optimizer steps) with the real :class:`ViewerCallback`
between the steps, serving a real viser server over real sockets; the field it renders is noise (see
``standin.py``), so that every frame is a full-size JPEG that fills the link fast. The viewer's budget
is 0.5 here (render time up to a third of the run): a server that kept rendering for the silent browser
would cost the loop that third, far beyond the tolerance. The tolerance is the issue's bound, 10 %;
on an idle 2-core machine the two loops measure within 2 % of each other.
"""

from __future__ import annotations

import socket
import statistics
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("viser")

import msgspec
import torch
from viser import __version__ as viser_version
from viser import _messages as messages
from websockets.client import ClientProtocol
from websockets.protocol import State
from websockets.uri import parse_uri

from nerf_lightning.viewer.browser_camera import wxyz_of
from nerf_lightning.viewer.callback import ViewerCallback
from nerf_lightning.viewer.link import behind_limit, bytes_in_flight
from nerf_lightning.viewer.server import ViewerServer

from .standin import noise_server, ring_info

#: steps/s with a silent browser may be this much lower than with none (the issue's bound: 10 %)
TOLERANCE = 0.10
SLICE_S, SLICES = 0.25, 12  # turns of each loop: 3 s of training each
MAX_SIZE = 128  # px: a noise JPEG of 128x96 is ~20 kB


class SilentBrowser:
    """A browser that opens the viewer, sends its camera and never reads again (a tab whose link went
    quiet): a plain socket with a small receive buffer, speaking websockets' protocol without I/O."""

    def __init__(self, port: int, receive_buffer: int = 16384) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.connect(("127.0.0.1", port))
        self.protocol = ClientProtocol(
            parse_uri(f"ws://127.0.0.1:{port}/"),
            subprotocols=[f"viser-v{viser_version}"],  # type: ignore[list-item]
        )
        self.protocol.send_request(self.protocol.connect())
        self._flush()
        while self.protocol.state is State.CONNECTING:  # the handshake's answer: the last bytes it reads
            self.protocol.receive_data(self.sock.recv(4096))
        assert self.protocol.state is State.OPEN
        c2w = ring_info().poses[0]
        camera = messages.ViewerCameraMessage(
            wxyz=tuple(float(v) for v in wxyz_of(c2w)),  # type: ignore[arg-type]
            position=tuple(float(v) for v in c2w[:3, 3]),  # type: ignore[arg-type]
            fov=0.8, near=0.01, far=1000.0, image_height=MAX_SIZE * 3 // 4, image_width=MAX_SIZE,
            look_at=(0.5, 0.5, 0.5), up_direction=(0.0, 0.0, 1.0),
        )  # fmt: skip
        self.protocol.send_binary(msgspec.msgpack.encode(camera.as_serializable_dict()))
        self._flush()

    def _flush(self) -> None:
        self.sock.sendall(b"".join(self.protocol.data_to_send()))

    def close(self) -> None:
        self.sock.close()


class TrainingLoop:
    """Optimizer steps of a small MLP on the CPU, the viewer callback after each (as Lightning calls it)."""

    def __init__(self, callback: ViewerCallback) -> None:
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
            torch.nn.Linear(128, 4),
        )  # fmt: skip
        self.opt = torch.optim.Adam(self.net.parameters(), lr=1e-3)
        self.x, self.y = torch.randn(1024, 32), torch.randn(1024, 4)
        self.callback = callback
        self.trainer = SimpleNamespace(
            global_step=0, max_steps=-1, callback_metrics={}, should_stop=False, received_sigterm=False
        )
        self.module = SimpleNamespace()

    def step(self) -> None:
        loss = torch.nn.functional.mse_loss(self.net(self.x), self.y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.trainer.global_step += 1
        self.callback.on_train_batch_end(self.trainer, self.module, None, None, self.trainer.global_step)

    def run(self, seconds: float) -> tuple[float, float]:
        """(steps/s, seconds) of ``seconds`` of training."""
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            self.step()
            steps += 1
        took = time.perf_counter() - start
        return steps / took, took

    def until(self, predicate, timeout_s: float) -> bool:  # noqa: ANN001
        end = time.perf_counter() + timeout_s
        while time.perf_counter() < end:
            if predicate():
                return True
            self.step()
        return False


def _client_buffer(server, client_id: int):  # noqa: ANN001, ANN202
    """viser's queue of messages for one browser (what would grow if frames were queued)."""
    return server.viser._websock_server._client_state_from_id[client_id].message_buffer


def _loop_with_viewer() -> tuple[TrainingLoop, ViewerServer]:
    server = noise_server(max_size=MAX_SIZE, preview_size=32, training=True, refresh_every_s=0.05)
    callback = ViewerCallback(budget=0.5, burst_every_s=0.05, max_bank_s=0.05, stats_every_s=0.2)
    callback.attach(server, pipelined=False, sync=lambda: None, controls=False)
    return TrainingLoop(callback), server


def _with_a_silent_browser(slices: int) -> dict[str, list[float]]:
    """Two identical training loops, each with its viewer: one without a browser, one with a browser that
    stopped reading. They take ``slices`` turns of ``SLICE_S`` (the machine's other load falls on both
    alike); returns each loop's steps/s per turn. Checks on the way that the silent browser's frames are
    dropped, not queued."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    (alone, quiet_server), (watched, server) = _loop_with_viewer(), _loop_with_viewer()
    rates: dict[str, list[float]] = {"none": [], "silent": []}
    try:
        alone.run(0.3)  # warm-up: allocator, Adam's state
        browser = SilentBrowser(server.port)
        assert watched.until(lambda: server.n_browsers == 1, 10)
        (cid,) = (s["id"] for s in server.browser_stats())
        # it takes frames until its link is full, then is found behind
        assert watched.until(lambda: server.browser_stats()[0]["behind"], 30), server.browser_stats()
        before = server.browser_stats()[0]
        in_flight = bytes_in_flight(server.viser, cid)
        broadcast = len(server.viser._websock_server._broadcast_buffer.message_from_id)

        for _ in range(slices):
            for name, loop in (("none", alone), ("silent", watched)):
                rate, _took = loop.run(SLICE_S)
                rates[name].append(rate)

        after = server.browser_stats()[0]
        assert before["sent"] >= 2  # the preview and frames went out before the link filled
        # nothing rendered or sent for it while it is behind: dropped, not queued
        assert after["sent"] == before["sent"] and after["behind"] and after["dropped"] > before["dropped"]
        # the server holds no more than it held when the link filled: the socket's bytes, at most one
        # pending picture in viser's queue for it, the shared scene's messages (each replaced by its
        # next value: the panel's statistics)
        assert in_flight <= bytes_in_flight(server.viser, cid) + 1 <= 2 * behind_limit(MAX_SIZE**2)
        pending = list(_client_buffer(server, cid).message_from_id.values())
        assert sum(isinstance(m, messages.BackgroundImageMessage) for m in pending) <= 1
        assert len(pending) <= 8, [type(m).__name__ for m in pending]
        assert len(server.viser._websock_server._broadcast_buffer.message_from_id) <= broadcast + 4
        assert quiet_server.frames_sent == 0

        browser.close()  # the server lets it go
        assert watched.until(lambda: server.n_browsers == 0, 10)
    finally:
        server.close()
        quiet_server.close()
        torch.set_num_threads(threads)
    return rates


def test_a_browser_that_stops_reading_holds_no_queue() -> None:
    """Its frames are dropped, not queued, while training goes on (a few turns: what is held, not how
    fast)."""
    rates = _with_a_silent_browser(slices=2)
    assert all(r > 0 for r in rates["none"] + rates["silent"])


@pytest.mark.timing
def test_a_browser_that_stops_reading_costs_the_loop_nothing() -> None:
    """steps/s with a silent browser within ``TOLERANCE`` of steps/s without one. Meaningful on an idle
    machine (``make test-timing``): the median of the turns' ratios rides out a burst of other load, not
    a machine that other jobs keep busy."""
    rates = _with_a_silent_browser(SLICES)
    ratio = statistics.median(s / n for n, s in zip(rates["none"], rates["silent"], strict=True))
    none, silent = statistics.median(rates["none"]), statistics.median(rates["silent"])
    print(f"steps/s: no browser {none:.1f}, a silent browser {silent:.1f} (median ratio {ratio:.3f})")
    assert ratio >= 1 - TOLERANCE, f"steps/s: none {none:.1f}, a silent browser {silent:.1f} ({ratio:.3f})"
