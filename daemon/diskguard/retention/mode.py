"""Which executor may act now: the mode decision of a retention cycle. Pure.

The decision is where safety lives: with the broker running, files are deleted only through
the broker (DeleteRecords) because unlinking a segment the broker holds open frees nothing
and corrupts its view; direct deletion happens only while no other process holds the log
dir's ``.lock``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DRY_RUN = "dry-run"
BROKER = "broker"
OFFLINE = "offline"
REFUSED = "refused"


@dataclass(frozen=True)
class ModeDecision:
    mode: str
    reason: str


def decide_mode(
    configured: str, broker_reachable: bool | None, locked_log_dirs: Sequence[str]
) -> ModeDecision:
    """Pure: which executor may act now.

    ``broker_reachable`` is None when no bootstrap servers are configured.
    """
    if configured == DRY_RUN:
        return ModeDecision(DRY_RUN, "mode = dry-run")
    if configured == BROKER:
        if broker_reachable is None:
            return ModeDecision(REFUSED, "mode = broker but broker.bootstrap_servers is not set")
        return ModeDecision(BROKER, "mode = broker")
    if configured == OFFLINE:
        if locked_log_dirs:
            return ModeDecision(
                REFUSED,
                f"mode = offline but another process holds {locked_log_dirs[0]}/.lock "
                "(is the broker running?)",
            )
        return ModeDecision(OFFLINE, "mode = offline, no process holds the log dirs' .lock")
    # auto
    if broker_reachable:
        return ModeDecision(BROKER, "auto: broker reachable")
    if not locked_log_dirs:
        why = "broker not reachable" if broker_reachable is False else "no bootstrap servers"
        return ModeDecision(OFFLINE, f"auto: {why} and no process holds the log dirs' .lock")
    return ModeDecision(
        REFUSED,
        f"auto: {locked_log_dirs[0]}/.lock is held by another process but the broker is "
        "not reachable through bootstrap_servers; refusing to delete files under a live broker",
    )
