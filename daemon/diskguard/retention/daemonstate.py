"""``<state_dir>/state.json``: what a running daemon says of itself, written and read here only.

The daemon writes it (``write_state``) every few seconds; the one-shot commands read it
(``read_state``): ``status`` shows a running daemon's flow state, last deletion and reclaim
view, ``plan``/``enforce --once``/``check-config --connect`` take the write rate it measured,
``plan``/``enforce --once`` the partitions it set aside. Both sides go through the types
below, so a key renamed on one side is renamed on the other; a file of another version is
refused with one line (``StateFileError``) rather than read as "no rate", "no daemon".

Version 1 is the shape written since the file was first versioned, which is also the shape
of the files written before (no ``version`` key): those read as version 1. Rewritten
atomically, so a reader never sees half a file, but not fsync'd: after a power loss the
daemon is a new process and rewrites it within seconds.

Its own module, apart from the retention cycle, so that ``status`` can read it without
importing the cycle's executors, broker client and segment dating (its start-up time).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from diskguard.config import Config
from diskguard.configschema import Problem, build, dotted
from diskguard.host import processes
from diskguard.host.atomicfile import read_json, write_json_atomic

#: The daemon's state file (flow state, last deletion, growth rate, reclaim latency).
STATE_FILE = "state.json"
#: The version this diskguard writes and reads (``version`` in the file).
STATE_VERSION = 1


class StateFileError(Exception):
    """``state.json`` exists but is not a file this diskguard can read (one line)."""


@dataclass(frozen=True)
class LastDeletion:
    """The newest segment the daemon deleted (or had the broker delete) on a filesystem."""

    ts: float
    topic: str
    partition: int
    base_offset: int
    bytes: int | None = None
    mode: str | None = None


@dataclass(frozen=True)
class ReclaimView:
    """A filesystem's write rate and the broker's reclaim latency (settings and measured),
    and what they imply: ``status``, the metrics and the snapshots show it."""

    check_interval_s: float
    delete_delay_s: float
    settings_source: str
    latency_p50_s: float | None = None
    latency_max_s: float | None = None
    latency_samples: int = 0
    growth_bytes_per_s: float | None = None
    expected_latency_s: float | None = None
    latency_source: str | None = None
    headroom_needed_bytes: int | None = None
    predicted_usage_percent: float | None = None
    broker_mode: bool | None = None


@dataclass(frozen=True)
class FilesystemState:
    """One guarded filesystem as the daemon sees it."""

    flow_state: str = "normal"
    alert_level: int = 0
    last_deletion: LastDeletion | None = None
    pending_reclaim_bytes: int = 0
    reclaim: ReclaimView | None = None


@dataclass(frozen=True)
class SetAsideEntry:
    """A partition the retention cycle set aside (``SetAside.export``), until ``until``
    (wall-clock seconds)."""

    topic: str
    partition: int
    error: str
    until: float


@dataclass(frozen=True)
class DaemonState:
    """The whole file."""

    pid: int
    updated: float = 0.0
    filesystems: dict[str, FilesystemState] = field(default_factory=dict)
    set_aside: list[SetAsideEntry] = field(default_factory=list)
    version: int = STATE_VERSION

    def rates(self) -> dict[str, float]:
        """mount -> write rate the daemon measured (``plan`` and ``enforce --once`` have no
        usage history of their own; without it their broker-mode forecast would assume no
        growth at all)."""
        out: dict[str, float] = {}
        for mount, fs in self.filesystems.items():
            rate = fs.reclaim.growth_bytes_per_s if fs.reclaim is not None else None
            if rate is not None and rate >= 0:
                out[mount] = rate
        return out


def write_state(state: DaemonState, state_dir: Path) -> None:
    """Replace ``<state_dir>/state.json`` atomically (not fsync'd: a view of this process,
    rewritten every few seconds; two fsyncs each time were the idle daemon's only disk writes
    between snapshots). Raises ``OSError``."""
    write_json_atomic(Path(state_dir) / STATE_FILE, asdict(state), durable=False)


def read_state(state_dir: Path) -> DaemonState | None:
    """The file as written, or None when there is none (or it is torn: a reader racing a
    daemon that was killed mid-write). Raises ``StateFileError`` for a file of another
    version or of another shape (an unknown key, a value of the wrong kind, a missing one),
    naming the file and the first problem in one line."""
    path = Path(state_dir) / STATE_FILE
    try:
        raw = read_json(path, None)
    except ValueError:
        return None
    except OSError as exc:
        raise StateFileError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise StateFileError(f"{path}: not a JSON object")
    # Files from before the version key are version 1: the same shape, unversioned.
    version = raw.get("version", 1)
    if version != STATE_VERSION:
        raise StateFileError(
            f"{path}: version {version!r} is not one this diskguard reads (it reads version "
            f"{STATE_VERSION}; written by a newer diskguard?); ignored"
        )
    problems: list[Problem] = []
    try:
        state = build(DaemonState, {**raw, "version": STATE_VERSION}, (), problems)
    except TypeError as exc:  # a key without a default is missing
        raise StateFileError(f"{path}: {exc}") from exc
    if state is None:
        loc, what = problems[0]
        raise StateFileError(f"{path}: {dotted(loc)}: {what}")
    return state


def running(state: DaemonState | None) -> DaemonState | None:
    """``state`` if the process that wrote it still runs (None otherwise)."""
    if state is None or not processes.running(state.pid):
        return None
    return state


def daemon_state(config: Config) -> DaemonState | None:
    """What a *running* daemon last wrote (None if none is running). Raises
    ``StateFileError``."""
    return running(read_state(Path(config.daemon.state_dir)))


def recent_state(config: Config, max_age: float = 60.0) -> DaemonState | None:
    """``daemon_state`` if the daemon wrote it within ``max_age`` seconds, else None."""
    state = daemon_state(config)
    if state is None or time.time() - state.updated > max_age:
        return None
    return state


@dataclass(frozen=True)
class TakenOver:
    """What ``plan`` and ``enforce --once`` take over from a running daemon's recent state:
    its write rates and the partitions it set aside (as written, for ``SetAside.load`` to
    check), so a dry run shows what the daemon will do rather than the deletion the broker
    (or the file) keeps refusing. ``problem``: why a state file there could not be read."""

    rates: Mapping[str, float] = field(default_factory=dict)
    set_aside: list[Any] = field(default_factory=list)
    problem: str | None = None


def daemon_memory(config: Config, max_age: float = 60.0) -> TakenOver:
    """``TakenOver`` from a running daemon's recent state, in one read (empty if none, or
    if the file cannot be read: ``problem`` says why, and the command goes on without it)."""
    try:
        state = recent_state(config, max_age)
    except StateFileError as exc:
        return TakenOver(problem=str(exc))
    if state is None:
        return TakenOver()
    return TakenOver(state.rates(), [asdict(e) for e in state.set_aside])
