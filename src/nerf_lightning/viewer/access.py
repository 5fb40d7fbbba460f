"""Who may open the viewer: a token beyond the loopback, as Jupyter does.

On a loopback host (``127.0.0.1``, ``localhost``, ``::1``) only this machine's users can reach the port,
and the viewer asks for nothing. On any other host (``0.0.0.0``: every interface) anyone who can reach
the port could watch the scene and write camera paths into the run folder, so the viewer requires a
token: one generated per launch (:func:`secrets.token_urlsafe`) unless ``token=`` sets it, printed in
the URL (``http://HOST:PORT/?token=...``). A ``token=`` on a loopback host is required too.

The check sits in the HTTP handshake, before viser sends anything: the page (``GET /``) and the
websocket upgrade each need the token, in the query (``?token=``) or in the cookie that the page's
first answer sets (viser's page opens its websocket without the page's query, and browsers send a
host's cookies with a websocket upgrade). Anything else is answered ``403 Forbidden`` with one line
that says where the token is. viser has no hook for the handshake: :func:`gated` wraps the
``process_request`` that viser passes to ``websockets.asyncio.server.serve`` while the server starts,
and the server refuses to run when the wrap did not take (a viser that starts differently).
"""

from __future__ import annotations

import hmac
import http
import ipaddress
import re
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs, urlsplit

from nerf_lightning.errors import UserError

__all__ = ["TokenGate", "check_token", "gated", "is_loopback", "viewer_token"]

#: characters a token may hold: it goes into a URL and a cookie as it is
_TOKEN = re.compile(r"^[A-Za-z0-9._~-]+$")
#: random bytes of a generated token (32 URL-safe characters)
TOKEN_BYTES = 24


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine's loopback interface."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: resolved by the system, may be any interface
        return False


def check_token(token: Any, key: str = "token") -> str | None:
    """``token`` as a string (None: none given); a :class:`UserError` naming ``key`` when it is not
    usable in a URL."""
    if token is None:
        return None
    text = str(token)
    if not _TOKEN.match(text):
        raise UserError(
            f"{key}={text!r}: expected a non-empty token of letters, digits and - _ . ~ (it goes into the "
            "viewer's URL); leave it unset for one generated per launch"
        )
    return text


def viewer_token(host: str, token: str | None, key: str = "token") -> str | None:
    """The token the viewer on ``host`` requires: ``token`` when given, else a new one beyond the
    loopback, else None (no token)."""
    given = check_token(token, key)
    if given is not None:
        return given
    return None if is_loopback(host) else secrets.token_urlsafe(TOKEN_BYTES)


class TokenGate:
    """The handshake check of one viewer (see the module docstring). ``token`` None: everyone enters."""

    def __init__(self, token: str | None, port: int) -> None:
        self.token = token
        self.cookie = f"nerf_lightning_viewer_{port}"  # cookies are per host, not per port
        self.installed = False
        self.refused = 0

    def _matches(self, value: str | None) -> bool:
        return value is not None and self.token is not None and hmac.compare_digest(value, self.token)

    def _query_token(self, path: str) -> str | None:
        values = parse_qs(urlsplit(path).query).get("token")
        return values[-1] if values else None

    def _cookie_token(self, headers: Any) -> str | None:
        jar: SimpleCookie = SimpleCookie()
        for raw in headers.get_all("Cookie"):
            try:
                jar.load(raw)
            except Exception:  # noqa: BLE001 - a malformed cookie header is no token
                continue
        morsel = jar.get(self.cookie)
        return None if morsel is None else morsel.value

    def wrap(self, inner: Callable[[Any, Any], Any] | None) -> Callable[[Any, Any], Any]:
        """``process_request`` for ``websockets.asyncio.server.serve``: refuse without the token, else
        answer as ``inner`` (viser's page server) would, setting the cookie when the query had it."""
        self.installed = True

        def process_request(connection: Any, request: Any) -> Any:
            if self.token is None:
                return inner(connection, request) if inner is not None else None
            in_query = self._matches(self._query_token(request.path))
            if not (in_query or self._matches(self._cookie_token(request.headers))):
                self.refused += 1
                return connection.respond(
                    http.HTTPStatus.FORBIDDEN,
                    "this viewer needs its token: open the URL it printed (http://HOST:PORT/?token=...)\n",
                )
            response = inner(connection, request) if inner is not None else None
            if response is not None and in_query:
                response.headers["Set-Cookie"] = (
                    f"{self.cookie}={self.token}; Path=/; HttpOnly; SameSite=Strict"
                )
            return response

        return process_request


@contextmanager
def gated(gate: TokenGate) -> Iterator[None]:
    """While it is open, websocket servers started in this process check ``gate`` in their handshake
    (open it around ``viser.ViserServer(...)``, which starts its server before it returns)."""
    import websockets.asyncio.server as ws_server

    serve = ws_server.serve

    def gated_serve(*args: Any, **kwargs: Any) -> Any:
        kwargs["process_request"] = gate.wrap(kwargs.get("process_request"))
        return serve(*args, **kwargs)

    ws_server.serve = gated_serve  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        ws_server.serve = serve  # type: ignore[misc]
