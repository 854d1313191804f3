"""The listing cache: unchanged partition dirs are not re-listed, yet nothing is missed."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from diskguard.config import load_config
from diskguard.kafkalog.dating import AgeCache, SegmentFileReader
from diskguard.kafkalog.listing import ListingCache
from diskguard.kafkalog.scan import scan, scan_log_dir, still_listed
from diskguard.kafkalog.topicpolicy import ProtectionRule
from diskguard.kafkalog.warming import date_ahead, warm_heads
from diskguard.retention.cycle import RetentionCycle
from support import configs
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


def test_a_partition_is_rebuilt_exactly_when_what_it_is_made_of_changes(tmp_path: Path) -> None:
    """The rescan reuses each unchanged partition's ``Partition``; a new log start offset, a
    new protection reason or a new listing each give a new one, equal to a fresh scan's."""
    log_dir = tmp_path / "logs"
    write_log_dir(log_dir, {("orders", p): [SegmentSpec(records=5)] * 3 for p in range(2)})
    age_dirs(log_dir)
    cache = ListingCache()
    first = scan_log_dir(str(log_dir), "/", ProtectionRule(), cache=cache)
    again = scan_log_dir(str(log_dir), "/", ProtectionRule(), cache=cache)
    assert all(a is b for a, b in zip(first.partitions, again.partitions, strict=True))

    # The broker checkpointed a new log start offset for orders-0 (the checkpoint is a file
    # of the log dir, not of the partition dir: the partition's listing is unchanged).
    orders0 = first.partitions[0]
    start = orders0.base_offsets[1]
    (log_dir / "log-start-offset-checkpoint").write_text(f"0\n1\norders 0 {start}\n")
    moved = scan_log_dir(str(log_dir), "/", ProtectionRule(), cache=cache)
    assert moved.partitions[0] is not orders0
    assert moved.partitions[0].log_start_offset == start
    assert moved.partitions[0].reclaiming == orders0.base_offsets[:1]
    assert moved.partitions[1] is again.partitions[1]

    # The topic became protected: a new Partition saying so.
    protected = scan_log_dir(
        str(log_dir), "/", ProtectionRule(protect_topics=("orders",)), cache=cache
    )
    assert all(p.protected and p.protected_reason for p in protected.partitions)
    assert protected.partitions[1] is not again.partitions[1]

    # Every scan equals one made without the cache.
    fresh = scan_log_dir(str(log_dir), "/", ProtectionRule(protect_topics=("orders",)))
    assert protected.partitions == fresh.partitions

    # A partition gone from the log dir is forgotten at the next prune.
    orders1 = protected.partitions[1]
    listing1 = cache.listing(orders1.path, False)
    assert (
        cache.partition(orders1.path, str(log_dir), listing1, None, orders1.protected_reason)
        is orders1
    )
    cache.prune()
    shutil.rmtree(orders1.path)
    scan_log_dir(str(log_dir), "/", ProtectionRule(protect_topics=("orders",)), cache=cache)
    cache.prune()
    assert (
        cache.partition(orders1.path, str(log_dir), listing1, None, orders1.protected_reason)
        is None
    )


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
        self,
        partition_dir: str,
        base: int,
        next_offset: int | None = None,
        ti: tuple[int, os.stat_result] | None = None,
    ) -> tuple[int | None, str]:
        CountingReader.calls += 1
        return super()._max_timestamp(partition_dir, base, next_offset, ti)


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


