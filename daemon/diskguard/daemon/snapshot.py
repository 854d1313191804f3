"""The daemon's usage snapshots: one record per filesystem after each full scan, spooled on
disk and shipped to the Kafka topic.

The record's shape is ``snapshots.record`` (docs/snapshots.md); this adds what only the
running daemon knows: flow state, alert level, bytes it deleted, its reclaim view, and the
space held by deleted-but-open files.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from diskguard.config import Config
from diskguard.flow.state import FlowState
from diskguard.host.openfiles import held_by_mount
from diskguard.kafkalog.scan import ScanResult
from diskguard.logs import get_logger
from diskguard.retention.daemonstate import ReclaimView
from diskguard.snapshots.kafkasink import KafkaSink
from diskguard.snapshots.record import DeletedBytesCounter, build_snapshot
from diskguard.snapshots.spool import Spool, SpoolError

log = get_logger("diskguard.daemon")

#: The walk of ``/proc/*/fd`` is skipped while, on every filesystem, the bytes its log dirs'
#: files do not explain (used minus Kafka's) moved less than this since the last walk...
OPEN_FILES_MOVED_BYTES = 16 * 1024 * 1024
#: ... and the last walk is younger than this (seconds).
OPEN_FILES_MAX_AGE_S = 3600.0

#: The reclaim view's fields a snapshot record carries (docs/snapshots.md).
_SNAPSHOT_RECLAIM_KEYS = (
    "growth_bytes_per_s",
    "check_interval_s",
    "delete_delay_s",
    "latency_p50_s",
    "latency_max_s",
    "latency_samples",
)


class Snapshots:
    """The spool and the Kafka sink of one config, and the deleted-but-open bytes last
    measured per filesystem (``status``'s "df says full, du says not")."""

    def __init__(self, config: Config, state_dir: Path) -> None:
        self.deleted_open: dict[str, int] = {}
        #: mount -> the bytes no log dir's file explained at the last walk, and when (the
        #: monotonic clock): see ``_measure_deleted_open``.
        self._walked: dict[str, int] = {}
        self._walked_at = float("-inf")
        self.build(config, state_dir)

    def build(self, config: Config, state_dir: Path) -> None:
        self._host = config.snapshots.host
        self.spool: Spool | None = None
        try:
            self.spool = Spool(
                state_dir / "spool",
                config.snapshots.spool_max_bytes,
                config.snapshots.spool_file_bytes,
            )
        except SpoolError as exc:
            # Snapshots are a report; guarding the disk is the job. Keep guarding.
            log.error("spool_unavailable", error=str(exc), snapshots="disabled")
        self.sink: KafkaSink | None = None
        if self.spool and config.snapshots.topic and config.broker.bootstrap_servers:
            self.sink = KafkaSink(
                config.broker.bootstrap_servers,
                config.snapshots.topic,
                dict(config.broker.client),
                self.spool,
            )

    def record(
        self,
        scan: ScanResult,
        mounts: Mapping[str, list[str]],
        flow: Mapping[str, FlowState],
        reclaim: Mapping[str, ReclaimView],
        deleted: DeletedBytesCounter,
        open_files: bool = True,
    ) -> None:
        """One usage snapshot per filesystem of a full scan, appended to the spool (which
        ships it to Kafka); ``deleted`` is taken (reset) per filesystem whether or not it is
        spooled. ``open_files``: measure the deleted-but-open files again (else the last
        measure stands)."""
        if open_files:
            self._measure_deleted_open(mounts, scan)
        ts_ms = int(time.time() * 1000)
        for fs in scan.filesystems:
            mount = fs.usage.mount
            topics = scan.topics_by_mount.get(mount, {})
            state = flow.get(mount, FlowState())
            record = build_snapshot(
                host=self._host,
                ts_ms=ts_ms,
                fs=fs,
                topic_bytes={t: (u.partitions, u.bytes) for t, u in topics.items()},
                kafka_bytes=sum(d.kafka_bytes or 0 for d in fs.log_dirs),
                deleted_bytes=deleted.take(mount),
                flow_state="overfull" if state.overfull else "normal",
                alert_level=state.alert_level or 0,
                reclaim=_snapshot_reclaim(reclaim.get(mount)),
            )
            if self.spool is not None:
                self.spool.append(record)

    def ship(self) -> None:
        """Each iteration: hand spooled records to the producer (never waits long)."""
        if self.sink is not None:
            self.sink.ship()
        elif self.spool is not None:
            self.spool.flush_queue()

    def close(self, timeout: float = 3.0) -> None:
        if self.sink is not None:
            self.sink.close(timeout=max(0.0, timeout))
        if self.spool is not None:
            self.spool.close()

    def _measure_deleted_open(self, mounts: Mapping[str, list[str]], scan: ScanResult) -> None:
        """Space held by deleted-but-open files ("df says full, du says not"), per mount.

        A walk of /proc/*/fd: done with the snapshot, not on every usage poll; and only when
        it may say something new. Such a file's blocks are in the filesystem's used bytes
        and in no file a scan finds, so its coming or going moves the bytes no log dir's file
        explains (used minus Kafka's, of this full scan) by its size. Beside a broker at rest
        (18,000 descriptors at 9,000 partitions: one ``readlink`` each, a third of an idle
        check's CPU) those stay put: the walk is skipped while every filesystem's moved less
        than ``OPEN_FILES_MOVED_BYTES`` since the last one, for up to
        ``OPEN_FILES_MAX_AGE_S`` (a file closed while another as large was written outside
        the log dirs is seen then).
        """
        unexplained = _unexplained(scan)
        now = time.monotonic()
        walked = self._walked
        if (
            unexplained is not None
            and now - self._walked_at < OPEN_FILES_MAX_AGE_S
            and all(m in self.deleted_open for m in mounts)
            and unexplained.keys() == walked.keys()
            and all(abs(b - walked[m]) < OPEN_FILES_MOVED_BYTES for m, b in unexplained.items())
        ):
            return
        try:
            held = held_by_mount(dict(mounts))
        except OSError as exc:
            log.warning("open_files_scan_failed", error=exc.strerror or str(exc))
            return
        self.deleted_open.update(held)
        self._walked = unexplained or {}
        self._walked_at = now if unexplained is not None else float("-inf")


def _unexplained(scan: ScanResult) -> dict[str, int] | None:
    """mount -> used bytes no log dir's file accounts for (None: a log dir not measured)."""
    out: dict[str, int] = {}
    for fs in scan.filesystems:
        kafka = 0
        for d in fs.log_dirs:
            if d.kafka_bytes is None:
                return None
            kafka += d.kafka_bytes
        out[fs.usage.mount] = fs.usage.used_bytes - kafka
    return out


def _snapshot_reclaim(view: ReclaimView | None) -> dict[str, Any] | None:
    if view is None:
        return None
    return {key: getattr(view, key) for key in _SNAPSHOT_RECLAIM_KEYS}
