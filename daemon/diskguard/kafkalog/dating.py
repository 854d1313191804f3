"""Dating segments: a closed segment's largest record timestamp (edge: reads index and log tails).

KIP-61 deletes the globally oldest segments first, and "oldest" is Kafka's own
``LogSegment.largestTimestamp``: read here from the ``.timeindex`` tail and, where that is
not enough, the ``.log`` tail (``SegmentFileReader``), cached across cycles (``AgeCache``).

Size: over 400 lines on purpose: the general read and its short way for a cleanly rolled
segment (``_cleanly_rolled``) must give the same answer; apart, each would have to be read
beside the other.
"""

from __future__ import annotations

import bisect
import os
import stat
from collections.abc import Callable

from diskguard.host import freespace, safeopen
from diskguard.kafkalog import offsetindex, recordbatch, timeindex
from diskguard.kafkalog.listing import InodeTally
from diskguard.kafkalog.model import (
    SEGMENT_FILE_SUFFIXES,
    Partition,
    SegmentInfo,
    segment_file_name,
    segment_info,
)

_Key = tuple[tuple[str, int, int, int], ...]
#: A cached age: (largest timestamp, its source, the warnings dating it gave).
_Age = tuple[int, str, tuple[str, ...]]
#: What one read gave, and the warnings it gave, by (partition dir, base offset): the memory of
#: one command, not of a daemon (``SegmentFileReader.dated``).
Dated = dict[tuple[str, int], tuple[SegmentInfo, tuple[str, ...]]]
#: A segment's files when its partition dir has no ``.txnindex`` at all (the common case).
_NO_TXN_SUFFIXES = tuple(s for s in SEGMENT_FILE_SUFFIXES if s != ".txnindex")
_TIMEINDEX = ".timeindex"


class AgeCache:
    """Segment ages from earlier cycles, keyed by the identity of the segment's files.

    A closed segment's files do not change, so while every file has the same inode, size and
    mtime its age is the one computed before: the daemon's cycles then read no index at all
    for partition heads they have already dated. An entry keeps the warnings its dating gave
    (an index read past, an mtime fallback): a read answered from the cache says them again,
    so what a plan warns of does not depend on which heads an earlier walk dated. ``prune``
    drops entries no plan used, or, given the segments that still exist, only those of
    segments gone.
    """

    def __init__(self) -> None:
        self._entries: dict[_Key, _Age] = {}
        self._used: set[_Key] = set()
        #: (partition dir, base offset) of every entry: what ``warm_heads`` has dated.
        self._segments: dict[tuple[str, int], _Key] = {}

    def get(self, key: _Key) -> _Age | None:
        value = self._entries.get(key)
        if value is not None:
            self._used.add(key)
        return value

    def put(self, key: _Key, value: _Age, segment: tuple[str, int]) -> None:
        """``segment``: the (partition dir, base offset) whose files ``key`` identifies."""
        self._entries[key] = value
        self._used.add(key)
        self._segments[segment] = key

    def has_segment(self, partition_dir: str, base_offset: int) -> bool:
        return (partition_dir, base_offset) in self._segments

    def prune(self, live: Callable[[str, int], bool] | None = None) -> None:
        """Drop what the last plan did not use; with ``live(partition_dir, base_offset)``,
        keep unused entries of segments that still exist (the daemon's warmed heads)."""
        used = self._used
        kept = {
            s: k
            for s, k in self._segments.items()
            if k in used or (live is not None and live(s[0], s[1]))
        }
        # Nothing to drop (the idle daemon's every cycle): keep both dicts as they are.
        if len(kept) != len(self._segments) or len(self._entries) != len(kept):
            keep = used | set(kept.values())
            self._entries = {k: v for k, v in self._entries.items() if k in keep}
            self._segments = {s: k for s, k in kept.items() if k in self._entries}
        self._used = set()


#: st_dev -> can files on that filesystem share extents (``freespace.can_share_extents``)?
_SHARES_EXTENTS: dict[int, bool] = {}


def _can_share(path: str, dev: int) -> bool:
    found = _SHARES_EXTENTS.get(dev)
    if found is None:
        found = _SHARES_EXTENTS[dev] = freespace.can_share_extents(path)
    return found


