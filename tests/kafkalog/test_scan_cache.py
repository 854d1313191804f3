"""The listing cache: unchanged partition dirs are not re-listed, yet nothing is missed."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from diskguard.kafkalog.dating import AgeCache, SegmentFileReader
from diskguard.kafkalog.listing import ListingCache
from diskguard.kafkalog.scan import scan_log_dir
from support.kafkagen import SegmentSpec, write_log_dir


def age_dirs(root: Path, seconds: float = 60) -> None:
    old = time.time() - seconds
    for d in [root, *(p for p in root.iterdir() if p.is_dir())]:
        os.utime(d, (old, old))


def test_unchanged_dirs_are_served_from_cache_and_changes_are_seen(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    layout = write_log_dir(log_dir, {("orders", p): [SegmentSpec(records=5)] * 3 for p in range(4)})
    age_dirs(log_dir)
    cache = ListingCache()
    protect = [re.compile("^__")]
    first = scan_log_dir(str(log_dir), "/", protect, full=True, cache=cache)
    assert cache.misses == 4 and cache.hits == 0
    second = scan_log_dir(str(log_dir), "/", protect, full=True, cache=cache)
    assert cache.hits == 4
    assert second.partitions == first.partitions and second.kafka_bytes == first.kafka_bytes

    # The active segment grows without its directory changing: its bytes are still counted.
    active = layout.partitions[("orders", 0)].active.log_path
    before = os.stat(active).st_blocks
    with open(active, "ab") as f:
        f.write(b"\0" * 1024 * 1024)
        f.flush()
        os.fsync(f.fileno())
    assert os.stat(active).st_blocks > before
    third = scan_log_dir(str(log_dir), "/", protect, full=True, cache=cache)
    assert third.kafka_bytes is not None and first.kafka_bytes is not None
    assert third.kafka_bytes > first.kafka_bytes

    # A roll (new segment file) changes the dir: re-listed, the new segment is seen at once.
    part_dir = layout.partitions[("orders", 1)].path
    new_base = layout.partitions[("orders", 1)].log_end_offset
    (part_dir / f"{new_base:020d}.log").write_bytes(b"")
    hits = cache.hits
    fourth = scan_log_dir(str(log_dir), "/", protect, full=True, cache=cache)
    orders1 = next(p for p in fourth.partitions if p.partition == 1)
    assert orders1.base_offsets[-1] == new_base
    assert cache.hits == hits + 3  # the three untouched partitions only


def test_recently_changed_dirs_are_not_cached(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    write_log_dir(log_dir, {("orders", 0): [SegmentSpec(records=5)] * 2})
    cache = ListingCache(settle_s=3600)
    scan_log_dir(str(log_dir), "/", [], cache=cache)
    scan_log_dir(str(log_dir), "/", [], cache=cache)
    assert cache.hits == 0 and cache.misses == 2


class CountingReader(SegmentFileReader):
    calls = 0

    def _max_timestamp(
        self, partition_dir: str, base: int, next_offset: int | None = None
    ) -> tuple[int | None, str]:
        CountingReader.calls += 1
        return super()._max_timestamp(partition_dir, base, next_offset)


def test_segment_ages_are_reused_while_the_files_are_unchanged(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    layout = write_log_dir(log_dir, {("orders", 0): [SegmentSpec(records=5)] * 3})
    part = scan_log_dir(str(log_dir), "/", []).partitions[0]
    ages = AgeCache()
    first = CountingReader(ages)(part, 0)
    assert CountingReader.calls == 1
    again = CountingReader(ages)(part, 0)
    assert again == first and CountingReader.calls == 1
    # Any change to the segment's files (here the timeindex rewritten) dates it afresh.
    seg = layout.partitions[("orders", 0)].segments[0]
    seg.timeindex_path.write_bytes(seg.timeindex_path.read_bytes()[:-12])
    CountingReader(ages)(part, 0)
    assert CountingReader.calls == 2
    ages.prune()
    ages.prune()  # nothing used since the last prune: empty
    CountingReader(ages)(part, 0)
    assert CountingReader.calls == 3
