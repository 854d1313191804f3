"""What the daemon writes of itself: ``state.json`` for the other commands, and the one line
systemd shows as the unit's status.

``status`` shows a running daemon's flow state and last deletion from ``state.json``; ``plan``
and ``enforce`` take its measured growth rate and reclaim latency. The file's shape and
version are ``retention.daemonstate``'s, which its readers share.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
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


def write_state(
    state_dir: Path,
    flow: Mapping[str, FlowState],
    last_deletion: Mapping[str, LastDeletion],
    pending: Callable[[str], int],
    reclaim: Mapping[str, ReclaimView],
    set_aside: Sequence[SetAsideEntry],
) -> None:
    """``<state_dir>/state.json``: what `status`, `plan` and `enforce` read of the running
    daemon (flow state, last deletion, pending reclaim, reclaim view per filesystem; the
    partitions set aside). A failed write is logged, never raised into the loop."""
    state = DaemonState(
        pid=os.getpid(),
        updated=time.time(),
        filesystems={
            mount: FilesystemState(
                flow_state="overfull" if st.overfull else "normal",
                alert_level=st.alert_level or 0,
                last_deletion=last_deletion.get(mount),
                pending_reclaim_bytes=pending(mount),
                reclaim=reclaim.get(mount),
            )
            for mount, st in flow.items()
        },
        set_aside=list(set_aside),
    )
    try:
        daemonstate.write_state(state, state_dir)
    except OSError as exc:
        log.warning("state_write_failed", error=exc.strerror or str(exc))


def status_line(usages: Mapping[str, FilesystemUsage], flow: Mapping[str, FlowState]) -> str:
    """The one line systemd shows as the unit's status (``sd_notify STATUS=``)."""
    parts = []
    for mount, usage in sorted(usages.items()):
        flag = " OVERFULL" if flow.get(mount, FlowState()).overfull else ""
        parts.append(f"{mount} {usage.usage_percent:.1f}%{flag}")
    return "; ".join(parts) or "starting"
