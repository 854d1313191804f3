"""Usage snapshot records: one JSON object per filesystem per tick, for the Spark fleet job.

Pure: the daemon loop hands in what it already knows (the scanned filesystem, per-topic
bytes, flow state) and gets back a plain dict that ``spool`` writes as one JSON line. Keeping
the record builder free of I/O means the wire schema is fixed by unit tests, not by whatever
the scanner happened to return.

The schema is versioned by the ``schema`` field; any change to field names, meanings or
types bumps :data:`SCHEMA_VERSION` (see ``docs/snapshots.md``). The Spark job deduplicates
by ``(host, mount, ts_ms)`` because the shipper delivers at least once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from diskguard.kafkalog.model import Filesystem, usage_fields

SCHEMA_VERSION = 1

FLOW_STATES: tuple[str, ...] = ("normal", "overfull")


def build_snapshot(
    host: str,
    ts_ms: int,
    fs: Filesystem,
    topic_bytes: Mapping[str, tuple[int, int]],
    kafka_bytes: int,
    deleted_bytes: int,
    flow_state: str,
    alert_level: int,
    reclaim: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The record for one filesystem at ``ts_ms``.

    ``reclaim`` (optional) is the daemon's view of the broker's reclaim latency and the
    filesystem's write rate. ``topic_bytes`` maps topic -> ``(partitions, bytes)`` for the
    partitions on this filesystem only. ``deleted_bytes`` is what diskguard freed here since
    the previous snapshot (see :class:`DeletedBytesCounter`). Topics are listed biggest
    first so that a truncated view (a log line, a dashboard) still shows what matters. Bad
    values raise
    ValueError: a malformed record would poison the fleet aggregation far from its cause.
    """
    if flow_state not in FLOW_STATES:
        raise ValueError(f"flow_state must be one of {FLOW_STATES}, got {flow_state!r}")
    for name, value in (
        ("ts_ms", ts_ms),
        ("kafka_bytes", kafka_bytes),
        ("deleted_bytes", deleted_bytes),
        ("alert_level", alert_level),
    ):
        if value < 0:
            raise ValueError(f"{name} must not be negative, got {value}")
    ordered = sorted(topic_bytes.items(), key=lambda item: (-item[1][1], item[0]))
    topics = [
        {"topic": topic, "partitions": int(partitions), "bytes": int(size)}
        for topic, (partitions, size) in ordered
    ]
    return {
        "schema": SCHEMA_VERSION,
        "host": host,
        "ts_ms": int(ts_ms),
        **usage_fields(fs.usage, [d.path for d in fs.log_dirs]),
        "kafka_bytes": int(kafka_bytes),
        "pending_reclaim_bytes": fs.pending_reclaim_bytes,
        "deleted_bytes": int(deleted_bytes),
        "flow_state": flow_state,
        "alert_level": int(alert_level),
        "topics": topics,
        # Optional (null when unknown): the broker's reclaim latency, measured, and the rate.
        "reclaim": dict(reclaim) if reclaim is not None else None,
    }


def encode_record(record: Mapping[str, Any]) -> bytes:
    """One compact JSON line (no trailing newline): the spool line and the Kafka value."""
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


@dataclass
class DeletedBytesCounter:
    """Bytes diskguard freed per mount since that mount's last snapshot.

    The executor adds as segments go; the snapshot takes and resets. A delta per snapshot
    (rather than a running total) survives daemon restarts without double counting: the
    Spark job sums deltas.
    """

    _freed: dict[str, int] = field(default_factory=dict)

    def add(self, mount: str, freed_bytes: int) -> None:
        if freed_bytes < 0:
            raise ValueError(f"freed bytes must not be negative, got {freed_bytes}")
        self._freed[mount] = self._freed.get(mount, 0) + freed_bytes

    def peek(self, mount: str) -> int:
        return self._freed.get(mount, 0)

    def take(self, mount: str) -> int:
        """The bytes freed since the previous ``take`` for ``mount``, resetting it to zero."""
        return self._freed.pop(mount, 0)
