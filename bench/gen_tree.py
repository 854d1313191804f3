"""Generate a large, real-format Kafka log dir fast (1,000 partitions x 1,000 segments = 3M files).

``tests/support/kafkagen.py`` writes ONE template partition (a closed segment holding one
RecordBatch v2 with a correct CRC32C, its trimmed ``.index``/``.timeindex``,
and an active segment with
preallocated sparse indexes). Its bytes are then stamped out for every segment with raw
``os.open``/``os.write`` relative to the partition directory's fd, patching per segment:

- the batch's ``baseOffset`` (the first 8 bytes, outside the CRC) to the segment's base offset,
  and its ``baseTimestamp``/``maxTimestamp`` to the segment's age, with the CRC32C recomputed
  (record timestamps are deltas from the base, so the records themselves stay as they are);
- the ``.timeindex`` entry (8-byte big-endian timestamp + 4-byte relative offset) to the
  segment's own largest timestamp: the planner orders segments by it.

Timestamps model topics that roll at different rates: partition ``p`` rolls every
``60 s x (1 + p % 7)`` and every partition's newest segment ends near the same "now", so the
globally oldest segments come mostly from slow-rolling partitions, as on a real broker.
Work is spread over processes by partition.

Usage: gen_tree.py LOG_DIR [--partitions 1000] [--segments 1000] [--workers 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "demo"))

import crc32c

from support import kafkagen

TOPICS = 50
RECORDS_PER_SEGMENT = 10
END_TIMESTAMP_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: "now" for the newest segments
_TIME_ENTRY = struct.Struct(">qi")
_OFFSET = struct.Struct(">q")
_BATCH_TIMES = struct.Struct(">qq")  # baseTimestamp, maxTimestamp
_CRC_AT, _CRC_FROM, _TIMES_AT = 17, 21, 27  # RecordBatch v2 header layout
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class Template:
    """Bytes of one real segment, ready to stamp out."""

    log: bytes
    index: bytes
    time_relative_offset: int
    records: int
    #: maxTimestamp - baseTimestamp of the template batch.
    time_span_ms: int
    index_bytes: int


def make_template(segment_index_bytes: int = kafkagen.DEFAULT_SEGMENT_INDEX_BYTES) -> Template:
    """Write a two-segment partition with the test generator and keep the closed one's bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        layout = kafkagen.write_partition(
            tmp,
            "template",
            0,
            [
                kafkagen.SegmentSpec(records=RECORDS_PER_SEGMENT, records_per_batch=10),
                kafkagen.SegmentSpec(records=1),
            ],
            snapshots=False,
        )
        closed = layout.segments[0]
        if len(closed.batches) != 1 or len(closed.time_index) != 1:
            raise RuntimeError("template segment must hold one batch and one time index entry")
        return Template(
            log=closed.log_path.read_bytes(),
            index=closed.index_path.read_bytes(),
            time_relative_offset=closed.time_index[-1][1],
            records=closed.next_offset - closed.base_offset,
            time_span_ms=_batch_span(closed.log_path.read_bytes()),
            index_bytes=segment_index_bytes,
        )


def _batch_span(log: bytes) -> int:
    base_ts, max_ts = _BATCH_TIMES.unpack_from(log, _TIMES_AT)
    return int(max_ts - base_ts)


def stamp_batch(log: bytearray, base_offset: int, max_timestamp_ms: int, span_ms: int) -> None:
    """Re-address the template batch in place: offset, timestamps, CRC32C."""
    _OFFSET.pack_into(log, 0, base_offset)
    _BATCH_TIMES.pack_into(log, _TIMES_AT, max_timestamp_ms - span_ms, max_timestamp_ms)
    struct.pack_into(">I", log, _CRC_AT, crc32c.crc32c(bytes(log[_CRC_FROM:])))


def partition_name(p: int, partitions: int) -> tuple[str, int]:
    """``(topic, partition)`` for the ``p``-th partition: 50 topics (fewer if few partitions)."""
    topics = min(TOPICS, partitions)
    return f"bench-topic-{p % topics:02d}", p // topics


def segment_timestamp(p: int, s: int, segments: int, end_ms: int = END_TIMESTAMP_MS) -> int:
    """Largest timestamp of segment ``s`` of partition ``p`` (the planner's age key)."""
    roll_ms = 60_000 * (1 + p % 7)
    jitter = (p * 7919) % 1000
    return end_ms - (segments - 1 - s) * roll_ms - jitter


