"""Scanning real log dirs into the model (edge: all the disk reads live here).

Cheap by design: listing names (``getdents``) is all a plan needs for most files; only the
heads the planner pops are stat'ed and have their ``.timeindex`` read (``SegmentFileReader``).
A *full* scan (snapshots, ``max_bytes``) stats every file, still without reading contents.

Safety rules from Kafka's own ``LogManager``: never follow a symlink out of a log dir, skip
``-delete``/``-future``/``-stray`` dirs (their bytes are pending reclaim or other), tolerate
files vanishing mid-scan (the broker deletes and rolls while we look).
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from diskguard import fsusage, offsetindex, recordbatch, safeopen, timeindex
from diskguard.model import (
    DELETED_SUFFIX,
    SEGMENT_FILE_SUFFIXES,
    Filesystem,
    LogDir,
    Partition,
    PartitionDirKind,
    SegmentInfo,
    parse_partition_dir,
    parse_segment_file,
    segment_file_name,
)

LOG_START_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"


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


def read_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """Kafka's ``OffsetCheckpointFile``: version 0, a count, then ``topic partition offset``.

    A missing file is normal (new broker); a malformed one raises ValueError naming it, and
    one that is not a regular file (a FIFO would block the reader forever) an OSError naming it.
    """
    try:
        text = safeopen.read_text(path)
    except FileNotFoundError:
        return {}
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start})") from None
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


def _tree_bytes(path: str) -> int:
    """Allocated bytes under ``path`` without following symlinks; vanishing files are fine."""
    total = 0
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        total += _tree_bytes(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += allocated_bytes(entry.stat(follow_symlinks=False))
                except FileNotFoundError:
                    continue
    except (FileNotFoundError, NotADirectoryError):
        return 0
    return total


@dataclass(frozen=True)
class _PartitionListing:
    bases: frozenset[int]
    deleted_bytes: int
    #: Allocated bytes of every file but the active segment's (full listings only).
    settled_bytes: int
    #: The active segment's files: they grow without the directory changing, so their size
    #: is always read afresh.
    active_files: tuple[str, ...]
    full: bool

    @property
    def has_deleted(self) -> bool:
        return self.deleted_bytes > 0


def _list_partition(path: str, full: bool) -> _PartitionListing:
    bases: set[int] = set()
    deleted = 0
    sizes: dict[str, int] = {}
    with os.scandir(path) as entries:
        for entry in entries:
            name = entry.name
            try:
                if name.endswith(DELETED_SUFFIX):
                    if entry.is_file(follow_symlinks=False):
                        deleted += allocated_bytes(entry.stat(follow_symlinks=False))
                    continue
                if name.endswith(".log"):
                    parsed = parse_segment_file(name)
                    # A symlink or dir named like a segment is never ours.
                    if parsed is not None and entry.is_file(follow_symlinks=False):
                        bases.add(parsed[0])
                if full and entry.is_file(follow_symlinks=False):
                    sizes[name] = allocated_bytes(entry.stat(follow_symlinks=False))
            except FileNotFoundError:
                continue
    active = max(bases) if bases else None
    active_files = (
        tuple(
            n
            for n in sizes
            if parse_segment_file(n) is not None and n.startswith(f"{active:020d}.")
        )
        if active is not None
        else ()
    )
    settled = sum(size for name, size in sizes.items() if name not in active_files)
    return _PartitionListing(frozenset(bases), deleted, settled, active_files, full)


class ListingCache:
    """Partition listings reused while their directory is unchanged.

    A directory's mtime changes whenever a file in it is created, renamed or removed — every
    segment roll, deletion and ``.deleted`` rename — but not when the active segment grows.
    So an unchanged ``(inode, mtime)`` means the same segments; only the active segment's
    files are stat'ed again. A directory changed within the last ``settle_s`` seconds is not
    cached, as a change in the same clock tick could go unseen. This is what keeps the idle
    daemon's periodic rescan of a large log dir to one ``stat`` per partition.
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


def _active_bytes(path: str, listing: _PartitionListing) -> int:
    total = 0
    for name in listing.active_files:
        try:
            total += allocated_bytes(os.lstat(os.path.join(path, name)))
        except FileNotFoundError:
            continue
    return total


