"""What a running daemon last wrote to ``<state_dir>/state.json``, as the one-shot commands
read it: ``status`` shows it, ``plan``/``enforce --once``/``check-config --connect`` take the
write rate it measured, ``plan``/``enforce --once`` the partitions it set aside.

Its own module, apart from the retention cycle, so that ``status`` can read it without
importing the cycle's executors, broker client and segment dating (issue 15: start-up).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diskguard.config import Config
from diskguard.host.atomicfile import read_json

if TYPE_CHECKING:
    from diskguard.retention.cycle import RetentionCycle

#: The daemon's state file (flow state, last deletion, growth rate, reclaim latency).
STATE_FILE = "state.json"


def daemon_state(config: Config) -> dict[str, Any] | None:
    """What a *running* daemon last wrote to ``state.json`` (None if none is running)."""
    try:
        state = read_json(Path(config.daemon.state_dir) / STATE_FILE, None)
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict):
        return None
    pid = state.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return state


def recent_state(config: Config, max_age: float = 60.0) -> dict[str, Any] | None:
    """``daemon_state`` if the daemon wrote it within ``max_age`` seconds, else None."""
    state = daemon_state(config)
    if state is None or time.time() - float(state.get("updated", 0)) > max_age:
        return None
    return state


def rates_of(state: dict[str, Any] | None) -> dict[str, float]:
    """mount -> write rate the daemon measured, from its ``state`` (empty for None).

    ``plan`` and ``enforce --once`` have no usage history of their own; without this their
    broker-mode forecast would assume no growth at all.
    """
    out: dict[str, float] = {}
    for mount, fs in ((state or {}).get("filesystems") or {}).items():
        rate = ((fs or {}).get("reclaim") or {}).get("growth_bytes_per_s")
        if isinstance(rate, int | float) and rate >= 0:
            out[str(mount)] = float(rate)
    return out


def set_aside_of(state: dict[str, Any] | None) -> list[Any]:
    """The partitions the daemon set aside (``retention.setaside``), from its ``state``: as
    written, for ``SetAside.load`` to check (empty for None or anything not a list)."""
    entries = (state or {}).get("set_aside")
    return entries if isinstance(entries, list) else []


def daemon_rates(config: Config, max_age: float = 60.0) -> dict[str, float]:
    """``rates_of`` a running daemon's recent state (``check-config --connect``)."""
    return rates_of(recent_state(config, max_age))


def daemon_memory(config: Config, max_age: float = 60.0) -> tuple[dict[str, float], list[Any]]:
    """What ``plan`` and ``enforce --once`` take over from a running daemon's recent state, in
    one read: its write rates (``rates_of``) and the partitions it set aside
    (``set_aside_of``), so a dry run shows what the daemon will do rather than the deletion
    the broker (or the file) keeps refusing."""
    state = recent_state(config, max_age)
    return rates_of(state), set_aside_of(state)


def take_over(retention: RetentionCycle) -> None:
    """``plan`` / ``enforce --once``: start from what a running daemon knows (``daemon_memory``)
    — its write rates, and the partitions it set aside, for the time they have left."""
    retention.daemon_rates, set_aside = daemon_memory(retention.config)
    retention.inputs.set_aside.load(set_aside, time.monotonic(), time.time())
