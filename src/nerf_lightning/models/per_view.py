"""What the per-training-view components (``camera_opt.py``, ``appearance.py``) share: the ``enabled``
switch and their optimizer parameter group.

Each component holds one small tensor per training view, learned with the field in its own parameter
group of the optimizer (its own learning rate, L2 and schedule). ``NeRFModule`` builds a component from
its config node with the number of training views and whether the capture is a photograph, and keeps it
only when it is enabled: a run with both off has no extra parameter, state-dict entry or kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from torch import nn

from nerf_lightning.config_schema import Injected, Note

__all__ = ["Enabled", "NViews", "Photograph", "ViewGroup", "build_if_enabled", "resolve_enabled"]

#: a component's ``enabled`` key: ``auto`` turns it on for photographs (not for renders)
Enabled = Annotated[bool | Literal["auto"], Note("auto: photographs only")]
#: whether the capture is photographs (``NeRFDataModule.is_photograph``), which ``NeRFModule`` passes
Photograph = Annotated[bool, Injected("NeRFModule: whether the capture is photographs")]
#: the number of training views, which ``NeRFModule`` passes
NViews = Annotated[int, Injected("NeRFModule: the capture's training views")]


def resolve_enabled(enabled: bool | str, photograph: bool) -> bool:
    """``enabled`` (:data:`Enabled`, checked by the component) as a bool: ``auto`` is on for
    photographs only."""
    return bool(photograph) if enabled == "auto" else bool(enabled)


def build_if_enabled(factory: Callable[..., nn.Module] | None, **kwargs: Any) -> Any:
    """The component ``factory(**kwargs)`` builds when it is enabled, else None (also for no factory)."""
    if factory is None:
        return None
    component = factory(**kwargs)
    return component if component.enabled else None


class ViewGroup:
    """A component's optimizer parameter group: its parameters, learning rate (``None``: the
    optimizer's), coupled L2 (Adam's ``weight_decay``) and learning-rate factor per step (``None``: the
    main schedule's, see ``schedules.with_group_lambdas``)."""

    def __init__(
        self,
        name: str,
        params: list[nn.Parameter],
        lr: float | None,
        weight_decay: float,
        lr_lambda: Callable[[int], float] | None,
    ) -> None:
        self.name = name
        self.params = params
        self.lr = lr
        self.weight_decay = float(weight_decay)
        self.lr_lambda = lr_lambda

    def as_dict(self) -> dict[str, Any]:
        """The ``torch.optim`` parameter-group dict."""
        group: dict[str, Any] = {"params": self.params, "weight_decay": self.weight_decay, "name": self.name}
        if self.lr is not None:
            group["lr"] = float(self.lr)
        return group
