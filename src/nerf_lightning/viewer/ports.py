"""The viewer's port: taken or free, checked before the server starts.

viser moves to the next port by itself when the one asked for is taken; the viewer does not, since a
URL that differs from the one asked for breaks an SSH tunnel (``ssh -L 7007:localhost:7007``) without a
word. A taken port is a :class:`UserError` naming it and a free one to use instead.
"""

from __future__ import annotations

import socket

from nerf_lightning.errors import UserError

__all__ = ["check_port", "is_free", "next_free_port"]


def is_free(host: str, port: int) -> bool:
    """Whether a server can listen on ``host:port`` now (as asyncio's servers bind: address reuse on)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def next_free_port(host: str, start: int, tries: int = 100) -> int | None:
    """The first free port in ``start .. start + tries - 1`` (None when all are taken)."""
    for port in range(max(1, start), min(65536, start + tries)):
        if is_free(host, port):
            return port
    return None


def check_port(host: str, port: int) -> None:
    """Raise :class:`UserError` when ``host:port`` (a ``viewer/options.Port``) is taken (port 0: the
    system picks one, always free)."""
    if port == 0 or is_free(host, port):
        return
    free = next_free_port(host, port + 1)
    hint = f"pass port={free} (free now)" if free is not None else "pass another port="
    raise UserError(f"port={port}: {host}:{port} is already in use (another viewer?); {hint}")
