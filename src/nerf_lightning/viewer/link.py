"""How far a browser is behind: the bytes sent to it that it has not taken yet.

A browser on a slow link, or one that stopped reading (a tab in the background, a laptop asleep), must
cost the training loop nothing and hold no growing queue. viser's sends run on its own event loop, so a
full socket never blocks the thread that renders; while its socket is full, viser keeps the newest
frame of each browser and drops the older ones (its message buffer replaces a queued background image
with the next). What remains is the render time of frames nobody will see: the server asks
:func:`bytes_in_flight` before it renders for a browser and skips (drops) its frames while more than
:func:`behind_limit` bytes are on their way, so each browser has at most about two frames in flight.

The bytes in flight are the event loop's write buffer for the connection plus the kernel's send queue
(``TIOCOUTQ``: sent bytes not yet acknowledged by the browser's machine, Linux). Both are read through
viser's private connection table; a viser without it reads as 0 in flight (never behind: the buffer
above still bounds the memory).
"""

from __future__ import annotations

import struct
from typing import Any

__all__ = ["MIN_BEHIND_BYTES", "behind_limit", "bytes_in_flight"]

#: in flight below this never counts as behind: a healthy link to another machine holds its
#: bandwidth-delay product (20 MB/s x 10 ms) in the kernel's queue
MIN_BEHIND_BYTES = 256 * 1024


def behind_limit(frame_pixels: int) -> int:
    """Bytes in flight beyond which a browser that is sent frames of ``frame_pixels`` is behind: two
    uncompressed frames (a JPEG is smaller), at least :data:`MIN_BEHIND_BYTES`."""
    return max(MIN_BEHIND_BYTES, 2 * 3 * int(frame_pixels))


def _connection(viser_server: Any, client_id: int) -> Any:
    live = getattr(getattr(viser_server, "_websock_server", None), "_live_connections", None)
    return live.get(client_id) if isinstance(live, dict) else None


def bytes_in_flight(viser_server: Any, client_id: int) -> int:
    """Bytes sent to browser ``client_id`` of ``viser_server`` that it has not acknowledged yet (0 when
    unknown: the connection closed, or a viser without the table)."""
    connection = _connection(viser_server, client_id)
    transport = getattr(connection, "transport", None)
    if transport is None or transport.is_closing():
        return 0
    pending = int(transport.get_write_buffer_size())
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            import fcntl
            import termios

            queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
            pending += struct.unpack("i", queued)[0]
        except (
            ImportError,
            OSError,
            AttributeError,
            ValueError,
        ):  # not Linux, or the socket closed meanwhile
            pass
    return pending
