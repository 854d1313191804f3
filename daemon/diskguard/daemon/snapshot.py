"""The daemon's usage snapshots: one record per filesystem after each full scan.

The record's shape is ``snapshots.record`` (docs/snapshots.md); this adds what only the
running daemon knows: flow state, alert level, bytes it deleted, its reclaim view.
"""

from __future__ import annotations

import time
from typing import Any

from diskguard.daemon.statefile import Memory
from diskguard.flow.state import FlowState
from diskguard.kafkalog.scan import ScanResult
from diskguard.retention.daemonstate import ReclaimView
from diskguard.snapshots.record import DeletedBytesCounter, build_snapshot
from diskguard.snapshots.spool import Spool


def record_snapshots(
    scan: ScanResult,
    host: str,
    memory: Memory,
    deleted: DeletedBytesCounter,
    spool: Spool | None,
) -> None:
    """One usage snapshot per filesystem of a full scan, appended to the spool (which ships
    it to Kafka); ``deleted`` is taken (reset) per filesystem whether or not it is spooled."""
    ts_ms = int(time.time() * 1000)
    for fs in scan.filesystems:
        mount = fs.usage.mount
        topics = scan.topics_by_mount.get(mount, {})
        state = memory.flow.get(mount, FlowState())
        record = build_snapshot(
            host=host,
            ts_ms=ts_ms,
            fs=fs,
            topic_bytes={t: (u.partitions, u.bytes) for t, u in topics.items()},
            kafka_bytes=sum(d.kafka_bytes or 0 for d in fs.log_dirs),
            deleted_bytes=deleted.take(mount),
            flow_state="overfull" if state.overfull else "normal",
            alert_level=state.alert_level or 0,
            reclaim=_snapshot_reclaim(memory.reclaim.get(mount)),
        )
        if spool is not None:
            spool.append(record)


#: The reclaim view's fields a snapshot record carries (docs/snapshots.md).
_SNAPSHOT_RECLAIM_KEYS = (
    "growth_bytes_per_s",
    "check_interval_s",
    "delete_delay_s",
    "latency_p50_s",
    "latency_max_s",
    "latency_samples",
)


def _snapshot_reclaim(view: ReclaimView | None) -> dict[str, Any] | None:
    if view is None:
        return None
    return {key: getattr(view, key) for key in _SNAPSHOT_RECLAIM_KEYS}
