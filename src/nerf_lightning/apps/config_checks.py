"""The apps' config values checked before any work starts: a bad value fails in a second, by its key.

A value of the wrong type or range (``trainer.max_steps=abc``, ``data.batch_size=0``,
``model.net.renderer.step_size=0``, ``render width=0``, ``export resolution=0``) would otherwise fail deep
inside the run — after the capture has loaded, with a traceback that names no key — or, worse, run and
produce a meaningless result (zero rays trained, a 16x16 video). Each app checks its config first
(:func:`check_config`): the first bad value ends the run with one line,
``error: <key>=<value>: expected <what>``, and exit status 2.

What a key may hold is written once, on the parameter that receives it (``config_schema.py``): a
``_target_``'s constructor for a node's keys, the app's options dataclass for its own top-level keys.
:func:`check_config` walks the config (``run/config_tree.py``) and checks each key present against its
parameter's annotation; keys absent from a config are skipped (eval/render/export hold only the
``data.*`` / ``model.*`` overrides given on their command line: the checkpoint's own values were
checked when it was trained). The checks that cannot be an annotation (the devices against the
strategy and the machine, lists) are functions below.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, is_dataclass
from typing import Annotated, Any, TypeVar

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from nerf_lightning.config_keys import show_value
from nerf_lightning.config_schema import Note, Range, Spec, spec_of
from nerf_lightning.errors import UserError
from nerf_lightning.run.config_tree import entries

__all__ = ["FOREIGN", "check_background", "check_bounds", "check_config", "check_devices"]

Options = TypeVar("Options")

#: Keys of constructors that are not this project's (Lightning's Trainer, torch's Adam): their
#: parameters carry no constraints we could read, so theirs are written here, by ``_target_``.
FOREIGN: dict[str, Mapping[str, Any]] = {
    "lightning.pytorch.Trainer": {
        "max_steps": Annotated[int, Range(low=-1), Note("-1: no limit")],
        "max_epochs": Annotated[int | None, Range(low=-1), Note("-1: no limit")],
        "log_every_n_steps": Annotated[int, Range(low=1)],
        "check_val_every_n_epoch": Annotated[int | None, Range(low=1)],
        "num_sanity_val_steps": Annotated[int, Range(low=-1)],
        "gradient_clip_val": Annotated[float | None, Range(low=0)],
    },
    "torch.optim.Adam": {"lr": Annotated[float, Range(above=0)]},
}


def check_config(
    cfg: DictConfig,
    options: Callable[..., Options] | None = None,
    extra: Sequence[Callable[[DictConfig], None]] = (),
) -> Options | None:
    """Check every key of ``cfg`` against the parameter that receives it (then the ``extra`` checks);
    :class:`UserError` at the first bad value, naming its key.

    Args:
        cfg: the app's composed config.
        options: the app's options dataclass (its top-level keys).
        extra: checks beyond an annotation.

    Returns:
        ``options`` built from ``cfg``'s top-level keys (None without ``options``).
    """
    for entry in entries(cfg, options, FOREIGN):
        spec = spec_of(entry.annotation)
        if spec is None:
            continue
        try:
            value = entry.node[entry.name]
        except MissingMandatoryValue:  # ``???``: the app names what is missing itself
            continue
        if isinstance(value, DictConfig | ListConfig) or not spec.accepts(value):
            raise UserError(f"{entry.user_key}={_show(value)}: expected {spec.expected()}")
    for check in extra:
        check(cfg)
    return read_options(cfg, options) if options is not None else None


def read_options(cfg: DictConfig, options: Callable[..., Options]) -> Options:
    """``options`` (a dataclass) of ``cfg``'s top-level keys, as plain values; absent keys keep the
    field's default."""
    assert is_dataclass(options), options
    given = {}
    for field in fields(options):
        if field.name in cfg:
            value = cfg[field.name]
            given[field.name] = (
                OmegaConf.to_container(value) if isinstance(value, DictConfig | ListConfig) else value
            )
    return options(**given)