def _is_protected(topic: str, patterns: Sequence[re.Pattern[str]], compacted: set[str]) -> bool:
    return topic in compacted or any(p.search(topic) for p in patterns)


def scan_log_dir(
    log_dir: str,
    mount: str,
    protect: Sequence[re.Pattern[str]],
    full: bool = False,
    topics: dict[str, list[int]] | None = None,
    requested_log_start: Mapping[tuple[str, int], int] | None = None,
    use_log_start: bool = True,
    on_partition: Callable[[float], None] | None = None,
    cache: ListingCache | None = None,
) -> LogDir:
    """One log dir: its live partitions, pending reclaim and (if ``full``) its Kafka bytes.

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
    try:
        compacted = {tp[0] for tp in read_checkpoint(root / CLEANER_CHECKPOINT)}
    except (ValueError, OSError) as exc:
        warnings.append(f"{exc}; compacted topics unknown from the cleaner checkpoint")
        compacted = set()

    partitions: list[Partition] = []
    pending = 0
    kafka_bytes = 0
    try:
        entries = list(os.scandir(log_dir))
    except OSError as exc:
        return LogDir(
            path=log_dir,
            mount=mount,
            partitions=(),
            warnings=(f"{log_dir}: cannot list log dir: {exc.strerror or exc}",),
            error=exc.strerror or str(exc),
        )
    for entry in entries:
        try:
            if entry.is_symlink():
                warnings.append(f"{entry.path}: symlink in log dir, not followed")
                continue
            if not entry.is_dir(follow_symlinks=False):
                if full and entry.is_file(follow_symlinks=False):
                    kafka_bytes += allocated_bytes(entry.stat(follow_symlinks=False))
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
            size = _tree_bytes(entry.path)
            if use_log_start:
                pending += size
            kafka_bytes += size
            continue
        if name.kind is not PartitionDirKind.LIVE:
            if full:
                kafka_bytes += _tree_bytes(entry.path)
            continue
        try:
            listing = (
                cache.listing(entry.path, full) if cache else _list_partition(entry.path, full)
            )
            file_bytes = listing.settled_bytes + (_active_bytes(entry.path, listing) if full else 0)
        except FileNotFoundError:
            continue  # partition deleted while we looked
        except OSError as exc:
            warnings.append(f"{entry.path}: cannot list partition: {exc.strerror or exc}; skipped")
            continue
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
            protected=_is_protected(name.topic, protect, compacted),
        )
        reclaiming_bytes = sum(_segment_bytes(part.path, base) for base in part.reclaiming)
        pending += listing.deleted_bytes + reclaiming_bytes
        kafka_bytes += file_bytes + (listing.deleted_bytes if full else 0)
        if topics is not None:
            acc = topics.setdefault(name.topic, [0, 0])
            acc[0] += 1
            acc[1] += file_bytes + listing.deleted_bytes
        partitions.append(part)
    partitions.sort(key=lambda p: (p.topic, p.partition))
    return LogDir(
        path=log_dir,
        mount=mount,
        partitions=tuple(partitions),
        pending_reclaim_bytes=pending,
        kafka_bytes=kafka_bytes if full else None,
        warnings=tuple(warnings),
    )


def _max_known(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


def _segment_paths(partition_dir: str, base: int) -> list[str]:
    return [
        os.path.join(partition_dir, segment_file_name(base, sfx)) for sfx in SEGMENT_FILE_SUFFIXES
    ]


def _segment_bytes(partition_dir: str, base: int) -> int:
    total = 0
    for path in _segment_paths(partition_dir, base):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            total += allocated_bytes(st)
    return total


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
        size = 0
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
            size += allocated_bytes(st)
            identity.append((path, st.st_ino, st.st_size, st.st_mtime_ns))
            if path.endswith(".log"):
                log_mtime_ms = st.st_mtime_ns // 1_000_000
        key = tuple(identity)
        cached = self.ages.get(key) if self.ages is not None else None
        if cached is not None:
            ts, source = cached
        else:
            found, source = self._max_timestamp(partition.path, base_offset)
            ts = log_mtime_ms if found is None else found
            if found is None:
                source = "mtime"
            if self.ages is not None:
                self.ages.put(key, (ts, source))
        return SegmentInfo(
            bytes=size, max_timestamp_ms=ts, timestamp_source=source, files=tuple(files)
        )

    def _max_timestamp(self, partition_dir: str, base: int) -> tuple[int | None, str]:
        """The segment's largest record timestamp, exactly, from as few bytes as possible.

        The ``.timeindex`` covers the log up to its last entry; the batches after the last
        ``.index`` position cover the rest (a segment that was active when the broker died has
        no final time-index entry). The max of both is the segment's largest timestamp. Only
        regular files are opened: a FIFO named like an index would block forever.
        """
        ti_path = os.path.join(partition_dir, segment_file_name(base, ".timeindex"))
        log_path = os.path.join(partition_dir, segment_file_name(base, ".log"))
        idx_path = os.path.join(partition_dir, segment_file_name(base, ".index"))
        problem = ""
        ti_ts: int | None = None
        if not _is_regular(ti_path):
            problem = "missing or not a regular file"
        else:
            try:
                if os.path.getsize(ti_path) % timeindex.ENTRY_SIZE:
                    problem = "size is not a whole number of entries (truncated)"
                else:
                    entry = timeindex.last_entry(ti_path)
                    if entry is not None and entry.timestamp_ms >= 0:
                        ti_ts = entry.timestamp_ms
                    else:
                        problem = "empty"
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
    """mount point -> log dirs on it (several log dirs may share one filesystem)."""
    out: dict[str, list[str]] = {}
    for log_dir in log_dirs:
        mount, _device = fsusage.mount_of(log_dir)
        out.setdefault(mount, []).append(log_dir)
    return out


def scan(
    log_dirs: Sequence[str | Path],
    protect_topics: Sequence[str],
    full: bool = False,
    requested_log_start: Mapping[str, Mapping[tuple[str, int], int]] | None = None,
    use_log_start: bool = True,
    on_partition: Callable[[float], None] | None = None,
    cache: ListingCache | None = None,
) -> ScanResult:
    """Scan every log dir and group them by filesystem with ``df``-exact usage.

    ``requested_log_start``: log dir -> (topic, partition) -> offset asked of the broker.
    """
    protect = [re.compile(p) for p in protect_topics]
    by_mount: dict[str, list[LogDir]] = {}
    topics_by_mount: dict[str, dict[str, TopicUsage]] = {}
    warnings: list[str] = []
    usages = {}
    for raw in log_dirs:
        log_dir = str(raw)
        try:
            mount, device = fsusage.mount_of(log_dir)
            usage = fsusage.filesystem_usage(log_dir) if mount not in usages else None
        except OSError as exc:
            # A log dir that vanished or whose disk was unmounted: say so, guard the rest.
            warnings.append(f"{log_dir}: log dir unreadable ({exc.strerror or exc}); skipped")
            continue
        if usage is not None:
            usages[mount] = replace(usage, mount=mount, device=device)
        topic_acc: dict[str, list[int]] = {}
        scanned = scan_log_dir(
            log_dir,
            mount,
            protect,
            full=full,
            topics=topic_acc if full else None,
            requested_log_start=(requested_log_start or {}).get(log_dir),
            use_log_start=use_log_start,
            on_partition=on_partition,
            cache=cache,
        )
        warnings.extend(scanned.warnings)
        by_mount.setdefault(mount, []).append(scanned)
        if full:
            merged = topics_by_mount.setdefault(mount, {})
            for topic, (parts, size) in topic_acc.items():
                prev = merged.get(topic, TopicUsage(0, 0))
                merged[topic] = TopicUsage(prev.partitions + parts, prev.bytes + size)
    if cache is not None:
        cache.prune()
    filesystems = tuple(
        Filesystem(usage=usages[mount], log_dirs=tuple(dirs))
        for mount, dirs in sorted(by_mount.items())
    )
    return ScanResult(filesystems, topics_by_mount, tuple(warnings))
