"""Errors a user can act on, the exit statuses of the apps, and the boundary that prints them in one line.

Every app (``train``, ``eval``, ``render``, ``export``) exits with 0 when it did what was asked, 1 on a
bug (a traceback), and otherwise with the status of the :class:`StopRun` that ended it:
:data:`EXIT_USER_ERROR` (2), :data:`EXIT_DIVERGED` (3), :data:`EXIT_INTERRUPTED` (143),
:data:`EXIT_HANGUP` (129) or :data:`EXIT_CTRL_C` (130);
``docs/exit_codes.md`` says what each leaves on disk.

A :class:`StopRun` ends a run with one line ``error: <message>`` on stderr (also in the job's log file)
and its exit status, no Python traceback; ``HYDRA_FULL_ERROR=1`` re-raises it instead, so the full
trace is one variable away. :class:`UserError` means the input is wrong, not the code: its message
names the file or config key, what was expected and what to do.

Errors raised by libraries for bad user input are converted at that boundary as well:
``ValueError`` raised while *instantiating* a config node (a constructor rejecting a value; Hydra
wraps it in ``InstantiationException``), OmegaConf's missing-value / interpolation errors (an unset
``???`` key or environment variable), an ``OSError`` that says the disk is full or the folder cannot
be written, and Lightning's ``SIGTERMException``.
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = [
    "EXIT_CTRL_C",
    "EXIT_DIVERGED",
    "EXIT_HANGUP",
    "EXIT_INTERRUPTED",
    "EXIT_USER_ERROR",
    "Cancelled",
    "Diverged",
    "HungUp",
    "Interrupted",
    "StopRun",
    "UserError",
    "as_stop",
    "io_error_line",
    "is_io_error",
    "user_errors",
    "writing_to",
    "written_file",
]

log = logging.getLogger("nerf_lightning")

#: exit status of a run stopped by a :class:`UserError` (1 stays "the code failed")
EXIT_USER_ERROR = 2
#: exit status of a training run that diverged (:class:`Diverged`)
EXIT_DIVERGED = 3
#: exit status of a run stopped by SIGTERM (:class:`Interrupted`): 128 + 15, as a shell reports it
EXIT_INTERRUPTED = 128 + 15

#: exit status of a run stopped by SIGHUP (:class:`HungUp`: the SSH session closed): 128 + 1
EXIT_HANGUP = 128 + 1

#: exit status of an app stopped by Ctrl-C (:class:`Cancelled`): 128 + 2 (SIGINT), as a shell reports it
EXIT_CTRL_C = 128 + 2

#: errno values of an ``OSError`` that the user fixes (space, permissions), not the code
_IO_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG, errno.ENOTDIR}


class StopRun(Exception):
    """A run that stops with a one-line message and an exit status of its own (:attr:`exit_code`)."""

    exit_code = 1


class UserError(StopRun):
    """Bad input the user can fix; the message is one actionable line (file/key, expected, what to do)."""

    exit_code = EXIT_USER_ERROR


class Diverged(StopRun):
    """Training produced a non-finite loss or non-finite weights; the message names the step."""

    exit_code = EXIT_DIVERGED


class Interrupted(StopRun):
    """The run was stopped by SIGTERM (preemption, ``timeout``, eviction) before it finished."""

    exit_code = EXIT_INTERRUPTED


class HungUp(Interrupted):
    """The run was stopped by SIGHUP (its terminal or SSH session closed), handled as SIGTERM."""

    exit_code = EXIT_HANGUP


class Cancelled(StopRun):
    """The user stopped the run with Ctrl-C (SIGINT) before it finished."""

    exit_code = EXIT_CTRL_C


def as_stop(err: BaseException) -> StopRun | None:
    """The :class:`StopRun` that ``err`` stands for, or None when it is a bug (keep the traceback)."""
    from hydra.errors import InstantiationException
    from lightning.pytorch.utilities.exceptions import SIGTERMException
    from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:  # look through exception chains (Hydra wraps)
        seen.add(id(cur))
        if isinstance(cur, StopRun):
            return cur
        if isinstance(cur, SIGTERMException):
            return Interrupted("stopped by SIGTERM before the run finished")
        if isinstance(cur, MissingMandatoryValue):
            key = getattr(cur, "full_key", None) or "?"
            return UserError(f"config key `{key}` has no value (???): pass `{key}=...` on the command line")
        if isinstance(cur, InterpolationResolutionError):
            key = getattr(cur, "full_key", None) or "?"
            msg = str(cur).splitlines()[0].split("resolving interpolation: ", 1)[-1].strip("\"'")
            return UserError(f"config key `{key}`: {msg} (set it on the command line or in the environment)")
        if isinstance(cur, OSError) and is_io_error(cur):
            return UserError(io_error_line(cur))
        cur = cur.__cause__ or cur.__context__
    if isinstance(err, InstantiationException):
        cause = err.__cause__
        if isinstance(cause, ValueError):
            key = _full_key(err)
            where = f"config `{key}`: " if key else ""
            return UserError(f"{where}{cause}")
    return None


def io_error_line(err: OSError, setting: str = "hydra.run.dir", where: str | None = None) -> str:
    """``<file>: <cause>; <what to do>`` of a failed write, e.g. ``run/checkpoints/last.ckpt: no space
    left on device; free space there or write elsewhere (hydra.run.dir=...)``.

    ``setting``: the key that chooses where the app writes (``out`` for export and process); ``where``:
    the file to name instead of the error's own (a build folder's file as it will be named)."""
    cause = (err.strerror or os.strerror(err.errno or 0)).lower()
    if where is None:
        where = written_file(err) or "a file"
    hint = {
        errno.ENOSPC: f"free space there or write elsewhere ({setting}=...)",
        errno.EDQUOT: f"free space there or write elsewhere ({setting}=...)",
        errno.EFBIG: "the file system or a ulimit refuses a file this large",
    }.get(err.errno or 0, f"choose a folder you can write ({setting}=...)")
    return f"{where}: {cause}; {hint}"


def written_file(err: OSError) -> str | None:
    """The file a failed write was writing: a copy's error names its source first (``filename``, shutil)
    and the file written second (``filename2``)."""
    written = err.filename2 if err.filename2 is not None else err.filename
    return None if written is None else str(written)


def is_io_error(err: BaseException) -> bool:
    """Whether ``err`` is a failed write the user fixes (space, permissions), not a bug."""
    return isinstance(err, OSError) and err.errno in _IO_ERRNOS


@contextmanager
def writing_to(setting: str) -> Iterator[None]:
    """Inside: a full disk or a folder that cannot be written ends the run as a :class:`UserError` whose
    advice names ``setting``, the key that chooses where this app writes (``out`` for export)."""
    try:
        yield
    except OSError as err:
        if not is_io_error(err):
            raise
        raise UserError(io_error_line(err, setting)) from err


def _full_key(err: BaseException) -> str | None:
    for line in str(err).splitlines():
        if line.startswith("full_key:"):
            return line.split(":", 1)[1].strip() or None
    return None


@contextmanager
def user_errors() -> Iterator[None]:
    """Run the body; a :class:`StopRun` (or what stands for one) becomes one ``error: ...`` line on
    stderr and its exit status (2: bad input, 3: diverged, 143: SIGTERM)."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    try:
        yield
    except (Exception, SIGTERMException) as err:
        stop = as_stop(err)
        if stop is None:
            raise
        if os.environ.get("HYDRA_FULL_ERROR") == "1":  # the traceback (exit status 1), never status 0
            if isinstance(err, Exception):
                raise
            raise stop from err  # Lightning's SIGTERMException is a SystemExit with status 0
        _to_log_files(f"error: {stop}")
        print(f"error: {stop}", file=sys.stderr, flush=True)
        raise SystemExit(stop.exit_code) from None


def _to_log_files(message: str) -> None:
    """Record ``message`` in the job's log file(s) only: the console gets the one stderr line."""
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)
