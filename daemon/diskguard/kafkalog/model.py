"""The log-dir model: Kafka's on-disk layout as plain, immutable data.

Pure: nothing here touches the disk. ``scan`` (an edge module) fills these types in from a
real log dir; the planner, flow state and snapshots read them. Naming rules mirror Kafka's
``LocalLog``/``UnifiedLog``: a partition dir is ``<topic>-<partition>``; a segment is named by
its 20-digit base offset; dirs ending in ``-delete``/``-future``/``-stray`` are not live.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import lru_cache
from typing import Any

#: Files that make up one segment and go when the segment goes (Kafka's LogSegment.deleteIfExists).
SEGMENT_FILE_SUFFIXES: tuple[str, ...] = (".log", ".index", ".timeindex", ".txnindex")
#: Per-offset files in a partition dir that are not part of a segment's lifetime.
SNAPSHOT_SUFFIX = ".snapshot"
#: Kafka's suffix for files scheduled for asynchronous deletion.
DELETED_SUFFIX = ".deleted"
#: Transient suffixes Kafka uses while cleaning/swapping; never touched, counted as Kafka bytes.
TRANSIENT_SUFFIXES: tuple[str, ...] = (".cleaned", ".swap")

#: A segment file's name, with no groups of its own: 20 ASCII digits (the base offset), then
#: a segment or snapshot suffix. The one definition: ``parse_segment_file`` matches it whole,
#: the offline guard rails find it in a whole directory's listing at once.
_NAME_SUFFIXES = "|".join(re.escape(s) for s in (*SEGMENT_FILE_SUFFIXES, SNAPSHOT_SUFFIX))
SEGMENT_NAME_PATTERN = rf"[0-9]{{20}}(?:{_NAME_SUFFIXES})"
_SEGMENT_NAME = re.compile(rf"{SEGMENT_NAME_PATTERN}\Z")
# Kafka: "topic-partition", plus ".uniqueId-delete" / "-future" / "-stray" for non-live dirs.
_PARTITION_DIR = re.compile(r"^(?P<topic>[a-zA-Z0-9._-]+?)-(?P<partition>[0-9]+)\Z")
_NON_LIVE_DIR = re.compile(
    r"^(?P<topic>[a-zA-Z0-9._-]+?)-(?P<partition>[0-9]+)\.(?P<uid>[a-zA-Z0-9_-]+)"
    r"-(?P<kind>delete|future|stray)\Z"
)


@dataclass(frozen=True)
class LockHolder:
    """Who holds a log dir's ``.lock``, as far as ``/proc`` tells: for a refusal that names
    the holder instead of guessing a broker. ``kind``: ``diskguard`` (another diskguard
    deleting there), ``broker`` (a Kafka broker's command line), ``other`` or ``unknown``
    (another PID namespace, an open-file-description lock, a ``.lock`` that cannot be
    probed); ``text`` says it in a few words for a message."""

    pid: int
    kind: str
    text: str


class PartitionDirKind(StrEnum):
    LIVE = "live"
    DELETE = "delete"
    FUTURE = "future"
    STRAY = "stray"


@dataclass(frozen=True)
class PartitionDirName:
    topic: str
    partition: int
    kind: PartitionDirKind


#: (kind, "-<kind>") for dirs named without a unique id; built once (an enum's ``.value``
#: is a slow property, and every partition dir name of a cold scan is parsed).
_OLD_STYLE_SUFFIXES: tuple[tuple[PartitionDirKind, str], ...] = tuple(
    (kind, f"-{kind.value}")
    for kind in (PartitionDirKind.DELETE, PartitionDirKind.FUTURE, PartitionDirKind.STRAY)
)


@lru_cache(maxsize=65536)
def parse_partition_dir(name: str) -> PartitionDirName | None:
    """``orders-3`` -> live partition; ``orders-3.<uuid>-delete`` -> a dir on its way out.

    Names that are not Kafka partition dirs (``lost+found``, checkpoint files) give None.
    Memoized (the result is immutable): the daemon parses every dir name of every log dir
    at each rescan, and the names rarely change.
    """
    match = _NON_LIVE_DIR.match(name)
    if match:
        return PartitionDirName(
            match["topic"], int(match["partition"]), PartitionDirKind(match["kind"])
        )
    # Older brokers name future/delete dirs without the unique id ("topic-0-delete").
    for kind, suffix in _OLD_STYLE_SUFFIXES:
        if name.endswith(suffix):
            inner = _PARTITION_DIR.match(name.removesuffix(suffix))
            if inner:
                return PartitionDirName(inner["topic"], int(inner["partition"]), kind)
            return None
    match = _PARTITION_DIR.match(name)
    if match and len(match["topic"]) <= 249 and match["topic"] not in (".", ".."):
        return PartitionDirName(match["topic"], int(match["partition"]), PartitionDirKind.LIVE)
    return None


_DIGITS = frozenset("0123456789")


def parse_segment_base(name: str) -> int | None:
    """``00000000000000001234.log`` -> 1234 (the ``.log`` file of a segment), else None.

    ``parse_segment_file``'s rule for ``.log`` names without the regex: the listing calls
    this for every ``.log`` of every partition, a third of a large plan's listing time.
    """
    if len(name) != 24 or not name.endswith(".log"):
        return None
    digits = name[:20]
    # Only ASCII digits: str.isdigit() would also accept other scripts' digits.
    if not _DIGITS.issuperset(digits):
        return None
    return int(digits)


def parse_segment_file(name: str) -> tuple[int, str] | None:
    """``00000000000000001234.log`` -> ``(1234, ".log")``; anything else -> None."""
    if not _SEGMENT_NAME.match(name):
        return None
    return int(name[:20]), name[20:]


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


@dataclass(frozen=True)
class FilesystemUsage:
    """One mounted filesystem as ``df`` sees it.

    ``used`` excludes root-reserved blocks and ``available`` is what a non-root process may
    still write, so ``usage_percent`` equals df's Use% (before its rounding up).
    """

    mount: str
    device: str
    total_bytes: int
    used_bytes: int
    available_bytes: int

    @property
    def usage_percent(self) -> float:
        denominator = self.used_bytes + self.available_bytes
        return 100.0 * self.used_bytes / denominator if denominator else 0.0

    def above(self, percent: float) -> bool:
        """Is usage above ``percent``, on the exact bytes? The one rule for "over the limit"
        (trigger, stuck tracker, displays): the rounded ``usage_percent`` of a plan or status
        reads 70.0 for 70.0004 %, and exactly at the limit is not over."""
        return self.usage_percent > percent

    def used_bytes_at(self, percent: float) -> int:
        """The ``used`` value at which df would show ``percent`` usage."""
        return int((self.used_bytes + self.available_bytes) * percent / 100.0)

    def fills_with(self, extra_bytes: int) -> bool:
        """Would ``extra_bytes`` more leave no free space at all? ``after_writing`` clamps the
        free bytes at 0, so a disk filled to the brim reads as usage and limits allow it
        (a bytes-only config with ``min_free_bytes = 0``); whoever asks "is there room for
        this?" asks this first."""
        return extra_bytes >= self.available_bytes

    def after_writing(self, extra_bytes: int) -> FilesystemUsage:
        """This filesystem with ``extra_bytes`` more written (at most what is available):
        how far a limit is, asked as "would it be crossed by then?"."""
        return replace(
            self,
            used_bytes=self.used_bytes + extra_bytes,
            available_bytes=max(0, self.available_bytes - extra_bytes),
        )


def usage_fields(usage: FilesystemUsage, log_dirs: Sequence[str]) -> dict[str, Any]:
    """The JSON shape of a filesystem's usage, shared by ``plan --json``, ``status --json``
    and the snapshot records (each adds its own fields after these, in this order)."""
    return {
        "mount": usage.mount,
        "device": usage.device,
        "log_dirs": list(log_dirs),
        "total_bytes": usage.total_bytes,
        "used_bytes": usage.used_bytes,
        "available_bytes": usage.available_bytes,
    }


@dataclass(frozen=True)
class SegmentInfo:
    """What the planner needs to know about one segment, read lazily from disk.

    ``bytes`` is what deleting the segment frees, per inode: a file with a hard link outside
    the segment frees nothing and is listed in ``shared_files`` instead; so is one whose
    extents another file shares (a snapshot, a reflinked copy: ``host.freespace``), and
    ``bytes`` then counts only its extents no other file holds.
    """

    bytes: int
    max_timestamp_ms: int
    #: "timeindex", "log" (last batch of the .log) or "mtime" (fallback, with a warning).
    timestamp_source: str
    files: tuple[str, ...]
    #: Files with another hard link (``st_nlink`` above the segment's own names) or with
    #: extents another file shares: deleting the segment would lose their records and free
    #: none (or not all) of their bytes.
    shared_files: tuple[str, ...] = ()
    #: Of ``shared_files``, those whose extents are shared (the rest are hard-linked).
    shared_extent_files: tuple[str, ...] = ()


_new_instance = object.__new__


def segment_info(
    size: int,
    max_timestamp_ms: int,
    source: str,
    files: tuple[str, ...],
    shared_files: tuple[str, ...] = (),
    shared_extent_files: tuple[str, ...] = (),
) -> SegmentInfo:
    """``SegmentInfo(...)`` for the hot paths (a plan makes one per head it dates or receives,
    ~17,000): the frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``; this fills the new instance's dict instead, ~3x faster, the same
    object (``tests/kafkalog/test_dating_fast_path.py`` compares them)."""
    info: SegmentInfo = _new_instance(SegmentInfo)
    info.__dict__.update(
        bytes=size,
        max_timestamp_ms=max_timestamp_ms,
        timestamp_source=source,
        files=files,
        shared_files=shared_files,
        shared_extent_files=shared_extent_files,
    )
    return info


@dataclass(frozen=True)
class Partition:
    """One live partition directory in one log dir.

    ``base_offsets`` is sorted; the last is the active segment. Segments wholly below
    ``log_start_offset`` are already on their way out (the broker deletes them at its next
    retention check) and are listed in ``reclaiming`` rather than offered again.
    """

    log_dir: str
    topic: str
    partition: int
    path: str
    base_offsets: tuple[int, ...]
    log_start_offset: int | None = None
    protected: bool = False
    #: Why the partition is protected (``topicpolicy``); None when it is not, or when a
    #: caller set ``protected`` by hand.
    protected_reason: str | None = None
    #: The partition dir holds tiered-storage state (a ``remote_log_snapshot`` entry).
    remote_log_state: bool = False
    #: The listing saw a ``*.txnindex`` file (False: dating a segment skips looking for its
    #: own, an ``lstat`` that fails for nearly every segment). Not part of the identity.
    txn_indexes: bool = field(default=True, compare=False, repr=False)

    #: How many leading segments are ``reclaiming``, counted once: the planner walks the
    #: candidates by index (``candidate``) at every head it pops; rebuilding the candidates
    #: tuple on each pop made a plan quadratic in segments per partition, and keeping it would
    #: cost a tuple per segment in the daemon's memory.
    _reclaiming_count: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        count = 0
        if self.log_start_offset is not None:
            bases = self.base_offsets
            while count + 1 < len(bases) and bases[count + 1] <= self.log_start_offset:
                count += 1
        object.__setattr__(self, "_reclaiming_count", count)

    @property
    def active_base_offset(self) -> int | None:
        return self.base_offsets[-1] if self.base_offsets else None

    @property
    def reclaiming(self) -> tuple[int, ...]:
        """Closed segments whose every offset is below the log start offset."""
        return self.base_offsets[: self._reclaiming_count]

    @property
    def candidate_count(self) -> int:
        return max(0, len(self.base_offsets) - 1 - self._reclaiming_count)

    def candidate(self, index: int) -> tuple[int, int] | None:
        """``candidates[index]`` in O(1), or None past the last one."""
        if index < 0 or index >= self.candidate_count:
            return None
        i = self._reclaiming_count + index
        return self.base_offsets[i], self.base_offsets[i + 1]

    @property
    def candidates(self) -> tuple[tuple[int, int], ...]:
        """``(base_offset, next_offset)`` of closed segments not yet reclaiming, oldest first."""
        skip = self._reclaiming_count
        return tuple(zip(self.base_offsets[skip:], self.base_offsets[skip + 1 :], strict=False))


#: What a partition dir that is not live is, for ``plan`` (diskguard never deletes one).
NOT_LIVE_REASONS: dict[PartitionDirKind, str] = {
    PartitionDirKind.STRAY: (
        "set aside by a KRaft broker as a stray (topic deleted or created again, replica moved "
        "away, or no partition.metadata): Kafka never deletes it and serves nothing from it; "
        "remove it by hand once it is not needed"
    ),
    PartitionDirKind.FUTURE: (
        "a replica moving between log dirs (AlterReplicaLogDirs) in progress: the partition's "
        "future, never touched"
    ),
}


@dataclass(frozen=True)
class NotLiveDir:
    """A ``-stray`` or ``-future`` partition dir: never deleted by diskguard, shown by
    ``plan`` with its bytes (an old stray can hold a disk full on its own)."""

    path: str
    topic: str
    partition: int
    kind: PartitionDirKind
    bytes: int

    @property
    def reason(self) -> str:
        return NOT_LIVE_REASONS[self.kind]


@dataclass(frozen=True)
class LogDir:
    """One configured log dir and what scanning it found."""

    path: str
    mount: str
    partitions: tuple[Partition, ...]
    #: Bytes already on their way out: ``*.deleted`` files, ``-delete`` dirs and segments
    #: wholly below a partition's log start offset.
    pending_reclaim_bytes: int = 0
    #: Allocated bytes of everything Kafka owns in this dir (known only after a full scan).
    kafka_bytes: int | None = None
    #: Warnings raised while scanning (unreadable files, odd names); never fatal.
    warnings: tuple[str, ...] = ()
    #: Broker holds the ``.lock`` file (another process has it locked).
    locked_by_broker: bool = False
    error: str | None = None
    #: ``-stray`` and ``-future`` partition dirs, sorted by name.
    not_live: tuple[NotLiveDir, ...] = ()


@dataclass(frozen=True)
class Filesystem:
    """A filesystem and the log dirs on it: the unit KIP-61 limits apply to."""

    usage: FilesystemUsage
    log_dirs: tuple[LogDir, ...] = field(default_factory=tuple)

    @property
    def pending_reclaim_bytes(self) -> int:
        return sum(d.pending_reclaim_bytes for d in self.log_dirs)
