"""The offline sweep's listings handed on to the scan: the daemon's plan is the one a scan
from nothing would make, whatever changed in between; and a plan made stale behind the
cache's back is refused at deletion, never carried out."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from diskguard.kafkalog.dating import AgeCache, SegmentFileReader
from diskguard.kafkalog.listing import ListingCache
from diskguard.kafkalog.scan import ScanResult, scan, still_listed
from diskguard.kafkalog.topicpolicy import ProtectionRule
from diskguard.kafkalog.warming import date_ahead
from diskguard.retention.audit import AuditLog
from diskguard.retention.limits import Limits
from diskguard.retention.offline.fileexecutor import FileExecutor
from diskguard.retention.offline.sweeptargets import targets
from diskguard.retention.planner import Deletion, plan_filesystem
from support.kafkagen import DEFAULT_FIRST_TIMESTAMP_MS, SegmentSpec, write_partition

RULE = ProtectionRule(assume_delete_policy=(".*",))
_T0 = DEFAULT_FIRST_TIMESTAMP_MS
#: Few distinct timestamps: equally old segments of different partitions are common (ties).
_TIMES = st.sampled_from([0, 0, 1, 2, 3]).map(lambda k: DEFAULT_FIRST_TIMESTAMP_MS + k * 60_000)
_TREE = st.lists(st.lists(_TIMES, min_size=1, max_size=4), min_size=1, max_size=4)
_CHANGES = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "roll",
                "drop_oldest",
                "remove",
                "to_delete",
                "leftover",
                "truncate",
                "recreate",
                "link_out",
                "compact",
                "none",
            ]
        ),
        st.integers(0, 3),
    ),
    max_size=6,
)


def _spec(ts: int) -> SegmentSpec:
    return SegmentSpec(records=2, payload_size=50, first_timestamp_ms=ts, timestamp_step_ms=0)


def _segment_files(part: Path) -> dict[int, list[Path]]:
    out: dict[int, list[Path]] = {}
    for f in part.iterdir():
        stem, _, suffix = f.name.partition(".")
        if len(stem) == 20 and stem.isdigit() and suffix in ("log", "index", "timeindex"):
            out.setdefault(int(stem), []).append(f)
    return dict(sorted(out.items()))


def _change(log_dir: Path, kind: str, which: int) -> None:
    """One change a broker (or an operator) could make between two cycles."""
    parts = sorted(p for p in log_dir.iterdir() if p.is_dir() and not p.name.endswith("-delete"))
    if not parts:
        return
    part = parts[which % len(parts)]
    segments = _segment_files(part)
    if kind == "roll" and segments:
        # A new segment after the active one: what was active becomes a candidate.
        last = max(segments)
        nxt = last + 2
        for suffix in (".log", ".index", ".timeindex"):
            (part / f"{nxt:020d}{suffix}").write_bytes(b"")
    elif kind == "drop_oldest" and len(segments) > 1:
        for f in segments[min(segments)]:
            f.unlink()
    elif kind == "remove":
        shutil.rmtree(part)
    elif kind == "to_delete":
        part.rename(log_dir / f"{part.name}.0123456789abcdef-delete")
    elif kind == "leftover" and segments:
        (part / f"{min(segments):020d}.snapshot.deleted").write_bytes(b"x" * 100)
    elif kind == "truncate" and len(segments) > 1:
        _truncate(part, segments, which)
    elif kind == "link_out" and len(segments) > 1:
        # A backup tool's hard link to the oldest segment's .log, from outside the log dir:
        # the partition dir does not change, the file's link count does.
        backup = log_dir.parent / "backup"
        backup.mkdir(exist_ok=True)
        src = part / f"{min(segments):020d}.log"
        dest = backup / f"{part.name}-{src.name}"
        if not dest.exists():
            os.link(src, dest)
    elif kind == "compact" and len(segments) > 1:
        # The cleaner's swap of the oldest segment, in Kafka's order: its files written as
        # .cleaned, renamed .swap, the old ones renamed .deleted, the .swap ones into place
        # (other bytes: the records it kept, filler here; new inodes, the same names).
        for f in segments[min(segments)]:
            cleaned = f.with_name(f.name + ".cleaned")
            cleaned.write_bytes(f.read_bytes() + b"\0" * 9000)
            swap = cleaned.rename(f.with_name(f.name + ".swap"))
            f.rename(f.with_name(f.name + ".deleted"))
            swap.rename(f)
    elif kind == "recreate" and segments:
        # Removed and made again (by hand, or a topic deleted and created again with a short
        # delete delay): the same names, other bytes, and ext4 hands the freed inode numbers
        # out again. A real re-creation takes longer than a clock tick (ctime's grain).
        shutil.rmtree(part)
        time.sleep(0.02)
        big = SegmentSpec(
            records=2, payload_size=5000, first_timestamp_ms=DEFAULT_FIRST_TIMESTAMP_MS
        )
        write_partition(log_dir, "orders", int(part.name.rsplit("-", 1)[1]), [big] * len(segments))


def _truncate(part: Path, segments: dict[int, list[Path]], which: int) -> None:
    """A follower truncating to an offset in a closed segment (its last one, or its first:
    ``which``), or a recovery finding a bad tail there, then rolling again: Kafka renames
    every segment above it for deletion, truncates it in place and it is the active one,
    written to, until the next roll closes it again: other bytes, the same inode."""
    bases = sorted(segments)
    keep = bases[-2] if which % 2 == 0 else bases[0]
    for base in bases[bases.index(keep) + 1 :]:
        for f in segments[base]:
            f.rename(f.with_name(f.name + ".deleted"))
    log = part / f"{keep:020d}.log"
    os.truncate(log, log.stat().st_size // 3)
    with open(log, "ab") as fh:  # the leader's records from there on (filler here)
        fh.write(b"\0" * 9000)
    nxt = bases[-1] + 2
    for suffix in (".log", ".index", ".timeindex"):
        (part / f"{nxt:020d}{suffix}").write_bytes(b"")


def _plan(result: ScanResult, read: SegmentFileReader) -> tuple[list[Deletion], list[str]]:
    """Every candidate in global-oldest order (limits of 0 %: all of them are wanted)."""
    chosen: list[Deletion] = []
    for fs in result.filesystems:
        _fs_plan, deletions = plan_filesystem(fs, Limits(0.0, 0.0), read)
        chosen.extend(deletions)
    return chosen, read.warnings


def _with_usage_of(daemon: ScanResult, fresh: ScanResult) -> ScanResult:
    """``fresh`` with ``daemon``'s usage per filesystem: both scans then compare on what
    they listed (other processes write to this filesystem meanwhile)."""
    return replace(
        fresh,
        filesystems=tuple(
            replace(f, usage=d.usage)
            for f, d in zip(fresh.filesystems, daemon.filesystems, strict=True)
        ),
    )


@settings(max_examples=25, deadline=None)
@given(_TREE, _CHANGES)
def test_the_daemons_plan_is_a_fresh_scans_plan_after_any_change(
    tree: list[list[int]], changes: list[tuple[str, int]]
) -> None:
    """Per cycle the daemon lists partition dirs in its sweep (``targets``) and hands the
    listings on to the scan, reuses unchanged dirs' listings and ``Partition``s, and reads
    ages through its age cache; a scan with no cache and a reader with none decides the
    same deletions, in the same order, with the same why and the same warnings, also after
    the segments an acting cycle's next crossing will reach were dated ahead."""
    root = Path(tempfile.mkdtemp(prefix="dg-handoff-"))
    try:
        log_dir = root / "logs"
        for p, times in enumerate(tree):
            write_partition(log_dir, "orders", p, [_spec(t) for t in times])
        cache, ages = ListingCache(), AgeCache()
        handed = 0
        for kind, which in [("none", 0), *changes]:
            _change(log_dir, kind, which)
            before = cache.fresh_hits
            targets(os.path.realpath(log_dir), cache)
            daemon = scan([str(log_dir)], RULE, use_log_start=False, cache=cache)
            handed += cache.fresh_hits - before
            reader = SegmentFileReader(ages)
            daemon_plan = _plan(daemon, reader)
            ages.prune(still_listed(daemon))
            # As an acting cycle does once it deleted the plan's first half: the segments
            # after those are dated ahead, for the next plan.
            taken: dict[tuple[str, str, int], int] = {}
            for d in daemon_plan[0][: len(daemon_plan[0]) // 2]:
                key = (d.log_dir, d.topic, d.partition)
                taken[key] = taken.get(key, 0) + 1
            parts = [p for f in daemon.filesystems for d in f.log_dirs for p in d.partitions]
            date_ahead(parts, taken, SegmentFileReader(ages), 60.0)
            fresh = _with_usage_of(daemon, scan([str(log_dir)], RULE, use_log_start=False))
            assert daemon.filesystems == fresh.filesystems
            assert daemon.warnings == fresh.warnings
            assert daemon_plan == _plan(fresh, SegmentFileReader(None))
        assert handed > 0  # the sweep's listings were taken, not made again
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_handed_on_listing_is_taken_once_and_only_while_the_dir_is_the_same(
    tmp_path: Path,
) -> None:
    log_dir = tmp_path / "logs"
    write_partition(log_dir, "orders", 0, [_spec(DEFAULT_FIRST_TIMESTAMP_MS)] * 3)
    path = str(log_dir / "orders-0")
    cache = ListingCache()
    handed = cache.listing(path, full=False, hand_on=True)
    assert cache.listing(path, full=False) is handed and cache.fresh_hits == 1
    assert cache.listing(path, full=False) is not handed  # once
    cache.listing(path, full=False, hand_on=True)
    (log_dir / "orders-0" / f"{99:020d}.log").write_bytes(b"")  # a roll, in between
    os.utime(log_dir / "orders-0", ns=(1, 1))  # a new mtime whatever the clock's grain
    assert 99 in cache.listing(path, full=False).bases and cache.fresh_hits == 1
    cache.listing(path, full=False, hand_on=True)
    cache.prune()  # the scan ended: nothing handed on survives it
    cache.listing(path, full=False)
    assert cache.fresh_hits == 1
    # A dir holding *.deleted leftovers (the sweep removes them) is never handed on.
    (log_dir / "orders-0" / f"{0:020d}.index.deleted").write_bytes(b"x")
    cache.listing(path, full=False, hand_on=True)
    cache.listing(path, full=False)
    assert cache.fresh_hits == 1


def test_a_plan_made_stale_behind_the_caches_back_is_refused_at_deletion(
    tmp_path: Path,
) -> None:
    """The cache trusts a dir's (inode, mtime). A segment removed with the dir's mtime put
    back is not seen by the daemon's scan, so its plan still names the segment before it as
    closed; the guard rails list the dir afresh before deleting and refuse: nothing goes."""
    log_dir = tmp_path / "logs"
    write_partition(log_dir, "orders", 0, [_spec(DEFAULT_FIRST_TIMESTAMP_MS)] * 3)
    part = log_dir / "orders-0"
    old = part.stat().st_mtime_ns - 60 * 10**9
    os.utime(part, ns=(old, old))
    os.utime(log_dir, ns=(old, old))
    cache = ListingCache()
    scan([str(log_dir)], RULE, use_log_start=False, cache=cache)  # cached: settled
    segments = _segment_files(part)
    bases = list(segments)
    for f in segments[bases[1]]:  # the segment after the oldest goes behind our back
        f.unlink()
    os.utime(part, ns=(old, old))
    stale = scan([str(log_dir)], RULE, use_log_start=False, cache=cache)
    assert cache.hits >= 1
    chosen, _ = _plan(stale, SegmentFileReader(None))
    first = chosen[0]
    assert (first.base_offset, first.next_offset) == (bases[0], bases[1])  # stale
    state = tmp_path / "state"
    state.mkdir()
    audit = AuditLog(state / "audit.jsonl")
    results = FileExecutor(state, audit).execute([first], {first.mount: 99.0})
    assert len(results) == 1 and not results[0].ok and results[0].refused
    assert "next offset" in (results[0].error or "")
    assert all(f.exists() for f in segments[bases[0]])  # nothing deleted


@settings(max_examples=25, deadline=None)
@given(_TREE, _CHANGES)
# A closed segment written again in place, and a partition made again with the same inodes:
# rare draws, always tried.
@example([[_T0] * 3], [("truncate", 0)])
@example([[_T0] * 4], [("truncate", 1)])
@example([[_T0] * 3], [("recreate", 0)])
def test_a_full_scan_reusing_closed_segments_stats_is_a_fresh_full_scan(
    tree: list[list[int]], changes: list[tuple[str, int]]
) -> None:
    """A dir that changed moments ago is listed again in full (snapshots, ``max_bytes``),
    reusing the stats of its closed segments' files that kept their name and inode: the
    bytes, files and partitions are those of a full scan with no cache, whatever changed,
    including a roll that closes the segment that was active (its indexes trimmed)."""
    root = Path(tempfile.mkdtemp(prefix="dg-fullreuse-"))
    try:
        log_dir = root / "logs"
        for p, times in enumerate(tree):
            write_partition(log_dir, "orders", p, [_spec(t) for t in times])
        cache = ListingCache()
        for kind, which in [("none", 0), *changes, ("trim_active", 0), ("roll", 0)]:
            if kind == "trim_active":
                for part in sorted(p for p in log_dir.iterdir() if p.is_dir()):
                    segments = _segment_files(part)
                    if segments:  # the active segment's indexes grow, as a broker's do
                        for f in segments[max(segments)]:
                            with open(f, "ab") as fh:
                                fh.write(b"\0" * 8192)
            else:
                _change(log_dir, kind, which)
            daemon = scan([str(log_dir)], RULE, full=True, use_log_start=False, cache=cache)
            fresh = scan([str(log_dir)], RULE, full=True, use_log_start=False)
            fresh = _with_usage_of(daemon, fresh)
            assert daemon.filesystems == fresh.filesystems
            assert daemon.topics_by_mount == fresh.topics_by_mount
        live = [p for p in log_dir.iterdir() if p.is_dir() and not p.name.endswith("-delete")]
        assert cache._closed or not live  # changed dirs were listed reusing what they kept
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_closed_segment_truncated_and_closed_again_is_stat_ed_afresh(tmp_path: Path) -> None:
    """Stats of closed segments' files are reused while the segment then active is the same
    file; after a truncation below it (that segment renamed for deletion, a closed one
    written again in place and closed by the next roll: the same name and inode) every
    file is stat'ed again, and the log dir's bytes are a fresh full scan's."""
    log_dir = tmp_path / "logs"
    write_partition(log_dir, "orders", 0, [_spec(DEFAULT_FIRST_TIMESTAMP_MS)] * 3)
    part = log_dir / "orders-0"
    path = str(part)
    cache = ListingCache()

    def kafka_bytes(with_cache: ListingCache | None) -> int | None:
        found = scan([str(log_dir)], RULE, full=True, use_log_start=False, cache=with_cache)
        return found.filesystems[0].log_dirs[0].kafka_bytes

    kafka_bytes(cache)
    oldest = f"{min(_segment_files(part)):020d}.log"
    kept = cache._closed[path].files[oldest][1]
    _change(log_dir, "roll", 0)
    assert kafka_bytes(cache) == kafka_bytes(None)
    assert cache._closed[path].files[oldest][1] is kept  # reused, not stat'ed again
    _change(log_dir, "truncate", 0)
    assert kafka_bytes(cache) == kafka_bytes(None)
    assert cache._closed[path].files[oldest][1] is not kept
