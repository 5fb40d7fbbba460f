"""Which mode a W&B run can start in: online, or offline when there is no API key or no network.

The probe never prompts and never blocks for long: an API key in the environment or netrc, then one
bounded TCP connect to the W&B host. An explicit ``WANDB_MODE`` wins over ``auto``.
"""

from __future__ import annotations

import netrc
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

__all__ = ["resolve_wandb_mode", "wandb_has_credentials", "wandb_host", "wandb_reachable"]

DEFAULT_WANDB_HOST = "https://api.wandb.ai"


def wandb_host() -> str:
    """Host name of the W&B server (``WANDB_BASE_URL``, default api.wandb.ai)."""
    url = os.environ.get("WANDB_BASE_URL") or DEFAULT_WANDB_HOST
    return urlparse(url if "://" in url else f"https://{url}").hostname or "api.wandb.ai"


def wandb_has_credentials(host: str | None = None) -> bool:
    """Whether W&B could authenticate without a prompt: an API key in the environment or in netrc."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = host or wandb_host()
    candidates = [os.environ["NETRC"]] if os.environ.get("NETRC") else []
    home = Path(os.path.expanduser("~"))
    candidates += [str(home / ".netrc"), str(home / "_netrc")]
    for path in candidates:
        if not os.path.isfile(path):
            continue
        try:
            entry = netrc.netrc(path).authenticators(host)
        except (netrc.NetrcParseError, OSError):
            continue  # an unreadable netrc is "no key", never an error
        if entry and entry[2]:
            return True
    return False


def wandb_reachable(host: str | None = None, timeout_s: float = 2.0) -> bool:
    """One TCP connect to the W&B host on 443, bounded by ``timeout_s`` (no HTTP, no auth)."""
    try:
        with socket.create_connection((host or wandb_host(), 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def resolve_wandb_mode(mode: str = "auto", timeout_s: float = 2.0) -> tuple[str, str]:
    """The mode ``wandb.init`` should run in, and why.

    Args:
        mode: ``auto`` (online when possible), ``online``, ``offline`` or ``disabled``. An explicit
            ``WANDB_MODE`` environment variable wins over ``auto``. ``online`` without credentials
            or network still falls back to offline: tracking must not stop training.
    Returns:
        ``(mode, reason)`` with mode in ``online | offline | disabled``.
    """
    env_mode = os.environ.get("WANDB_MODE", "").strip().lower()
    if mode == "auto" and env_mode:
        mode = {"dryrun": "offline", "run": "online"}.get(env_mode, env_mode)
    if mode not in ("auto", "online", "offline", "disabled"):
        raise ValueError(f"logger.wandb.mode must be auto | online | offline | disabled, got {mode!r}")
    if mode in ("offline", "disabled"):
        return mode, "requested" if env_mode != mode else "WANDB_MODE"
    host = wandb_host()
    if not wandb_has_credentials(host):
        return "offline", "no W&B API key"
    if not wandb_reachable(host, timeout_s):
        return "offline", f"{host} unreachable"
    return "online", "API key found"
