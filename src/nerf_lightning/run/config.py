"""Compose the training config outside ``@hydra.main`` (benchmarks, tests, notebooks)."""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from nerf_lightning.errors import UserError
from nerf_lightning.run.config_tree import CONF_DIR, REFERENCE_NODES, key_aliases
from nerf_lightning.run.run_dir import register_resolvers

_BATCH_RULE = "the batch rule is the config group batch_rule=auto|per_device|large_batch|throughput"
_RESEARCH = "measured and removed (docs/benchmarks/2026-12-05.md)"

#: Keys that were removed, and what to use instead: an override of one fails with this line, a
#: checkpoint's stored config that holds one drops it (:func:`drop_removed_keys`). A record, kept by
#: hand: a removed key has no parameter left to carry it. (A key that moved carries its old spelling
#: on its parameter: ``config_schema.Formerly``, :func:`~nerf_lightning.run.config_tree.key_aliases`.)
REMOVED_KEYS: dict[str, str] = {
    "data.batch_scaling": _BATCH_RULE,
    **{
        f"data.{key}": f"{_RESEARCH}; {_BATCH_RULE} (docs/batch_rule.md)"
        for key in (
            "batch_multiple",
            "schedule_unit",
            "lr_scaling",
            "beta_scaling",
            "grid_unit",
            "lr_warmup",
            "lr_anneal",
            "mlp_lr_scaling",
        )
    },  # fmt: skip
    "data.resolution_schedule": f"coarse-to-fine training resolution was {_RESEARCH}",
    "data.samplers.loss_weighted.error_map_resolution": f"the per-view error map was {_RESEARCH}",
    "model.mlp_weight_decay": f"the MLPs' L2 was {_RESEARCH}",
    "model.scheduler.warmup_steps": f"the learning-rate warm-up was {_RESEARCH}",
    "data.train_background": "every training ray is over a random background colour: the evaluation "
    "background lost on lego's published protocol and was removed (docs/benchmarks/2026-12-07.md)",
}

_OVERRIDE = re.compile(r"^([+~]{0,2})([^=]*)(.*)$", re.S)


def alias_override(arg: str) -> str:
    """One command-line override with an old key (:func:`~nerf_lightning.run.config_tree.key_aliases`)
    spelled as the config's key.

    Raises:
        UserError: the key was removed (:data:`REMOVED_KEYS`), naming what replaced it.
    """
    sign, key, rest = _OVERRIDE.match(arg).groups()  # type: ignore[union-attr]
    if key in REMOVED_KEYS:
        raise UserError(f"{key}: no longer exists: {REMOVED_KEYS[key]}")
    if not key.startswith(tuple(f"{node}." for node in REFERENCE_NODES)):
        return arg  # not a key the aliases can hold: no need to import the constructors to know
    return f"{sign}{today_key(key)}{rest}"


def today_key(key: str) -> str:
    """``key`` spelled as today's config spells it: old spellings followed to the end, since a key
    can have moved more than once (``model.encoding.backend`` -> ``model.net.field.encoding.backend`` ->
    ``model.net.backend``)."""
    aliases = key_aliases()
    for _ in range(len(aliases)):
        moved = _moved_once(key, aliases)
        if moved == key:
            break
        key = moved
    return key


def _moved_once(key: str, aliases: dict[str, str]) -> str:
    if key in aliases:
        return aliases[key]
    for old, new in aliases.items():
        if old.endswith(".") and key.startswith(old):
            return f"{new}{key[len(old) :]}"
    return key


def drop_removed_keys(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (plain run config, e.g. a checkpoint's) without the keys of :data:`REMOVED_KEYS`."""
    out = copy.deepcopy(config)
    for key in REMOVED_KEYS:
        *parents, leaf = key.split(".")
        node: Any = out
        for name in parents:
            node = node.get(name) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return out


def alias_overrides(overrides: Sequence[str]) -> list[str]:
    """:func:`alias_override` of each override."""
    return [alias_override(arg) for arg in overrides]


def compose_train_config(
    overrides: list[str], output_dir: str | Path, cwd: str | Path | None = None
) -> DictConfig:
    """The config ``python -m nerf_lightning.train <overrides>`` would run, writing into ``output_dir``.

    ``cwd`` stands for the launch directory (``paths.root_dir``: scene and image caches); default
    ``output_dir``. Old keys (``config_tree.key_aliases``) are read as the command line reads them.
    Registers the config as the current Hydra config so ``${hydra:...}`` resolves.
    """
    return compose_app_config("train", overrides, output_dir, cwd)


def compose_app_config(
    config_name: str, overrides: list[str], output_dir: str | Path, cwd: str | Path | None = None
) -> DictConfig:
    """Like :func:`compose_train_config` for any app (``train``, ``eval``, ``render``, ``export``)."""
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=alias_overrides(overrides), return_hydra_config=True)
        with open_dict(cfg):
            cfg.hydra.runtime.output_dir = str(output_dir)
            cfg.hydra.runtime.cwd = str(cwd if cwd is not None else output_dir)
            cfg.hydra.job.num = 0
        HydraConfig.instance().set_config(cfg)
    return cfg
