"""The keys of a composed config, each with the constructor parameter that receives it.

A node with a ``_target_`` is read by that constructor: its keys are the target's parameters
(``config_schema.parameters``, imported with ``hydra.utils.get_object``, never instantiated). A node
without one is either a mapping a parameter receives (``KeysOf``: ``model.net.field.encoding``) or an
override node of the checkpoint apps (``render model.net.renderer.step_size=...``: ``model: {}`` in
``render.yaml``), whose target is the one the training config gives that place
(:func:`reference_config`). The root node's keys belong to the app's options dataclass. Every typed
parameter of this project's constructors is read; of another library's, only those marked with
``config_schema``'s markers (its plain types were not written for our YAML).

The config checks (``apps/config_checks.py``) and the key aliases (:func:`key_aliases`) both
walk this (:func:`entries`), so a key's constraint and its old spelling live on its parameter only.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from nerf_lightning.config_keys import CONF_DIR
from nerf_lightning.config_schema import formerly_keys, is_marked, keys_of, parameters

__all__ = ["CONF_DIR", "Entry", "aliases_of", "entries", "key_aliases", "reference_config"]

#: nodes of the training config whose targets the checkpoint apps' override nodes stand for
REFERENCE_NODES = ("data", "model")

#: config keys that steer Hydra itself, not a parameter
_HYDRA_KEYS = frozenset({"_target_", "_partial_", "_recursive_", "_convert_", "_args_"})

_SIMPLE_INTERPOLATION = re.compile(r"^\$\{([\w.]+)\}$")


@dataclass(frozen=True)
class Entry:
    """One key of a node and the parameter that receives it.

    Args:
        node: the node holding the key.
        name: the key within ``node``.
        path: the dotted key from the root (``model.net.renderer.step_size``).
        annotation: the parameter's annotation.
    """

    node: DictConfig
    name: str
    path: str
    annotation: Any

    @property
    def user_key(self) -> str:
        """The key a user sets for this value: :attr:`path`, or for a value that is a plain
        interpolation (``callbacks.viewer.port: ${viewer.port}``), the key it reads (``viewer.port``)."""
        if OmegaConf.is_interpolation(self.node, self.name):
            match = _SIMPLE_INTERPOLATION.match(str(self.node._get_node(self.name)._value()))
            if match:
                return match.group(1)
        return self.path


@functools.cache
def reference_config() -> DictConfig:
    """The training config's :data:`REFERENCE_NODES`, each its default group option as written
    (``conf/model/ngp.yaml``, ...; read, not composed: nothing of Hydra's global state is touched)."""
    defaults = OmegaConf.load(CONF_DIR / "train.yaml").get("defaults", [])
    choices = {k: v for item in defaults if isinstance(item, Mapping) for k, v in item.items()}
    return OmegaConf.create(
        {node: OmegaConf.load(CONF_DIR / node / f"{choices[node]}.yaml") for node in REFERENCE_NODES}
    )


@functools.cache
def _parameters_of_target(target: str) -> dict[str, Any]:
    try:
        found = parameters(hydra.utils.get_object(target))
    except Exception:  # noqa: BLE001 - a target that does not import is instantiate's error to report
        return {}
    if target.startswith("nerf_lightning."):
        return found
    # Another library's plain types were not written for our YAML (its constructors are described by
    # the caller's ``foreign`` table); what it marks with config_schema's markers is meant for it.
    return {name: annotation for name, annotation in found.items() if is_marked(annotation)}


def _target_at(path: str) -> str | None:
    target = OmegaConf.select(reference_config(), f"{path}._target_", default=None)
    return target if isinstance(target, str) else None


def _node_parameters(
    node: DictConfig, path: str, received: dict[str, Any] | None, foreign: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    raw = node._get_node("_target_") if "_target_" in node else None
    target = raw._value() if raw is not None else None
    if not isinstance(target, str):
        if received is not None:
            return received
        target = _target_at(path)
    if target is None:
        return {}
    if target in foreign:
        return dict(foreign[target])
    return _parameters_of_target(target)


def entries(
    cfg: DictConfig,
    root: Callable[..., Any] | None = None,
    foreign: Mapping[str, Mapping[str, Any]] | None = None,
) -> Iterator[Entry]:
    """Every key of ``cfg`` that a known parameter receives, in the config's order (a node's own keys,
    a child node after its key). ``root``: the constructor of the root's keys (an app's options);
    ``foreign``: ``{target: {key: annotation}}`` for targets that are not this project's."""
    root_params = parameters(root) if root is not None else {}
    yield from _walk(cfg, "", root_params, dict(foreign or {}))


def _walk(
    node: DictConfig, prefix: str, params: dict[str, Any], foreign: Mapping[str, Mapping[str, Any]]
) -> Iterator[Entry]:
    for name in node.keys():
        name = str(name)
        if name in _HYDRA_KEYS:
            continue
        path = f"{prefix}{name}"
        annotation = params.get(name)
        if annotation is not None:
            yield Entry(node, name, path, annotation)
        child = node._get_node(name)
        if isinstance(child, DictConfig) and not (
            child._is_none() or child._is_missing() or child._is_interpolation()
        ):
            received = keys_of(annotation) if annotation is not None else None
            given = parameters(received) if received is not None else None
            yield from _walk(child, f"{path}.", _node_parameters(child, path, given, foreign), foreign)


@functools.cache
def key_aliases() -> dict[str, str]:
    """:func:`aliases_of` the training config's data and model nodes (:func:`reference_config`)."""
    return aliases_of(reference_config())


def aliases_of(cfg: DictConfig) -> dict[str, str]:
    """``{old key: today's key}`` of every :class:`~nerf_lightning.config_schema.Formerly` on a
    parameter that receives a key of ``cfg``. A node's old spelling maps every key under it
    (``model.encoding.`` -> ``model.net.field.encoding.``). For :func:`key_aliases`, an old key lies under a
    :data:`REFERENCE_NODES` node: ``alias_override`` looks no further, so that other keys import no
    constructor."""
    out: dict[str, str] = {}
    for entry in entries(cfg):
        for old in formerly_keys(entry.annotation):
            if isinstance(entry.node._get_node(entry.name), DictConfig):
                out[f"{old}."] = f"{entry.path}."
            else:
                out[old] = entry.path
    return out
