"""A parameter's annotation says what its config key may hold (config_schema.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

import pytest

from nerf_lightning.config_schema import (
    Formerly,
    Injected,
    KeysOf,
    MultipleOf,
    Note,
    PowerOfTwo,
    Range,
    injected,
    is_marked,
    parameters,
    spec_of,
)


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (int, "an integer"),
        (float, "a number"),
        (bool, "true or false"),
        (Literal["a", "b"], "one of a, b"),
        (Annotated[int, Range(low=1), Note("rays per step")], "an integer >= 1 (rays per step)"),
        (Annotated[float | None, Range(above=0, below=180)], "a number > 0 and < 180 or null"),
        (Annotated[int | None, PowerOfTwo(), Range(high=128)], "a power of two <= 128 or null"),
        (Annotated[float | Literal["auto"], Range(low=0)], "a number >= 0 or auto"),
        (Annotated[int, Range(low=2), MultipleOf(2)], "an integer >= 2, a multiple of 2"),
        (Annotated[bool | Literal["auto"], Note("auto: photographs only")],
         "one of True, False, auto (auto: photographs only)"),
    ],
)  # fmt: skip
def test_the_type_and_the_markers_make_the_message(annotation: Any, expected: str) -> None:
    spec = spec_of(annotation)
    assert spec is not None and spec.expected() == expected


@pytest.mark.parametrize("annotation", [str, Mapping[str, Any], bool | int, bool | str, Any])
def test_other_types_are_not_checked_here(annotation: Any) -> None:
    assert spec_of(annotation) is None


def test_what_each_kind_accepts() -> None:
    count = spec_of(Annotated[int, Range(low=1, high=4)])
    assert count is not None
    assert [count.accepts(v) for v in (1, 4, 0, 5, 2.0, True, "2", None)] == [True, True] + [False] * 6
    ratio = spec_of(Annotated[float | None, Range(low=0, below=1)])
    assert ratio is not None
    assert [ratio.accepts(v) for v in (0, 0.5, None, 1, -0.1, float("nan"), False)] == [True] * 3 + [
        False
    ] * 4
    pow2 = spec_of(Annotated[int, PowerOfTwo(), Range(high=8)])
    assert pow2 is not None and [pow2.accepts(v) for v in (1, 2, 8, 3, 16, 0)] == [True] * 3 + [False] * 3
    even = spec_of(Annotated[int, Range(low=2), MultipleOf(2)])
    assert even is not None and [even.accepts(v) for v in (2, 4, 128, 0, 3, 4.0)] == [True] * 3 + [False] * 3
    word = spec_of(Annotated[float | Literal["auto"], Range(low=0)])
    assert word is not None and [word.accepts(v) for v in ("auto", 0.1, "off", -1)] == [
        True,
        True,
        False,
        False,
    ]


class _Socket:
    def __init__(self, size: Annotated[int, Range(low=1)] = 1) -> None:
        self.size = size


def _build(
    count: Annotated[int, Formerly("n")] = 1,
    name: str = "",
    *args: Any,
    sockets: Annotated[Mapping[str, Any] | None, KeysOf(_Socket)] = None,
    **kwargs: Annotated[Any, KeysOf(_Socket)],
) -> None:
    del count, name, args, sockets, kwargs


def test_parameters_follow_kwargs_to_their_receiver() -> None:
    params = parameters(_build)
    assert list(params) == ["count", "name", "sockets", "size"]  # *args is no key; **kwargs: _Socket's
    assert spec_of(params["size"]) == spec_of(Annotated[int, Range(low=1)])


def test_an_injected_argument_is_marked_as_no_config_key() -> None:
    given = Annotated[int, Injected("the train app: the capture's box")]
    assert injected(given) and is_marked(given) and spec_of(given) == spec_of(int)
    assert not injected(Annotated[int, Range(low=1)]) and not injected(int)
