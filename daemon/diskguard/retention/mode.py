"""Which executor may act now: the mode decision of a retention cycle. Pure.

The decision is where safety lives: with the broker running, files are deleted only through
the broker (DeleteRecords) because unlinking a segment the broker holds open frees nothing
and corrupts its view; direct deletion happens only while no other process holds the log
dir's ``.lock``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from diskguard.kafkalog.model import LockHolder

DRY_RUN = "dry-run"
BROKER = "broker"
OFFLINE = "offline"
REFUSED = "refused"


@dataclass(frozen=True)
class ModeDecision:
    mode: str
    reason: str


def decide_mode(
    configured: str,
    broker_reachable: bool | None,
    locked_log_dirs: Sequence[str],
    holder: LockHolder | None = None,
) -> ModeDecision:
    """Pure: which executor may act now.

    ``broker_reachable`` is None when no bootstrap servers are configured. ``holder``: who
    holds the first of ``locked_log_dirs`` (named in a refusal; None: not known).
    """
    if configured == DRY_RUN:
        return ModeDecision(DRY_RUN, "mode = dry-run")
    if configured == BROKER:
        if broker_reachable is None:
            return ModeDecision(REFUSED, "mode = broker but broker.bootstrap_servers is not set")
        return ModeDecision(BROKER, "mode = broker")
    if configured == OFFLINE:
        if locked_log_dirs:
            return ModeDecision(REFUSED, f"mode = offline but {_held(locked_log_dirs[0], holder)}")
        return ModeDecision(OFFLINE, "mode = offline, no process holds the log dirs' .lock")
    # auto
    if broker_reachable:
        return ModeDecision(BROKER, "auto: broker reachable")
    if not locked_log_dirs:
        why = "broker not reachable" if broker_reachable is False else "no bootstrap servers"
        return ModeDecision(OFFLINE, f"auto: {why} and no process holds the log dirs' .lock")
    if holder is not None and holder.kind == "diskguard":
        return ModeDecision(REFUSED, f"auto: {_held(locked_log_dirs[0], holder)}")
    return ModeDecision(
        REFUSED,
        f"auto: {locked_log_dirs[0]}/.lock is held by "
        f"{holder.text if holder else 'another process'} but the broker is "
        "not reachable through bootstrap_servers; refusing to delete files under a live broker",
    )


def _held(log_dir: str, holder: LockHolder | None) -> str:
    """``<log_dir>/.lock is held by ...`` and what that means for the operator."""
    if holder is None:
        return f"another process holds {log_dir}/.lock (is the broker running?)"
    text = f"{log_dir}/.lock is held by {holder.text}"
    if holder.kind == "diskguard":
        return f"{text}, deleting there now; nothing touched: run again once it has finished"
    return text
