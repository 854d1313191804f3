"""configschema on its own: each kind strictly, every problem at once, never an exception but
the problems (the config's own rules are in test_config.py)."""

from __future__ import annotations

import dataclasses
import datetime
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diskguard.config import Config, parse_config
from diskguard.configschema import Problem, build, describe, toml_keys
from diskguard.errors import ConfigError


def _even(value: object) -> int:
    if not isinstance(value, int) or value % 2:
        raise ValueError(f"expected an even integer, got {value!r}")
    return value


@dataclass(frozen=True)
class Inner:
    name: str = "x"
    when: Literal["now", "later"] = "now"


@dataclass(frozen=True)
class Outer:
    flag: bool = False
    count: int = 0
    ratio: float = 0.5
    path: Path | None = None
    even: Annotated[int, _even] = 0
    names: list[str] = field(default_factory=list)
    extra: dict[str, str | int | bool] = field(default_factory=dict)
    inner: Inner = field(default_factory=Inner)
    hidden: str = field(default="h", metadata={"toml": False})

    def __post_init__(self) -> None:
        if self.count > 10 and not self.flag:
            raise ValueError("count above 10 needs flag")


def built(table: object) -> tuple[Outer | None, list[Problem]]:
    problems: list[Problem] = []
    return build(Outer, table, (), problems), problems


def test_values_of_the_right_kind_are_kept_typed() -> None:
    outer, problems = built(
        {
            "flag": True,
            "count": 3,
            "ratio": 2,  # an integer is a float
            "path": "/x",
            "even": 4,
            "names": ["a", "b"],
            "extra": {"s": "v", "n": 1, "b": False},
            "inner": {"name": "y", "when": "later"},
        }
    )
    assert problems == []
    assert outer == Outer(
        True, 3, 2.0, Path("/x"), 4, ["a", "b"], {"s": "v", "n": 1, "b": False}, Inner("y", "later")
    )
    assert isinstance(outer.ratio, float)
    assert built({}) == (Outer(), [])


def test_every_problem_at_once_with_where_it_is() -> None:
    outer, problems = built(
        {
            "flag": 1,
            "count": True,
            "ratio": "0.5",
            "path": 5,
            "even": 3,
            "names": ["a", 2, None],
            "extra": {"bad": [1]},
            "inner": {"when": "never", "nmae": "z"},
            "hidden": "no",
            "flga": True,
        }
    )
    assert outer is None
    assert problems == [
        (("flag",), "expected a boolean, got an integer"),
        (("count",), "expected an integer, got a boolean"),
        (("ratio",), "expected a number, got a string"),
        (("path",), "expected a path (a string), got an integer"),
        (("even",), "expected an even integer, got 3"),
        (("names", 1), "expected a string, got an integer"),
        (("names", 2), "expected a string, got nothing (null)"),
        (("extra", "bad"), "expected a string, an integer or a boolean, got an array"),
        (("inner", "when"), "expected one of 'now', 'later', got 'never'"),
        (("inner", "nmae"), "unknown key (did you mean name?)"),
        (("hidden",), "unknown key"),
        (("flga",), "unknown key (did you mean flag?)"),
    ]


def test_a_cross_key_rule_is_a_problem_of_its_table_once_its_keys_are_valid() -> None:
    assert built({"count": 11}) == (None, [((), "count above 10 needs flag")])
    # A key already wrong: the rule is not run on a half-built table.
    assert built({"count": 11, "ratio": "x"})[1] == [
        (("ratio",), "expected a number, got a string")
    ]


def test_a_table_where_a_table_belongs() -> None:
    assert built([1])[1] == [((), "expected a table, got an array")]
    assert built({"inner": "x"})[1] == [(("inner",), "expected a table, got a string")]
    assert built({"names": "a"})[1] == [(("names",), "expected an array, got a string")]


def test_toml_kinds_are_named() -> None:
    assert describe(datetime.date(2026, 1, 1)) == "a date"
    assert describe(1.5) == "a float" and describe({}) == "a table" and describe(()) == "an array"
    assert toml_keys(Outer)[-1] == "inner"


def _every_key(section: type = Config, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    keys: list[tuple[str, ...]] = []
    for info in dataclasses.fields(section):
        if not info.metadata.get("toml", True):
            continue
        if dataclasses.is_dataclass(info.type):
            keys += _every_key(info.type, (*prefix, info.name))  # type: ignore[arg-type]
        else:
            keys.append((*prefix, info.name))
    return keys


@pytest.mark.parametrize("key", _every_key(), ids=".".join)
def test_every_key_refuses_a_toml_date_in_one_line(tmp_path: Path, key: tuple[str, ...]) -> None:
    """Every config key's kind is one configschema checks (an unsupported annotation would be
    a TypeError at the first config that sets it), and none takes a TOML date."""
    data: dict[str, object] = {"broker": {"log_dirs": [str(tmp_path)]}}
    table = data
    for part in key[:-1]:
        table = table.setdefault(part, {})  # type: ignore[assignment]
    table[key[-1]] = datetime.date(2026, 1, 1)
    with pytest.raises(ConfigError) as err:
        parse_config(data, tmp_path / "c.toml")
    (problem,) = err.value.problems
    assert problem.startswith(f"{tmp_path / 'c.toml'}: {'.'.join(key)}"), problem


TOML_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=8)
    | st.dates()
    | st.sampled_from(["5s", "1GiB", "auto", "json", "exec", "/x", "80"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
KEYS = st.sampled_from([".".join(k) for k in _every_key()])


@given(st.dictionaries(KEYS, TOML_VALUES, max_size=6))
def test_any_values_under_real_keys_give_a_config_or_problems(values: dict[str, object]) -> None:
    """Values of any TOML kind under the real keys: a Config or problems, never an exception
    (a fuzz over arbitrary tables is in the reliability suite; this one reaches every key)."""
    data: dict[str, typing.Any] = {}
    for dotted, value in values.items():
        *sections, name = dotted.split(".")
        table = data
        for part in sections:
            table = table.setdefault(part, {})
        table[name] = value
    problems: list[Problem] = []
    config = build(Config, data, (), problems)
    assert (config is None) == bool(problems)
    assert all(isinstance(message, str) and message for _loc, message in problems)
