"""Rebuild a trained run from its checkpoint alone: config, model, data (eval / render / export).

A checkpoint written by ``nerf_lightning.train`` carries the run's resolved config as plain data
(``checkpoint["nerf_lightning"]["config"]``, see ``run/checkpoint_callbacks.py``). The model and the
DataModule are rebuilt from it with ``hydra.utils.instantiate`` — the same path ``train`` takes — and
the weights (hash grid, MLPs, occupancy grid) loaded from ``state_dict``. Nothing needs the original
Python objects, so the file loads with ``torch.load(weights_only=True)``; checkpoints written under
DDP, FSDP (``state_dict_type: full``) or any precision hold full-precision, unwrapped weights and
rebuild the same way on one device.

The stored config names classes by their import path (``_target_``) at the time of writing; paths that
have moved since are mapped to their new place when the file is read (:data:`MOVED_TARGETS`). A model
config of an earlier layout (the flat ``model.near_plane``, ``model.sample_budget``, ...; the nodes
``model.field``, ``model.renderer``, ... and loss keys ``model.loss``, ``model.huber_delta``, ... before
``model.net``) gets today's nodes, holding its values (:func:`upgrade_model_keys`); a key that moved
from one node to another (``model.renderer.ops_backend`` -> ``model.net.backend``, ``data.cuda_graph``
-> ``model.cuda_graph``) is read at its new place (:func:`upgrade_moved_keys`, after the nodes moved);
keys that were removed since are dropped (``run/config.py``'s ``REMOVED_KEYS``).
:func:`upgrade_stored_config` does all four. The model is rebuilt with the values the train app passed
(``run/model_node.py``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import lightning as L
from omegaconf import DictConfig, ListConfig, OmegaConf

from nerf_lightning.data.types import Capture
from nerf_lightning.errors import UserError
from nerf_lightning.run.checkpoint_callbacks import CHECKPOINT_KEY
from nerf_lightning.run.checkpoint_io import read_checkpoint
from nerf_lightning.run.config import CONF_DIR, drop_removed_keys
from nerf_lightning.run.config_tree import key_aliases
from nerf_lightning.run.model_node import instantiate_model

__all__ = [
    "MOVED_TARGETS",
    "RestoredRun",
    "load_run",
    "resolve_ckpt_file",
    "upgrade_model_keys",
    "upgrade_moved_keys",
    "upgrade_stored_config",
    "upgrade_targets",
]

#: ``_target_`` paths a checkpoint's stored config may hold that have moved: old -> new.
MOVED_TARGETS: dict[str, str] = {
    "nerf_lightning.callbacks.checkpointing.LastCheckpoint": (
        "nerf_lightning.run.checkpoint_callbacks.LastCheckpoint"
    ),
    "nerf_lightning.callbacks.prometheus.PrometheusExporter": (
        "nerf_lightning.tracking.prometheus.PrometheusExporter"
    ),
    "nerf_lightning.utils.tracking.CSVLogger": "nerf_lightning.tracking.loggers.CSVLogger",
    "nerf_lightning.utils.tracking.TensorBoardLogger": "nerf_lightning.tracking.loggers.TensorBoardLogger",
    "nerf_lightning.utils.tracking.WandbLogger": "nerf_lightning.tracking.wandb_logger.WandbLogger",
    "nerf_lightning.models.schedules.ngp_exponential_decay": (
        "nerf_lightning.training.lr_schedules.ngp_exponential_decay"
    ),
    # one step path for every configuration (issue 46): the budgeted step's factory became train_step
    "nerf_lightning.models.train_step.budgeted_step": "nerf_lightning.models.train_step.train_step",
    "nerf_lightning.render.occupancy.OccupancyGrid": "nerf_lightning.volume.occupancy.OccupancyGrid",
    "nerf_lightning.render.renderer.build_renderer": "nerf_lightning.volume.renderer.build_renderer",
    **{
        f"nerf_lightning.utils.distributed.{name}": f"nerf_lightning.run.strategies.{name}"
        for name in ("fsdp_full_precision", "fsdp_wrap_policy", "single_device_strategy", "slurm_environment")
    },
}


def upgrade_targets(node: Any) -> Any:
    """``node`` (plain config data) with every ``_target_`` of :data:`MOVED_TARGETS` at its new path."""
    if isinstance(node, Mapping):
        return {
            k: MOVED_TARGETS.get(v, v) if k == "_target_" and isinstance(v, str) else upgrade_targets(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [upgrade_targets(v) for v in node]
    return node


def upgrade_model_keys(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (plain run config) with an earlier layout's ``model`` section moved into today's nodes:
    each old key of :func:`~nerf_lightning.run.config_tree.key_aliases` directly under ``model`` goes to
    its place (a node's old spelling moves the whole node), the nodes it lacks come from
    ``conf/model/ngp.yaml``. Whole nodes move first, so that an old flat key lands in the node it names."""
    model = config.get("model")
    moves = {
        old.removeprefix("model.").rstrip("."): new.removeprefix("model.").rstrip(".")
        for old, new in key_aliases().items()
    }
    flat = {old: new for old, new in moves.items() if "." not in old}
    if not isinstance(model, dict) or not any(key in model for key in flat):
        return config
    defaults = OmegaConf.load(CONF_DIR / "model" / "ngp.yaml")
    upgraded = OmegaConf.create({k: v for k, v in model.items() if k not in flat})
    for new in flat.values():  # the first node on the way to each key that the config lacks: ngp.yaml's
        parts = new.split(".")
        for depth in range(1, len(parts)):
            prefix = ".".join(parts[:depth])
            if OmegaConf.select(upgraded, prefix) is None:
                OmegaConf.update(upgraded, prefix, OmegaConf.select(defaults, prefix), merge=False)
                break
    for old, new in sorted(flat.items(), key=lambda item: not isinstance(model.get(item[0]), dict)):
        if old in model:
            OmegaConf.update(upgraded, new, model[old], merge=False)
    upgraded_model = OmegaConf.to_container(upgraded)
    for key in _moved_later(config, moves):  # ngp.yaml's value must not shadow what upgrade_moved_keys moves
        *parents, leaf = key.split(".")
        node = _node_at(upgraded_model, parents)
        if isinstance(node, dict) and OmegaConf.select(OmegaConf.create(model), key) is None:
            node.pop(leaf, None)
    return {**config, "model": upgraded_model}


