"""What a config key may hold, written once: on the parameter of the constructor that receives it.

A constructor built from the config (a ``_target_`` of the YAML, or an app's options dataclass)
annotates each parameter with its type and, through :data:`typing.Annotated`, these markers::

    batch_size: Annotated[int, Range(low=1), Note("rays per step")] = 65536
    aabb_scale: Annotated[int | None, PowerOfTwo(), Range(high=128), Note("null: the capture's own")]
    alpha_weight: Annotated[float | Literal["auto"], Range(low=0)] = "auto"
    resolution: Annotated[int, Range(low=2), MultipleOf(2), Formerly("model.grid_resolution")] = 128
    feedback: Annotated[TrainingFeedback | None, Injected("the train app: the run's feedback")] = None

The type says the kind: ``int`` (an integer), ``float`` (a finite number), ``bool``, ``Literal[...]``
(one of these words; beside a number, words it also accepts), ``X | None`` (null accepted). A parameter
of any other type (``str``, a factory, a mapping) is not checked here. ``apps/config_checks.py`` walks a
composed config and checks each key against its parameter (:func:`spec_of`), and each constructor checks
its own arguments the same way (``config_keys.check_arguments``); ``run/config_tree.py`` derives the old
spellings of keys from :class:`Formerly`. A default written on a parameter is the YAML's
(``tests/test_config_defaults.py``).

This module imports nothing of the project: every layer may annotate with it.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

__all__ = [
    "Formerly",
    "Injected",
    "KeysOf",
    "MultipleOf",
    "Note",
    "PowerOfTwo",
    "Range",
    "Spec",
    "annotations",
    "formerly",
    "formerly_keys",
    "injected",
    "is_marked",
    "keys_of",
    "parameters",
    "spec_of",
]


@dataclass(frozen=True)
class Range:
    """Bounds of a number: ``low`` / ``high`` inclusive, ``above`` / ``below`` exclusive."""

    low: float | None = None
    high: float | None = None
    above: float | None = None
    below: float | None = None


@dataclass(frozen=True)
class Note:
    """What a special value means, shown in the message (``-1: no limit``)."""

    text: str


@dataclass(frozen=True)
class PowerOfTwo:
    """An integer power of two."""


@dataclass(frozen=True)
class MultipleOf:
    """An integer multiple of ``n``."""

    n: int


@dataclass(frozen=True)
class Formerly:
    """An earlier spelling of this key, from the config's root (``model.grid_resolution``): a command
    line or a checkpoint's config that uses it is read as today's key. On a parameter that receives a
    node, every key under the old node maps to the same key under the new one. A key that replaced
    several carries one marker for each, the first the one a checkpoint's stored value is read from when
    they disagree (``run/restore.upgrade_moved_keys``). Read on the parameters
    of the training config's ``data`` and ``model`` nodes, for old keys under those nodes
    (``run/config_tree.key_aliases``)."""

    key: str


@dataclass(frozen=True)
class Injected:
    """Not a config key: the code that builds the object passes this argument (``by``: who, and what
    it is), so no YAML holds it."""

    by: str


@dataclass(frozen=True)
class KeysOf:
    """The keys of this node (a mapping without ``_target_``, or ``**kwargs``) are the parameters of
    ``target``, which receives them."""

    target: Callable[..., Any]


@dataclass(frozen=True)
class Spec:
    """What one key may hold, read from its parameter's annotation (:func:`spec_of`).

    Args:
        kind: ``int``, ``number`` (int or float, finite), ``bool``, ``choice`` or ``pow2``.
        low / high / above / below: the :class:`Range`.
        multiple_of: the :class:`MultipleOf` of an ``int``.
        null: ``null`` is accepted.
        choices: the accepted values of a ``choice``; of a number, the words it also accepts.
        note: the :class:`Note`.
    """

    kind: str
    low: float | None = None
    high: float | None = None
    above: float | None = None
    below: float | None = None
    multiple_of: int | None = None
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
        if self.multiple_of is not None and value % self.multiple_of:
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
            if self.multiple_of is not None:
                what += f", a multiple of {self.multiple_of}"
            what += "".join(f" or {c}" for c in self.choices)
        if self.null:
            what += " or null"
        return f"{what} ({self.note})" if self.note else what


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _split(annotation: Any) -> tuple[Any, tuple[Any, ...]]:
    """``(type, markers)`` of an annotation (markers: the metadata of ``Annotated``)."""
    if get_origin(annotation) is Annotated:
        base, *markers = get_args(annotation)
        return base, tuple(markers)
    return annotation, ()


def _marker(annotation: Any, kind: type) -> Any:
    return next((m for m in _split(annotation)[1] if isinstance(m, kind)), None)


def spec_of(annotation: Any) -> Spec | None:
    """The check of a parameter annotated ``annotation``; None when its type is not one checked here."""
    base, markers = _split(annotation)
    members = get_args(base) if get_origin(base) in (Union, types.UnionType) else (base,)
    null = type(None) in members
    kinds: set[str] = set()
    words: list[Any] = []
    for member in members:
        if member is type(None):
            continue
        if get_origin(member) is Literal:
            words += get_args(member)
        elif member in (bool, int, float):
            kinds.add({bool: "bool", int: "int", float: "number"}[member])
        else:
            return None
    if kinds == {"bool"}:
        kind, choices = ("choice", (True, False, *words)) if words else ("bool", ())
    elif not kinds:
        kind, choices = "choice", tuple(words)
    elif "bool" in kinds:
        return None
    else:
        kind = "number" if "number" in kinds else "int"
        if kind == "int" and any(isinstance(m, PowerOfTwo) for m in markers):
            kind = "pow2"
        choices = tuple(words)
    bounds = next((m for m in markers if isinstance(m, Range)), Range())
    note = next((m.text for m in markers if isinstance(m, Note)), "")
    multiple = next((m.n for m in markers if isinstance(m, MultipleOf)), None)
    return Spec(
        kind, **dataclasses.asdict(bounds), multiple_of=multiple, null=null, choices=choices, note=note
    )


def is_marked(annotation: Any) -> bool:
    """Whether ``annotation`` carries a marker of this module."""
    markers = Range | Note | PowerOfTwo | MultipleOf | Formerly | KeysOf | Injected
    return any(isinstance(m, markers) for m in _split(annotation)[1])


def formerly(annotation: Any) -> str | None:
    """The earlier spelling (:class:`Formerly`) of the key annotated ``annotation``, if any."""
    marker = _marker(annotation, Formerly)
    return marker.key if marker else None


def formerly_keys(annotation: Any) -> tuple[str, ...]:
    """Every earlier spelling (:class:`Formerly`) of the key annotated ``annotation``, in their order."""
    return tuple(m.key for m in _split(annotation)[1] if isinstance(m, Formerly))


def injected(annotation: Any) -> bool:
    """Whether the parameter annotated ``annotation`` is :class:`Injected` (no config key)."""
    return _marker(annotation, Injected) is not None


def keys_of(annotation: Any) -> Callable[..., Any] | None:
    """The constructor (:class:`KeysOf`) whose parameters are the keys of a node annotated so."""
    marker = _marker(annotation, KeysOf)
    return marker.target if marker else None


def parameters(target: Callable[..., Any]) -> dict[str, Any]:
    """The config keys ``target`` receives: ``{name: annotation}`` of its parameters, with the
    parameters of the constructor its ``**kwargs`` go to (:class:`KeysOf`)."""
    hints = annotations(target)
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return {}
    out: dict[str, Any] = {}
    for name, param in signature.parameters.items():
        annotation = hints.get(name, Any)
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            receiver = keys_of(annotation)
            if receiver is not None:
                out.update({k: v for k, v in parameters(receiver).items() if k not in out})
        elif param.kind is not inspect.Parameter.VAR_POSITIONAL:
            out[name] = annotation
    return out


def annotations(target: Callable[..., Any]) -> dict[str, Any]:
    """The resolved annotations of ``target``'s parameters (a class: its ``__init__``'s, or a
    dataclass's fields'). One that does not resolve (a name imported for type checkers only) is left
    out: it cannot be a checked type."""
    if dataclasses.is_dataclass(target):
        owner: Any = target
    else:
        owner = target.__init__ if inspect.isclass(target) else target
    try:
        return typing.get_type_hints(owner, include_extras=True)
    except Exception:  # noqa: BLE001 - resolve one by one below
        pass
    raw = getattr(owner, "__annotations__", {})
    scope = getattr(inspect.unwrap(owner), "__globals__", None) or vars(inspect.getmodule(owner) or typing)
    out = {}
    for name, annotation in raw.items():
        try:
            out[name] = eval(annotation, scope) if isinstance(annotation, str) else annotation  # noqa: S307
        except Exception:  # noqa: BLE001, S112 - a type-checking-only name: not a checked type
            continue
    return out
