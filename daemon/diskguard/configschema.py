"""A parsed TOML table checked against frozen dataclasses: every problem at once, typed out.

Why not pydantic, which did this before: importing it and building the models took
~60 ms of every command's ~150 ms start-up (``plan``, ``status``, ``check-config``), for a
config of ~45 keys of a dozen kinds. This module checks exactly those kinds, strictly (TOML
is typed, so a string where a number belongs is a mistake, not something to coerce), and
reports every problem with where it is, as pydantic did.

A field's kind is its annotation, read as an object (no postponed annotations in the
modules that declare sections):

- ``Annotated[T, conv, check, ...]``: the converters run in order, the first on the raw
  value; each returns the value to keep or raises ``ValueError`` whose text is the problem.
  A later one checks what the first read (a size in whole bytes, a duration in seconds), so
  its problem gets ", got <the value as written>": the operator never wrote the 0 that
  "0.5" bytes became;
- ``bool``, ``int``, ``float``, ``str``, ``Path``: that TOML type (``float`` also takes an
  integer; a boolean is never a number);
- ``Literal[...]``, ``X | None``, a union of scalars, ``list[X]``, ``dict[str, X]``;
- a dataclass: a nested table, built by :func:`build`.

Cross-key rules live in the section's ``__post_init__`` (a ``ValueError`` there is a
problem of the section). A field whose ``metadata`` has ``"toml": False`` is not a key.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
#: Where a value is: table keys and array indexes from the top of the file.
Loc = tuple[int | str, ...]
#: ``(where, what is wrong)``: what :func:`build` collects.
Problem = tuple[Loc, str]

_SCALARS: dict[type, str] = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
}


def describe(value: object) -> str:
    """The TOML kind of a value, for "expected X, got Y"."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, Mapping):
        return "a table"
    return f"a {type(value).__name__}"  # TOML dates and times


def dotted(loc: Loc) -> str:
    """Where a problem is, as a dotted key path (``retention.protect_topics[2]``)."""
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        elif re.fullmatch(r"[A-Za-z0-9_-]+", item):
            parts.append(item)
        else:
            # Quoted as TOML would (a key with a newline must not break the one-line rule).
            import json  # only on this error path: check-config otherwise never loads it

            parts.append(json.dumps(item))
    return ".".join(parts) or "(top level)"


def toml_keys(cls: type) -> list[str]:
    """The keys of a section's table, in declaration order."""
    return list(_kinds(cls))


def _unknown(key: int | str, known: list[str]) -> str:
    """An unknown key, naming the closest known key of the same table when one is close: a
    typo should cost one glance, not a trip to the README."""
    if isinstance(key, str):
        import difflib  # only on this error path: not worth its import at every start-up

        close = difflib.get_close_matches(key, known, n=1)
        if close:
            return f"unknown key (did you mean {close[0]}?)"
    return "unknown key"


_KINDS: dict[type, dict[str, Any]] = {}


def _kinds(cls: type) -> dict[str, Any]:
    """A section's TOML keys and their annotations, as objects. Postponed annotations (a
    module with ``from __future__ import annotations``) are evaluated once, on first use."""
    kinds = _KINDS.get(cls)
    if kinds is None:
        keys = [f for f in dataclasses.fields(cls) if f.metadata.get("toml", True)]
        if any(isinstance(f.type, str) for f in keys):
            hints = typing.get_type_hints(cls, include_extras=True)
            kinds = {f.name: hints[f.name] for f in keys}
        else:
            kinds = {f.name: f.type for f in keys}
        _KINDS[cls] = kinds
    return kinds


def build(cls: type[T], table: object, loc: Loc, problems: list[Problem]) -> T | None:
    """``cls`` built from ``table``, or None with what is wrong appended to ``problems``.

    Every key is checked, known or not, before giving up, so that one run of
    ``check-config`` lists every problem of the file.
    """
    if not isinstance(table, Mapping):
        problems.append((loc, f"expected a table, got {describe(table)}"))
        return None
    known = _kinds(cls)
    before = len(problems)
    values: dict[str, Any] = {}
    for name, kind in known.items():
        if name in table:
            values[name] = check(kind, table[name], (*loc, name), problems)
    for key in table:
        if key not in known:
            problems.append(((*loc, key), _unknown(key, list(known))))
    if len(problems) > before:
        return None
    try:
        return cls(**values)
    except ValueError as exc:  # a cross-key rule of the section (__post_init__)
        problems.append((loc, str(exc)))
        return None


def check(kind: Any, value: object, loc: Loc, problems: list[Problem]) -> Any:
    """``value`` as ``kind`` wants it; on a problem, None and the problem appended."""
    origin = typing.get_origin(kind)
    if origin is typing.Annotated:
        _base, *converters = typing.get_args(kind)
        written = value
        for i, convert in enumerate(converters):
            try:
                value = convert(value)
            except ValueError as exc:
                problems.append((loc, str(exc) if i == 0 else f"{exc}, got {_as_written(written)}"))
                return None
        return value
    if origin is typing.Union or origin is types.UnionType:
        return _union(typing.get_args(kind), value, loc, problems)
    if origin is typing.Literal:
        allowed = typing.get_args(kind)
        if isinstance(value, str) and value in allowed:
            return value
        choices = ", ".join(repr(a) for a in allowed)
        shown = repr(value) if isinstance(value, str) else describe(value)
        problems.append((loc, f"expected one of {choices}, got {shown}"))
        return None
    if origin is list:
        if not isinstance(value, list | tuple):
            problems.append((loc, f"expected an array, got {describe(value)}"))
            return None
        (item,) = typing.get_args(kind)
        return [check(item, v, (*loc, i), problems) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            problems.append((loc, f"expected a table, got {describe(value)}"))
            return None
        _key, item = typing.get_args(kind)
        return {str(k): check(item, v, (*loc, str(k)), problems) for k, v in value.items()}
    if dataclasses.is_dataclass(kind):
        return build(kind, value, loc, problems)  # type: ignore[arg-type]
    if _is_a(kind, value):
        return Path(value) if kind is Path else float(value) if kind is float else value  # type: ignore[arg-type]
    wanted = "a path (a string)" if kind is Path else _SCALARS.get(kind)
    if wanted is None:
        raise TypeError(f"configschema cannot check {kind!r} (at {loc})")
    problems.append((loc, f"expected {wanted}, got {describe(value)}"))
    return None


def _as_written(value: object) -> str:
    """A value from the file, as the operator wrote it (cut short past 40 characters)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _is_a(kind: Any, value: object) -> bool:
    """Is ``value`` of the scalar ``kind``, strictly (a boolean is no number)?"""
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is str or kind is Path:
        return isinstance(value, str)
    return False


def _union(options: tuple[Any, ...], value: object, loc: Loc, problems: list[Problem]) -> Any:
    """``X | None``: None or an X. A union of scalars: a value of one of them, kept as it is
    (a Kafka client setting may be a string, a number or a boolean)."""
    rest = [o for o in options if o is not type(None)]
    if value is None and len(rest) < len(options):
        return None
    if len(rest) == 1:
        return check(rest[0], value, loc, problems)
    for option in rest:
        if _is_a(option, value):
            return value
    *first, last = [_SCALARS.get(o, repr(o)) for o in rest]
    problems.append((loc, f"expected {', '.join(first)} or {last}, got {describe(value)}"))
    return None
