"""The daemon's memory between cycles, written to ``state.json`` for the other commands.

``status`` shows a running daemon's flow state and last deletion from it; ``plan`` and
``enforce`` take its measured growth rate and reclaim latency. The file's shape and version
are ``retention.daemonstate``'s, which its readers share.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from diskguard.flow.state import FlowState
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.logs import get_logger
from diskguard.retention import daemonstate
from diskguard.retention.daemonstate import (
    DaemonState,
    FilesystemState,
    LastDeletion,
    ReclaimView,
    SetAsideEntry,
)

log = get_logger("diskguard.daemon")

#: state.json is rewritten at least this often (seconds) while the daemon runs.
STATE_EVERY_S = 5.0


@dataclass
class Memory:
    """What the loop remembers between cycles (also written to ``state.json`` for `status`)."""

    flow: dict[str, FlowState] = field(default_factory=dict)
    last_deletion: dict[str, LastDeletion] = field(default_factory=dict)
    usage: dict[str, FilesystemUsage] = field(default_factory=dict)
    deleted_open: dict[str, int] = field(default_factory=dict)
    #: mount -> growth rate and broker reclaim latency view (status, metrics, snapshots).
    reclaim: dict[str, ReclaimView] = field(default_factory=dict)
    #: Partitions the retention cycle set aside: plan and status show them.
    set_aside: list[SetAsideEntry] = field(default_factory=list)


def write_state(memory: Memory, state_dir: Path, pending: Callable[[str], int]) -> None:
    """``<state_dir>/state.json`` (``retention.daemonstate``): what `status`, `plan` and
    `enforce` read of the running daemon (flow state, last deletion, pending reclaim, reclaim
    view per filesystem; the partitions set aside)."""
    state = DaemonState(
        pid=os.getpid(),
        updated=time.time(),
        filesystems={
            mount: FilesystemState(
                flow_state="overfull" if st.overfull else "normal",
                alert_level=st.alert_level or 0,
                last_deletion=memory.last_deletion.get(mount),
                pending_reclaim_bytes=pending(mount),
                reclaim=memory.reclaim.get(mount),
            )
            for mount, st in memory.flow.items()
        },
        set_aside=memory.set_aside,
    )
    try:
        daemonstate.write_state(state, state_dir)
    except OSError as exc:
        log.warning("state_write_failed", error=exc.strerror or str(exc))


def status_line(memory: Memory) -> str:
    """The one line systemd shows as the unit's status (``sd_notify STATUS=``)."""
    parts = []
    for mount, usage in sorted(memory.usage.items()):
        st = memory.flow.get(mount, FlowState())
        flag = " OVERFULL" if st.overfull else ""
        parts.append(f"{mount} {usage.usage_percent:.1f}%{flag}")
    return "; ".join(parts) or "starting"
