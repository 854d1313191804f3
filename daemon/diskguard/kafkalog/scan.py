"""Scanning real log dirs into the model (edge: all the disk reads live here).

Cheap by design: listing names (``getdents``) is all a plan needs for most files; only the
heads the planner pops are stat'ed and have their ``.timeindex`` read (``SegmentFileReader``).
A *full* scan (snapshots, ``max_bytes``) stats every file, still without reading contents.

Safety rules from Kafka's own ``LogManager``: never follow a symlink out of a log dir, skip
``-delete``/``-future``/``-stray`` dirs (their bytes are pending reclaim or other), tolerate
files vanishing mid-scan (the broker deletes and rolls while we look).
"""

from __future__ import annotations

import bisect
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from diskguard.host import fsusage, safeopen
from diskguard.kafkalog import offsetindex, recordbatch, timeindex
from diskguard.kafkalog.model import (
    DELETED_SUFFIX,
    SEGMENT_FILE_SUFFIXES,
    Filesystem,
    FilesystemUsage,
    LogDir,
    Partition,
    PartitionDirKind,
    SegmentInfo,
    parse_partition_dir,
    parse_segment_file,
    segment_file_name,
)
from diskguard.kafkalog.topicpolicy import ProtectionRule

LOG_START_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
#: An entry a broker with tiered storage keeps in the partition dir (remote log metadata).
REMOTE_LOG_SNAPSHOT = "remote_log_snapshot"


@dataclass(frozen=True)
class TopicUsage:
    partitions: int
    bytes: int


@dataclass(frozen=True)
class ScanResult:
    """Filesystems with their log dirs, plus what a full scan measured."""

    filesystems: tuple[Filesystem, ...]
    #: topic -> usage, per mount; only filled by a full scan.
    topics_by_mount: Mapping[str, Mapping[str, TopicUsage]] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


def allocated_bytes(st: os.stat_result) -> int:
    """Bytes a file really occupies: sparse preallocated indexes count only written blocks."""
    return st.st_blocks * 512


@dataclass(frozen=True)
class _Linked:
    """A file with more than one hard link: its bytes depend on which names are counted."""

    name: str
    dev: int
    ino: int
    nlink: int
    bytes: int
    deleted: bool = False

    @classmethod
    def of(cls, name: str, st: os.stat_result, deleted: bool = False) -> _Linked:
        return cls(name, st.st_dev, st.st_ino, st.st_nlink, allocated_bytes(st), deleted)


class InodeTally:
    """Bytes of a set of file names, per inode (``st_nlink``), not per name.

    ``allocated``: the blocks the names occupy, each inode once however many of its names are
    in the set (what ``du`` shows). ``freeable``: what unlinking every name in the set would
    free: an inode frees its blocks only when all its links are in the set, so a file also
    linked from outside (a backup tool's hard link) frees nothing. Files with a single link,
    which is every file of a normal Kafka log dir, are just summed.
    """

    def __init__(self) -> None:
        self.single = 0
        #: (dev, ino) -> [st_nlink, bytes, names seen]
        self._linked: dict[tuple[int, int], list[int]] = {}

    def add(self, st: os.stat_result) -> int:
        """Count one name; returns the bytes it adds to ``allocated`` (0 for a known inode)."""
        if st.st_nlink <= 1:
            size = allocated_bytes(st)
            self.single += size
            return size
        return self.add_linked(_Linked.of("", st))

    def add_linked(self, linked: _Linked) -> int:
        entry = self._linked.get((linked.dev, linked.ino))
        if entry is None:
            self._linked[(linked.dev, linked.ino)] = [linked.nlink, linked.bytes, 1]
            return linked.bytes
        entry[2] += 1
        return 0

    @property
    def allocated(self) -> int:
        return self.single + sum(size for _n, size, _seen in self._linked.values())

    @property
    def freeable(self) -> int:
        return self.single + sum(size for n, size, seen in self._linked.values() if seen >= n)

    def shared(self) -> set[tuple[int, int]]:
        """Inodes with links outside the set: unlinking the set's names frees none of them."""
        return {key for key, (n, _size, seen) in self._linked.items() if seen < n}


