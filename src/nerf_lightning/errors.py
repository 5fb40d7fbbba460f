"""Errors a user can act on, and the entry points' boundary that prints them in one line.

A :class:`UserError` means the input is wrong (a capture, a config value, a checkpoint path), not the
code. Its message names the file or config key, what was expected and what to do. The Hydra apps
(``train``, ``eval``, ``render``, ``export``) run their task inside :func:`user_errors`, which prints
``error: <message>`` to stderr, logs it to the job's log file and exits with status 2 — no Python
traceback. ``HYDRA_FULL_ERROR=1`` re-raises instead, so the full trace is one variable away.

Errors raised by libraries for bad user input are converted at that boundary as well:
``ValueError`` raised while *instantiating* a config node (a constructor rejecting a value; Hydra
wraps it in ``InstantiationException``), and OmegaConf's missing-value / interpolation errors (an
unset ``???`` key or environment variable).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["UserError", "as_user_error", "user_errors", "EXIT_USER_ERROR"]

log = logging.getLogger("nerf_lightning")

#: exit status of a run stopped by a :class:`UserError` (1 stays "the code failed")
EXIT_USER_ERROR = 2


class UserError(Exception):
    """Bad input the user can fix; the message is one actionable line (file/key, expected, what to do)."""


def as_user_error(err: BaseException) -> UserError | None:
    """The :class:`UserError` that ``err`` stands for, or None when it is a bug (keep the traceback)."""
    from hydra.errors import InstantiationException
    from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:  # look through exception chains (Hydra wraps)
        seen.add(id(cur))
        if isinstance(cur, UserError):
            return cur
        if isinstance(cur, MissingMandatoryValue):
            key = getattr(cur, "full_key", None) or "?"
            return UserError(f"config key `{key}` has no value (???): pass `{key}=...` on the command line")
        if isinstance(cur, InterpolationResolutionError):
            key = getattr(cur, "full_key", None) or "?"
            msg = str(cur).splitlines()[0].split("resolving interpolation: ", 1)[-1].strip("\"'")
            return UserError(f"config key `{key}`: {msg} (set it on the command line or in the environment)")
        cur = cur.__cause__ or cur.__context__
    if isinstance(err, InstantiationException):
        cause = err.__cause__
        if isinstance(cause, ValueError):
            key = _full_key(err)
            where = f"config `{key}`: " if key else ""
            return UserError(f"{where}{cause}")
    return None


def _full_key(err: BaseException) -> str | None:
    for line in str(err).splitlines():
        if line.startswith("full_key:"):
            return line.split(":", 1)[1].strip() or None
    return None


@contextmanager
def user_errors() -> Iterator[None]:
    """Run the body; a user error becomes one ``error: ...`` line on stderr and exit status 2."""
    try:
        yield
    except Exception as err:
        user = as_user_error(err)
        if user is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        _to_log_files(f"error: {user}")
        print(f"error: {user}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_USER_ERROR) from None


def _to_log_files(message: str) -> None:
    """Record ``message`` in the job's log file(s) only: the console gets the one stderr line."""
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)