def _shared_extent_bytes(path: str, ti: tuple[int, os.stat_result] | None) -> int:
    """Bytes of the segment file ``path`` in extents another file shares (0 if it cannot be
    read: then nothing is known, as on a filesystem without FIEMAP). ``ti``: the
    ``.timeindex`` already open, whose descriptor serves when ``path`` is that file."""
    if ti is not None and path.endswith(_TIMEINDEX):
        try:
            return freespace.shared_bytes(ti[0])
        except OSError:
            return 0
    try:
        fd = safeopen.open_regular(path)
    except OSError:
        return 0
    try:
        return freespace.shared_bytes(fd)
    except OSError:
        return 0
    finally:
        os.close(fd)


class SegmentFileReader:
    """The planner's ``SegmentReader`` over real files; collects warnings as it goes.

    The age key mirrors Kafka's ``LogSegment.largestTimestamp``: the max timestamp the segment
    holds (last ``.timeindex`` entry, or the last batch of the ``.log`` when the index is empty
    or unreadable), falling back to the ``.log`` mtime only when no record carries a timestamp.
    """

    def __init__(self, ages: AgeCache | None = None, dated: Dated | None = None) -> None:
        self.warnings: list[str] = []
        self.reads = 0
        self.ages = ages
        #: What earlier reads of this command gave, by (partition dir, base offset): a
        #: one-shot plan that walks twice (broker mode) reads no file again in its second walk.
        self.dated = dated

    def __call__(self, partition: Partition, base_offset: int) -> SegmentInfo:
        dated = self.dated
        if dated is None:
            return self._dated(partition, base_offset)
        known = dated.get((partition.path, base_offset))
        if known is not None:
            self.reads += 1
            info, said = known
            self.warnings.extend(said)
            return info
        before = len(self.warnings)
        info = self._dated(partition, base_offset)
        dated[(partition.path, base_offset)] = (info, tuple(self.warnings[before:]))
        return info

    def _dated(self, partition: Partition, base_offset: int) -> SegmentInfo:
        self.reads += 1
        # os.path.join's result: a partition dir's path never ends in "/". Formatted here,
        # not joined: this runs for every head a plan pops.
        stem = f"{partition.path}/{base_offset:020d}"
        ages = self.ages
        ti = None
        if ages is None or not ages.has_segment(partition.path, base_offset):
            # To be dated (not in the age cache): open the .timeindex now and let its fstat
            # stand in for the lstat the segment's identity needs; read it through that
            # descriptor below. If it cannot be opened (missing, not regular, ...), it is
            # lstat'ed like the others, and reading it the usual way says why.
            try:  # noqa: SIM105 - not contextlib.suppress: ~1 µs a head, 10,000 heads a plan
                ti = safeopen.open_regular_stat(stem + _TIMEINDEX)
            except OSError:
                pass
        try:
            if ti is not None and ages is None:
                info = _cleanly_rolled(partition, base_offset, stem, ti)
                if info is not None:
                    return info
            return self._read(partition, base_offset, stem, ti)
        finally:
            if ti is not None:
                os.close(ti[0])

    def _read(
        self,
        partition: Partition,
        base_offset: int,
        stem: str,
        ti: tuple[int, os.stat_result] | None,
    ) -> SegmentInfo:
        """``__call__``'s work; ``ti``: the ``.timeindex`` open as ``(fd, fstat)``, if it is."""
        files: list[str] = []
        stats: list[os.stat_result] = []
        blocks = 0
        linked = False
        log_mtime_ms = 0
        for sfx in SEGMENT_FILE_SUFFIXES if partition.txn_indexes else _NO_TXN_SUFFIXES:
            path = stem + sfx
            if ti is not None and sfx == _TIMEINDEX:
                st = ti[1]
            else:
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
            files.append(path)
            stats.append(st)
            blocks += st.st_blocks
            if st.st_nlink > 1:
                linked = True
            if sfx == ".log":
                log_mtime_ms = st.st_mtime_ns // 1_000_000
        shared: tuple[str, ...] = ()
        freeable = blocks * 512  # allocated_bytes of each file: no other links
        extent_shared: list[str] = []
        extent_held = 0
        if stats and _can_share(partition.path, stats[0].st_dev):
            # A snapshot or a reflinked copy holds these extents: unlinking frees none of
            # them, and st_blocks does not say so (FIEMAP does). Asked on every read, not
            # cached with the age: a snapshot can be taken without touching the files. A
            # hard-linked file frees nothing anyway (below).
            for path, st in zip(files, stats, strict=True):
                if st.st_blocks and st.st_nlink == 1 and (held := _shared_extent_bytes(path, ti)):
                    extent_shared.append(path)
                    extent_held += min(held, st.st_blocks * 512)
        if linked:
            tally = InodeTally()
            for st in stats:
                tally.add(st)
            outside = tally.shared()
            shared = tuple(
                path
                for path, st in zip(files, stats, strict=True)
                if (st.st_dev, st.st_ino) in outside
            )
            freeable = tally.freeable
        if shared:
            self.warnings.append(
                f"{partition.path}/{base_offset:020d}: "
                f"{', '.join(os.path.basename(p) for p in shared)} hard-linked elsewhere too "
                "(st_nlink > 1; a backup?): deleting the segment would lose its records and "
                f"free none of those bytes, so it is kept and {partition.topic}-"
                f"{partition.partition} is not trimmed past it this cycle"
            )
        if extent_shared:
            self.warnings.append(
                f"{partition.path}/{base_offset:020d}: "
                f"{', '.join(os.path.basename(p) for p in extent_shared)}: extents shared "
                "with another file (a snapshot of the subvolume or a reflinked copy; FIEMAP): "
                "deleting the segment would lose its records and free none of those bytes, so "
                f"it is kept and {partition.topic}-{partition.partition} is not trimmed past "
                "it this cycle"
            )
            freeable = max(0, freeable - extent_held)
            shared = (*shared, *extent_shared)
        ages = self.ages
        key: _Key = ()
        cached = None
        if ages is not None:
            key = tuple(
                (path, st.st_ino, st.st_size, st.st_mtime_ns)
                for path, st in zip(files, stats, strict=True)
            )
            cached = ages.get(key)
        if cached is not None:
            ts, source, said = cached
            if said:
                self.warnings.extend(said)
        else:
            before = len(self.warnings)
            found, source = self._max_timestamp(
                partition.path, base_offset, _next_base(partition, base_offset), ti
            )
            ts = log_mtime_ms if found is None else found
            if found is None:
                source = "mtime"
            if ages is not None:
                said = tuple(self.warnings[before:])
                ages.put(key, (ts, source, said), (partition.path, base_offset))
        return SegmentInfo(
            bytes=freeable,
            max_timestamp_ms=ts,
            timestamp_source=source,
            files=tuple(files),
            shared_files=shared,
            shared_extent_files=tuple(extent_shared),
        )

    def _max_timestamp(
        self,
        partition_dir: str,
        base: int,
        next_offset: int | None = None,
        ti: tuple[int, os.stat_result] | None = None,
    ) -> tuple[int | None, str]:
        """The segment's largest record timestamp, exactly, from as few bytes as possible.

        The ``.timeindex`` covers the log up to its last entry; the batches after the last
        ``.index`` position cover the rest (a segment that was active when the broker died has
        no final time-index entry). The max of both is the segment's largest timestamp.
        A segment Kafka rolled cleanly needs only the ``.timeindex``: its index is trimmed to
        its entries and the last entry is the max timestamp at the segment's *last* offset
        (``next_offset - 1``), so no batch after it exists to hold a larger one. Anything else
        (a preallocated index, a last entry short of the last offset, ``next_offset``
        unknown) reads the ``.log`` tail as well. Only regular files are opened: a FIFO named
        like an index would block forever. ``ti``: the ``.timeindex`` already open as ``(fd,
        fstat)`` (``__call__`` took the segment's identity from that ``fstat``).
        """
        if ti is not None and next_offset is not None:
            # A cleanly rolled segment (nearly all): its last entry, without the records.
            clean = timeindex.clean_last(ti[0], ti[1].st_size)
            if clean is not None and base + clean[1] == next_offset - 1:
                return clean[0], "timeindex"
        stem = os.path.join(partition_dir, segment_file_name(base, ""))
        ti_path, log_path, idx_path = stem + _TIMEINDEX, stem + ".log", stem + ".index"
        problem = ""
        ti_ts: int | None = None
        try:
            if ti is not None:
                tail = timeindex.tail_of(ti[0], ti[1].st_size, ti_path)
            else:
                tail = timeindex.read_tail(ti_path)
            if tail.file_size % timeindex.ENTRY_SIZE:
                problem = "size is not a whole number of entries (truncated)"
            elif tail.entry is not None and tail.entry.timestamp_ms >= 0:
                ti_ts = tail.entry.timestamp_ms
                if (
                    next_offset is not None
                    and tail.trimmed
                    and base + tail.entry.relative_offset == next_offset - 1
                ):
                    return ti_ts, "timeindex"
            else:
                problem = "empty"
        except (FileNotFoundError, safeopen.NotRegularFile):
            problem = "missing or not a regular file"
        except (ValueError, OSError) as exc:
            problem = str(exc)
        start = 0
        if ti_ts is not None and _is_regular(idx_path):
            try:
                last = offsetindex.last_entry(idx_path)
                start = last.position if last is not None else 0
            except (ValueError, OSError):
                start = 0
        log_ts: int | None = None
        log_problem = "missing or not a regular file"
        if _is_regular(log_path):
            log_problem = ""
            for position in dict.fromkeys((start, 0)):
                # A start from the index may land inside a batch: then walk the whole log.
                try:
                    log_ts = _max_batch_timestamp(log_path, position)
                    log_problem = ""
                    break
                except (ValueError, OSError) as exc:
                    log_problem = str(exc)
        if log_problem and ti_ts is None:
            self.warnings.append(
                f"{log_path}: no usable timestamp (timeindex {problem}; log: {log_problem}); "
                "using mtime"
            )
            return None, "mtime"
        if ti_ts is not None:
            return max(ti_ts, log_ts if log_ts is not None else ti_ts), "timeindex"
        if log_ts is not None:
            if problem not in ("empty", "missing or not a regular file"):
                self.warnings.append(f"{ti_path}: {problem}; max timestamp read from the .log")
            return log_ts, "log"
        self.warnings.append(f"{ti_path}: {problem} and no record timestamps; using .log mtime")
        return None, "mtime"