def read_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """Kafka's ``OffsetCheckpointFile``: version 0, a count, then ``topic partition offset``.

    A missing or empty file is normal (a broker creates ``cleaner-offset-checkpoint`` empty at
    start-up and leaves it so until the first compaction); a malformed one raises ValueError
    naming it, and one that is not a regular file (a FIFO would block the reader forever) an
    OSError naming it.
    """
    try:
        text = safeopen.read_text(path)
    except FileNotFoundError:
        return {}
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    if not text:
        return {}
    lines = text.splitlines()
    if len(lines) < 2 or lines[0].strip() != "0" or not lines[1].strip().isdigit():
        raise ValueError(f"{path}: malformed checkpoint header")
    count = int(lines[1])
    out: dict[tuple[str, int], int] = {}
    for line in lines[2 : 2 + count]:
        parts = line.split()
        if len(parts) != 3 or not parts[1].isdigit() or not re.fullmatch(r"-?\d+", parts[2]):
            raise ValueError(f"{path}: malformed checkpoint line {line!r}")
        out[(parts[0], int(parts[1]))] = int(parts[2])
    if len(out) != count:
        raise ValueError(f"{path}: checkpoint says {count} entries, has {len(out)}")
    return out


def _tree_stats(path: str) -> list[os.stat_result]:
    """``lstat`` of every regular file under ``path``, symlinks not followed; vanishing files
    are fine."""
    out: list[os.stat_result] = []
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        out.extend(_tree_stats(entry.path))
                    elif entry.is_file(follow_symlinks=False):
                        out.append(entry.stat(follow_symlinks=False))
                except FileNotFoundError:
                    continue
    except (FileNotFoundError, NotADirectoryError):
        return []
    return out


@dataclass(frozen=True)
class _PartitionListing:
    bases: frozenset[int]
    #: Allocated bytes of single-link ``*.deleted`` files.
    deleted_bytes: int
    #: Allocated bytes of every single-link file but the active segment's (full listings only).
    settled_bytes: int
    #: The active segment's files: they grow without the directory changing, so their size
    #: is always read afresh.
    active_files: tuple[str, ...]
    full: bool
    #: Files with other hard links (``*.deleted`` ones always, others in full listings): they
    #: count per inode across the whole log dir, see ``InodeTally``.
    linked: tuple[_Linked, ...] = ()
    #: A ``remote_log_snapshot`` entry (any kind) is in the dir: tiered storage.
    remote_log_state: bool = False

    @property
    def has_deleted(self) -> bool:
        return self.deleted_bytes > 0 or any(f.deleted for f in self.linked)


def _list_partition(path: str, full: bool) -> _PartitionListing:
    bases: set[int] = set()
    deleted = 0
    linked: list[_Linked] = []
    stats: dict[str, os.stat_result] = {}
    remote = False
    with os.scandir(path) as entries:
        for entry in entries:
            name = entry.name
            if name == REMOTE_LOG_SNAPSHOT:
                remote = True
            try:
                if name.endswith(DELETED_SUFFIX):
                    if entry.is_file(follow_symlinks=False):
                        st = entry.stat(follow_symlinks=False)
                        if st.st_nlink > 1:
                            linked.append(_Linked.of(name, st, deleted=True))
                        else:
                            deleted += allocated_bytes(st)
                    continue
                if name.endswith(".log"):
                    parsed = parse_segment_file(name)
                    # A symlink or dir named like a segment is never ours.
                    if parsed is not None and entry.is_file(follow_symlinks=False):
                        bases.add(parsed[0])
                if full and entry.is_file(follow_symlinks=False):
                    stats[name] = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
    active = max(bases) if bases else None
    active_files = (
        tuple(
            n
            for n in stats
            if parse_segment_file(n) is not None and n.startswith(f"{active:020d}.")
        )
        if active is not None
        else ()
    )
    settled = 0
    for name, st in stats.items():
        if name in active_files:
            continue
        if st.st_nlink > 1:
            linked.append(_Linked.of(name, st))
        else:
            settled += allocated_bytes(st)
    return _PartitionListing(
        frozenset(bases), deleted, settled, active_files, full, tuple(linked), remote
    )