def _write(dir_fd: int, name: str, data: bytes) -> None:
    fd = os.open(name, _FLAGS, 0o644, dir_fd=dir_fd)
    try:
        if data:
            os.write(fd, data)
    finally:
        os.close(fd)


def write_partition_dir(
    log_dir: str,
    p: int,
    partitions: int,
    segments: int,
    template: Template,
    end_ms: int = END_TIMESTAMP_MS,
) -> None:
    topic, partition = partition_name(p, partitions)
    path = os.path.join(log_dir, f"{topic}-{partition}")
    os.mkdir(path)
    dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        log = bytearray(template.log)
        for s in range(segments):
            base = s * template.records
            stem = f"{base:020d}"
            ts = segment_timestamp(p, s, segments, end_ms)
            stamp_batch(log, base, ts, template.time_span_ms)
            _write(dir_fd, stem + ".log", bytes(log))
            if s < segments - 1:
                _write(dir_fd, stem + ".index", template.index)
                _write(
                    dir_fd, stem + ".timeindex", _TIME_ENTRY.pack(ts, template.time_relative_offset)
                )
            else:  # the active segment: indexes preallocated sparse, as the broker leaves them
                for sfx, entry in ((".index", 8), (".timeindex", 12)):
                    fd = os.open(stem + sfx, _FLAGS, 0o644, dir_fd=dir_fd)
                    try:
                        os.ftruncate(fd, template.index_bytes - template.index_bytes % entry)
                    finally:
                        os.close(fd)
        _write(dir_fd, "leader-epoch-checkpoint", b"0\n1\n0 0\n")
        tid = kafkagen.topic_id(topic)
        _write(dir_fd, "partition.metadata", f"version: 0\ntopic_id: {tid}\n".encode())
    finally:
        os.close(dir_fd)


def _worker(args: tuple[str, list[int], int, int, Template, int]) -> int:
    log_dir, ps, partitions, segments, template, end_ms = args
    for p in ps:
        write_partition_dir(log_dir, p, partitions, segments, template, end_ms)
    return len(ps)


def write_log_dir_files(log_dir: str, partitions: int, segments: int, records: int) -> None:
    """meta.properties, the four checkpoints and ``.lock``, as a stopped broker leaves them."""
    root = Path(log_dir)
    (root / "meta.properties").write_text(
        "#\n#Generated by diskguard bench\ncluster.id=diskguard-bench\nnode.id=1\nversion=1\n"
    )
    names = sorted(partition_name(p, partitions) for p in range(partitions))
    end = segments * records
    ends = [(t, q, end) for t, q in names]
    kafkagen.write_checkpoint(root / "recovery-point-offset-checkpoint", ends)
    kafkagen.write_checkpoint(root / "replication-offset-checkpoint", ends)
    # Kafka writes a log start offset only where it is above the first segment: none here.
    kafkagen.write_checkpoint(root / "log-start-offset-checkpoint", [])
    kafkagen.write_checkpoint(root / "cleaner-offset-checkpoint", [])
    (root / ".lock").touch()


def generate(
    log_dir: str,
    partitions: int,
    segments: int,
    workers: int = 2,
    end_ms: int = END_TIMESTAMP_MS,
) -> float:
    """Write the whole tree under ``log_dir`` (must not hold partitions yet); returns seconds.

    ``end_ms``: the newest segments' largest timestamp.
    """
    if segments < 1 or partitions < 1:
        raise ValueError("need at least one partition and one segment")
    started = time.monotonic()
    os.makedirs(log_dir, exist_ok=True)
    template = make_template()
    chunks = [list(range(i, partitions, workers * 8)) for i in range(workers * 8)]
    jobs = [(log_dir, c, partitions, segments, template, end_ms) for c in chunks if c]
    if workers > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            done = sum(pool.imap_unordered(_worker, jobs))
    else:
        done = sum(_worker(j) for j in jobs)
    assert done == partitions
    write_log_dir_files(log_dir, partitions, segments, template.records)
    return time.monotonic() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log_dir")
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--segments", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    seconds = generate(args.log_dir, args.partitions, args.segments, args.workers)
    files = args.partitions * args.segments * 3
    print(f"wrote {files:,} segment files in {seconds:.1f} s ({files / seconds:,.0f} files/s)")


if __name__ == "__main__":
    main()
