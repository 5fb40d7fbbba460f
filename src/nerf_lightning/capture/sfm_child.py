"""Structure from motion in a child process, so that a signal always ends the caller cleanly.

COLMAP's native code does not stop on a Python signal: glog's failure handler (installed when
pycolmap is imported) answers SIGTERM with a stack dump and kills the process before any clean-up, and
a step cancelled half-way can leave native threads that abort the interpreter when it exits. Here the
solve (:func:`~nerf_lightning.capture.sfm.run_sfm`) runs in a spawned child; the caller only reads its
progress and result. Ctrl-C, SIGTERM or any error in the caller kills the child (SIGKILL: nothing of
it runs on), waits for it, and re-raises: the caller's own clean-up (the build folder) and its one-line
message follow as for any other interruption.

The child ignores SIGINT (a Ctrl-C in the terminal reaches the whole process group: the caller answers
it) and dies with its caller (``PR_SET_PDEATHSIG`` on Linux), so a caller killed with SIGKILL leaves no
solver running.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
from pathlib import Path
from typing import Any

from nerf_lightning.capture.sfm import Progress, SfmOptions, SfmResult, run_sfm

__all__ = ["run_sfm_in_child"]

_POLL_S = 0.25


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(Exception):  # Linux only; elsewhere the parent's kill() is the only guard
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


def _child(
    image_dir: str, names: list[str], work_dir: str, options: SfmOptions, conn: Any, parent: int
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent)
    try:
        result = run_sfm(image_dir, names, work_dir, options, lambda *p: conn.send(("progress", *p)))
        conn.send(("done", result))
    except BaseException as err:  # noqa: BLE001 - re-raised in the caller
        try:
            conn.send(("error", err))
        except Exception:  # noqa: BLE001 - an exception that does not pickle: its text
            conn.send(("error", RuntimeError(f"{type(err).__name__}: {err}")))
    finally:
        conn.close()


def run_sfm_in_child(
    image_dir: str | Path,
    names: list[str],
    work_dir: str | Path,
    options: SfmOptions,
    on_progress: Progress | None = None,
) -> SfmResult:
    """:func:`~nerf_lightning.capture.sfm.run_sfm` in a spawned child process; same arguments, result
    and errors (a :class:`~nerf_lightning.errors.UserError` of the solve is raised here)."""
    report: Progress = on_progress or (lambda stage, done, total: None)
    ctx = mp.get_context("spawn")  # a fresh interpreter: no threads or CUDA state of the caller
    receiver, sender = ctx.Pipe(duplex=False)
    args = (str(image_dir), list(names), str(work_dir), options, sender, os.getpid())
    child = ctx.Process(target=_child, args=args, name="structure-from-motion", daemon=True)
    child.start()
    sender.close()
    try:
        while True:
            if not receiver.poll(_POLL_S):
                if not child.is_alive() and not receiver.poll(0):
                    raise RuntimeError(
                        f"structure from motion: the solver process died (exit status {child.exitcode})"
                    )
                continue
            try:
                kind, *payload = receiver.recv()
            except EOFError:
                raise RuntimeError(
                    f"structure from motion: the solver process died (exit status {child.exitcode})"
                ) from None
            if kind == "progress":
                report(*payload)
            elif kind == "error":
                raise payload[0]
            else:
                child.join()
                return payload[0]
    except BaseException:
        child.kill()  # Ctrl-C, SIGTERM, an error here: nothing of the solve runs on
        child.join()
        raise
    finally:
        receiver.close()