class ListingCache:
    """Partition listings reused while their directory is unchanged.

    A directory's mtime changes whenever a file in it is created, renamed or removed — every
    segment roll, deletion and ``.deleted`` rename — but not when the active segment grows.
    So an unchanged ``(inode, mtime)`` means the same segments; only the active segment's
    files are stat'ed again. A directory changed within the last ``settle_s`` seconds is not
    cached, as a change in the same clock tick could go unseen. This is what keeps the idle
    daemon's periodic rescan of a large log dir to one ``stat`` per partition.
    A hard link made from elsewhere to a cached file does not touch this directory, so the link
    counts kept here can lag until it changes: that only delays reported Kafka bytes, since
    the planner re-stats every segment it considers (``SegmentFileReader``).
    """

    def __init__(self, settle_s: float = 2.0) -> None:
        self.settle_s = settle_s
        self._entries: dict[str, tuple[tuple[int, int], _PartitionListing]] = {}
        self._touched: set[str] = set()
        self.hits = 0
        self.misses = 0

    def listing(self, path: str, full: bool) -> _PartitionListing:
        self._touched.add(path)
        st = os.stat(path, follow_symlinks=False)
        key = (st.st_ino, st.st_mtime_ns)
        cached = self._entries.get(path)
        if cached is not None and cached[0] == key and (cached[1].full or not full):
            self.hits += 1
            return cached[1]
        self.misses += 1
        listing = _list_partition(path, full)
        if time.time() - st.st_mtime_ns / 1e9 > self.settle_s:
            self._entries[path] = (key, listing)
        else:
            self._entries.pop(path, None)
        return listing

    def prune(self) -> None:
        """Drop entries not asked for since the last prune (deleted partitions)."""
        for path in [p for p in self._entries if p not in self._touched]:
            del self._entries[path]
        self._touched.clear()


def _active_stats(path: str, listing: _PartitionListing) -> list[os.stat_result]:
    out = []
    for name in listing.active_files:
        try:
            out.append(os.lstat(os.path.join(path, name)))
        except FileNotFoundError:
            continue
    return out


def as_rule(protect: ProtectionRule | Sequence[re.Pattern[str] | str]) -> ProtectionRule:
    """Callers that still pass ``protect_topics`` regexes get a rule with no known policies:
    every non-internal topic is then protected as "cleanup.policy unknown"."""
    if isinstance(protect, ProtectionRule):
        return protect
    return ProtectionRule(
        protect_topics=tuple(p if isinstance(p, str) else p.pattern for p in protect)
    )


def compacted_topics(log_dirs: Iterable[str]) -> tuple[frozenset[str], list[str]]:
    """Topics any log dir's ``cleaner-offset-checkpoint`` lists, plus warnings.

    A partition's topic may be cleaned in another log dir (JBOD): the cleaner only lists the
    partitions it holds, but the policy is the topic's, so every dir's checkpoint counts.
    """
    topics: set[str] = set()
    warnings: list[str] = []
    for log_dir in log_dirs:
        try:
            topics.update(tp[0] for tp in read_checkpoint(Path(log_dir) / CLEANER_CHECKPOINT))
        except (ValueError, OSError) as exc:
            warnings.append(f"{exc}; compacted topics unknown from the cleaner checkpoint")
    return frozenset(topics), warnings


