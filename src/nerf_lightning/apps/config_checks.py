"""The apps' config values checked before any work starts: a bad value fails in a second, by its key.

A value of the wrong type or range (``trainer.max_steps=abc``, ``data.batch_size=0``,
``model.renderer.step_size=0``, ``render width=0``, ``export resolution=0``) would otherwise fail deep
inside the
run — after the capture has loaded, with a traceback that names no key — or, worse, run and produce a
meaningless result (zero rays trained, a 16x16 video). Each app checks its config against its table
of :class:`Rule` first (:func:`check_config`): the first bad value ends the run with one line,
``error: <key>=<value>: expected <what>``, and exit status 2.

The tables hold the keys whose values matter and the checks that cannot be a table entry (the
devices against the strategy and the machine) are functions next to them. Keys absent from a config
are skipped: eval/render/export hold only the ``data.*`` / ``model.*`` overrides given on their command
line (the checkpoint's own values were checked when it was trained).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from nerf_lightning.callbacks.grad_exchange import EXCHANGES
from nerf_lightning.errors import UserError

__all__ = ["EVAL", "EXPORT", "RENDER", "TRAIN", "VIEW", "Rule", "check_config"]

_ABSENT = object()


@dataclass(frozen=True)
class Rule:
    """What one config key may hold.

    Args:
        key: dotted config key.
        kind: ``int``, ``number`` (int or float, finite), ``bool``, ``choice`` or ``pow2`` (an integer
            power of two).
        low / high: inclusive bounds; ``above`` / ``below``: exclusive bounds.
        null: ``null`` is accepted (it means "default" or "off" at that key).
        choices: the accepted values of a ``choice``; of a number, the words it also accepts (``auto``).
        note: what a special value means, shown in the message (``-1: no limit``).
    """

    key: str
    kind: str
    low: float | None = None
    high: float | None = None
    above: float | None = None
    below: float | None = None
    null: bool = False
    choices: tuple[Any, ...] = ()
    note: str = ""

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.null
        if self.kind == "bool":
            return isinstance(value, bool)
        if value in self.choices:
            return True
        if self.kind == "choice":
            return False
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.kind in ("int", "pow2") and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        if self.kind == "pow2" and (value < 1 or value & (value - 1)):
            return False
        return not (
            (self.low is not None and value < self.low)
            or (self.high is not None and value > self.high)
            or (self.above is not None and value <= self.above)
            or (self.below is not None and value >= self.below)
        )

    def expected(self) -> str:
        if self.kind == "bool":
            what = "true or false"
        elif self.kind == "choice":
            what = "one of " + ", ".join(str(c) for c in self.choices)
        else:
            what = {"int": "an integer", "number": "a number", "pow2": "a power of two"}[self.kind]
            bounds = [
                f">= {_num(self.low)}" if self.low is not None else "",
                f"> {_num(self.above)}" if self.above is not None else "",
                f"<= {_num(self.high)}" if self.high is not None else "",
                f"< {_num(self.below)}" if self.below is not None else "",
            ]
            what = " ".join([what, " and ".join(b for b in bounds if b)]).strip()
            what += "".join(f" or {c}" for c in self.choices)
        if self.null:
            what += " or null"
        return f"{what} ({self.note})" if self.note else what


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _int(key: str, low: float | None = None, **kw: Any) -> Rule:
    return Rule(key, "int", low=low, **kw)


def _num_rule(key: str, **kw: Any) -> Rule:
    return Rule(key, "number", **kw)


def _bool(key: str) -> Rule:
    return Rule(key, "bool")


#: data.* values (train; eval/render/export overrides)
DATA: tuple[Rule, ...] = (
    _int("data.batch_size", 1, note="rays per step"),
    _int("data.steps_per_epoch", 1),
    _int("data.max_val_views", 1, null=True, note="null: every held-out view"),
    _int("data.max_test_views", 1, null=True, note="null: every view of the final evaluation"),
    _int("data.downscale", 1),
    _int("data.test_every", 0, note="0: no holdout"),
    Rule("data.aabb_scale", "pow2", high=128, null=True, note="null: the capture's own"),
    _int("data.image_workers", 1, null=True),
)

#: model.* values (train; eval/render/export overrides)
MODEL: tuple[Rule, ...] = (
    _num_rule("model.renderer.step_size", above=0, note="the marching step in NGP units"),
    _int("model.renderer.max_samples_per_ray", 1),
    _int("model.renderer.occupancy.resolution", 1),
    _int("model.renderer.occupancy.update_every", 1),
    _int("model.renderer.occupancy.warmup_steps", 0),
    _num_rule("model.renderer.occupancy.decay", low=0, high=1),
    _num_rule("model.renderer.occupancy.density_threshold", low=0),
    _num_rule("model.renderer.near_plane", low=0),
    _num_rule("model.renderer.cone_angle", low=0, null=True),
    _num_rule("model.renderer.large_scene_cone_angle", low=0),
    _num_rule("model.renderer.early_stop_eps", low=0, below=1),
    _num_rule("model.huber_delta", above=0),
    _num_rule("model.distortion_weight", low=0),
    _num_rule("model.alpha_weight", low=0, choices=("auto",), note="auto: 0.1 on renders, 0 on photographs"),
    _num_rule("model.renderer.gradient_scaling_distance", above=0, null=True, note="null: off"),
    _int("model.step.sample_budget", 1, null=True, note="null: data.batch_size rays per step"),
    _int("model.step.march_budget", 1, null=True),
    _int("model.step.n_rays_init", 1),
    _int("model.val_chunk", 1),
    _int("model.sigterm_check_every", 1),
    _num_rule("model.optimizer.lr", above=0),
    _int("model.field.encoding.n_levels", 1),
    _int("model.field.encoding.n_features_per_level", 1),
    _int("model.field.encoding.log2_hashmap_size", 1, high=32),
    _int("model.field.encoding.base_resolution", 1),
    _int("model.field.encoding.max_resolution", 1),
    _int("model.field.hidden_dim", 1),
    Rule("model.camera_opt.enabled", "choice", choices=(True, False, "auto"), note="auto: photographs only"),
    Rule("model.camera_opt.mode", "choice", choices=("SO3xR3", "SE3")),
    Rule("model.camera_opt.gauge", "choice", choices=("similarity", "none")),
    _num_rule("model.camera_opt.lr", above=0),
    _num_rule("model.camera_opt.lr_final", above=0),
    _num_rule("model.camera_opt.decay_steps", low=0, note="a fraction of the run (<= 1) or a step count"),
    _num_rule("model.camera_opt.warmup_steps", low=0, note="a fraction of the run (<= 1) or a step count"),
    _num_rule("model.camera_opt.weight_decay", low=0),
    Rule("model.appearance.enabled", "choice", choices=(True, False, "auto"), note="auto: photographs only"),
    _bool("model.appearance.bias"),
    _num_rule("model.appearance.lr", above=0, null=True, note="null: the field's learning rate and schedule"),
    _num_rule("model.appearance.weight_decay", low=0),
)


def _viewer(prefix: str) -> tuple[Rule, ...]:
    """The viewer's values: ``view``'s own keys, ``viewer.*`` of ``train viewer=on``."""
    return (
        _int(f"{prefix}port", 0, high=65535, note="0: any free port"),
        _int(f"{prefix}max_size", 8, null=True, note="px; null: 1024 on a GPU, 256 on the CPU"),
        _int(f"{prefix}preview_size", 8, null=True, note="px; null: 256 on a GPU, 64 on the CPU"),
    )


TRAIN: tuple[Rule, ...] = (
    _int("trainer.max_steps", -1, note="-1: no limit"),
    _int("trainer.max_epochs", -1, null=True, note="-1: no limit"),
    _int("trainer.log_every_n_steps", 1),
    _int("trainer.check_val_every_n_epoch", 1, null=True),
    _int("trainer.num_sanity_val_steps", -1),
    _num_rule("trainer.gradient_clip_val", low=0, null=True),
    _int("accumulate_grad_batches", 1),
    _int("num_nodes", 1),
    _int("seed", 0),
    _num_rule("dist_timeout_s", above=0),
    Rule("grad_exchange", "choice", choices=EXCHANGES),
    Rule("resume", "choice", choices=("never", "auto")),
    _bool("overwrite"),
    *_viewer("viewer."),
    _num_rule("viewer.budget", above=0, note="render seconds per training second"),
    _num_rule("viewer.burst_every_s", above=0, note="seconds between two render bursts"),
    _num_rule("viewer.max_bank_s", above=0, note="most render seconds banked"),
    _num_rule("viewer.chunk_s", above=0, null=True, note="null: 10 ms on a GPU, 100 ms on the CPU"),
    _num_rule("viewer.refresh_every_s", above=0),
    _num_rule("viewer.stats_every_s", above=0),
    *DATA,
    *MODEL,
)

VIEW: tuple[Rule, ...] = (
    *_viewer(""),
    _int("chunk", 1),
    _num_rule("max_seconds", above=0, null=True, note="null: until Ctrl-C"),
    *DATA,
    *MODEL,
)

EVAL: tuple[Rule, ...] = (
    Rule("split", "choice", choices=("auto", "val", "test", "train")),
    _bool("save_images"),
    *DATA,
    *MODEL,
)

RENDER: tuple[Rule, ...] = (
    _int("frames", 1),
    _num_rule("fps", above=0, null=True, note="null: a file's own, else 30"),
    _int("width", 1, null=True, note="null: the first training view's"),
    _int("height", 1, null=True, note="null: the first training view's"),
    _num_rule("fov", above=0, below=180, null=True, note="vertical, degrees"),
    _num_rule("spiral_height"),
    _int("chunk", 1),
    _int("quality", 0, high=10),
    _bool("depth"),
    _bool("save_frames"),
    Rule("camera_path_space", "choice", choices=("capture", "ngp")),
    *DATA,
    *MODEL,
)

EXPORT: tuple[Rule, ...] = (
    Rule("what", "choice", choices=("mesh", "pointcloud")),
    Rule("space", "choice", choices=("capture", "ngp")),
    _int("resolution", 1, note="grid cells along the longest side"),
    Rule("format", "choice", choices=("glb", "obj", "ply")),
    _bool("texture"),
    Rule("texture_size", "pow2", high=8192, note="texels per side"),
    _int("bake_views", 0, note="training cameras per texel"),
    _int("faces", 1, note="the most triangles of the mesh"),
    _num_rule("min_component", low=0, high=1, note="a fraction of the largest piece's faces"),
    _int("smooth", 0, note="smoothing iterations"),
    Rule("up", "choice", choices=("y", "z"), null=True, note="null: y for glb and obj, z for ply"),
    _num_rule("threshold"),
    _int("chunk", 1),
    _bool("pointcloud"),
    _int("num_points", 1),
    _int("pointcloud_downscale", 1),
    _num_rule("min_opacity", low=0, high=1),
    *DATA,
    *MODEL,
)


def check_config(
    cfg: DictConfig, rules: Sequence[Rule], extra: Sequence[Callable[[DictConfig], None]] = ()
) -> None:
    """Check ``cfg`` against ``rules`` (then the ``extra`` checks); :class:`UserError` at the first bad
    value, naming its key. Keys absent from ``cfg`` are skipped."""
    for rule in rules:
        value = OmegaConf.select(cfg, rule.key, default=_ABSENT)
        if value is _ABSENT:
            continue
        if isinstance(value, DictConfig | ListConfig) or not rule.accepts(value):
            raise UserError(f"{rule.key}={_show(value)}: expected {rule.expected()}")
    for check in extra:
        check(cfg)


def _show(value: Any) -> str:
    if isinstance(value, DictConfig | ListConfig):
        return str(OmegaConf.to_container(value))
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return repr(value) if not value or value.strip() != value else value
    return str(value)


# ---------------------------------------------------------------------------- beyond a table entry
def check_devices(cfg: DictConfig) -> None:
    """``devices`` that the strategy and the machine can give, instead of one device in silence."""
    devices = OmegaConf.select(cfg, "devices", default="auto")
    count = _device_count(devices)
    if count is None:
        raise UserError(
            f"devices={_show(devices)}: expected auto, a number of devices >= 1, -1 (all) or a list of ids"
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
    if rgb is None or len(rgb) != 3 or not all(Rule("", "number", low=0, high=1).accepts(c) for c in rgb):
        raise UserError(f"background={_show(value)}: expected [r, g, b] with values in [0, 1], or null")


def check_bounds(cfg: DictConfig) -> None:
    """``bounds``: null or ``[xmin, ymin, zmin, xmax, ymax, zmax]`` with max > min."""
    value = OmegaConf.select(cfg, "bounds", default=None)
    if value is None:
        return
    box = list(value) if isinstance(value, ListConfig | list | tuple) else []
    finite = len(box) == 6 and all(Rule("", "number").accepts(c) for c in box)
    if not finite or any(box[i + 3] <= box[i] for i in range(3)):
        raise UserError(
            f"bounds={_show(value)}: expected [xmin, ymin, zmin, xmax, ymax, zmax] with max > min"
        )