def _cleanly_rolled(
    partition: Partition, base_offset: int, stem: str, ti: tuple[int, os.stat_result]
) -> SegmentInfo | None:
    """``_read``'s answer for the segment nearly every head is, in fewer steps; None for
    anything else (``_read`` then reads it the general way, with the same system calls).

    That segment: its files regular, each with one link, on a filesystem whose files cannot
    share extents, its ``.timeindex`` (open as ``ti``) trimmed to entries whose last is the
    segment's last offset (``timeindex.clean_last``). Its ``SegmentInfo`` is then all its
    files' blocks, dated by that entry: what ``_read`` gives, without its general loop and
    warning checks (a one-shot plan dates ~11,000 heads; no age cache: ``ages`` None).
    """
    fd, ti_st = ti
    log_path = stem + ".log"
    index_path = stem + ".index"
    try:
        log_st = os.lstat(log_path)
        index_st = os.lstat(index_path)
    except FileNotFoundError:
        return None
    if not (stat.S_ISREG(log_st.st_mode) and stat.S_ISREG(index_st.st_mode)):
        return None
    if log_st.st_nlink > 1 or index_st.st_nlink > 1 or ti_st.st_nlink > 1:
        return None
    blocks = log_st.st_blocks + index_st.st_blocks + ti_st.st_blocks
    files: tuple[str, ...] = (log_path, index_path, stem + _TIMEINDEX)
    if partition.txn_indexes:
        txn_path = stem + ".txnindex"
        try:
            txn_st = os.lstat(txn_path)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISREG(txn_st.st_mode) or txn_st.st_nlink > 1:
                return None
            blocks += txn_st.st_blocks
            files = (*files, txn_path)
    if _can_share(partition.path, log_st.st_dev):
        return None
    next_offset = _next_base(partition, base_offset)
    if next_offset is None:
        return None
    clean = timeindex.clean_last(fd, ti_st.st_size)
    if clean is None or base_offset + clean[1] != next_offset - 1:
        return None
    return segment_info(blocks * 512, clean[0], "timeindex", files)


def _next_base(partition: Partition, base_offset: int) -> int | None:
    """The base offset of the segment after ``base_offset`` (its ``next_offset``), if any."""
    bases = partition.base_offsets
    i = bisect.bisect_right(bases, base_offset)
    return bases[i] if i < len(bases) and i > 0 and bases[i - 1] == base_offset else None


def _is_regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _max_batch_timestamp(log_path: str, start: int) -> int | None:
    """Largest ``maxTimestamp`` of the batches from ``start`` (None: no timestamps there)."""
    best: int | None = None
    for batch in recordbatch.iter_batches(log_path, start):
        if batch.max_timestamp >= 0 and (best is None or batch.max_timestamp > best):
            best = batch.max_timestamp
    return best
