"""The keys of a config reach the parameters that receive them (run/config_tree.py): a constructor
annotated with config_schema's markers is checked, and its old spellings read, with no other edit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

import pytest
from omegaconf import OmegaConf

from nerf_lightning.apps.config_checks import check_config
from nerf_lightning.config_schema import Formerly, KeysOf, Note, PowerOfTwo, Range
from nerf_lightning.errors import UserError
from nerf_lightning.run.config_tree import aliases_of


class Bulb:
    """A constructor no table names: only its annotations say what its keys hold."""

    def __init__(self, socket: Annotated[int, PowerOfTwo(), Range(high=64)] = 8) -> None:
        self.socket = socket


class Lamp:
    def __init__(
        self,
        watts: Annotated[int, Range(low=1, high=100), Note("per bulb"), Formerly("lamp_watts")] = 40,
        colour: Annotated[Literal["warm", "cold"], Note("the bulbs' light")] = "warm",
        dimmer: Annotated[float | None, Range(low=0, below=1)] = None,
        bulbs: Annotated[Mapping[str, Any] | None, KeysOf(Bulb), Formerly("bulbs")] = None,
        height: int = 1,  # no marker on a class outside the project: another library's plain type
    ) -> None:
        self.watts, self.colour, self.dimmer, self.bulbs, self.height = watts, colour, dimmer, bulbs, height


def _cfg(**lamp: Any) -> Any:
    return OmegaConf.create({"room": {"lamp": {"_target_": f"{__name__}.Lamp", **lamp}}, "bulb_watts": 60})


@pytest.mark.parametrize(
    ("lamp", "line"),
    [
        ({"watts": 0}, "room.lamp.watts=0: expected an integer >= 1 and <= 100 (per bulb)"),
        ({"watts": 60.5}, "room.lamp.watts=60.5: expected an integer >= 1 and <= 100"),
        ({"colour": "hot"}, "room.lamp.colour=hot: expected one of warm, cold (the bulbs' light)"),
        ({"dimmer": 1}, "room.lamp.dimmer=1: expected a number >= 0 and < 1 or null"),
        ({"bulbs": {"socket": 3}}, "room.lamp.bulbs.socket=3: expected a power of two <= 64"),
        ({"watts": "${bulb_watts}", "dimmer": 2}, "room.lamp.dimmer=2"),
    ],
)
def test_a_new_annotated_constructor_is_checked_by_its_key(lamp: dict[str, Any], line: str) -> None:
    with pytest.raises(UserError) as err:
        check_config(_cfg(**lamp))
    assert str(err.value).startswith(line), str(err.value)


def test_a_good_lamp_passes_and_an_unmarked_foreign_type_is_not_checked() -> None:
    check_config(_cfg(watts=100, colour="cold", dimmer=0.5, bulbs={"socket": 64}, height="tall"))


def test_an_interpolated_value_is_reported_by_the_key_a_user_sets() -> None:
    cfg = _cfg(watts="${bulb_watts}")
    cfg.bulb_watts = 500
    with pytest.raises(UserError, match=r"^bulb_watts=500: expected an integer >= 1 and <= 100"):
        check_config(cfg)


def test_old_spellings_come_from_formerly_on_the_parameters() -> None:
    cfg = _cfg(watts=40, bulbs={"socket": 8})
    assert aliases_of(cfg) == {"lamp_watts": "room.lamp.watts", "bulbs.": "room.lamp.bulbs."}
    assert aliases_of(_cfg(colour="warm")) == {}  # only keys the config holds


def test_a_project_constructor_s_plain_types_are_checked(compose_cfg) -> None:
    # model.net.field.density_bias carries no marker: NGPField's ``float`` alone says what it holds
    with pytest.raises(UserError, match=r"^model\.net\.field\.density_bias=wide: expected a number$"):
        check_config(compose_cfg("model.net.field.density_bias=wide"))