def test_quiet_cycles_warm_each_head_once_and_keep_it_while_it_exists(tmp_path: Path) -> None:
    """``warm_heads`` dates every partition's oldest candidate ahead of need (the daemon's
    quiet cycles), within its time budget; ``prune(live)`` keeps those ages while their
    segments exist, so the first plan over a limit reads no index."""
    log_dir = tmp_path / "logs"
    layout = write_log_dir(log_dir, {("orders", p): [SegmentSpec(records=5)] * 3 for p in range(3)})
    rule = ProtectionRule(assume_delete_policy=(".*",))
    result = scan([str(log_dir)], rule)
    parts = [p for fs in result.filesystems for d in fs.log_dirs for p in d.partitions]
    assert len(parts) == 3 and not any(p.protected for p in parts)
    CountingReader.calls = 0
    ages = AgeCache()
    assert warm_heads(parts, CountingReader(ages), budget_s=60) == 3
    assert warm_heads(parts, CountingReader(ages), budget_s=60) == 0
    assert CountingReader.calls == 3
    ages.prune(still_listed(result))  # no plan used them; their segments exist: kept
    assert warm_heads(parts, CountingReader(ages), budget_s=60) == 0
    # A head that goes (deleted) is dropped at the next prune; the new head gets dated.
    for path in layout.partitions[("orders", 1)].segments[0].files:
        path.unlink()
    result = scan([str(log_dir)], rule)
    parts = [p for fs in result.filesystems for d in fs.log_dirs for p in d.partitions]
    ages.prune(still_listed(result))
    assert not ages.has_segment(str(log_dir / "orders-1"), 0)
    assert warm_heads(parts, CountingReader(ages), budget_s=60) == 1
    # Without ``live``, what no plan used goes (one-shot commands).
    ages.prune()
    ages.prune()
    assert warm_heads(parts, CountingReader(ages), budget_s=60) == 3


def test_warming_heads_stops_when_its_budget_is_spent(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    write_log_dir(log_dir, {("orders", p): [SegmentSpec(records=5)] * 3 for p in range(4)})
    result = scan([str(log_dir)], ProtectionRule(assume_delete_policy=(".*",)))
    parts = [p for fs in result.filesystems for d in fs.log_dirs for p in d.partitions]
    ticks = iter(range(100))
    ages = AgeCache()
    # Each clock reading is one second later: the first head spends the whole budget.
    assert warm_heads(parts, SegmentFileReader(ages), 0.5, clock=lambda: next(ticks)) == 1
    assert warm_heads(parts, SegmentFileReader(ages), 0.0) == 0
    assert warm_heads(parts, SegmentFileReader(None), 60) == 0  # no cache, nothing to warm
    assert warm_heads(parts, SegmentFileReader(ages), 60) == 3


def test_after_an_acting_cycle_the_segments_next_in_line_are_dated_ahead(tmp_path: Path) -> None:
    """``date_ahead``: a cycle deleted n segments of a partition's head; the n after them
    are dated (the first after each partition before the second after any), none twice,
    never the active segment, never a protected partition's, within the budget."""
    log_dir = tmp_path / "logs"
    write_log_dir(
        log_dir,
        {
            ("orders", 0): [SegmentSpec(records=5)] * 6,
            ("orders", 1): [SegmentSpec(records=5)] * 3,
            ("__consumer_offsets", 0): [SegmentSpec(records=5)] * 4,
        },
    )
    result = scan([str(log_dir)], ProtectionRule(assume_delete_policy=("orders",)))
    parts = {
        p.topic + str(p.partition): p
        for fs in result.filesystems
        for d in fs.log_dirs
        for p in d.partitions
    }
    o0, o1, internal = parts["orders0"], parts["orders1"], parts["__consumer_offsets0"]
    assert internal.protected and not o0.protected
    taken = {(p.log_dir, p.topic, p.partition): 2 for p in (o0, o1, internal)}
    ages = AgeCache()
    # orders-0: candidates 2 and 3 (of 0..4); orders-1 has only 0 and 1 (2 is active).
    assert date_ahead(parts.values(), taken, SegmentFileReader(ages), 60) == 2
    assert ages.has_segment(o0.path, o0.base_offsets[2]) and ages.has_segment(
        o0.path, o0.base_offsets[3]
    )
    assert not ages.has_segment(o0.path, o0.base_offsets[4])
    assert not any(ages.has_segment(o1.path, b) for b in o1.base_offsets)
    assert not any(ages.has_segment(internal.path, b) for b in internal.base_offsets)
    assert date_ahead(parts.values(), taken, SegmentFileReader(ages), 60) == 0  # dated once
    ticks = iter(range(100))
    fresh = AgeCache()
    # Each clock reading a second later: the first read spends the budget.
    assert (
        date_ahead(parts.values(), taken, SegmentFileReader(fresh), 0.5, lambda: next(ticks)) == 1
    )
    assert date_ahead(parts.values(), taken, SegmentFileReader(None), 60) == 0  # no cache


def _reference_prune(ages: AgeCache, live: Callable[[str, int], bool] | None) -> None:
    """``AgeCache.prune`` as first written (rebuilds both dicts every time)."""
    keep = ages._used
    if live is not None:
        keep = keep | {key for (path, base), key in ages._segments.items() if live(path, base)}
    ages._entries = {k: v for k, v in ages._entries.items() if k in keep}
    ages._segments = {s: k for s, k in ages._segments.items() if k in ages._entries}
    ages._used = set()


_ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "get", "prune", "prune_live"]),
        st.integers(0, 5),  # segment
        st.integers(0, 2),  # identity generation (a segment's files changed)
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(_ops, st.sets(st.integers(0, 5)))
def test_prune_keeps_exactly_what_the_plain_rebuild_kept(
    ops: list[tuple[str, int, int]], alive: set[int]
) -> None:
    """The prune that skips rebuilding when nothing goes (the idle daemon's every cycle)
    leaves the same entries as the rebuild it replaced, after any sequence of uses."""
    fast, plain = AgeCache(), AgeCache()

    def live(path: str, base: int) -> bool:
        return base in alive

    for op, seg, gen in ops:
        key = ((f"/p/{seg}.log", seg, gen, 0),)
        for ages in (fast, plain):
            if op == "put":
                ages.put(key, (seg, "timeindex"), ("/p", seg))
            elif op == "get":
                ages.get(key)
        if op in ("prune", "prune_live"):
            fast.prune(live if op == "prune_live" else None)
            _reference_prune(plain, live if op == "prune_live" else None)
        assert fast._entries == plain._entries
        assert fast._segments == plain._segments
        assert fast._used == plain._used


