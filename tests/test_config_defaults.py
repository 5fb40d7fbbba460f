"""Each default is written once: the YAML under ``conf/`` is the source, read here at test time.

Every node of every Hydra group (and every app's root config) whose ``_target_`` is one of this project's
constructors is compared with that constructor: each YAML key is one of its parameters, each parameter
is a YAML key (unless the code that builds it passes it: ``Injected``), and each default equals the
YAML value. So a default changed in one place only, or a key added to one side only, fails here.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf

from nerf_lightning.apps.eval import EvalOptions
from nerf_lightning.apps.export import ExportOptions
from nerf_lightning.apps.render import RenderOptions
from nerf_lightning.apps.train import TrainOptions
from nerf_lightning.apps.view import ViewOptions
from nerf_lightning.config_keys import CONF_DIR, node_files, nodes
from nerf_lightning.config_schema import annotations, injected, keys_of

#: the root config of each app and the dataclass of its own top-level keys
APP_OPTIONS: dict[str, Callable[..., Any]] = {
    "train.yaml": TrainOptions,
    "eval.yaml": EvalOptions,
    "render.yaml": RenderOptions,
    "export.yaml": ExportOptions,
    "view.yaml": ViewOptions,
}
_HYDRA_KEYS = frozenset({"_target_", "_partial_", "_recursive_", "_convert_", "_args_"})
_INTERPOLATION = re.compile(r"^\$\{([\w.]+)\}$")


@dataclass(frozen=True)
class Built:
    """A node of ``conf/`` and the project constructor that receives its keys."""

    where: str  # file:key, for the messages
    node: DictConfig
    content: DictConfig  # the whole file, where an interpolation is looked up
    package: str
    target: Callable[..., Any]

    def __str__(self) -> str:
        return self.where


@dataclass(frozen=True)
class Param:
    default: Any
    annotation: Any


def _import(target: str) -> Any:
    module, _, name = target.rpartition(".")
    return getattr(__import__(module, fromlist=[name]), name)


def _own(target: Callable[..., Any]) -> bool:
    """Whether ``target``'s parameters are written in this project (not inherited from a library)."""
    owner = target.__init__ if inspect.isclass(target) and "__init__" not in target.__dict__ else target
    module = inspect.getmodule(owner)
    return module is not None and module.__name__.startswith("nerf_lightning.")


def _signature(target: Callable[..., Any]) -> tuple[dict[str, Param], bool]:
    """``({name: Param}, takes other keys)``: the parameters a node of ``target`` holds, the
    constructor its ``**kwargs`` hands them to followed (``KeysOf``), and whether it passes further
    keys on to a library (an untyped ``**kwargs``)."""
    hints = annotations(target)
    found: dict[str, Param] = {}
    open_ended = False
    for name, p in inspect.signature(target).parameters.items():
        if p.kind is p.VAR_KEYWORD:
            receiver = keys_of(hints.get(name))
            if receiver is None:
                open_ended = True
                continue
            more, more_open = _signature(receiver)
            found.update({k: v for k, v in more.items() if k not in found})
            open_ended |= more_open
        elif p.kind is not p.VAR_POSITIONAL:
            found[name] = Param(p.default, hints.get(name))
    return found, open_ended


def built_nodes() -> Iterator[Built]:
    """Every node of ``conf/`` that one of this project's constructors receives."""
    for path, package, content in node_files():
        name = path.relative_to(CONF_DIR).as_posix()
        for key, node in nodes(content, package):
            raw = node._get_node("_target_")._value() if "_target_" in node else None
            if not (isinstance(raw, str) and raw.startswith("nerf_lightning.")):
                continue
            target = _import(raw)
            if not _own(target):
                continue
            yield Built(f"{name}:{key or '<root>'}", node, content, package, target)
            params, _ = _signature(target)
            for child, param in params.items():
                receiver = keys_of(param.annotation)
                if receiver is not None and child in node and isinstance(node._get_node(child), DictConfig):
                    yield Built(f"{name}:{key}.{child}", node[child], content, package, receiver)


def _written(built: Built, key: str) -> tuple[bool, Any]:
    """``(known, value)`` of ``key`` as the YAML gives it: an interpolation of a key of the same file
    (``${viewer.port}``) is followed; one of another file (``${paths.output_dir}``) is unknown here, and
    so is a node (a factory's keys, checked as a node of its own)."""
    node = built.node._get_node(key)
    for _ in range(8):
        if isinstance(node, DictConfig):
            return False, None
        if isinstance(node, ListConfig):
            return True, OmegaConf.to_container(node)
        raw = node._value()
        match = _INTERPOLATION.match(raw) if isinstance(raw, str) else None
        if match is None:
            return (False, None) if isinstance(raw, str) and "${" in raw else (True, raw)
        path = match.group(1)
        if built.package:
            if not path.startswith(built.package + "."):
                return False, None
            path = path[len(built.package) + 1 :]
        parent, _, leaf = path.rpartition(".")
        holder = OmegaConf.select(built.content, parent) if parent else built.content
        if not isinstance(holder, DictConfig) or leaf not in holder:
            return False, None
        node = holder._get_node(leaf)
    return False, None


def _same(default: Any, value: Any) -> bool:
    if isinstance(default, tuple | list) and isinstance(value, list):
        return list(default) == value
    if isinstance(default, bool) or isinstance(value, bool):
        return default is value
    return type(default) in (int, float, str, type(None)) and default == value


BUILT = list(built_nodes())


def test_the_walk_sees_every_group() -> None:
    where = {b.where.split(":")[0].split("/")[0] for b in BUILT}
    assert {"data", "model", "callbacks", "logger", "viewer", "debug", "hydra", "batch_rule"} <= where
    assert any(b.target.__name__ == "HashEncoding" for b in BUILT)  # a node received through KeysOf


@pytest.mark.parametrize("built", BUILT, ids=str)
def test_each_yaml_key_is_a_parameter_and_each_parameter_a_yaml_key(built: Built) -> None:
    params, open_ended = _signature(built.target)
    keys = [str(k) for k in built.node.keys() if str(k) not in _HYDRA_KEYS]
    if not open_ended:
        unknown = [k for k in keys if k not in params]
        assert not unknown, f"{built}: keys without a parameter of {built.target.__qualname__}: {unknown}"
    missing = [n for n, p in params.items() if n not in keys and not injected(p.annotation)]
    assert not missing, f"{built}: parameters of {built.target.__qualname__} without a YAML entry: {missing}"


@pytest.mark.parametrize("built", BUILT, ids=str)
def test_each_constructor_default_is_the_yaml_value(built: Built) -> None:
    params, _ = _signature(built.target)
    for key in built.node.keys():
        param = params.get(str(key))
        if param is None or param.default is inspect.Parameter.empty:
            continue
        known, value = _written(built, str(key))
        if known:
            assert _same(param.default, value), (
                f"{built}.{key}: YAML {value!r}, {built.target.__qualname__} default {param.default!r}"
            )


@pytest.mark.parametrize("root", sorted(APP_OPTIONS))
def test_each_app_option_is_a_root_key_with_its_default(root: str) -> None:
    content = OmegaConf.load(Path(CONF_DIR) / root)
    built = Built(root, content, content, "", APP_OPTIONS[root])
    for name, param in _signature(APP_OPTIONS[root])[0].items():
        assert name in content, f"{root}: {name} of {APP_OPTIONS[root].__name__} has no YAML entry"
        known, value = _written(built, name)
        if param.default is not inspect.Parameter.empty and known:
            assert _same(param.default, value), f"{root}:{name}: YAML {value!r}, default {param.default!r}"
