"""The appending segment writer writes what the whole-file generator writes, and what a broker
leaves on disk while a segment is active: read back with diskguard's own parsers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from diskguard.kafkalog import offsetindex, recordbatch, timeindex
from support import kafkagen
from support.segmentwriter import (
    DEFAULT_SEGMENT_INDEX_BYTES,
    OFFSET_INDEX_ENTRY,
    TIME_INDEX_ENTRY,
    ActiveSegment,
)

T0 = 1_700_000_000_000
RECORDS = 300
PER_BATCH = 4
PAYLOAD = 250


def _values(first_offset: int, n: int) -> list[bytes | None]:
    # The generator's payloads, so both writers must produce identical bytes.
    return [(f"{first_offset + i}:".encode() + b"x" * PAYLOAD)[:PAYLOAD] for i in range(n)]


def _fill(seg: ActiveSegment) -> None:
    for start in range(0, RECORDS, PER_BATCH):
        timestamps = [T0 + (start + i) * 1000 for i in range(PER_BATCH)]
        seg.append(timestamps, _values(seg.next_offset, PER_BATCH))


def test_rolled_segment_is_byte_identical_to_the_generator(tmp_path: Path) -> None:
    spec = kafkagen.SegmentSpec(records=RECORDS, payload_size=PAYLOAD, records_per_batch=PER_BATCH)
    layout = kafkagen.write_partition(tmp_path / "gen", "t", 0, [spec, kafkagen.SegmentSpec()])
    closed = layout.segments[0]

    part = tmp_path / "live" / "t-0"
    part.mkdir(parents=True)
    seg = ActiveSegment(part, 0)
    _fill(seg)
    seg.roll()
    seg.roll()  # idempotent

    assert seg.next_offset == closed.next_offset
    assert seg.log_path.read_bytes() == closed.log_path.read_bytes()
    assert seg.index_path.read_bytes() == closed.index_path.read_bytes()
    assert seg.timeindex_path.read_bytes() == closed.timeindex_path.read_bytes()
    # The final time entry of a clean roll names the segment's max timestamp.
    last = timeindex.last_entry(seg.timeindex_path)
    assert last is not None and last.timestamp_ms == T0 + (RECORDS - 1) * 1000
    with pytest.raises(ValueError, match="already rolled"):
        seg.append([T0], [b"late"])


def test_active_segment_is_sparse_and_readable_while_written(tmp_path: Path) -> None:
    seg = ActiveSegment(tmp_path, 500)
    _fill(seg)
    for path, entry in (
        (seg.index_path, OFFSET_INDEX_ENTRY),
        (seg.timeindex_path, TIME_INDEX_ENTRY),
    ):
        st = path.stat()
        assert st.st_size == DEFAULT_SEGMENT_INDEX_BYTES - DEFAULT_SEGMENT_INDEX_BYTES % entry
        assert st.st_blocks * 512 < 64 * 1024, "preallocated indexes must stay sparse"
    headers = list(recordbatch.iter_batches(seg.log_path, verify_crc=True))
    assert headers[0].base_offset == 500
    assert headers[-1].next_offset == seg.next_offset == 500 + RECORDS
    assert sum(h.size_in_bytes for h in headers) == seg.size == seg.log_path.stat().st_size
    # diskguard finds the last entries of the preallocated files where the builder put them.
    assert seg.indexes.offset_entries, "a log this long has index entries"
    off = offsetindex.last_entry(seg.index_path)
    assert off is not None
    assert (off.relative_offset, off.position) == seg.indexes.offset_entries[-1]
    ts = timeindex.last_entry(seg.timeindex_path)
    assert ts is not None
    assert (ts.timestamp_ms, ts.relative_offset) == seg.indexes.time_entries[-1]
    seg.close()  # unclean: indexes stay preallocated
    assert os.path.getsize(seg.index_path) > len(seg.indexes.offset_entries) * OFFSET_INDEX_ENTRY
