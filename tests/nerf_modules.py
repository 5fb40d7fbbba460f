"""A :class:`NeRFModule` from the arguments it took before ``model.net`` (issue 65): the net's parts,
the capture's values, the ops backend and the loss keys go to ``build_nerf``, the rest to the module."""

from __future__ import annotations

from typing import Any

from nerf_lightning.models.loss import StepLoss
from nerf_lightning.models.module import NeRFModule
from nerf_lightning.models.nerf import build_nerf

_NET = ("field", "renderer", "step", "camera_opt", "appearance", "backend", "aabb_scale", "n_train_views",
        "train_poses", "photograph")  # fmt: skip
_LOSS = {"loss": "kind", "huber_delta": "huber_delta", "distortion_weight": "distortion_weight",
         "alpha_weight": "alpha_weight"}  # fmt: skip


def nerf_module(**kwargs: Any) -> NeRFModule:
    """``NeRFModule(net=build_nerf(...), ...)`` of the flat arguments ``kwargs``."""
    net = {k: kwargs.pop(k) for k in _NET if k in kwargs}
    loss = {name: kwargs.pop(k) for k, name in _LOSS.items() if k in kwargs}
    return NeRFModule(net=build_nerf(**net, loss=StepLoss(**loss)), **kwargs)
