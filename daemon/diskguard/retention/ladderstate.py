"""What the ladder changed on the cluster, kept in ``<state_dir>/ladder.json`` (edge).

Lowering a topic's local retention, cordoning a log dir and moving a replica are changes a
restarted guard must know it made: to restore the operator's retention once the disk is
back under its target, to lift only its own cordons (never one an operator set), and to
count a move still copying as space on its way. Each change is written here *before* it is
asked of the broker (a crash between the two leaves a record of a change that may not have
happened: restoring or lifting it then is harmless), and forgotten only after it was undone.

One lock: the daemon's loop (cordons) and its retention cycle (evictions, moves) both write.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from diskguard.host.atomicfile import write_json_atomic
from diskguard.logs import get_logger

__all__ = ["LADDER_FILE", "LadderState", "Lowered", "MoveInFlight"]

LADDER_FILE = "ladder.json"
VERSION = 1

log = get_logger("diskguard.ladder")


@dataclass(frozen=True)
class Lowered:
    """A topic whose ``key`` diskguard lowered to ``value``: ``previous`` is the operator's
    topic-level value (None: no override, the topic followed the broker default)."""

    key: str
    value: str
    previous: str | None
    mounts: tuple[str, ...]
    since_ms: int


@dataclass(frozen=True)
class MoveInFlight:
    topic: str
    partition: int
    source_dir: str
    target_dir: str
    bytes: int
    source_mount: str
    started_ms: int
    #: Monotonic time of the request in this process (None after a restart: not timed).
    started_at: float | None = field(default=None, compare=False)


@dataclass
class _Data:
    lowered: dict[str, Lowered] = field(default_factory=dict)
    moves: dict[str, MoveInFlight] = field(default_factory=dict)
    cordoned: list[str] = field(default_factory=list)
    #: Measured copy rate of replica moves (bytes per second), None until one was timed.
    move_rate: float | None = None


def move_key(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


class LadderState:
    """The record file; ``problem`` says why an unreadable one was set aside."""

    def __init__(self, path: Path, persist: bool = True) -> None:
        self.path = path
        self.persist = persist
        self._lock = threading.RLock()
        self.problem: str | None = None
        self._data = self._load()

    def _load(self) -> _Data:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return _Data()
        except (OSError, ValueError) as exc:
            self.problem = f"{self.path}: unreadable ({exc}); the ladder starts with no record"
            return _Data()
        try:
            return _parse(raw)
        except (KeyError, TypeError, ValueError) as exc:
            self.problem = f"{self.path}: not a version {VERSION} ladder record ({exc})"
            return _Data()

    @contextmanager
    def change(self) -> Iterator[_Data]:
        """Change the record; it is written (durably) when the block ends."""
        with self._lock:
            yield self._data
            if self.persist:
                write_json_atomic(self.path, _dump(self._data))

    # -- reads (copies: the record may change under another thread) ------------------------
    def lowered(self) -> dict[str, Lowered]:
        with self._lock:
            return dict(self._data.lowered)

    def moves(self) -> dict[str, MoveInFlight]:
        with self._lock:
            return dict(self._data.moves)

    def cordoned(self) -> list[str]:
        with self._lock:
            return list(self._data.cordoned)

    def move_rate(self) -> float | None:
        with self._lock:
            return self._data.move_rate


def _dump(data: _Data) -> dict[str, Any]:
    return {
        "version": VERSION,
        "lowered": {
            t: {**asdict(v), "mounts": list(v.mounts)} for t, v in sorted(data.lowered.items())
        },
        "moves": {
            k: {key: val for key, val in asdict(m).items() if key != "started_at"}
            for k, m in sorted(data.moves.items())
        },
        "cordoned": sorted(data.cordoned),
        "move_rate": data.move_rate,
    }


def _parse(raw: Any) -> _Data:
    if not isinstance(raw, dict) or raw.get("version") != VERSION:
        raise ValueError("no version 1")
    lowered = {
        str(t): Lowered(
            key=str(v["key"]),
            value=str(v["value"]),
            previous=None if v["previous"] is None else str(v["previous"]),
            mounts=tuple(str(m) for m in v["mounts"]),
            since_ms=int(v["since_ms"]),
        )
        for t, v in dict(raw.get("lowered", {})).items()
    }
    moves = {
        str(k): MoveInFlight(
            topic=str(m["topic"]),
            partition=int(m["partition"]),
            source_dir=str(m["source_dir"]),
            target_dir=str(m["target_dir"]),
            bytes=int(m["bytes"]),
            source_mount=str(m["source_mount"]),
            started_ms=int(m["started_ms"]),
        )
        for k, m in dict(raw.get("moves", {})).items()
    }
    cordoned = [str(d) for d in raw.get("cordoned", [])]
    rate = raw.get("move_rate")
    return _Data(lowered, moves, cordoned, None if rate is None else float(rate))


def with_value(entry: Lowered, value: str, mounts: tuple[str, ...]) -> Lowered:
    """Lowered again: the new value, the operator's previous kept, the mounts joined."""
    return replace(entry, value=value, mounts=tuple(sorted({*entry.mounts, *mounts})))