def scan_log_dir(
    log_dir: str,
    mount: str,
    protect: ProtectionRule | Sequence[re.Pattern[str] | str],
    full: bool = False,
    topics: dict[str, list[int]] | None = None,
    requested_log_start: Mapping[tuple[str, int], int] | None = None,
    use_log_start: bool = True,
    on_partition: Callable[[float], None] | None = None,
    cache: ListingCache | None = None,
    own_checkpoint: bool = True,
) -> LogDir:
    """One log dir: its live partitions, pending reclaim and (if ``full``) its Kafka bytes.

    ``protect`` decides each partition's protection (``topicpolicy``); with
    ``own_checkpoint`` this dir's ``cleaner-offset-checkpoint`` is added to it (``scan``
    reads every dir's checkpoint up front and passes False).

    ``topics`` (optional, out-parameter) receives ``topic -> [partitions, bytes]`` sums.
    ``requested_log_start`` holds log start offsets diskguard asked the broker for
    (DeleteRecords) that the broker may not have checkpointed yet: segments below them are
    pending reclaim too, or the next cycle would delete the same bytes again.
    """
    warnings: list[str] = []
    root = Path(log_dir)
    try:
        log_start = read_checkpoint(root / LOG_START_CHECKPOINT) if use_log_start else {}
    except (ValueError, OSError) as exc:
        warnings.append(f"{exc}; log start offsets unknown, no segment counted as reclaiming")
        log_start = {}
    rule = as_rule(protect)
    if own_checkpoint:
        compacted, checkpoint_warnings = compacted_topics([log_dir])
        warnings.extend(checkpoint_warnings)
        rule = rule.with_compacted(compacted)

    partitions: list[Partition] = []
    # Per inode, not per name: a file also linked from outside frees nothing when deleted,
    # and two names of one inode occupy its blocks once (see InodeTally).
    pending = InodeTally()
    kafka = InodeTally()
    try:
        entries = sorted(os.scandir(log_dir), key=lambda e: e.name)
    except OSError as exc:
        return LogDir(
            path=log_dir,
            mount=mount,
            partitions=(),
            warnings=(f"{log_dir}: cannot list log dir: {exc.strerror or exc}",),
            error=exc.strerror or str(exc),
        )
    top_files: list[os.stat_result] = []
    for entry in entries:
        try:
            if entry.is_symlink():
                warnings.append(f"{entry.path}: symlink in log dir, not followed")
                continue
            if not entry.is_dir(follow_symlinks=False):
                if full and entry.is_file(follow_symlinks=False):
                    top_files.append(entry.stat(follow_symlinks=False))
                continue
        except FileNotFoundError:
            continue
        name = parse_partition_dir(entry.name)
        if name is None:
            continue
        if on_partition is not None:
            on_partition(1)
        if name.kind is PartitionDirKind.DELETE:
            # A broker removes these after file.delete.delay.ms; with no broker running
            # (offline, use_log_start=False) nobody will, so they are not "on their way out".
            for st in _tree_stats(entry.path):
                if use_log_start:
                    pending.add(st)
                kafka.add(st)
            continue
        if name.kind is not PartitionDirKind.LIVE:
            if full:
                for st in _tree_stats(entry.path):
                    kafka.add(st)
            continue
        try:
            listing = (
                cache.listing(entry.path, full) if cache else _list_partition(entry.path, full)
            )
            active = _active_stats(entry.path, listing) if full else []
        except FileNotFoundError:
            continue  # partition deleted while we looked
        except OSError as exc:
            warnings.append(f"{entry.path}: cannot list partition: {exc.strerror or exc}; skipped")
            continue
        reason = rule.reason(name.topic, listing.remote_log_state)
        part = Partition(
            log_dir=log_dir,
            topic=name.topic,
            partition=name.partition,
            path=entry.path,
            base_offsets=tuple(sorted(listing.bases)),
            log_start_offset=_max_known(
                log_start.get((name.topic, name.partition)),
                (requested_log_start or {}).get((name.topic, name.partition)),
            ),
            protected=reason is not None,
            protected_reason=reason,
            remote_log_state=listing.remote_log_state,
        )
        if use_log_start:
            # A running broker removes ``*.deleted`` files after its delete delay. Offline
            # nobody will: the sweep has already removed those diskguard may remove, and what
            # is left (names that are not segment files) stays — counting it as "on its way
            # out" would leave the disk over its limit by exactly that much.
            pending.single += listing.deleted_bytes
            for linked in listing.linked:
                if linked.deleted:
                    pending.add_linked(linked)
        for base in part.reclaiming:
            for st in _segment_stats(part.path, base):
                pending.add(st)
        # Bytes this partition adds to the log dir's (inodes seen before count there once).
        part_bytes = listing.settled_bytes + listing.deleted_bytes
        kafka.single += part_bytes
        part_bytes += sum(kafka.add_linked(linked) for linked in listing.linked)
        part_bytes += sum(kafka.add(st) for st in active)
        if topics is not None:
            acc = topics.setdefault(name.topic, [0, 0])
            acc[0] += 1
            acc[1] += part_bytes
        partitions.append(part)
    for st in top_files:
        kafka.add(st)
    partitions.sort(key=lambda p: (p.topic, p.partition))
    return LogDir(
        path=log_dir,
        mount=mount,
        partitions=tuple(partitions),
        pending_reclaim_bytes=pending.freeable,
        kafka_bytes=kafka.allocated if full else None,
        warnings=tuple(warnings),
    )


