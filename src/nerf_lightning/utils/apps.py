"""Shared plumbing of the apps that work on a trained checkpoint (``eval``, ``render``, ``export``)."""

from __future__ import annotations

import re
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

__all__ = ["device_of", "nested_overrides", "normalize_app_argv"]

# `data.x=...` / `model.x=...` override keys of the *checkpoint's* config: those nodes are empty in
# the app's own config, so the override must be allowed to add keys (`++`).
_NESTED = re.compile(r"^(data|model)\.")
_NUMERIC_GROUP_CHOICE = re.compile(r"^(\+{0,2}precision)=(\d+)$")


def normalize_app_argv(argv: list[str], positional: str | None = None) -> list[str]:
    """``data.k=v`` -> ``++data.k=v`` (same for ``model.``); ``precision=32`` -> ``precision='32'``; a
    leading bare word -> ``<positional>=word`` (``python -m nerf_lightning.export mesh ...``)."""
    out = []
    for i, arg in enumerate(argv):
        if positional and i == 0 and "=" not in arg and not arg.startswith("-"):
            arg = f"{positional}={arg}"
        arg = _NUMERIC_GROUP_CHOICE.sub(r"\1='\2'", arg)  # precision=32: a group choice, not an int
        out.append(f"++{arg}" if _NESTED.match(arg) else arg)
    return out


def nested_overrides(node: Any) -> dict[str, Any]:
    """A config node of overrides as a plain nested dict ({} when unset)."""
    if node is None:
        return {}
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]
    return dict(node)


def device_of(accelerator: str) -> torch.device:
    """``auto``/``gpu``/``cuda``: the first GPU when there is one, else the CPU; ``cpu``: the CPU."""
    if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        return torch.device("cuda", 0)
    return torch.device("cpu")
