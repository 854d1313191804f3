"""A scan on the hints' word (``ListingCache.trust``) takes an untouched partition's share of
the last scan whole (``ListingCache.scan_memo``): it must find exactly what a scan with no
cache finds, whatever changed where the hints said so, and take nothing whole once the
inputs that decide a partition's share (log start offsets, the protection rule) changed."""

from __future__ import annotations

import os
import time
from pathlib import Path

from diskguard.kafkalog.checkpoints import LOG_START_CHECKPOINT
from diskguard.kafkalog.listing import ListingCache
from diskguard.kafkalog.model import Partition
from diskguard.kafkalog.scan import ScanResult, scan
from diskguard.kafkalog.topicpolicy import ProtectionRule
from support import kafkagen
from support.segmentwriter import write_checkpoint

RULE = ProtectionRule(protect_topics=())


def settled(log_dir: Path) -> None:
    """Every dir older than the cache's settle time: their listings are kept."""
    past = time.time() - 30
    for path in (log_dir, *log_dir.iterdir()):
        os.utime(path, (past, past))


def tree(tmp_path: Path) -> Path:
    log_dir = tmp_path / "kafka"
    for topic in ("orders", "payments"):
        for partition in range(3):
            kafkagen.write_partition(log_dir, topic, partition, [kafkagen.SegmentSpec()] * 3)
    write_checkpoint(log_dir / LOG_START_CHECKPOINT, [])  # as a broker keeps it
    settled(log_dir)
    return log_dir


Found = tuple[object, ...]


def found(result: ScanResult) -> Found:
    """What a scan found in the log dirs (the filesystem's usage moves on its own)."""
    return (
        tuple(d for fs in result.filesystems for d in fs.log_dirs),
        result.topics_by_mount,
        result.warnings,
    )


def cached(cache: ListingCache, log_dir: Path, **kw: object) -> Found:
    return found(scan([log_dir], RULE, full=True, cache=cache, **kw))  # type: ignore[arg-type]


def hinted(cache: ListingCache, log_dir: Path, touched: set[str], **kw: object) -> Found:
    cache.trust(frozenset(touched))
    try:
        return cached(cache, log_dir, **kw)
    finally:
        cache.trust(None)


def fresh(log_dir: Path, **kw: object) -> Found:
    return found(scan([log_dir], RULE, full=True, **kw))  # type: ignore[arg-type]


def partitions(result: Found) -> dict[tuple[str, int], Partition]:
    (log_dir,) = result[0]
    return {(p.topic, p.partition): p for p in log_dir.partitions}  # type: ignore[attr-defined]


def test_a_hinted_scan_reads_again_what_the_hints_name(tmp_path: Path) -> None:
    log_dir = tree(tmp_path)
    cache = ListingCache()
    first = cached(cache, log_dir)
    assert first == fresh(log_dir)
    hits = cache.hits
    assert hinted(cache, log_dir, set()) == first  # nothing touched: all taken whole
    assert cache.hits - hits == 6

    # The active segment grows in one partition, another rolls: both named by the hints.
    with open(log_dir / "orders-1" / "00000000000000000020.log", "ab") as f:
        f.write(b"\0" * 8192)
    kafkagen.write_partition(log_dir, "payments", 2, [kafkagen.SegmentSpec()] * 5)
    again = hinted(cache, log_dir, {"orders-1", "payments-2"})
    assert again == fresh(log_dir) != first
    assert len(partitions(again)["payments", 2].base_offsets) == 5


def test_nothing_is_taken_whole_once_a_log_start_offset_moved(tmp_path: Path) -> None:
    """The broker moved a log start offset (DeleteRecords, retention) of a partition whose
    dir had no event: its segments below it are pending reclaim now."""
    log_dir = tree(tmp_path)
    cache = ListingCache()
    cached(cache, log_dir)
    write_checkpoint(log_dir / LOG_START_CHECKPOINT, [("orders", 0, 20)])
    moved = hinted(cache, log_dir, {LOG_START_CHECKPOINT})
    assert moved == fresh(log_dir)
    (moved_dir,) = moved[0]
    assert moved_dir.pending_reclaim_bytes > 0  # type: ignore[attr-defined]
    asked = {str(log_dir): {("payments", 1): 10}}
    assert hinted(cache, log_dir, set(), requested_log_start=asked) == fresh(
        log_dir, requested_log_start=asked
    )


def test_hard_linked_files_are_counted_per_inode_every_time(tmp_path: Path) -> None:
    """A segment also linked elsewhere (a backup's hard link) is counted once per inode, which
    depends on the other partitions: such a partition is never taken whole."""
    log_dir = tree(tmp_path)
    os.link(log_dir / "orders-0" / "00000000000000000000.log", tmp_path / "backup.log")
    os.link(
        log_dir / "orders-2" / "00000000000000000010.log",
        log_dir / "payments-0" / "00000000000000000010.log.deleted",
    )
    settled(log_dir)
    cache = ListingCache()
    first = cached(cache, log_dir)
    assert first == fresh(log_dir)
    assert hinted(cache, log_dir, set()) == first
    assert hinted(cache, log_dir, {"orders-0"}) == first
    assert hinted(cache, log_dir, {"payments-0"}) == first  # the inode's second name


def test_a_scan_not_on_trust_sees_a_change_no_hint_named(tmp_path: Path) -> None:
    """The memo is for scans on the hints' word only: a check reads what changed."""
    log_dir = tree(tmp_path)
    cache = ListingCache()
    cached(cache, log_dir)
    kafkagen.write_partition(log_dir, "orders", 2, [kafkagen.SegmentSpec()] * 6)
    settled(log_dir)
    checked = cached(cache, log_dir)
    assert checked == fresh(log_dir)
    assert len(partitions(checked)["orders", 2].base_offsets) == 6
