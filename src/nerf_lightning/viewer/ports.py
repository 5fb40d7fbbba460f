"""The viewer's port: taken or free, checked before the server starts.

viser moves to the next port by itself when the one asked for is taken; the viewer does not, since a
URL that differs from the one asked for breaks an SSH tunnel (``ssh -L 7007:localhost:7007``) without a
word. A taken port is a :class:`UserError` naming it and a free one to use instead; a host that is no
address of this machine (``EADDRNOTAVAIL``) one naming the host.
"""

from __future__ import annotations

import errno
import socket

from nerf_lightning.errors import UserError

__all__ = ["bind_error", "check_port", "is_free", "next_free_port"]


def bind_error(host: str, port: int) -> OSError | None:
    """Why a server cannot listen on ``host:port`` now (as asyncio's servers bind: address reuse on);
    None when it can."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            return err
    return None


def is_free(host: str, port: int) -> bool:
    """Whether a server can listen on ``host:port`` now."""
    return bind_error(host, port) is None


def next_free_port(host: str, start: int, tries: int = 100) -> int | None:
    """The first free port in ``start .. start + tries - 1`` (None when all are taken)."""
    for port in range(max(1, start), min(65536, start + tries)):
        if is_free(host, port):
            return port
    return None


def check_port(host: str, port: int, prefix: str = "") -> None:
    """Raise :class:`UserError` when the server cannot listen on ``host:port`` (a ``viewer/options.Port``;
    port 0: the system picks one, always free): the port is taken, or ``host`` is no address of this
    machine. ``prefix``: where the keys live (``viewer.`` for the train app's, ``""`` for the view app's)."""
    err = bind_error(host, port)
    if err is None:
        return
    if isinstance(err, socket.gaierror) or err.errno == errno.EADDRNOTAVAIL:
        raise UserError(
            f"{prefix}host={host}: not an address of this machine ({(err.strerror or str(err)).lower()}); "
            f"use {prefix}host=127.0.0.1 (this machine only) or {prefix}host=0.0.0.0 (every interface)"
        )
    free = next_free_port(host, port + 1)
    hint = f"pass {prefix}port={free} (free now)" if free is not None else f"pass another {prefix}port="
    raise UserError(f"{prefix}port={port}: {host}:{port} is already in use (another viewer?); {hint}")