def _moved_later(config: dict[str, Any], moves: dict[str, str]) -> set[str]:
    """The model keys (below ``model``) that :func:`upgrade_moved_keys` will give a value from an old
    nested key ``config`` holds (``model.field.encoding.backend`` -> ``model.net.backend``)."""
    out = set()
    for old, new in moves.items():
        *parents, leaf = old.split(".")
        node = _node_at(config.get("model") or {}, parents)
        if parents and isinstance(node, dict) and leaf in node and not isinstance(node[leaf], dict):
            out.add(new)
    return out


def upgrade_moved_keys(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (plain run config) with each old key of
    :func:`~nerf_lightning.run.config_tree.key_aliases` it holds moved to today's key. A key the config
    already holds keeps its value (the old one is dropped: ``data.cuda_graph`` beside
    ``model.cuda_graph``). Several old keys of one new key (``model.renderer.ops_backend``,
    ``model.field.encoding.backend`` and ``model.field.mlp_backend`` of ``model.net.backend``): the first, in
    the order of the parameter's ``Formerly`` markers, whose value is not ``auto`` gives it, else
    ``auto``."""
    out = copy.deepcopy(config)
    found: dict[str, list[Any]] = {}
    for old, new in key_aliases().items():
        *parents, leaf = old.split(".")
        node = _node_at(out, parents)
        if not old.endswith(".") and isinstance(node, dict) and leaf in node:
            found.setdefault(new, []).append(node.pop(leaf))
    for new, values in found.items():
        *parents, leaf = new.split(".")
        node = _node_at(out, parents)
        if isinstance(node, dict) and leaf not in node:
            node[leaf] = next((v for v in values if v != "auto"), values[0])
    return out


def _node_at(config: dict[str, Any], keys: list[str]) -> Any:
    node: Any = config
    for name in keys:
        node = node.get(name) if isinstance(node, dict) else None
    return node


def upgrade_stored_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint's stored run config read with today's targets and keys (the module docstring)."""
    return drop_removed_keys(upgrade_moved_keys(upgrade_model_keys(upgrade_targets(config))))


def resolve_ckpt_file(ckpt: str | Path | None) -> Path:
    """``ckpt`` as a file: a ``.ckpt`` path, or a run folder (its ``checkpoints/last.ckpt``)."""
    if ckpt in (None, "", "???"):
        raise UserError("ckpt: no checkpoint given; pass ckpt=PATH (a .ckpt file or a training run folder)")
    path = Path(str(ckpt)).expanduser()
    if path.is_dir():
        last = path / "checkpoints" / "last.ckpt"
        if not last.is_file():
            raise UserError(
                f"ckpt={ckpt}: the folder has no checkpoints/last.ckpt; pass the .ckpt file itself"
            )
        return last
    if not path.is_file():
        raise UserError(f"ckpt={ckpt}: no such file; expected a .ckpt file or a training run folder")
    return path


@dataclass
class RestoredRun:
    """A checkpoint and the config of the run that wrote it."""

    path: Path
    checkpoint: dict[str, Any]
    config: DictConfig
    instantiate_kwargs: dict[str, dict[str, Any]]

    @property
    def global_step(self) -> int:
        return int(self.checkpoint.get("global_step", 0))

    def node(self, name: str, overrides: Mapping[str, Any] | None = None) -> DictConfig:
        """Config node ``name`` of the run with ``overrides`` (a nested mapping) merged in."""
        base = self.config.get(name)
        if base is None:
            raise UserError(f"{self.path}: the stored run config has no `{name}` section")
        if not isinstance(base, DictConfig):
            raise UserError(
                f"{self.path}: the stored run config's `{name}` section is {_shown(base)}; expected a "
                f"mapping of the run's {name}.* keys (the checkpoint is damaged: use another one of the run)"
            )
        node = OmegaConf.merge(base, OmegaConf.create(dict(overrides or {})))
        assert isinstance(node, DictConfig)
        return node

    def build_model(self, overrides: Mapping[str, Any] | None = None) -> L.LightningModule:
        """The trained LightningModule (on the CPU, in eval mode)."""
        node = self.node("model", overrides)
        model = instantiate_model(node, self.instantiate_kwargs.get("model", {}))
        try:
            model.load_state_dict(self.checkpoint["state_dict"], strict=True)
        except RuntimeError as err:
            first = str(err).splitlines()[1].strip() if len(str(err).splitlines()) > 1 else str(err)
            if overrides:
                raise UserError(
                    f"{self.path}: its weights do not fit the model built from its config with the "
                    f"overrides {dict(overrides)} ({first}); drop model overrides that change shapes"
                ) from err
            raise UserError(
                f"{self.path}: its weights do not fit the model built from its own stored config ({first}); "
                "the checkpoint is damaged or incomplete: use another one of the run"
            ) from err
        return model.eval()

    def build_datamodule(self, overrides: Mapping[str, Any] | None = None) -> L.LightningDataModule:
        """The run's DataModule (not set up)."""
        return hydra.utils.instantiate(self.node("data", overrides))

    def load_capture(self, overrides: Mapping[str, Any] | None = None) -> Capture:
        """The run's capture (cameras, splits, scene box; no pixels), as its DataModule reads it."""
        from nerf_lightning.data.formats import load_capture

        dm = self.build_datamodule(overrides)
        return load_capture(
            dm.resolve_path(),
            format=dm.format,
            downscale=dm.downscale,
            test_every=dm.test_every,
            min_sharpness=dm.min_sharpness,
        )


def load_run(ckpt: str | Path | None) -> RestoredRun:
    """Read ``ckpt`` (weights only) and its stored run config.

    Raises:
        UserError: no such file, unreadable, or written without a stored config.
    """
    path = resolve_ckpt_file(ckpt)
    checkpoint = read_checkpoint(path)
    section = checkpoint.get(CHECKPOINT_KEY)
    if not isinstance(section, dict) or "config" not in section:
        raise UserError(
            f"{path}: no stored run config (checkpoint[{CHECKPOINT_KEY!r}]); it was not written by "
            "nerf_lightning.train (or by a version before checkpoints carried their config)"
        )
    if not isinstance(section["config"], Mapping):
        raise UserError(
            f"{path}: its stored run config (checkpoint[{CHECKPOINT_KEY!r}]['config']) is "
            f"{_shown(section['config'])}; expected a mapping of the run's keys (the checkpoint is damaged: "
            "use another one of the run)"
        )
    return RestoredRun(
        path=path,
        checkpoint=checkpoint,
        config=OmegaConf.create(upgrade_stored_config(section["config"])),
        instantiate_kwargs=dict(section.get("instantiate_kwargs") or {}),
    )


def _shown(value: Any) -> str:
    """``5 (an int)``: a stored value that should have been a mapping, as a message shows it."""
    text = repr(value if not isinstance(value, DictConfig | ListConfig) else OmegaConf.to_container(value))
    kind = type(value).__name__
    return f"{text[:40]}{'...' if len(text) > 40 else ''} ({'an' if kind[0] in 'aeiou' else 'a'} {kind})"
