"""The ``model`` config node built with the values a run decides: its ``net`` node gets them.

``model.net`` is a ``_partial_`` node (``models/nerf.py``'s ``build_nerf``): the train app, and eval /
render / export from a checkpoint's stored values, call it with what the capture decides (its box, its
training views and their poses, whether it is photographs), and the module gets the one object it builds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import hydra
from omegaconf import DictConfig

__all__ = ["instantiate_model"]


def instantiate_model(node: DictConfig, run_values: Mapping[str, Any], **passed: Any) -> Any:
    """``node`` instantiated, its ``net`` called with ``run_values`` first; ``passed``: further
    arguments of the module itself (the run's feedback)."""
    if "net" not in node:  # a model node without a net: the values go to the module itself
        return hydra.utils.instantiate(node, **run_values, **passed)
    factory = hydra.utils.instantiate(node, _partial_=True)
    net = factory.keywords["net"](**run_values)
    return factory(net=net, **passed)