def _max_known(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


def _segment_paths(partition_dir: str, base: int) -> list[str]:
    # One join for the stem, not one per file: this runs for every head a plan pops.
    stem = os.path.join(partition_dir, segment_file_name(base, ""))
    return [stem + sfx for sfx in SEGMENT_FILE_SUFFIXES]


def _segment_stats(partition_dir: str, base: int) -> list[os.stat_result]:
    """``lstat`` of the segment's regular files (vanished ones skipped)."""
    out = []
    for path in _segment_paths(partition_dir, base):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            out.append(st)
    return out


class AgeCache:
    """Segment ages from earlier cycles, keyed by the identity of the segment's files.

    A closed segment's files do not change, so while every file has the same inode, size and
    mtime its age is the one computed before: the daemon's cycles then read no index at all
    for partition heads they have already dated. Entries not used by a plan are dropped.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[tuple[str, int, int, int], ...], tuple[int, str]] = {}
        self._used: set[tuple[tuple[str, int, int, int], ...]] = set()

    def get(self, key: tuple[tuple[str, int, int, int], ...]) -> tuple[int, str] | None:
        value = self._entries.get(key)
        if value is not None:
            self._used.add(key)
        return value

    def put(self, key: tuple[tuple[str, int, int, int], ...], value: tuple[int, str]) -> None:
        self._entries[key] = value
        self._used.add(key)

    def prune(self) -> None:
        self._entries = {k: v for k, v in self._entries.items() if k in self._used}
        self._used = set()


class SegmentFileReader:
    """The planner's ``SegmentReader`` over real files; collects warnings as it goes.

    The age key mirrors Kafka's ``LogSegment.largestTimestamp``: the max timestamp the segment
    holds (last ``.timeindex`` entry, or the last batch of the ``.log`` when the index is empty
    or unreadable), falling back to the ``.log`` mtime only when no record carries a timestamp.
    """

    def __init__(self, ages: AgeCache | None = None) -> None:
        self.warnings: list[str] = []
        self.reads = 0
        self.ages = ages

    def __call__(self, partition: Partition, base_offset: int) -> SegmentInfo:
        self.reads += 1
        files: list[str] = []
        tally = InodeTally()
        inodes: dict[str, tuple[int, int]] = {}
        log_mtime_ms = 0
        identity: list[tuple[str, int, int, int]] = []
        for path in _segment_paths(partition.path, base_offset):
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            files.append(path)
            tally.add(st)
            inodes[path] = (st.st_dev, st.st_ino)
            identity.append((path, st.st_ino, st.st_size, st.st_mtime_ns))
            if path.endswith(".log"):
                log_mtime_ms = st.st_mtime_ns // 1_000_000
        outside = tally.shared()
        shared = tuple(path for path in files if inodes[path] in outside)
        if shared:
            self.warnings.append(
                f"{partition.path}/{base_offset:020d}: "
                f"{', '.join(os.path.basename(p) for p in shared)} hard-linked elsewhere too "
                "(st_nlink > 1; a backup?): deleting the segment would lose its records and "
                f"free none of those bytes, so it is kept and {partition.topic}-"
                f"{partition.partition} is not trimmed past it this cycle"
            )
        key = tuple(identity)
        cached = self.ages.get(key) if self.ages is not None else None
        if cached is not None:
            ts, source = cached
        else:
            found, source = self._max_timestamp(
                partition.path, base_offset, _next_base(partition, base_offset)
            )
            ts = log_mtime_ms if found is None else found
            if found is None:
                source = "mtime"
            if self.ages is not None:
                self.ages.put(key, (ts, source))
        return SegmentInfo(
            bytes=tally.freeable,
            max_timestamp_ms=ts,
            timestamp_source=source,
            files=tuple(files),
            shared_files=shared,
        )

    def _max_timestamp(
        self, partition_dir: str, base: int, next_offset: int | None = None
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
        like an index would block forever.
        """
        stem = os.path.join(partition_dir, segment_file_name(base, ""))
        ti_path, log_path, idx_path = stem + ".timeindex", stem + ".log", stem + ".index"
        problem = ""
        ti_ts: int | None = None
        try:
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


def group_by_filesystem(log_dirs: Iterable[str]) -> dict[str, list[str]]:
    """Mount label -> log dirs on that *device* (several log dirs may share one filesystem,
    whatever mount point leads to each); see ``fsusage.group_by_device``."""
    out: dict[str, list[str]] = {}
    for group in fsusage.group_by_device(log_dirs):
        out.setdefault(group.mount, []).extend(group.paths)
    return out


def scan(
    log_dirs: Sequence[str | Path],
    protect_topics: ProtectionRule | Sequence[str],
    full: bool = False,
    requested_log_start: Mapping[str, Mapping[tuple[str, int], int]] | None = None,
    use_log_start: bool = True,
    on_partition: Callable[[float], None] | None = None,
    cache: ListingCache | None = None,
) -> ScanResult:
    """Scan every log dir and group them by filesystem with ``df``-exact usage.

    A filesystem is a *device* (``st_dev`` of the log dir), not a mount point: log dirs
    reached through a bind mount of the same device share one heap and one excess, labelled
    with the first mount point seen for it. The same directory named twice (two paths to one
    inode) is scanned once, or its segments would be planned twice.
    ``requested_log_start``: log dir -> (topic, partition) -> offset asked of the broker.
    ``protect_topics``: the protection rule (``enforcement.Planner`` builds it from the config
    and the known topic policies); plain regexes still work (no policy known).
    """
    compacted, warnings = compacted_topics(str(d) for d in log_dirs)
    rule = as_rule(protect_topics).with_compacted(compacted)
    filesystems: list[Filesystem] = []
    topics_by_mount: dict[str, dict[str, TopicUsage]] = {}
    paths = [str(raw) for raw in log_dirs]
    try:
        groups = fsusage.group_by_device(paths)
    except OSError as exc:
        why = exc.strerror or str(exc)
        unreadable = [f"{d}: log dir unreadable ({why}); skipped" for d in paths]
        return ScanResult((), {}, (*warnings, *unreadable))
    seen_dirs: dict[tuple[int, int], str] = {}
    for group in groups:
        usage: FilesystemUsage | None = None
        scanned_dirs: list[LogDir] = []
        for log_dir in group.paths:
            try:
                st = os.stat(log_dir)
                if usage is None:
                    usage = fsusage.usage_of(log_dir, group.mount, group.device)
            except OSError as exc:
                # A log dir that vanished or whose disk was unmounted: say so, guard the rest.
                warnings.append(f"{log_dir}: log dir unreadable ({exc.strerror or exc}); skipped")
                continue
            first = seen_dirs.setdefault((st.st_dev, st.st_ino), log_dir)
            if first != log_dir:
                warnings.append(
                    f"{log_dir}: the same directory as log dir {first} (another path to it); "
                    "scanned once"
                )
                continue
            topic_acc: dict[str, list[int]] = {}
            scanned = scan_log_dir(
                log_dir,
                group.mount,
                rule,
                full=full,
                topics=topic_acc if full else None,
                requested_log_start=(requested_log_start or {}).get(log_dir),
                use_log_start=use_log_start,
                on_partition=on_partition,
                cache=cache,
                own_checkpoint=False,
            )
            warnings.extend(scanned.warnings)
            scanned_dirs.append(scanned)
            if full:
                merged = topics_by_mount.setdefault(group.mount, {})
                for topic, (parts, size) in topic_acc.items():
                    prev = merged.get(topic, TopicUsage(0, 0))
                    merged[topic] = TopicUsage(prev.partitions + parts, prev.bytes + size)
        if usage is not None and scanned_dirs:
            filesystems.append(Filesystem(usage=usage, log_dirs=tuple(scanned_dirs)))
    if cache is not None:
        cache.prune()
    filesystems.sort(key=lambda fs: fs.usage.mount)
    return ScanResult(tuple(filesystems), topics_by_mount, tuple(warnings))