def _show(value: Any) -> str:
    if isinstance(value, DictConfig | ListConfig):
        return str(OmegaConf.to_container(value))
    return show_value(value)


# ---------------------------------------------------------------------------- beyond an annotation
def check_devices(cfg: DictConfig) -> None:
    """``devices`` that the strategy and the machine can give, instead of one device in silence."""
    devices = OmegaConf.select(cfg, "devices", default="auto")
    count = _device_count(devices)
    if count is None:
        raise UserError(
            f"devices={_show(devices)}: expected auto, a number of devices >= 1, -1 (every GPU) or a list "
            "of GPU ids"
        )
    target = str(OmegaConf.select(cfg, "trainer.strategy._target_", default="") or "")
    if target.endswith("single_device_strategy") and count not in (0, 1):
        raise UserError(
            f"devices={_show(devices)}: strategy=single trains on one device; for {count} processes "
            f"use strategy=ddp devices={count} (on a CPU: {count} processes with gloo)"
        )
    accelerator = str(OmegaConf.select(cfg, "accelerator", default="auto"))
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise UserError(f"accelerator={accelerator}: no CUDA GPU is visible; use accelerator=auto or cpu")
    on_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    if not on_gpu and not (devices == "auto" or str(devices).strip().isdigit()):
        # Lightning's CPU accelerator takes a number of processes >= 1 (auto: one), no -1 or ids
        what = "means every GPU" if devices in (-1, "-1") else "lists GPU ids"
        raise UserError(
            f"devices={_show(devices)}: {what}, and this run trains on the CPU (accelerator={accelerator}); "
            "give a number of processes instead (devices=2 with strategy=ddp), or devices=auto (one)"
        )
    if on_gpu and count > torch.cuda.device_count():
        raise UserError(
            f"devices={_show(devices)}: {torch.cuda.device_count()} CUDA GPU(s) visible on this machine"
        )


def _device_count(devices: Any) -> int | None:
    """Devices asked for (0: "auto" or -1, as many as there are); None when it is no device spec."""
    if devices in ("auto", -1, "-1"):
        return 0
    if isinstance(devices, bool):
        return None
    if isinstance(devices, int):
        return devices if devices >= 1 else None
    if isinstance(devices, str):
        parts = [p for p in devices.split(",") if p.strip()]
        if len(parts) == 1 and parts[0].strip().isdigit():
            return int(parts[0]) or None
        return len(parts) if parts and all(p.strip().isdigit() for p in parts) else None
    if isinstance(devices, ListConfig | list | tuple):
        ids = list(devices)
        return len(ids) if ids and all(isinstance(i, int) and not isinstance(i, bool) for i in ids) else None
    return None


def check_background(cfg: DictConfig) -> None:
    """``background``: null or an RGB triple in [0, 1]."""
    value = OmegaConf.select(cfg, "background", default=None)
    if value is None:
        return
    rgb = list(value) if isinstance(value, ListConfig | list | tuple) else None
    if rgb is None or len(rgb) != 3 or not all(Spec("number", low=0, high=1).accepts(c) for c in rgb):
        raise UserError(f"background={_show(value)}: expected [r, g, b] with values in [0, 1], or null")


def check_bounds(cfg: DictConfig) -> None:
    """``bounds``: null or ``[xmin, ymin, zmin, xmax, ymax, zmax]`` with max > min."""
    value = OmegaConf.select(cfg, "bounds", default=None)
    if value is None:
        return
    box = list(value) if isinstance(value, ListConfig | list | tuple) else []
    finite = len(box) == 6 and all(Spec("number").accepts(c) for c in box)
    if not finite or any(box[i + 3] <= box[i] for i in range(3)):
        raise UserError(
            f"bounds={_show(value)}: expected [xmin, ymin, zmin, xmax, ymax, zmax] with max > min"
        )
