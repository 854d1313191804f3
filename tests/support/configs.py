"""Write a diskguard TOML config for a test: the one config writer the tests share.

Most tests vary only a few ``[retention]`` keys, so those are plain keyword arguments;
the other sections are dicts. Generated test topics are ``cleanup.policy=delete`` but,
offline, no broker or KRaft metadata can say so: ``assume_delete_policy = [".*"]`` is the
default, and passing ``assume_delete_policy=None`` leaves it out (a key whose value is None
is never written). Tests of bad input write their own text; this writes only valid TOML.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

_Section = Mapping[str, object]


def write_config(
    tmp: Path,
    log_dirs: Path | Sequence[Path],
    *,
    broker: _Section | None = None,
    ladder: _Section | None = None,
    flow_control: _Section | None = None,
    alerts: _Section | None = None,
    ballast: _Section | None = None,
    snapshots: _Section | None = None,
    metrics: _Section | None = None,
    logging: _Section | None = None,
    state_dir: Path | None = None,
    name: str = "diskguard.toml",
    **retention: object,
) -> Path:
    """Write ``tmp/name`` and return its path.

    ``log_dirs`` is one dir or several; ``state_dir`` defaults to ``tmp/"state"`` (beside
    ``tmp`` when ``tmp`` is a log dir);
    ``**retention`` are ``[retention]`` keys (after the ``assume_delete_policy`` default).
    A dict inside a section dict becomes a sub-table (``broker={"client": {...}}``).
    """
    dirs = [log_dirs] if isinstance(log_dirs, Path) else list(log_dirs)
    sections: dict[str, _Section | None] = {
        "broker": {"log_dirs": dirs, **(broker or {})},
        "retention": {"assume_delete_policy": [".*"], **retention},
        "ladder": ladder,
        "flow_control": flow_control,
        "alerts": alerts,
        "ballast": ballast,
        "snapshots": snapshots,
        "metrics": metrics,
        "logging": logging,
        "daemon": {"state_dir": _state_dir(tmp, dirs) if state_dir is None else state_dir},
    }
    lines: list[str] = []
    for section, keys in sections.items():
        lines += _table(section, keys or {})
    path = tmp / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _state_dir(tmp: Path, log_dirs: Sequence[Path]) -> Path:
    """``tmp/"state"``, or beside ``tmp`` when ``tmp`` is itself a log dir (or inside one):
    a state dir inside a log dir is refused (a broker will not start with it there)."""
    inside = any(tmp == d or d in tmp.parents for d in log_dirs)
    return tmp.parent / f"{tmp.name}-state" if inside else tmp / "state"


def _table(name: str, keys: _Section) -> list[str]:
    plain = {k: v for k, v in keys.items() if v is not None and not isinstance(v, Mapping)}
    subtables = {k: v for k, v in keys.items() if isinstance(v, Mapping)}
    lines = [f"[{name}]", *(f"{_key(k)} = {_value(v)}" for k, v in plain.items())] if plain else []
    for sub, sub_keys in subtables.items():
        lines += _table(f"{name}.{_key(sub)}", sub_keys)
    return lines


def _key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def _value(value: object) -> str:
    if isinstance(value, Path):
        return json.dumps(str(value))
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):  # an inline table, e.g. in a list of tables
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)
