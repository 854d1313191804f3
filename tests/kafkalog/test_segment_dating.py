"""Dating a segment from as few bytes as possible, without ever dating it too old.

A segment Kafka rolled cleanly is dated by its ``.timeindex`` alone (its last entry is the
max timestamp at the segment's last offset); every other segment also has the ``.log`` tail
read, because records after the last time-index entry may carry a larger timestamp (a
segment that was active when the broker stopped uncleanly has no final entry).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from diskguard.kafkalog import dating
from diskguard.kafkalog.dating import SegmentFileReader
from diskguard.kafkalog.model import Partition
from support.kafkagen import SegmentSpec, write_partition

# 60 records of 2 kB, 2 per batch: time-index entries every ~4 kB, so an unclean stop leaves
# entries that stop short of the segment's end.
BIG = SegmentSpec(records=60, payload_size=2000, records_per_batch=2, timestamp_step_ms=60_000)


def partition_of(layout: object, path: Path) -> Partition:
    bases = tuple(s.base_offset for s in layout.segments)  # type: ignore[attr-defined]
    return Partition(
        log_dir=str(path.parent), topic="t", partition=0, path=str(path), base_offsets=bases
    )


@pytest.fixture
def log_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = dating._max_batch_timestamp

    def counting(log_path: str, start: int) -> int | None:
        calls.append(log_path)
        return real(log_path, start)

    monkeypatch.setattr(dating, "_max_batch_timestamp", counting)
    return calls


def test_a_cleanly_rolled_segment_is_dated_from_its_time_index_alone(
    tmp_path: Path, log_reads: list[str]
) -> None:
    layout = write_partition(tmp_path, "t", 0, [BIG, BIG, SegmentSpec()])
    part = partition_of(layout, layout.path)
    reader = SegmentFileReader()
    for seg in layout.closed:
        info = reader(part, seg.base_offset)
        assert (info.max_timestamp_ms, info.timestamp_source) == (seg.max_timestamp_ms, "timeindex")
    assert log_reads == [], "a cleanly rolled segment's .log must not be read"
    assert reader.warnings == []


def test_a_segment_active_at_an_unclean_stop_is_dated_from_its_log_tail(
    tmp_path: Path, log_reads: list[str]
) -> None:
    layout = write_partition(
        tmp_path, "t", 0, [BIG, BIG, SegmentSpec()], simulate_unclean_stop=True
    )
    crashed = layout.closed[-1]
    assert crashed.timeindex_last_timestamp_ms is not None
    assert crashed.timeindex_last_timestamp_ms < crashed.max_timestamp_ms
    info = SegmentFileReader()(partition_of(layout, layout.path), crashed.base_offset)
    assert info.max_timestamp_ms == crashed.max_timestamp_ms
    assert log_reads == [str(crashed.log_path)]


def test_a_trimmed_time_index_short_of_the_last_offset_still_reads_the_log_tail(
    tmp_path: Path, log_reads: list[str]
) -> None:
    """Trimmed but without the final entry (an unclean stop, then something trimmed the
    index): the last entry's offset is not the segment's last offset, so the tail is read."""
    layout = write_partition(
        tmp_path, "t", 0, [BIG, BIG, SegmentSpec()], simulate_unclean_stop=True
    )
    crashed = layout.closed[-1]
    for path, entry, count in (
        (crashed.timeindex_path, 12, len(crashed.time_index)),
        (crashed.index_path, 8, len(crashed.offset_index)),
    ):
        os.truncate(path, entry * count)
    info = SegmentFileReader()(partition_of(layout, layout.path), crashed.base_offset)
    assert info.max_timestamp_ms == crashed.max_timestamp_ms
    assert log_reads == [str(crashed.log_path)]


def test_out_of_order_timestamps_are_dated_by_the_largest(
    tmp_path: Path, log_reads: list[str]
) -> None:
    """CreateTime: the last batch may be older than an earlier one; the time index's final
    entry then names the earlier offset, and the answer is still the segment's max."""
    t0 = 1_700_000_000_000
    skewed = SegmentSpec(timestamps_ms=(t0, t0 + 9_000, t0 + 1_000), payload_size=3000)
    layout = write_partition(tmp_path, "t", 0, [skewed, SegmentSpec()])
    seg = layout.closed[0]
    info = SegmentFileReader()(partition_of(layout, layout.path), seg.base_offset)
    assert info.max_timestamp_ms == t0 + 9_000 == seg.max_timestamp_ms
