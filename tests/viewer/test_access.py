"""Who may open the viewer: beyond the loopback a token generated per launch, carried by the URL; a browser
without it (or with another) is refused in the handshake, before the server sends anything."""

from __future__ import annotations

import re
import urllib.error
import urllib.request

import pytest

pytest.importorskip("viser")

import viser
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from nerf_lightning.errors import UserError
from nerf_lightning.viewer.access import is_loopback, viewer_token
from nerf_lightning.viewer.client import HeadlessClient

from .standin import noise_server, ring_info

CANVAS = (64, 48)


def _refused(url: str) -> int:
    """The HTTP status that refused a websocket to ``url`` (fails the test when it was accepted)."""
    with pytest.raises(InvalidStatus) as refused:
        HeadlessClient(url, timeout_s=5).close()
    return refused.value.response.status_code


def _first_frame(url: str, server) -> tuple[int, int]:  # noqa: ANN001
    """Connect to ``url``, send a camera, render until the first complete frame: its (height, width)."""
    client = HeadlessClient(url)
    try:
        client.send_camera(ring_info().poses[0], 0.8, *CANVAS)
        for _ in range(200):
            server.render(0.05)
            if client.wait_for(lambda c: c.completed > 0, 0.05):
                break
        return client.wait_complete(0, timeout_s=5).image.shape[:2]
    finally:
        client.close()


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers)


def test_beyond_the_loopback_only_the_token_opens_the_viewer() -> None:
    server = noise_server(host="0.0.0.0")
    try:
        base = f"http://127.0.0.1:{server.port}"
        m = re.fullmatch(rf"http://localhost:{server.port}/\?token=([A-Za-z0-9_-]{{32}})", server.url)
        assert m, server.url  # a token generated for this launch, in the URL
        token = m.group(1)
        another = noise_server(host="0.0.0.0")
        another.close()
        assert another.token not in (None, token)  # another launch, another token

        # the websocket: refused without the token, with another, with one character off
        assert _refused(base) == 403
        assert _refused(f"{base}/?token=wrong") == 403
        assert _refused(f"{base}/?token={token[:-1]}") == 403
        assert server.n_browsers == 0 and server.gate.refused == 3
        # with it: a browser that gets frames
        assert _first_frame(f"{base}/?token={token}", server) == (48, 64)

        # the page: refused without; with the token in the query it sets the cookie that the page's own
        # websocket (opened without the query) brings
        status, _ = _get(base + "/")
        assert status == 403
        status, headers = _get(f"{base}/?token={token}")
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        cookie = headers["Set-Cookie"].split(";")[0]
        assert cookie == f"nerf_lightning_viewer_{server.port}={token}"
        with connect(
            base.replace("http", "ws"), subprotocols=[f"viser-v{viser.__version__}"],  # type: ignore[list-item]
            additional_headers={"Cookie": cookie}, open_timeout=5,
        ) as ws:  # fmt: skip
            assert ws.recv(timeout=5)  # the scene's first messages
        status, _ = _get(base + "/", {"Cookie": f"nerf_lightning_viewer_{server.port}=wrong"})
        assert status == 403
    finally:
        server.close()


def test_loopback_needs_no_token_unless_one_is_set() -> None:
    server = noise_server(host="127.0.0.1")
    try:
        assert server.token is None and server.url == f"http://localhost:{server.port}"
        assert _first_frame(server.url, server) == (48, 64)
    finally:
        server.close()
    server = noise_server(host="127.0.0.1", token="my-own.token~1")
    try:
        assert server.url == f"http://localhost:{server.port}/?token=my-own.token~1"
        assert _refused(f"http://localhost:{server.port}") == 403
        assert _first_frame(server.url, server) == (48, 64)
    finally:
        server.close()


def test_the_token_setting() -> None:
    assert [is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "localhost")] == [True] * 4
    assert [is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.5", "myhost")] == [False] * 4
    assert viewer_token("127.0.0.1", None) is None
    assert viewer_token("0.0.0.0", "abc") == "abc"
    assert viewer_token("0.0.0.0", 1234) == "1234"  # Hydra reads token=1234 as a number
    with pytest.raises(UserError, match=r"^viewer.token='a b': expected a non-empty token of letters"):
        viewer_token("0.0.0.0", "a b", key="viewer.token")
    with pytest.raises(UserError, match=r"^token='': expected"):
        viewer_token("0.0.0.0", "")
