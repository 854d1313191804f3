"""Test-only generator of REAL Kafka log dirs.

~450 lines because everything a broker leaves in a log dir (not only segments) is written
here, in one place, so that every test agrees on the layout.

Writes what a Kafka 3.x broker leaves on disk, byte for byte where it matters to diskguard:
``.log`` files of RecordBatch v2 batches (varint-encoded records, correct CRC32C), ``.index``
and ``.timeindex`` entries every ``index.interval.bytes`` of log exactly as
``LogSegment.append`` writes them, closed segments' indexes trimmed to their entries, the
active segment's indexes preallocated sparse to ``segment.index.bytes``, producer-state
``.snapshot`` files, ``leader-epoch-checkpoint``, ``partition.metadata``, and the log dir's
checkpoint files, ``meta.properties`` and ``.lock``. ``hold_lock`` locks ``.lock`` from
another process, as a running broker does.

The returned layouts say what was written (offsets, timestamps, paths), so tests assert
against the generator's truth rather than against the parsers under test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import selectors
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# The encoding lives in the package (the demo's simulated broker writes segments too); these
# names stay importable from here, as tests and bench use them.
from support.segmentwriter import (
    DEFAULT_SEGMENT_INDEX_BYTES,
    OFFSET_INDEX_ENTRY,
    TIME_INDEX_ENTRY,
    IndexBuilder,
    empty_producer_snapshot,
    encode_batch,
    encode_record,
    offset_index_entry,
    preallocate,
    time_index_entry,
    topic_id,
    varint,
    write_checkpoint,
    zigzag,
)

__all__ = [
    "DEFAULT_FIRST_TIMESTAMP_MS",
    "DEFAULT_SEGMENT_INDEX_BYTES",
    "OFFSET_INDEX_ENTRY",
    "TIME_INDEX_ENTRY",
    "BatchLayout",
    "LogDirLayout",
    "PartitionLayout",
    "SegmentLayout",
    "SegmentSpec",
    "empty_producer_snapshot",
    "encode_batch",
    "encode_record",
    "hold_lock",
    "lock_is_held_elsewhere",
    "topic_id",
    "varint",
    "write_checkpoint",
    "write_log_dir",
    "write_log_dir_files",
    "write_partition",
    "zigzag",
]

DEFAULT_FIRST_TIMESTAMP_MS = 1_700_000_000_000


# --------------------------------------------------------------------------- layouts


@dataclass(frozen=True)
class SegmentSpec:
    """What to put in one segment.

    Timestamps are ``first_timestamp_ms + i * timestamp_step_ms`` for record ``i`` unless
    ``timestamps_ms`` lists them explicitly (then its length is the record count).
    """

    records: int = 10
    payload_size: int = 100
    first_timestamp_ms: int = DEFAULT_FIRST_TIMESTAMP_MS
    timestamp_step_ms: int = 1000
    timestamps_ms: tuple[int, ...] | None = None
    records_per_batch: int = 1

    def record_timestamps(self) -> list[int]:
        if self.timestamps_ms is not None:
            return list(self.timestamps_ms)
        return [self.first_timestamp_ms + i * self.timestamp_step_ms for i in range(self.records)]


@dataclass(frozen=True)
class BatchLayout:
    position: int
    base_offset: int
    last_offset: int
    max_timestamp_ms: int
    size: int


@dataclass(frozen=True)
class SegmentLayout:
    base_offset: int
    next_offset: int
    #: Largest record timestamp in the segment (what Kafka's maxTimestampSoFar ends at).
    max_timestamp_ms: int
    #: Timestamp of the last ``.timeindex`` entry written, None if none was.
    timeindex_last_timestamp_ms: int | None
    log_path: Path
    index_path: Path
    timeindex_path: Path
    snapshot_path: Path | None
    batches: tuple[BatchLayout, ...]
    offset_index: tuple[tuple[int, int], ...]
    time_index: tuple[tuple[int, int], ...]
    active: bool
    #: Indexes still at their preallocated (sparse) size.
    preallocated: bool

    @property
    def log_bytes(self) -> int:
        return sum(b.size for b in self.batches)

    @property
    def files(self) -> tuple[Path, ...]:
        out = [self.log_path, self.index_path, self.timeindex_path]
        return tuple(out)


@dataclass(frozen=True)
class PartitionLayout:
    topic: str
    partition: int
    path: Path
    segments: tuple[SegmentLayout, ...]
    log_start_offset: int
    topic_id: str
    snapshot_paths: tuple[Path, ...] = ()

    @property
    def log_end_offset(self) -> int:
        return self.segments[-1].next_offset if self.segments else self.log_start_offset

    @property
    def base_offsets(self) -> tuple[int, ...]:
        return tuple(s.base_offset for s in self.segments)

    @property
    def active(self) -> SegmentLayout:
        return self.segments[-1]

    @property
    def closed(self) -> tuple[SegmentLayout, ...]:
        return self.segments[:-1]


@dataclass(frozen=True)
class LogDirLayout:
    path: Path
    cluster_id: str
    node_id: int
    partitions: dict[tuple[str, int], PartitionLayout] = field(default_factory=dict)


# --------------------------------------------------------------------------- writers


def _write_segment(
    part_dir: Path,
    base_offset: int,
    spec: SegmentSpec,
    *,
    leader_epoch: int,
    index_interval_bytes: int,
    active: bool,
    closed_cleanly: bool,
    preallocate_indexes: bool,
    segment_index_bytes: int,
) -> SegmentLayout:
    timestamps = spec.record_timestamps()
    if not timestamps:
        raise ValueError("a segment needs at least one record")
    per_batch = max(1, spec.records_per_batch)
    log = bytearray()
    batches: list[BatchLayout] = []
    indexes = IndexBuilder(base_offset, index_interval_bytes)
    offset = base_offset
    for start in range(0, len(timestamps), per_batch):
        ts_chunk = timestamps[start : start + per_batch]
        values = [
            (f"{offset + i}:".encode() + b"x" * spec.payload_size)[: spec.payload_size]
            for i in range(len(ts_chunk))
        ]
        batch = encode_batch(offset, ts_chunk, values, partition_leader_epoch=leader_epoch)
        position = len(log)
        last_offset = offset + len(ts_chunk) - 1
        log += batch
        batch_max = max(ts_chunk)
        batches.append(BatchLayout(position, offset, last_offset, batch_max, len(batch)))
        indexes.append(position, last_offset, batch_max, len(batch))
        offset = last_offset + 1
    if closed_cleanly:
        indexes.close()
    offset_index = indexes.offset_entries
    time_index = indexes.time_entries
    max_ts_so_far = indexes.max_timestamp_ms

    log_path = part_dir / f"{base_offset:020d}.log"
    index_path = part_dir / f"{base_offset:020d}.index"
    timeindex_path = part_dir / f"{base_offset:020d}.timeindex"
    log_path.write_bytes(bytes(log))
    index_path.write_bytes(b"".join(offset_index_entry(r, p) for r, p in offset_index))
    timeindex_path.write_bytes(b"".join(time_index_entry(t, r) for t, r in time_index))
    if preallocate_indexes:
        preallocate(index_path, segment_index_bytes, OFFSET_INDEX_ENTRY)
        preallocate(timeindex_path, segment_index_bytes, TIME_INDEX_ENTRY)
    return SegmentLayout(
        base_offset=base_offset,
        next_offset=offset,
        max_timestamp_ms=max_ts_so_far,
        timeindex_last_timestamp_ms=time_index[-1][0] if time_index else None,
        log_path=log_path,
        index_path=index_path,
        timeindex_path=timeindex_path,
        snapshot_path=None,
        batches=tuple(batches),
        offset_index=tuple(offset_index),
        time_index=tuple(time_index),
        active=active,
        preallocated=preallocate_indexes,
    )


def write_partition(
    log_dir: str | os.PathLike[str],
    topic: str,
    partition: int,
    segments: Sequence[SegmentSpec],
    *,
    active_preallocated: bool = True,
    index_interval_bytes: int = 4096,
    segment_index_bytes: int = DEFAULT_SEGMENT_INDEX_BYTES,
    log_start_offset: int | None = None,
    first_offset: int = 0,
    simulate_unclean_stop: bool | Sequence[int] = False,
    leader_epoch: int = 0,
    leader_epoch_checkpoint: bool = True,
    snapshots: bool = True,
) -> PartitionLayout:
    """Write ``<log_dir>/<topic>-<partition>`` with one segment per spec (the last is active).

    ``simulate_unclean_stop``: True makes the segment before the active one look like it was
    active when the broker died (indexes still preallocated sparse with a zero tail, no final
    time-index entry); a sequence picks the segment indices explicitly. Snapshots are written
    at every roll (named for the new segment's base offset) as the broker does.
    """
    if not segments:
        raise ValueError("a partition needs at least one segment (the active one)")
    part_dir = Path(log_dir) / f"{topic}-{partition}"
    part_dir.mkdir(parents=True, exist_ok=True)
    last = len(segments) - 1
    if simulate_unclean_stop is True:
        unclean = {last - 1} if last >= 1 else set()
    elif simulate_unclean_stop is False:
        unclean = set()
    else:
        unclean = set(simulate_unclean_stop)
    if last in unclean:
        raise ValueError("the active segment is always 'unclean'; pick closed segment indices")
    layouts: list[SegmentLayout] = []
    snapshot_paths: list[Path] = []
    base = first_offset
    for i, spec in enumerate(segments):
        is_active = i == last
        layout = _write_segment(
            part_dir,
            base,
            spec,
            leader_epoch=leader_epoch,
            index_interval_bytes=index_interval_bytes,
            active=is_active,
            closed_cleanly=not is_active and i not in unclean,
            preallocate_indexes=(is_active and active_preallocated) or i in unclean,
            segment_index_bytes=segment_index_bytes,
        )
        snapshot: Path | None = None
        if snapshots and i > 0:
            snapshot = part_dir / f"{base:020d}.snapshot"
            snapshot.write_bytes(empty_producer_snapshot())
            snapshot_paths.append(snapshot)
            layout = dataclasses.replace(layout, snapshot_path=snapshot)
        layouts.append(layout)
        base = layout.next_offset
    start = first_offset if log_start_offset is None else log_start_offset
    if leader_epoch_checkpoint:
        (part_dir / "leader-epoch-checkpoint").write_text(f"0\n1\n{leader_epoch} {first_offset}\n")
    tid = topic_id(topic)
    (part_dir / "partition.metadata").write_text(f"version: 0\ntopic_id: {tid}\n")
    return PartitionLayout(
        topic=topic,
        partition=partition,
        path=part_dir,
        segments=tuple(layouts),
        log_start_offset=start,
        topic_id=tid,
        snapshot_paths=tuple(snapshot_paths),
    )


def write_log_dir(
    path: str | os.PathLike[str],
    partitions: Mapping[tuple[str, int], Sequence[SegmentSpec]] | None = None,
    *,
    node_id: int = 1,
    cluster_id: str = "diskguard-test-cluster",
    log_start_offsets: Mapping[tuple[str, int], int] | None = None,
    **partition_options: object,
) -> LogDirLayout:
    """A whole log dir: partitions plus the files the broker keeps beside them.

    ``partition_options`` go to every ``write_partition`` call. The checkpoints agree with the
    partitions written: recovery point and high watermark at the log end offset, a
    log-start-offset line only where it is above the first segment (as Kafka writes it).
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    layout = LogDirLayout(path=root, cluster_id=cluster_id, node_id=node_id)
    for (topic, partition), specs in (partitions or {}).items():
        start = (log_start_offsets or {}).get((topic, partition))
        layout.partitions[(topic, partition)] = write_partition(
            root,
            topic,
            partition,
            specs,
            log_start_offset=start,
            **partition_options,  # type: ignore[arg-type]
        )
    write_log_dir_files(layout)
    return layout


def write_log_dir_files(layout: LogDirLayout) -> None:
    """(Re)write meta.properties, the four checkpoints and ``.lock`` for ``layout``.

    Call again after adding partitions with ``write_partition`` to keep checkpoints in step.
    """
    root = layout.path
    (root / "meta.properties").write_text(
        "#\n#Generated by diskguard tests\n"
        f"cluster.id={layout.cluster_id}\nnode.id={layout.node_id}\nversion=1\n"
    )
    parts = sorted(layout.partitions.values(), key=lambda p: (p.topic, p.partition))
    ends = [(p.topic, p.partition, p.log_end_offset) for p in parts]
    write_checkpoint(root / "recovery-point-offset-checkpoint", ends)
    write_checkpoint(root / "replication-offset-checkpoint", ends)
    write_checkpoint(
        root / "log-start-offset-checkpoint",
        [
            (p.topic, p.partition, p.log_start_offset)
            for p in parts
            if p.segments and p.log_start_offset > p.segments[0].base_offset
        ],
    )
    write_checkpoint(root / "cleaner-offset-checkpoint", [])
    (root / ".lock").touch()


# --------------------------------------------------------------------------- broker lock

_LOCK_HOLDER = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
sys.stdout.write("locked\n")
sys.stdout.flush()
sys.stdin.read()
"""


@contextlib.contextmanager
def hold_lock(
    log_dir: str | os.PathLike[str], timeout_s: float = 10.0, argv_tail: Sequence[str] = ()
) -> Iterator[int]:
    """Lock ``<log_dir>/.lock`` from another process, as a running broker holds it.
    ``argv_tail``: more arguments on its command line (what ``/proc/PID/cmdline`` shows).

    Java's ``FileChannel.tryLock`` is a POSIX record lock (``fcntl`` F_SETLK), which a lock
    taken in this test process would not reveal to this process; hence the subprocess. Yields
    the holder's pid; the lock goes when the block exits (stdin closed -> holder exits).
    """
    lock_path = os.path.join(os.fspath(log_dir), ".lock")
    proc = subprocess.Popen(
        [sys.executable, "-c", _LOCK_HOLDER, lock_path, *argv_tail],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = _readline_with_timeout(proc, timeout_s)
        if ready != "locked\n":
            proc.kill()
            _, err = proc.communicate(timeout=timeout_s)
            raise RuntimeError(f"lock holder for {lock_path} did not lock it: {err.strip()}")
        yield proc.pid
    finally:
        if proc.poll() is None:
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _readline_with_timeout(proc: subprocess.Popen[str], timeout_s: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            return ""
    return proc.stdout.readline()


def lock_is_held_elsewhere(log_dir: str | os.PathLike[str]) -> bool:
    """True when another process holds ``.lock`` (test helper; mirrors what scan must do)."""
    fd = os.open(os.path.join(os.fspath(log_dir), ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
