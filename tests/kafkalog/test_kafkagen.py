"""The generator writes what Kafka writes: parse its output with diskguard's parsers and with
kafka-python, and check Kafka's index rules hold."""

from __future__ import annotations

import itertools
import os
import struct
import warnings
from pathlib import Path

import crc32c
import pytest

from diskguard.kafkalog import model, offsetindex, recordbatch, timeindex
from support import kafkagen
from support.kafkagen import SegmentSpec

T0 = 1_700_000_000_000
TEN_MIB = 10 * 1024 * 1024


def _kafka_python_records(data: bytes) -> list[tuple[int, int, bytes]]:
    """(offset, timestamp, value) of every record, decoded by kafka-python."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka.record.default_records import DefaultRecordBatch

    out = []
    position = 0
    while position < len(data):
        (length,) = struct.unpack_from(">i", data, position + 8)
        batch = DefaultRecordBatch(data[position : position + 12 + length])
        assert batch.validate_crc()
        out += [(r.offset, r.timestamp, bytes(r.value)) for r in batch]
        position += 12 + length
    return out


def _check_segment(seg: kafkagen.SegmentLayout, interval: int) -> None:
    headers = list(recordbatch.iter_batches(seg.log_path, verify_crc=True))
    assert [(h.position, h.base_offset, h.last_offset) for h in headers] == [
        (b.position, b.base_offset, b.last_offset) for b in seg.batches
    ]
    assert headers[0].base_offset == seg.base_offset
    assert headers[-1].next_offset == seg.next_offset
    assert seg.log_path.stat().st_size == seg.log_bytes
    by_position = {h.position: h for h in headers}

    # Offset index: every entry points at a batch start and names that batch's last offset;
    # entries are at least index.interval.bytes of log apart (LogSegment.append).
    index = offsetindex.entries(seg.index_path)
    assert [(e.relative_offset, e.position) for e in index] == list(seg.offset_index)
    for entry in index:
        assert by_position[entry.position].last_offset == seg.base_offset + entry.relative_offset
    positions = [0] + [e.position for e in index]
    assert all(b - a > interval for a, b in itertools.pairwise(positions))
    if seg.log_bytes > 3 * interval + max(b.size for b in seg.batches) * 3:
        assert index, "a log this long must have index entries"

    # Time index: non-decreasing, offsets inside the segment, max so far at each entry.
    times = timeindex.entries(seg.timeindex_path)
    assert [(e.timestamp_ms, e.relative_offset) for e in times] == list(seg.time_index)
    assert all(a.timestamp_ms < b.timestamp_ms for a, b in itertools.pairwise(times))
    for entry in times:
        assert 0 <= entry.relative_offset < seg.next_offset - seg.base_offset
        upto = [
            h.max_timestamp
            for h in headers
            if h.last_offset <= seg.base_offset + entry.relative_offset
        ]
        assert entry.timestamp_ms == max(upto)
    batch_max = max(h.max_timestamp for h in headers)
    assert seg.max_timestamp_ms == batch_max
    last = timeindex.last_entry(seg.timeindex_path)
    if not seg.active and not seg.preallocated:
        # A cleanly closed segment's time index ends with its largest timestamp.
        assert last is not None and last.timestamp_ms == batch_max
        assert seg.index_path.stat().st_size == 8 * len(index)
        assert seg.timeindex_path.stat().st_size == 12 * len(times)

    # kafka-python reads the same records back.
    records = _kafka_python_records(seg.log_path.read_bytes())
    assert [r[0] for r in records] == list(range(seg.base_offset, seg.next_offset))


def test_partition_round_trips_through_the_parsers(tmp_path: Path) -> None:
    specs = [
        SegmentSpec(records=120, payload_size=300, first_timestamp_ms=T0 + s * 1_000_000)
        for s in range(3)
    ] + [SegmentSpec(records=40, payload_size=900, records_per_batch=4, first_timestamp_ms=T0 * 2)]
    part = kafkagen.write_partition(tmp_path, "orders", 3, specs)
    assert part.path == tmp_path / "orders-3"
    assert part.base_offsets == (0, 120, 240, 360)
    assert part.log_end_offset == 400
    for seg in part.segments:
        _check_segment(seg, 4096)
        assert model.parse_segment_file(seg.log_path.name) == (seg.base_offset, ".log")
    assert model.parse_partition_dir(part.path.name) == model.PartitionDirName(
        "orders", 3, model.PartitionDirKind.LIVE
    )
    assert part.closed == part.segments[:3] and part.active.active


def test_active_segment_indexes_are_sparse_10mib(tmp_path: Path) -> None:
    part = kafkagen.write_partition(
        tmp_path, "t", 0, [SegmentSpec(records=50), SegmentSpec(records=300, payload_size=200)]
    )
    active = part.active
    assert active.preallocated
    assert active.index_path.stat().st_size == TEN_MIB
    assert active.timeindex_path.stat().st_size == TEN_MIB - TEN_MIB % 12
    for path in (active.index_path, active.timeindex_path):
        assert path.stat().st_blocks * 512 <= 64 * 1024, "preallocation must be sparse"
    entry = timeindex.last_entry(active.timeindex_path)
    assert (
        entry is not None and (entry.timestamp_ms, entry.relative_offset) == active.time_index[-1]
    )
    index = offsetindex.last_entry(active.index_path)
    assert index is not None and (index.relative_offset, index.position) == active.offset_index[-1]
    # The index hint lets the .log tail give the newest timestamp without a full walk.
    assert recordbatch.last_batch_max_timestamp(active.log_path, index.position) == (
        active.max_timestamp_ms
    )
    _check_segment(active, 4096)


def test_unpreallocated_active_and_custom_index_sizes(tmp_path: Path) -> None:
    part = kafkagen.write_partition(
        tmp_path,
        "t",
        1,
        [SegmentSpec(records=30), SegmentSpec(records=30)],
        active_preallocated=False,
        index_interval_bytes=512,
    )
    assert not part.active.preallocated
    assert part.active.index_path.stat().st_size == 8 * len(part.active.offset_index)
    for seg in part.segments:
        _check_segment(seg, 512)
    part2 = kafkagen.write_partition(
        tmp_path, "u", 0, [SegmentSpec(records=5)], segment_index_bytes=1000
    )
    assert part2.active.index_path.stat().st_size == 1000
    assert part2.active.timeindex_path.stat().st_size == 996


def test_simulated_unclean_stop_leaves_a_closed_segment_preallocated(tmp_path: Path) -> None:
    specs = [
        SegmentSpec(records=100, payload_size=500, first_timestamp_ms=T0 + s * 10**6)
        for s in range(4)
    ]
    part = kafkagen.write_partition(tmp_path, "t", 0, specs, simulate_unclean_stop=True)
    crashed = part.segments[2]
    assert crashed.preallocated and not crashed.active
    assert crashed.timeindex_path.stat().st_size == TEN_MIB - TEN_MIB % 12
    assert crashed.timeindex_path.stat().st_blocks * 512 <= 64 * 1024
    assert not part.segments[1].preallocated
    last = timeindex.last_entry(crashed.timeindex_path)
    assert last is not None and last.timestamp_ms == crashed.timeindex_last_timestamp_ms
    # No roll entry: the index lags the segment's true max, the .log tail has it.
    assert last.timestamp_ms < crashed.max_timestamp_ms
    hint = offsetindex.last_entry(crashed.index_path)
    assert hint is not None
    assert recordbatch.last_batch_max_timestamp(crashed.log_path, hint.position) == (
        crashed.max_timestamp_ms
    )
    _check_segment(crashed, 4096)

    explicit = kafkagen.write_partition(tmp_path, "v", 0, specs, simulate_unclean_stop=[0, 1])
    assert [s.preallocated for s in explicit.segments] == [True, True, False, True]
    with pytest.raises(ValueError):
        kafkagen.write_partition(tmp_path, "w", 0, specs, simulate_unclean_stop=[3])


def test_explicit_out_of_order_timestamps(tmp_path: Path) -> None:
    stamps = (T0 + 50, T0 + 10, T0 + 90, T0 + 20, T0 + 5)
    part = kafkagen.write_partition(
        tmp_path,
        "t",
        0,
        [
            SegmentSpec(timestamps_ms=stamps, payload_size=3000, records_per_batch=2),
            SegmentSpec(records=1),
        ],
        index_interval_bytes=100,
    )
    seg = part.segments[0]
    assert seg.next_offset == 5 and seg.max_timestamp_ms == T0 + 90
    _check_segment(seg, 100)
    records = _kafka_python_records(seg.log_path.read_bytes())
    assert [r[1] for r in records] == list(stamps)


def test_side_files(tmp_path: Path) -> None:
    part = kafkagen.write_partition(
        tmp_path, "t", 0, [SegmentSpec(records=3)] * 3, leader_epoch=7, first_offset=1000
    )
    assert (part.path / "leader-epoch-checkpoint").read_text() == "0\n1\n7 1000\n"
    meta = (part.path / "partition.metadata").read_text().splitlines()
    assert meta[0] == "version: 0" and meta[1] == f"topic_id: {part.topic_id}"
    assert len(part.topic_id) == 22
    assert part.base_offsets == (1000, 1003, 1006)
    assert [p.name for p in part.snapshot_paths] == [
        "00000000000000001003.snapshot",
        "00000000000000001006.snapshot",
    ]
    snap = part.snapshot_paths[0].read_bytes()
    version, crc = struct.unpack_from(">hI", snap)
    assert version == 1 and crc == crc32c.crc32c(snap[6:])
    assert model.parse_segment_file(part.snapshot_paths[0].name) == (1003, ".snapshot")
    assert part.segments[1].snapshot_path == part.snapshot_paths[0]


def test_log_dir_checkpoints_and_meta(tmp_path: Path) -> None:
    layout = kafkagen.write_log_dir(
        tmp_path / "kafka-logs",
        {
            ("orders", 0): [SegmentSpec(records=10), SegmentSpec(records=5)],
            ("orders", 1): [SegmentSpec(records=7)],
            ("__consumer_offsets", 12): [SegmentSpec(records=2)],
        },
        log_start_offsets={("orders", 0): 4},
        node_id=3,
    )
    root = layout.path
    assert (root / ".lock").is_file()
    meta = (root / "meta.properties").read_text()
    assert "node.id=3\n" in meta and "version=1\n" in meta and "cluster.id=" in meta

    def checkpoint(name: str) -> list[str]:
        return (root / name).read_text().splitlines()

    ends = ["0", "3", "__consumer_offsets 12 2", "orders 0 15", "orders 1 7"]
    assert checkpoint("recovery-point-offset-checkpoint") == ends
    assert checkpoint("replication-offset-checkpoint") == ends
    assert checkpoint("log-start-offset-checkpoint") == ["0", "1", "orders 0 4"]
    assert checkpoint("cleaner-offset-checkpoint") == ["0", "0"]
    assert layout.partitions[("orders", 0)].log_start_offset == 4
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [
        "__consumer_offsets-12",
        "orders-0",
        "orders-1",
    ]
    # Options pass through to every partition.
    other = kafkagen.write_log_dir(
        tmp_path / "other", {("t", 0): [SegmentSpec(records=3)]}, active_preallocated=False
    )
    assert not other.partitions[("t", 0)].active.preallocated


def test_hold_lock_locks_from_another_process(tmp_path: Path) -> None:
    layout = kafkagen.write_log_dir(tmp_path / "logs")
    assert not kafkagen.lock_is_held_elsewhere(layout.path)
    with kafkagen.hold_lock(layout.path) as pid:
        assert pid != os.getpid()
        assert os.path.exists(f"/proc/{pid}")
        assert kafkagen.lock_is_held_elsewhere(layout.path)
        assert kafkagen.lock_is_held_elsewhere(layout.path)  # probing does not steal it
    assert not kafkagen.lock_is_held_elsewhere(layout.path)
    # The holder creates .lock if the dir has none, as the broker does.
    bare = tmp_path / "bare"
    bare.mkdir()
    with kafkagen.hold_lock(bare):
        assert (bare / ".lock").exists() and kafkagen.lock_is_held_elsewhere(bare)


def test_hold_lock_fails_loudly_when_it_cannot_lock(tmp_path: Path) -> None:
    with (
        pytest.raises(RuntimeError, match="did not lock"),
        kafkagen.hold_lock(tmp_path / "x" / "y"),
    ):
        pass


def test_varint_matches_kafka_examples() -> None:
    # Kafka's ByteUtils zig-zag examples.
    assert kafkagen.varint(0) == b"\x00"
    assert kafkagen.varint(-1) == b"\x01"
    assert kafkagen.varint(1) == b"\x02"
    assert kafkagen.varint(-64) == b"\x7f"
    assert kafkagen.varint(64) == b"\x80\x01"
    assert kafkagen.varint(300) == b"\xd8\x04"
