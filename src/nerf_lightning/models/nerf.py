"""The model Hydra builds (``model.net``): field, renderer, per-view parts, the training step and its loss.

``model.net`` is a ``_partial_`` node of :func:`build_nerf`; the train app calls it with what the capture
decides (``run/model_node.py``), and :class:`~nerf_lightning.models.module.NeRFModule` gets the one
:class:`NeRF` it returns. The state dict keeps the names it had when the module built these parts itself
(``field.*``, ``renderer.*``, ``camera_opt.*``, ``appearance.*``): the module holds them under those names.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from torch import Tensor

from nerf_lightning.config_schema import Formerly, Injected, Note
from nerf_lightning.models.appearance import PerViewExposure
from nerf_lightning.models.camera_opt import CameraOptimizer
from nerf_lightning.models.field import NGPField
from nerf_lightning.models.loss import StepLoss
from nerf_lightning.models.per_view import build_if_enabled
from nerf_lightning.models.train_step import TrainStep, train_step
from nerf_lightning.ops import Backend, BackendName
from nerf_lightning.volume.renderer import Renderer, build_renderer

__all__ = ["NeRF", "build_nerf"]


@dataclass(frozen=True)
class NeRF:
    """The parts of one NeRF, built for one capture."""

    #: the radiance field
    field: NGPField
    #: the ray marcher and compositor, with its occupancy grid
    renderer: Renderer
    #: the training step, sharing the field, the renderer and the per-view parts
    step: TrainStep
    #: the step's loss, ``alpha_weight`` resolved for the capture
    loss: StepLoss
    #: builds another field of the same shape (the full copy that evaluation renders with under FSDP)
    new_field: Callable[[], NGPField]
    #: the learned camera-pose corrections of the training views, or None (off)
    camera_opt: CameraOptimizer | None = None
    #: the learned per-view exposure of the training views, or None (off)
    appearance: PerViewExposure | None = None


def build_nerf(
    field: Annotated[Callable[..., NGPField], Formerly("model.field")],
    renderer: Annotated[Callable[..., Renderer] | None, Formerly("model.renderer")] = None,
    step: Annotated[Callable[..., TrainStep] | None, Formerly("model.step")] = None,
    loss: StepLoss | None = None,
    camera_opt: Annotated[Callable[..., CameraOptimizer] | None, Formerly("model.camera_opt")] = None,
    appearance: Annotated[Callable[..., PerViewExposure] | None, Formerly("model.appearance")] = None,
    backend: Annotated[
        BackendName,
        Note("auto: our CUDA kernels for CUDA tensors, else torch"),
        Formerly("model.renderer.ops_backend"),
        Formerly("model.ops_backend"),
        Formerly("model.field.encoding.backend"),
        Formerly("model.field.mlp_backend"),
        # the same three keys once their nodes moved into model.net (a stored config's, read in this order)
        Formerly("model.net.renderer.ops_backend"),
        Formerly("model.net.field.encoding.backend"),
        Formerly("model.net.field.mlp_backend"),
        Formerly("model.backend"),
    ] = "auto",
    *,
    aabb_scale: Annotated[int, Injected("the train app: the capture's box")] = 1,
    n_train_views: Annotated[int, Injected("the train app: the capture's training views")] = 0,
    train_poses: Annotated[Tensor | None, Injected("the train app: the training views' poses")] = None,
    photograph: Annotated[bool, Injected("the train app: whether the capture is photographs")] = False,
) -> NeRF:
    """The ``model.net`` node: the parts built for a capture.

    Args:
        field: factory (``_partial_``) of the radiance field, called with ``aabb_scale``.
        renderer: factory of the renderer (``volume/renderer.py``'s ``build_renderer`` with its
            ``occupancy`` grid), called with ``aabb_scale``. None: instant-ngp's defaults.
        step: factory of the training step (``models/train_step.py``'s ``train_step``), called with the
            field, the renderer, the loss and the per-view parts. None: a step without a sample budget.
        loss: the loss's kind and weights (``models/loss.py``). None: its defaults.
        camera_opt: factory of the learned camera-pose corrections (``models/camera_opt.py``), called
            with ``n_views``, ``poses`` and ``photograph``; kept only when it is enabled. None: off.
        appearance: factory of the learned per-view exposure (``models/appearance.py``), called with
            ``n_views`` and ``photograph``; kept only when it is enabled. None: off.
        backend: the ops backend of the whole step (``model.net.backend``, ``ops/registry.py``): read
            here, once, and handed to the field (encodings, MLPs) and the renderer (marching,
            compositing, occupancy grid, the step's loss kernels). ``auto``: our CUDA kernels for CUDA
            tensors when the extension loads, else the PyTorch reference; ``cuda``; ``tcnn`` (the hash
            grid on tiny-cuda-nn); ``torch``.
        aabb_scale: outer box size (from the capture; see ``data/types.py``).
        n_train_views: training views of the capture: the per-view parts' sizes.
        train_poses: float [V, 3, 4] NGP-space given poses of the training views (the camera
            corrections' gauge). None when the state is loaded from a checkpoint next.
        photograph: whether the capture is photographs (``enabled`` and ``alpha_weight``: auto).
    """
    resolved = (loss if loss is not None else StepLoss()).resolved(photograph)
    ops = Backend(backend)  # resolved once: every op of the step runs on it
    new_field = functools.partial(field, aabb_scale=aabb_scale, backend=ops)
    built_field = new_field()
    built_renderer = (renderer or build_renderer)(aabb_scale=aabb_scale, backend=ops)
    cameras = build_if_enabled(camera_opt, n_views=n_train_views, poses=train_poses, photograph=photograph)
    exposure = build_if_enabled(appearance, n_views=n_train_views, photograph=photograph)
    step_factory = step if step is not None else functools.partial(train_step, sample_budget=None)
    built_step = step_factory(built_field, built_renderer, resolved, camera_opt=cameras, appearance=exposure)
    return NeRF(built_field, built_renderer, built_step, resolved, new_field, cameras, exposure)
