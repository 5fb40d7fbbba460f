"""SIGHUP (the SSH session or the terminal closed) stops an app the way SIGTERM does.

Python's default for SIGHUP ends the process on the spot: a training lost the steps since its last
checkpoint, printed nothing and left its pid in the run folder's ``.lock``. :func:`hang_up_as_sigterm`
(every app, ``apps/entry.py``) sends the process a SIGTERM when a SIGHUP arrives, so whatever handles
SIGTERM handles it (Lightning in train and eval: ``last.ckpt`` written at that step; the apps' own
handler in render, export and process: partial outputs removed). :func:`interruption` then names the
signal that arrived in the one line, with exit status 129 for SIGHUP (128 + 1, as a shell reports
it) and 143 for SIGTERM. A SIGHUP that is ignored (``nohup``) stays ignored.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

from nerf_lightning.errors import HungUp, Interrupted

__all__ = ["hang_up_as_sigterm", "interruption", "stop_signal"]

_hung_up = False


def hang_up_as_sigterm() -> None:
    """From now on a SIGHUP is answered as a SIGTERM (unless SIGHUP is ignored: ``nohup``)."""
    global _hung_up
    _hung_up = False
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        return
    signal.signal(signal.SIGHUP, _relay)


def _relay(signum: int, frame: FrameType | None) -> None:
    global _hung_up
    _hung_up = True
    os.kill(os.getpid(), signal.SIGTERM)


def stop_signal() -> str:
    """The name of the signal that stops the app: ``SIGHUP`` once one arrived, else ``SIGTERM``."""
    return "SIGHUP" if _hung_up else "SIGTERM"


def interruption(message: str) -> Interrupted:
    """The stop that ends the app with ``message``: :class:`HungUp` (129) after a SIGHUP, else
    :class:`Interrupted` (143)."""
    return HungUp(message) if _hung_up else Interrupted(message)