def test_the_log_dir_listing_is_kept_while_unchanged_and_new_partitions_are_seen(
    tmp_path: Path,
) -> None:
    """The rescan keeps a log dir's sorted entries while its mtime is unchanged; a partition
    created (or a top-level file rewritten by rename, as Kafka's checkpoints are) changes
    it, and a top-level file's bytes are read afresh in a full scan even when cached."""
    log_dir = tmp_path / "logs"
    write_log_dir(log_dir, {("orders", p): [SegmentSpec(records=5)] * 2 for p in range(2)})
    (log_dir / "meta.properties").write_text("x" * 10)
    age_dirs(log_dir)
    cache = ListingCache()
    protect = [re.compile("^__")]
    first = cache.log_dir_entries(str(log_dir))
    assert cache.log_dir_entries(str(log_dir)) is first  # unchanged: the same list
    before = scan_log_dir(str(log_dir), "/", protect, full=True, cache=cache)
    with open(log_dir / "meta.properties", "a") as f:  # in place: the dir does not change
        f.write("y" * 100_000)
    grown = scan_log_dir(str(log_dir), "/", protect, full=True, cache=cache)
    assert grown.kafka_bytes is not None and before.kafka_bytes is not None
    assert grown.kafka_bytes > before.kafka_bytes
    write_log_dir(log_dir, {("orders", 2): [SegmentSpec(records=5)] * 2})
    after = scan_log_dir(str(log_dir), "/", protect, cache=cache)
    assert [p.partition for p in after.partitions] == [0, 1, 2]


def test_a_one_shot_offline_plan_dates_each_head_without_keeping_ages(tmp_path: Path) -> None:
    """``plan`` offline plans once: it reads each head once and keeps no age cache (keying it
    was ~10 % of dating); the daemon's cycles, planning again and again, keep theirs."""
    log_dir = tmp_path / "logs"
    write_log_dir(log_dir, {("orders", p): [SegmentSpec(records=5)] * 3 for p in range(2)})
    config = load_config(configs.write_config(tmp_path, log_dir, disk_usage_percent=0.001))
    for read_only in (True, False):
        with RetentionCycle(config, read_only=read_only) as cycle:
            outcome = cycle.plan()
            assert outcome.mode.mode == "offline"
            chosen = outcome.plan.deletions
            assert len(chosen) == 4  # every closed segment: far over the limit
            kept = [
                cycle.inputs.ages.has_segment(f"{d.log_dir}/{d.topic}-{d.partition}", d.base_offset)
                for d in chosen
            ]
            assert kept == [not read_only] * 4
