"""A constructor's arguments checked against its own annotations, each reported by its config key.

A constructor built from the config calls :func:`check_arguments` first::

    def __init__(self, step_size: Annotated[float, Range(above=0)], ...) -> None:
        check_arguments(Renderer, locals())

The first argument its annotation refuses (``config_schema.spec_of``) raises one line that names the key
a user sets, read from the YAML under ``conf/`` where the constructor is the ``_target_`` of a node
(:func:`config_key`): ``model.net.renderer.step_size=0: expected a number > 0``. So a range is written once,
in the annotation, and its message follows the key wherever the YAML moves it. A rule between two
arguments (``max_resolution >= base_resolution``) is no annotation: the constructor states it itself.

This module imports :mod:`nerf_lightning.config_schema` only; the constructors that receive a node through
a ``KeysOf`` parameter are imported by name from the YAML, and only to name a refused key.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from nerf_lightning.config_schema import annotations, injected, keys_of, parameters, spec_of

__all__ = [
    "CONF_DIR",
    "check_arguments",
    "config_key",
    "homes",
    "node_files",
    "nodes",
    "show_value",
    "target_name",
]

CONF_DIR = Path(__file__).resolve().parent / "conf"

#: groups whose options override other groups' keys (presets): no constructor's home
_PRESET_GROUPS = ("experiment", "hparams_search")
_PACKAGE = re.compile(r"^#\s*@package\s+(\S+)", re.MULTILINE)
_SIMPLE_INTERPOLATION = re.compile(r"^\$\{([\w.]+)\}$")


def check_arguments(target: Callable[..., Any], arguments: Mapping[str, Any]) -> None:
    """Raise :class:`ValueError` for the first of ``arguments`` (a constructor's ``locals()``) that its
    parameter's annotation on ``target`` refuses: ``<key>=<value>: expected <what>``."""
    for name, spec in _specs(target).items():
        if name in arguments and not spec.accepts(arguments[name]):
            value = show_value(arguments[name])
            raise ValueError(f"{config_key(target, name)}={value}: expected {spec.expected()}")


@functools.cache
def _specs(target: Callable[..., Any]) -> dict[str, Any]:
    found = {name: spec_of(annotation) for name, annotation in parameters(target).items()}
    return {name: spec for name, spec in found.items() if spec is not None}


def show_value(value: Any) -> str:
    """A value as a user writes it on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return repr(value) if not value or value.strip() != value else value
    return str(value)


def target_name(target: Callable[..., Any]) -> str:
    """The ``_target_`` string that names ``target``."""
    return f"{target.__module__}.{target.__qualname__}"


def config_key(target: Callable[..., Any], name: str) -> str:
    """The config key that parameter ``name`` of ``target`` receives: where the training config (or an
    app's) builds ``target``, or hands its keys to it through a ``KeysOf`` parameter; a value that is a
    plain interpolation (``callbacks.viewer.port: ${viewer.port}``) is named by the key it reads.
    ``<qualified name>.<name>`` when no YAML builds ``target``, or the code that builds it passes the
    argument (:class:`~nerf_lightning.config_schema.Injected`)."""
    home = homes().get(target_name(target))
    if home is None or injected(parameters(target).get(name)):
        return f"{target.__qualname__}.{name}"
    path, node = home
    written = str(node._get_node(name)._value()) if name in node else ""
    match = _SIMPLE_INTERPOLATION.match(written)
    return match.group(1) if match else f"{path}.{name}" if path else name


def node_files() -> Iterator[tuple[Path, str, DictConfig]]:
    """Every YAML file under ``conf/`` but the presets, with the key its content is placed at (its group
    folder, or the ``# @package`` it declares; ``""`` for the root) and its content."""
    for path in sorted(CONF_DIR.rglob("*.yaml")):
        group = path.parent.relative_to(CONF_DIR).as_posix()
        if group.split("/")[0] in _PRESET_GROUPS:
            continue
        declared = _PACKAGE.search(path.read_text())
        package = declared.group(1) if declared else group.replace("/", ".") if group != "." else ""
        content = OmegaConf.load(path)
        if isinstance(content, DictConfig):
            yield path, "" if package == "_global_" else package, content


def nodes(node: DictConfig, path: str) -> Iterator[tuple[str, DictConfig]]:
    """``node`` and every mapping below it (not null, not an interpolation), with their keys."""
    yield path, node
    for key in node.keys():
        child = node._get_node(str(key))
        if isinstance(child, DictConfig) and not (child._is_none() or child._is_interpolation()):
            yield from nodes(child, f"{path}.{key}" if path else str(key))


@functools.cache
def homes() -> dict[str, tuple[str, DictConfig]]:
    """``{_target_: (key, node)}``: the first node of ``conf/`` that builds each target, and the node
    that a project target hands to a ``KeysOf`` receiver (``model.net.field.encoding`` for ``HashEncoding``;
    ``**kwargs: KeysOf(Renderer)`` passes ``model.net.renderer`` itself on)."""
    found: dict[str, tuple[str, DictConfig]] = {}
    for _, package, content in node_files():
        for path, node in nodes(content, package):
            target = node._get_node("_target_")._value() if "_target_" in node else None
            if isinstance(target, str) and target not in found:
                found[target] = (path, node)
    for target, (path, node) in list(found.items()):
        owner = _import(target) if target.startswith("nerf_lightning.") else None
        if owner is None:
            continue
        variadic = {p.name for p in inspect.signature(owner).parameters.values() if p.kind is p.VAR_KEYWORD}
        for name, annotation in annotations(owner).items():
            receiver = keys_of(annotation)
            if receiver is None:
                continue
            if name in variadic:
                found.setdefault(target_name(receiver), (path, node))
            elif name in node and isinstance(node._get_node(name), DictConfig):
                found.setdefault(target_name(receiver), (f"{path}.{name}", node[name]))
    return found


def _import(target: str) -> Callable[..., Any] | None:
    module, _, name = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
