"""A stand-in Kafka broker for tests: a real Kafka-protocol server on 127.0.0.1 in front of
real log dirs, whose *log manager* behaves as a real Apache Kafka broker's was measured to
(``/work/shared/kafka/README.md``, DESIGN.md "Facts measured against a real Kafka broker").

~1000 lines in one file: it is the program run as its own process (``python -m
support.standin.broker``), protocol handlers and log manager together, like the broker it
stands in for; ``standin/__init__`` is the small API the tests use.

Why: diskguard's broker mode asks the broker to delete (DeleteRecords) and must then wait
for the broker to free the files at its next retention check plus its delete delay. CI has
no Kafka, so this process plays the broker closely enough for librdkafka's AdminClient and
for diskguard's disk scanner, and the closed loop can be tested end to end.

What it mirrors of Kafka's ``LogManager`` / ``Log``:

- ``<log_dir>/.lock`` locked the way ``FileLock`` does (Java ``FileChannel.tryLock`` = POSIX
  ``fcntl`` record lock, exclusive, whole file), every log dir before anything else; start-up
  fails ("Failed to acquire lock ...", exit 1) if any is held. ``meta.properties`` written
  when absent; ``cleaner-offset-checkpoint`` created empty (0 bytes, as on a fresh broker);
  ``.kafka_cleanshutdown`` written on a clean stop, removed at start.
- Partitions are ``<topic>-<n>`` dirs (placed round-robin over the log dirs) holding real
  segments (``support.segmentwriter``: RecordBatch v2, ``.index``/``.timeindex``, active
  indexes preallocated sparse to ``segment.index.bytes`` and trimmed on roll, a producer
  ``.snapshot`` at each roll). A producer thread appends at ``write_rate`` bytes/s spread
  round-robin over the partitions and rolls when a batch would overflow ``segment.bytes``
  (``LogSegment.shouldRoll``). Every segment's ``.log``/``.index``/``.timeindex`` stays open
  until the broker deletes it, so unlinking one underneath frees nothing.
- DeleteRecords moves the log start offset at once (``-1`` = the high watermark);
  ``OFFSET_OUT_OF_RANGE`` beyond the high watermark, ``POLICY_VIOLATION`` when the topic's
  ``cleanup.policy`` lacks ``delete``, ``UNKNOWN_TOPIC_OR_PARTITION``.
- The retention task (``kafka-log-retention``) first runs ``initial_delay_ms`` after start
  (Kafka: 30 s) and then every ``log.retention.check.interval.ms``: closed segments whose
  next segment starts at or below the log start offset are renamed ``*.deleted`` (all their
  files, fds kept open) and closed + unlinked ``file.delete.delay.ms`` later (topic config,
  default ``log.segment.delete.delay.ms``) — only then is the space free. Leftover
  ``*.deleted`` files are removed at the next start, as log loading does.
- Every ``checkpoint_interval_ms``: ``recovery-point-offset-checkpoint``,
  ``replication-offset-checkpoint`` (high watermark) and ``log-start-offset-checkpoint``
  (only partitions whose log start is above their first segment, as Kafka filters) in
  ``OffsetCheckpointFile`` format; all again on a clean stop.
- SIGTERM: stop writing, trim and close the active segments (as ``LogSegment.close`` does),
  close every file, write checkpoints and the clean-shutdown marker, release the locks.
  SIGKILL leaves whatever was on disk; the kernel drops the locks.

Kafka APIs answered (versions chosen so librdkafka 2.x needs no special client settings):
ApiVersions 0-3 (librdkafka 2.16 sends v3 first, answered as is; a newer request gets
``UNSUPPORTED_VERSION`` in the v0 format with the ApiVersions range, as Kafka does),
Metadata 0-9, ListOffsets 0-5 (earliest/latest only; a timestamp lookup answers offset -1),
FindCoordinator 0-4, OffsetCommit 0-8 (simple, ``assign()``-style commits),
OffsetFetch 0-7 (-1 for a partition the group never committed), ListGroups 0-4 (a group with
only committed offsets is ``Empty``), DeleteRecords 0-2, DescribeConfigs 0-4 (topic and
broker resources). Encoding is kafka-python's (``kafka.protocol``, Kafka's own JSON schemas).

What it does not do: Produce/Fetch (clients cannot produce or consume; the internal producer
writes), replication (one broker, leader of everything, HW = log end), group membership
(Join/Sync/Heartbeat), time- and size-based retention, compaction, segment.ms rolls,
transactions, ACLs, quotas, SASL/TLS, ZooKeeper/KRaft metadata. A restart reloads the
partition dirs (segments, log start offsets) but rolls a fresh active segment instead of
recovering the old one's indexes.

Control channel for tests: JSON lines on the unix socket ``control_socket`` (see
``Broker.control``). Run: ``python -m support.standin.broker CONFIG.json`` (tests/ and daemon/ on
``sys.path``); it prints ``bootstrap 127.0.0.1:PORT`` once it serves. ``standin.start``
wraps all of this for pytest.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka.protocol.admin import (
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.consumer import (
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)

from diskguard.kafkalog.model import parse_partition_dir, parse_segment_file, segment_file_name
from diskguard.kafkalog.recordbatch import iter_batches
from support.segmentwriter import ActiveSegment, empty_producer_snapshot, write_checkpoint

# Kafka error codes used here.
NONE = 0
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
UNSUPPORTED_VERSION = 35
INVALID_REQUEST = 42
POLICY_VIOLATION = 44

# DescribeConfigs config sources and types.
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
TYPE_BOOLEAN, TYPE_STRING, TYPE_INT, TYPE_LONG, TYPE_LIST = 1, 2, 3, 5, 7
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4

#: Topic configs a broker reports for every topic: (default, type). ``file.delete.delay.ms``
#: defaults to the broker's ``log.segment.delete.delay.ms`` (filled in per broker).
TOPIC_DEFAULTS: dict[str, tuple[str, int]] = {
    "cleanup.policy": ("delete", TYPE_LIST),
    "compression.type": ("producer", TYPE_STRING),
    "file.delete.delay.ms": ("60000", TYPE_LONG),
    "index.interval.bytes": ("4096", TYPE_INT),
    "max.message.bytes": ("1048588", TYPE_INT),
    "min.insync.replicas": ("1", TYPE_INT),
    "remote.storage.enable": ("false", TYPE_BOOLEAN),
    "retention.bytes": ("-1", TYPE_LONG),
    "retention.ms": ("604800000", TYPE_LONG),
    "segment.bytes": ("1073741824", TYPE_INT),
    "segment.index.bytes": ("10485760", TYPE_INT),
    "segment.ms": ("604800000", TYPE_LONG),
}

#: (api key, request class, response class, max version answered).
APIS: dict[int, tuple[Any, Any, int]] = {
    2: (ListOffsetsRequest, ListOffsetsResponse, 5),
    3: (MetadataRequest, MetadataResponse, 9),
    8: (OffsetCommitRequest, OffsetCommitResponse, 8),
    9: (OffsetFetchRequest, OffsetFetchResponse, 7),
    10: (FindCoordinatorRequest, FindCoordinatorResponse, 4),
    16: (ListGroupsRequest, ListGroupsResponse, 4),
    18: (ApiVersionsRequest, ApiVersionsResponse, 3),
    21: (DeleteRecordsRequest, DeleteRecordsResponse, 2),
    32: (DescribeConfigsRequest, DescribeConfigsResponse, 4),
}

SEGMENT_SUFFIXES = (".log", ".index", ".timeindex", ".txnindex")


def log(message: str) -> None:
    print(f"[standin {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class ClosedSegment:
    """A rolled segment: its files (path -> fd held open, None for files not kept open)."""

    base_offset: int
    next_offset: int
    files: dict[Path, int | None]


@dataclass
class PartitionLog:
    topic: str
    index: int
    log_dir: Path
    directory: Path
    configs: dict[str, str]
    closed: list[ClosedSegment] = field(default_factory=list)
    active: ActiveSegment | None = None
    log_start_offset: int = 0

    @property
    def high_watermark(self) -> int:
        assert self.active is not None
        return self.active.next_offset

    @property
    def first_base(self) -> int:
        if self.closed:
            return self.closed[0].base_offset
        assert self.active is not None
        return self.active.base_offset

    def config(self, key: str) -> str:
        return self.configs[key]


@dataclass
class PendingDelete:
    due: float
    segment: ClosedSegment


class LockFailed(Exception):
    pass


class Broker:
    """One stand-in broker process: log manager, producer thread, protocol and control server."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.broker_id = int(conf.get("broker_id", 0))
        self.host = str(conf.get("host", "127.0.0.1"))
        self.log_dirs = [Path(d) for d in conf["log_dirs"]]
        self.check_interval = float(conf.get("check_interval_ms", 300_000)) / 1000
        self.initial_delay = float(conf.get("initial_delay_ms", 30_000)) / 1000
        self.delete_delay_ms = int(conf.get("delete_delay_ms", 60_000))
        self.checkpoint_interval = float(conf.get("checkpoint_interval_ms", 60_000)) / 1000
        self.write_rate = float(conf.get("write_rate", 0))
        self.record_bytes = int(conf.get("record_bytes", 512))
        self.batch_bytes = int(conf.get("batch_bytes", 16384))
        self.paused = False
        self.lock = threading.RLock()
        self.stopping = threading.Event()
        self.partitions: dict[tuple[str, int], PartitionLog] = {}
        self.topic_configs: dict[str, dict[str, str]] = {}
        self.groups: dict[str, dict[tuple[str, int], int]] = {}
        self.pending: list[PendingDelete] = []
        self.retention_checks = 0
        self._lock_fds: list[int] = []
        self._payload = os.urandom(max(1, self.record_bytes))
        self._rr = 0
        self._tick_lock = threading.Lock()
        self.port = 0
        self._threads: list[threading.Thread] = []
        self._server: socketserver.ThreadingTCPServer | None = None
        self._control: socketserver.ThreadingUnixStreamServer | None = None

    # ------------------------------------------------------------------ start-up
    def lock_log_dirs(self) -> None:
        """Every log dir's ``.lock``, like ``LogManager.lockLogDirs``: all or nothing."""
        for d in self.log_dirs:
            d.mkdir(parents=True, exist_ok=True)
            fd = os.open(d / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                raise LockFailed(
                    f"Failed to acquire lock on file .lock in {d}. A Kafka instance in another "
                    "process or thread is using this directory."
                ) from exc
            self._lock_fds.append(fd)

    def prepare_log_dirs(self) -> None:
        for d in self.log_dirs:
            meta = d / "meta.properties"
            if not meta.exists():
                meta.write_text(f"version=0\nbroker.id={self.broker_id}\n")
            cleaner = d / "cleaner-offset-checkpoint"
            if not cleaner.exists():
                cleaner.touch()
            with contextlib.suppress(FileNotFoundError):
                (d / ".kafka_cleanshutdown").unlink()

    def topic_config(self, topic: str) -> dict[str, str]:
        configs = {k: v for k, (v, _) in TOPIC_DEFAULTS.items()}
        configs["file.delete.delay.ms"] = str(self.delete_delay_ms)
        configs.update(self.topic_configs.get(topic, {}))
        return configs

    def load(self) -> None:
        """Reload existing partition dirs, then create the configured topics' partitions."""
        for name, spec in self.conf.get("topics", {}).items():
            self.topic_configs[name] = {k: str(v) for k, v in spec.get("configs", {}).items()}
        start_offsets: dict[tuple[str, int], int] = {}
        for d in self.log_dirs:
            start_offsets.update(read_checkpoint(d / "log-start-offset-checkpoint"))
            for child in sorted(d.iterdir()):
                parsed = parse_partition_dir(child.name)
                if not child.is_dir() or parsed is None or parsed.kind != "live":
                    continue
                self._load_partition(d, child, parsed.topic, parsed.partition, start_offsets)
        counter = len(self.partitions)
        created: list[PartitionLog] = []
        for name, spec in self.conf.get("topics", {}).items():
            for index in range(int(spec.get("partitions", 1))):
                if (name, index) in self.partitions:
                    continue
                log_dir = self.log_dirs[counter % len(self.log_dirs)]
                counter += 1
                directory = log_dir / f"{name}-{index}"
                directory.mkdir()
                part = PartitionLog(name, index, log_dir, directory, self.topic_config(name))
                part.active = self._new_active(part, 0)
                self.partitions[(name, index)] = part
                created.append(part)
        for part in created:  # prefill only what this start created, not a reloaded log
            self.write(part, int(self.conf["topics"][part.topic].get("prefill_bytes", 0)))
        for group, entries in self.conf.get("groups", {}).items():
            for topic, partition, offset in entries:
                self.groups.setdefault(group, {})[(topic, int(partition))] = int(offset)

    def _load_partition(
        self,
        log_dir: Path,
        directory: Path,
        topic: str,
        index: int,
        start_offsets: dict[tuple[str, int], int],
    ) -> None:
        for leftover in directory.iterdir():
            if leftover.name.endswith((".deleted", ".cleaned", ".swap")):
                leftover.unlink()
        bases = sorted(
            p[0]
            for f in directory.iterdir()
            if (p := parse_segment_file(f.name)) and p[1] == ".log"
        )
        part = PartitionLog(topic, index, log_dir, directory, self.topic_config(topic))
        next_offset = 0
        for base in bases:
            log_path = directory / segment_file_name(base, ".log")
            end = base
            for batch in iter_batches(log_path):
                end = batch.next_offset
            if end == base and base == bases[-1]:
                for suffix in (*SEGMENT_SUFFIXES, ".snapshot"):
                    with contextlib.suppress(FileNotFoundError):
                        (directory / segment_file_name(base, suffix)).unlink()
                break
            part.closed.append(ClosedSegment(base, end, self._open_files(directory, base)))
            next_offset = end
        part.active = self._new_active(part, next_offset)
        part.log_start_offset = max(start_offsets.get((topic, index), 0), part.first_base)
        self.partitions[(topic, index)] = part

    def _open_files(self, directory: Path, base: int) -> dict[Path, int | None]:
        files: dict[Path, int | None] = {}
        for suffix in (*SEGMENT_SUFFIXES, ".snapshot"):
            path = directory / segment_file_name(base, suffix)
            if not path.exists():
                continue
            keep = suffix != ".snapshot"  # Kafka reads snapshots only when it loads them
            files[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC) if keep else None
        return files

    def _new_active(self, part: PartitionLog, base: int) -> ActiveSegment:
        return ActiveSegment(
            part.directory,
            base,
            index_interval_bytes=int(part.config("index.interval.bytes")),
            segment_index_bytes=int(part.config("segment.index.bytes")),
        )

    # ------------------------------------------------------------------ writing
    def write(self, part: PartitionLog, nbytes: int) -> int:
        """Append about ``nbytes`` of record values to ``part`` in batches; returns the bytes
        written."""
        written = 0
        per_batch = max(1, self.batch_bytes // self.record_bytes)
        segment_bytes = int(part.config("segment.bytes"))
        while nbytes - written >= self.record_bytes:
            count = min(per_batch, (nbytes - written) // self.record_bytes)
            with self.lock:
                active = part.active
                assert active is not None
                # LogSegment.shouldRoll: the batch would not fit behind what is there.
                estimate = count * (self.record_bytes + 20) + 61
                if active.size > 0 and active.size > segment_bytes - estimate:
                    self.roll(part)
                    active = part.active
                    assert active is not None
                now = int(time.time() * 1000)
                active.append([now] * count, [self._payload] * count)
            written += count * self.record_bytes
        return written

    def roll(self, part: PartitionLog) -> None:
        """Close the active segment cleanly, keep its files open, start the next one."""
        with self.lock:
            active = part.active
            assert active is not None
            if active.size == 0:
                return
            active.roll()
            base, end = active.base_offset, active.next_offset
            part.closed.append(ClosedSegment(base, end, self._open_files(part.directory, base)))
            (part.directory / segment_file_name(end, ".snapshot")).write_bytes(
                empty_producer_snapshot()
            )
            part.active = self._new_active(part, end)

    def producer_loop(self) -> None:
        budget = 0.0
        last = time.monotonic()
        while not self.stopping.wait(0.02):
            now = time.monotonic()
            if self.paused or self.write_rate <= 0 or not self.partitions:
                budget, last = 0.0, now
                continue
            budget += self.write_rate * (now - last)
            last = now
            parts = sorted(self.partitions.values(), key=lambda p: (p.topic, p.index))
            with self._tick_lock:
                while budget >= self.record_bytes and self.writing():
                    part = parts[self._rr % len(parts)]
                    self._rr += 1
                    chunk = min(self.batch_bytes, int(budget))
                    budget -= self.write(part, chunk) or chunk

    def writing(self) -> bool:
        return not (self.paused or self.write_rate <= 0 or self.stopping.is_set())

    # ------------------------------------------------------------------ log manager
    def delete_records(self, topic: str, index: int, offset: int) -> tuple[int, int]:
        """``Partition.deleteRecordsOnLeader``: (low watermark, error code)."""
        with self.lock:
            part = self.partitions.get((topic, index))
            if part is None:
                return -1, UNKNOWN_TOPIC_OR_PARTITION
            if "delete" not in [p.strip() for p in part.config("cleanup.policy").split(",")]:
                return -1, POLICY_VIOLATION
            hw = part.high_watermark
            target = hw if offset == -1 else offset
            if target < 0 or target > hw:
                return -1, OFFSET_OUT_OF_RANGE
            part.log_start_offset = max(part.log_start_offset, target)
            log(f"DeleteRecords {topic}-{index} -> log start offset {part.log_start_offset}")
            return part.log_start_offset, NONE

    def retention_check(self) -> None:
        """``LogManager.cleanupLogs`` restricted to log-start-offset breaches: rename the
        closed segments wholly below the log start offset ``*.deleted`` and schedule their
        removal ``file.delete.delay.ms`` later (``Log.asyncDeleteSegment``)."""
        with self.lock:
            self.retention_checks += 1
            now = time.monotonic()
            for part in self.partitions.values():
                while part.closed and part.closed[0].next_offset <= part.log_start_offset:
                    segment = part.closed.pop(0)
                    renamed: dict[Path, int | None] = {}
                    for path, fd in segment.files.items():
                        target = path.with_name(path.name + ".deleted")
                        os.rename(path, target)
                        renamed[target] = fd
                    segment.files = renamed
                    delay = int(part.config("file.delete.delay.ms")) / 1000
                    self.pending.append(PendingDelete(now + delay, segment))
                    log(f"scheduled deletion of {part.directory.name}/{segment.base_offset}")

    def delete_due(self) -> None:
        with self.lock:
            now = time.monotonic()
            due = [p for p in self.pending if p.due <= now]
            self.pending = [p for p in self.pending if p.due > now]
        for item in due:
            for path, fd in item.segment.files.items():
                if fd is not None:
                    os.close(fd)
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    def write_checkpoints(self) -> None:
        with self.lock:
            for d in self.log_dirs:
                parts = sorted(
                    (p for p in self.partitions.values() if p.log_dir == d),
                    key=lambda p: (p.topic, p.index),
                )
                recovery = [(p.topic, p.index, p.high_watermark) for p in parts]
                starts = [
                    (p.topic, p.index, p.log_start_offset)
                    for p in parts
                    if p.log_start_offset > p.first_base
                ]
                write_checkpoint_atomic(d / "recovery-point-offset-checkpoint", recovery)
                write_checkpoint_atomic(d / "replication-offset-checkpoint", recovery)
                write_checkpoint_atomic(d / "log-start-offset-checkpoint", starts)

    def scheduler_loop(self) -> None:
        started = time.monotonic()
        next_retention = started + self.initial_delay
        next_checkpoint = started + self.checkpoint_interval
        while not self.stopping.wait(0.01):
            now = time.monotonic()
            if now >= next_retention:
                self.retention_check()
                next_retention += self.check_interval
            self.delete_due()
            if now >= next_checkpoint:
                self.write_checkpoints()
                next_checkpoint += self.checkpoint_interval

    # ------------------------------------------------------------------ control
    def control(self, request: dict[str, Any]) -> dict[str, Any]:
        """One control command: ``state``, ``set_rate`` (bytes_per_sec), ``pause``,
        ``resume``, ``commit`` (group, offsets [[topic, partition, offset]]), ``write``
        (topic, partition, bytes), ``roll`` (topic, partition), ``retention_check``."""
        op = request.get("op")
        if op in ("set_rate", "pause"):
            if op == "pause":
                self.paused = True
            else:
                self.write_rate = float(request["bytes_per_sec"])
            with self._tick_lock:
                pass  # the producer's current tick is over: no write after this answer
        elif op == "resume":
            self.paused = False
        elif op == "commit":
            with self.lock:
                offsets = self.groups.setdefault(str(request["group"]), {})
                for topic, partition, offset in request["offsets"]:
                    offsets[(topic, int(partition))] = int(offset)
        elif op == "write":
            part = self.partitions[(request["topic"], int(request["partition"]))]
            self.write(part, int(request["bytes"]))
        elif op == "roll":
            self.roll(self.partitions[(request["topic"], int(request["partition"]))])
        elif op == "retention_check":
            self.retention_check()
        elif op != "state":
            return {"error": f"unknown op {op!r}"}
        return self.state()

    def state(self) -> dict[str, Any]:
        with self.lock:
            parts = []
            for part in sorted(self.partitions.values(), key=lambda p: (p.topic, p.index)):
                assert part.active is not None
                parts.append(
                    {
                        "topic": part.topic,
                        "partition": part.index,
                        "log_dir": str(part.log_dir),
                        "log_start_offset": part.log_start_offset,
                        "high_watermark": part.high_watermark,
                        "segments": [s.base_offset for s in part.closed],
                        "segment_ends": [s.next_offset for s in part.closed],
                        "active_base": part.active.base_offset,
                    }
                )
            return {
                "ok": True,
                "partitions": parts,
                "pending_delete": sorted(str(p) for d in self.pending for p in d.segment.files),
                "write_rate": self.write_rate,
                "paused": self.paused,
                "retention_checks": self.retention_checks,
            }

    # ------------------------------------------------------------------ protocol
    def handle(self, api_key: int, version: int, req: Any) -> Any:
        handler: Callable[[int, Any], Any] = getattr(self, f"_api_{api_key}")
        return handler(version, req)

    def _api_18(self, version: int, req: Any) -> Any:  # ApiVersions
        keys = [
            ApiVersionsResponse.ApiVersion(api_key=k, min_version=0, max_version=v)
            for k, (_, _, v) in sorted(APIS.items())
        ]
        return ApiVersionsResponse(
            version=version, error_code=NONE, api_keys=keys, throttle_time_ms=0
        )

    def _api_3(self, version: int, req: Any) -> Any:  # Metadata
        R = MetadataResponse
        with self.lock:
            known = sorted({t for t, _ in self.partitions})
            # v0 has no null: an empty list means all topics there.
            all_topics = req.topics is None or (version == 0 and not req.topics)
            names = known if all_topics else [t.name for t in req.topics]
            topics = []
            for name in names:
                if name not in known:
                    topics.append(
                        R.MetadataResponseTopic(
                            error_code=UNKNOWN_TOPIC_OR_PARTITION, name=name, partitions=[]
                        )
                    )
                    continue
                indexes = sorted(i for t, i in self.partitions if t == name)
                partitions = [
                    R.MetadataResponseTopic.MetadataResponsePartition(
                        error_code=NONE,
                        partition_index=i,
                        leader_id=self.broker_id,
                        leader_epoch=0,
                        replica_nodes=[self.broker_id],
                        isr_nodes=[self.broker_id],
                        offline_replicas=[],
                    )
                    for i in indexes
                ]
                topics.append(
                    R.MetadataResponseTopic(
                        error_code=NONE,
                        name=name,
                        is_internal=name.startswith("__"),
                        partitions=partitions,
                    )
                )
        broker = R.MetadataResponseBroker(
            node_id=self.broker_id, host=self.host, port=self.port, rack=None
        )
        return R(
            version=version,
            throttle_time_ms=0,
            brokers=[broker],
            cluster_id="standin-cluster",
            controller_id=self.broker_id,
            topics=topics,
        )

    def _api_21(self, version: int, req: Any) -> Any:  # DeleteRecords
        R = DeleteRecordsResponse
        topics = []
        for topic in req.topics:
            results = []
            for p in topic.partitions:
                low, error = self.delete_records(topic.name, p.partition_index, p.offset)
                results.append(
                    R.DeleteRecordsTopicResult.DeleteRecordsPartitionResult(
                        partition_index=p.partition_index, low_watermark=low, error_code=error
                    )
                )
            topics.append(R.DeleteRecordsTopicResult(name=topic.name, partitions=results))
        return R(version=version, throttle_time_ms=0, topics=topics)

    def broker_configs(self) -> dict[str, tuple[str, int, int]]:
        """Broker configs: key -> (value, source, type)."""
        return {
            "broker.id": (str(self.broker_id), SOURCE_STATIC_BROKER, TYPE_INT),
            "log.dirs": (",".join(map(str, self.log_dirs)), SOURCE_STATIC_BROKER, TYPE_STRING),
            "log.retention.check.interval.ms": (
                str(int(self.check_interval * 1000)),
                SOURCE_STATIC_BROKER,
                TYPE_LONG,
            ),
            "log.segment.delete.delay.ms": (
                str(self.delete_delay_ms),
                SOURCE_STATIC_BROKER,
                TYPE_LONG,
            ),
            "log.cleanup.policy": ("delete", SOURCE_DEFAULT, TYPE_LIST),
            "log.retention.hours": ("168", SOURCE_DEFAULT, TYPE_INT),
            "log.retention.bytes": ("-1", SOURCE_DEFAULT, TYPE_LONG),
            "log.segment.bytes": ("1073741824", SOURCE_DEFAULT, TYPE_INT),
            "log.index.size.max.bytes": ("10485760", SOURCE_DEFAULT, TYPE_INT),
        }

    def _api_32(self, version: int, req: Any) -> Any:  # DescribeConfigs
        R = DescribeConfigsResponse
        Result = R.DescribeConfigsResult
        Entry = Result.DescribeConfigsResourceResult
        results = []
        for res in req.resources:
            entries: dict[str, tuple[str, int, int]] | None = None
            error, message = NONE, None
            if res.resource_type == RESOURCE_TOPIC:
                with self.lock:
                    exists = any(t == res.resource_name for t, _ in self.partitions)
                if exists:
                    overrides = self.topic_configs.get(res.resource_name, {})
                    entries = {}
                    for key, value in self.topic_config(res.resource_name).items():
                        source = SOURCE_DYNAMIC_TOPIC if key in overrides else SOURCE_DEFAULT
                        entries[key] = (value, source, TOPIC_DEFAULTS[key][1])
                else:
                    error, message = UNKNOWN_TOPIC_OR_PARTITION, "This server does not host this"
                    message += " topic-partition."
            elif res.resource_type == RESOURCE_BROKER and res.resource_name in (
                "",
                str(self.broker_id),
            ):
                entries = self.broker_configs()
            else:
                error, message = INVALID_REQUEST, f"unsupported resource {res.resource_name!r}"
            configs = []
            wanted = res.configuration_keys
            for key, (value, source, ctype) in sorted((entries or {}).items()):
                if wanted is not None and key not in wanted:
                    continue
                configs.append(
                    Entry(
                        name=key,
                        value=value,
                        read_only=res.resource_type == RESOURCE_BROKER,
                        config_source=source,
                        is_default=source == SOURCE_DEFAULT,
                        is_sensitive=False,
                        synonyms=[],
                        config_type=ctype,
                        documentation=None,
                    )
                )
            results.append(
                Result(
                    error_code=error,
                    error_message=message,
                    resource_type=res.resource_type,
                    resource_name=res.resource_name,
                    configs=configs,
                )
            )
        return R(version=version, throttle_time_ms=0, results=results)

    def _coordinator(self) -> dict[str, Any]:
        return {"node_id": self.broker_id, "host": self.host, "port": self.port}

    def _api_10(self, version: int, req: Any) -> Any:  # FindCoordinator
        R = FindCoordinatorResponse
        if version >= 4:
            coordinators = [
                R.Coordinator(key=k, error_code=NONE, error_message=None, **self._coordinator())
                for k in req.coordinator_keys
            ]
            return R(version=version, throttle_time_ms=0, coordinators=coordinators)
        return R(
            version=version,
            throttle_time_ms=0,
            error_code=NONE,
            error_message=None,
            **self._coordinator(),
        )

    def _api_16(self, version: int, req: Any) -> Any:  # ListGroups
        R = ListGroupsResponse
        states = set(req.states_filter or []) if version >= 4 else set()
        with self.lock:
            names = sorted(self.groups)
        groups = [
            R.ListedGroup(group_id=g, protocol_type="consumer", group_state="Empty")
            for g in names
            if not states or "Empty" in states
        ]
        return R(version=version, throttle_time_ms=0, error_code=NONE, groups=groups)

    def _api_9(self, version: int, req: Any) -> Any:  # OffsetFetch (v0-7)
        R = OffsetFetchResponse
        Topic = R.OffsetFetchResponseTopic
        Part = Topic.OffsetFetchResponsePartition
        with self.lock:
            committed = dict(self.groups.get(req.group_id, {}))
        if req.topics is None:
            wanted: dict[str, list[int]] = {}
            for topic, partition in sorted(committed):
                wanted.setdefault(topic, []).append(partition)
        else:
            wanted = {t.name: list(t.partition_indexes) for t in req.topics}
        topics = [
            Topic(
                name=name,
                partitions=[
                    Part(
                        partition_index=i,
                        committed_offset=committed.get((name, i), -1),
                        committed_leader_epoch=-1,
                        metadata="",
                        error_code=NONE,
                    )
                    for i in indexes
                ],
            )
            for name, indexes in wanted.items()
        ]
        return R(version=version, throttle_time_ms=0, topics=topics, error_code=NONE)

    def _api_8(self, version: int, req: Any) -> Any:  # OffsetCommit (simple commits)
        R = OffsetCommitResponse
        Topic = R.OffsetCommitResponseTopic
        Part = Topic.OffsetCommitResponsePartition
        topics = []
        with self.lock:
            offsets = self.groups.setdefault(req.group_id, {})
            for t in req.topics:
                parts = []
                for p in t.partitions:
                    known = (t.name, p.partition_index) in self.partitions
                    if known:
                        offsets[(t.name, p.partition_index)] = p.committed_offset
                    error = NONE if known else UNKNOWN_TOPIC_OR_PARTITION
                    parts.append(Part(partition_index=p.partition_index, error_code=error))
                topics.append(Topic(name=t.name, partitions=parts))
        return R(version=version, throttle_time_ms=0, topics=topics)

    def _api_2(self, version: int, req: Any) -> Any:  # ListOffsets
        R = ListOffsetsResponse
        Topic = R.ListOffsetsTopicResponse
        Part = Topic.ListOffsetsPartitionResponse
        topics = []
        with self.lock:
            for t in req.topics:
                parts = []
                for p in t.partitions:
                    part = self.partitions.get((t.name, p.partition_index))
                    error, offset = NONE, -1
                    if part is None:
                        error = UNKNOWN_TOPIC_OR_PARTITION
                    elif p.timestamp == -2:
                        offset = part.log_start_offset
                    elif p.timestamp == -1:
                        offset = part.high_watermark
                    parts.append(
                        Part(
                            partition_index=p.partition_index,
                            error_code=error,
                            old_style_offsets=[offset] if offset >= 0 else [],
                            timestamp=-1,
                            offset=offset,
                            leader_epoch=0,
                        )
                    )
                topics.append(Topic(name=t.name, partitions=parts))
        return R(version=version, throttle_time_ms=0, topics=topics)

    # ------------------------------------------------------------------ servers
    def serve(self) -> None:
        broker = self

        class KafkaHandler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                with contextlib.suppress(OSError, ConnectionError):
                    broker.serve_connection(self.request)

        class ControlHandler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                for line in self.rfile:
                    try:
                        answer = broker.control(json.loads(line))
                    except Exception as exc:  # report, keep serving
                        answer = {"error": f"{type(exc).__name__}: {exc}"}
                    self.wfile.write(json.dumps(answer).encode() + b"\n")
                    self.wfile.flush()

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        socketserver.ThreadingTCPServer.daemon_threads = True
        self._server = socketserver.ThreadingTCPServer(
            (self.host, int(self.conf.get("port", 0))), KafkaHandler
        )
        self.port = self._server.server_address[1]
        control_path = self.conf.get("control_socket")
        if control_path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(control_path)
            socketserver.ThreadingUnixStreamServer.daemon_threads = True
            self._control = socketserver.ThreadingUnixStreamServer(control_path, ControlHandler)
        for target in (
            self._server.serve_forever,
            *([self._control.serve_forever] if self._control else []),
            self.producer_loop,
            self.scheduler_loop,
        ):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)

    def serve_connection(self, conn: socket.socket) -> None:
        while True:
            head = recv_exact(conn, 4)
            if head is None:
                return
            (size,) = struct.unpack(">i", head)
            data = recv_exact(conn, size)
            if data is None:
                return
            api_key, version, correlation_id = struct.unpack_from(">hhi", data)
            api = APIS.get(api_key)
            if api is None:
                log(f"unsupported api key {api_key} v{version}: closing the connection")
                return
            request_cls, _, max_version = api
            if version > max_version:
                if api_key != 18:
                    log(f"api key {api_key} v{version} above v{max_version}: closing")
                    return
                # Kafka (KIP-511) answers an ApiVersions version it does not know in the v0
                # format, with its own ApiVersions range, so the client retries with that.
                out = ApiVersionsResponse(
                    version=0,
                    error_code=UNSUPPORTED_VERSION,
                    api_keys=[
                        ApiVersionsResponse.ApiVersion(
                            api_key=18, min_version=0, max_version=max_version
                        )
                    ],
                )
                out.with_header(correlation_id=correlation_id)
                conn.sendall(out.encode(header=True, framed=True))
                continue
            req = request_cls.decode(data, version=version, header=True)
            resp = self.handle(api_key, version, req)
            resp.with_header(correlation_id=correlation_id)
            conn.sendall(resp.encode(header=True, framed=True))

    def shutdown(self) -> None:
        """Clean stop: what ``KafkaServer.shutdown`` leaves on disk."""
        self.stopping.set()
        for server in (self._server, self._control):
            if server is not None:
                server.shutdown()
                server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        with self.lock:
            for part in self.partitions.values():
                if part.active is not None:
                    part.active.roll()  # LogSegment.close trims the indexes the same way
                for segment in part.closed:
                    close_all(segment.files)
            for item in self.pending:
                close_all(item.segment.files)  # their *.deleted files go at the next start
            self.write_checkpoints()
            for d in self.log_dirs:
                (d / ".kafka_cleanshutdown").touch()
        if self.conf.get("control_socket"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.conf["control_socket"])
        for fd in self._lock_fds:
            os.close(fd)  # releases the lock


def close_all(files: dict[Path, int | None]) -> None:
    for fd in files.values():
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def recv_exact(conn: socket.socket, n: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = conn.recv(n - len(chunks))
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


def read_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """Kafka's OffsetCheckpointFile: version, count, ``topic partition offset`` lines."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    out = {}
    for line in lines[2:]:
        topic, partition, offset = line.split()
        out[(topic, int(partition))] = int(offset)
    return out


def write_checkpoint_atomic(path: Path, entries: list[tuple[str, int, int]]) -> None:
    """Write to ``.tmp`` and rename, as ``CheckpointFile.write`` does."""
    tmp = path.with_name(path.name + ".tmp")
    write_checkpoint(tmp, entries)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m support.standin.broker CONFIG.json", file=sys.stderr)
        return 2
    try:
        conf = json.loads(Path(argv[0]).read_text())
        broker = Broker(conf)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"standin: bad config {argv[0]}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        broker.lock_log_dirs()
    except LockFailed as exc:
        log(f"ERROR {exc}")
        return 1
    broker.prepare_log_dirs()
    broker.load()
    broker.serve()
    log(f"started: broker {broker.broker_id} on {broker.host}:{broker.port}")
    print(f"bootstrap {broker.host}:{broker.port}", flush=True)
    while not stop.wait(0.2):
        pass
    log("shutting down")
    broker.shutdown()
    log("shut down cleanly")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
