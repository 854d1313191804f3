"""Listing partition dirs and counting their bytes per inode (edge: directory reads only).

Cheap by design: listing names (``getdents``) is all a plan needs for most files; a *full*
listing (snapshots, ``max_bytes``) stats every file, still without reading contents.
``ListingCache`` keeps an unchanged directory's listing; ``InodeTally`` counts hard-linked
files once per inode. Symlinks are never followed and vanishing files are fine.

Size: the names-only listing, the full one and the cache fill and keep the same
``PartitionListing``; apart, each would repeat its rules.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from diskguard.host.fsusage import allocated_bytes
from diskguard.kafkalog.model import (
    DELETED_SUFFIX,
    SEGMENT_FILE_SUFFIXES,
    Partition,
    PartitionDirKind,
    parse_partition_dir,
    parse_segment_base,
    parse_segment_file,
    segment_file_name,
)

if TYPE_CHECKING:
    from diskguard.host.forked import Worker
    from diskguard.kafkalog.listingstore import Stamp
    from diskguard.kafkalog.parallellisting import EarlyListing

_T = TypeVar("_T")

#: An entry a broker with tiered storage keeps in the partition dir (remote log metadata).
REMOTE_LOG_SNAPSHOT = "remote_log_snapshot"
_TXN_INDEX = ".txnindex"
PARTITION_METADATA = "partition.metadata"  # each partition's topic id (KIP-516)
#: Opening a partition dir to list it: followed like ``os.scandir(path)`` would.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
#: A segment's ``.log`` in a "/"-joined listing: ``parse_segment_base``'s rule (20 ASCII
#: digits, then ``.log``, the whole name), applied to all names at once.
_SEGMENT_LOG = re.compile(r"/([0-9]{20})\.log(?=/)")


@dataclass(frozen=True)
class LinkedFile:
    """A file with more than one hard link: its bytes depend on which names are counted."""

    name: str
    dev: int
    ino: int
    nlink: int
    bytes: int
    deleted: bool = False

    @classmethod
    def of(cls, name: str, st: os.stat_result, deleted: bool = False) -> LinkedFile:
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
        return self.add_linked(LinkedFile.of("", st))

    def add_linked(self, linked: LinkedFile) -> int:
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


def tree_stats(path: str) -> list[os.stat_result]:
    """``lstat`` of every regular file under ``path``, symlinks not followed; vanishing files
    are fine."""
    out: list[os.stat_result] = []
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        out.extend(tree_stats(entry.path))
                    elif entry.is_file(follow_symlinks=False):
                        out.append(entry.stat(follow_symlinks=False))
                except FileNotFoundError:
                    continue
    except (FileNotFoundError, NotADirectoryError):
        return []
    return out


@dataclass(frozen=True)
class PartitionListing:
    #: Base offsets of the segments (regular ``.log`` files), sorted once here: a cached
    #: listing is reused every cycle, and sorting 100 bases per partition per cycle was a
    #: quarter of the idle daemon's rescan.
    bases: tuple[int, ...]
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
    linked: tuple[LinkedFile, ...] = ()
    #: A ``remote_log_snapshot`` entry (any kind) is in the dir: tiered storage.
    remote_log_state: bool = False
    #: Regular files named ``*.deleted`` (any size, any link count): the offline sweep
    #: lists only partition dirs that have some.
    deleted_files: int = 0
    #: Some regular file is named ``*.txnindex`` (Kafka writes one only for a segment with
    #: aborted transactions): without any, dating a head need not look for its own.
    txn_indexes: bool = True
    #: A regular ``partition.metadata`` is there (a KRaft broker sets a dir without aside).
    partition_metadata: bool = True


def list_partition(path: str, full: bool) -> PartitionListing:
    if full:
        return _list_full(path)[0]
    # Names only, filtered in C: one comprehension keeps the regular files (``d_type`` from
    # ``getdents``, as ``ls`` sees them: a symlink, dir or FIFO named like a segment is never
    # ours), one regex over them finds the segments. A Python loop over every entry was the
    # listing's cost at 300k entries; this is the same rule in a third of the time.
    # Through a descriptor of the dir: entries then carry no joined path (one string less
    # per name), and the few lstats below are relative to it.
    dir_fd = os.open(path, _DIR_FLAGS)
    try:
        with os.scandir(dir_fd) as entries:
            regular = [e.name for e in entries if e.is_file(follow_symlinks=False)]
        # "/" cannot occur in a file name, so it delimits names exactly (a name may hold "\n").
        joined = "/" + "/".join(regular) + "/"
        logs = _SEGMENT_LOG.findall(joined)
        logs.sort()  # 20 digits each: text order is numeric order
        deleted = 0
        deleted_files = 0
        linked: list[LinkedFile] = []
        if DELETED_SUFFIX + "/" in joined:
            for name in regular:
                if not name.endswith(DELETED_SUFFIX):
                    continue
                try:
                    st = os.lstat(name, dir_fd=dir_fd)
                except FileNotFoundError:
                    continue
                deleted_files += 1
                if st.st_nlink > 1:
                    linked.append(LinkedFile.of(name, st, deleted=True))
                else:
                    deleted += allocated_bytes(st)
        # Any kind of entry (it is a directory on a real broker): one lstat, not a second
        # pass over every name.
        try:
            os.lstat(REMOTE_LOG_SNAPSHOT, dir_fd=dir_fd)
            remote = True
        except OSError:
            remote = False
    finally:
        os.close(dir_fd)
    return PartitionListing(
        tuple(map(int, logs)),
        deleted,
        0,
        (),
        False,
        tuple(linked),
        remote,
        deleted_files,
        _TXN_INDEX + "/" in joined,
        f"/{PARTITION_METADATA}/" in joined,
    )


@dataclass(frozen=True)
class ClosedStats:
    """What a full listing keeps for the next full listing of the same dir (``_list_full``)."""

    #: name -> (inode, stat) of the dir's closed segment files.
    files: dict[str, tuple[int, os.stat_result]]
    #: The newest closed segment's ``.log`` as (name, st_dev, st_ino, st_ctime_ns).
    anchor: tuple[str, int, int, int] | None


def _unchanged(path: str, anchor: tuple[str, int, int, int] | None) -> bool:
    """Is ``anchor``'s file (name, st_dev, st_ino, st_ctime_ns) in the dir ``path`` as it was?"""
    if anchor is None:
        return False
    name, dev, ino, ctime_ns = anchor
    try:
        st = os.lstat(os.path.join(path, name))
    except OSError:
        return False
    return (st.st_dev, st.st_ino, st.st_ctime_ns) == (dev, ino, ctime_ns)


def _list_full(path: str, prior: ClosedStats | None = None) -> tuple[PartitionListing, ClosedStats]:
    """A listing with every regular file stat'ed (snapshots, ``max_bytes``), and the stats of
    its closed segments' files, for the next full listing of the same dir (``prior``).

    ``prior``: a closed segment's file that still has the same name and inode (``d_ino``, no
    ``stat``) is not stat'ed again. Kafka writes a segment's files only while it is active
    (the roll trims its indexes, which is why only files below the then active segment are
    kept); what replaces one (the cleaner's swap) is a new inode. A writer's partition dir
    changes several times a second, so no listing of it is ever kept whole, and every
    snapshot's scan stat'ed its thousands of files again: the crossing that came meanwhile
    waited for it.
    A name and an inode are not a file's identity: a closed segment is written again after
    a truncation made it the active one (a follower's divergence, a recovery finding a bad
    tail: in place, the same inode, closed again by the next roll), and a partition dir
    removed and made again reuses the freed inode numbers (ext4 gave every file its old
    one). Either changes or removes the newest closed segment's ``.log``, and any change
    sets its ``st_ctime_ns``, which a file made later cannot share; so the reused stats
    stand only if that ``.log`` is the same file with the same ctime after this listing
    (a log dir moved to another disk fails it too); else they are stat'ed again."""
    files = prior.files if prior is not None else None
    reused: list[str] = []
    bases: set[int] = set()
    deleted = 0
    deleted_files = 0
    linked: list[LinkedFile] = []
    stats: dict[str, os.stat_result] = {}
    inodes: dict[str, int] = {}
    remote = False
    txn_indexes = False
    with os.scandir(path) as entries:
        for entry in entries:
            name = entry.name
            if name == REMOTE_LOG_SNAPSHOT:
                remote = True
            try:
                if name.endswith(DELETED_SUFFIX):
                    if entry.is_file(follow_symlinks=False):
                        deleted_files += 1
                        st = entry.stat(follow_symlinks=False)
                        if st.st_nlink > 1:
                            linked.append(LinkedFile.of(name, st, deleted=True))
                        else:
                            deleted += allocated_bytes(st)
                    continue
                if name.endswith(".log"):
                    base = parse_segment_base(name)
                    # A symlink or dir named like a segment is never ours.
                    if base is not None and entry.is_file(follow_symlinks=False):
                        bases.add(base)
                if entry.is_file(follow_symlinks=False):
                    known = files.get(name) if files else None
                    ino = entry.inode()
                    if known is not None and known[0] == ino:
                        stats[name] = known[1]
                        reused.append(name)
                    else:
                        stats[name] = entry.stat(follow_symlinks=False)
                    inodes[name] = ino
                    txn_indexes = txn_indexes or name.endswith(_TXN_INDEX)
            except FileNotFoundError:
                continue
    if reused and not _unchanged(path, prior.anchor if prior is not None else None):
        for name in reused:
            try:
                stats[name] = st = os.lstat(os.path.join(path, name))
                inodes[name] = st.st_ino
            except FileNotFoundError:
                del stats[name]  # gone meanwhile, as a file vanishing mid-listing is
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
    closed: dict[str, tuple[int, os.stat_result]] = {}
    settled = 0
    for name, st in stats.items():
        if name in active_files:
            continue
        if active is not None and (seg := parse_segment_file(name)) is not None and seg[0] < active:
            closed[name] = (inodes[name], st)
        if st.st_nlink > 1:
            linked.append(LinkedFile.of(name, st))
        else:
            settled += allocated_bytes(st)
    listing = PartitionListing(
        tuple(sorted(bases)),
        deleted,
        settled,
        active_files,
        True,
        tuple(linked),
        remote,
        deleted_files,
        txn_indexes,
        PARTITION_METADATA in stats,
    )
    anchor = None
    if len(listing.bases) > 1:
        log_name = segment_file_name(listing.bases[-2], ".log")
        if (log_st := stats.get(log_name)) is not None:
            anchor = (log_name, log_st.st_dev, log_st.st_ino, log_st.st_ctime_ns)
    return listing, ClosedStats(closed, anchor)


class ListingCache:
    """Partition listings reused while their directory is unchanged.

    A directory's mtime changes whenever a file in it is created, renamed or removed — every
    segment roll, deletion and ``.deleted`` rename — but not when the active segment grows.
    So an unchanged ``(inode, mtime)`` means the same segments; only the active segment's
    files are stat'ed again. A directory changed within the last ``settle_s`` seconds is not
    cached, as a change in the same clock tick could go unseen. This is what keeps the idle
    daemon's periodic rescan of a large log dir to one ``stat`` per partition.
    A dir changed within ``settle_s`` (a writer's partition rolls several times a second) that
    the offline sweep lists just before a scan (``hand_on``) is handed on to that scan, once,
    if the dir's ``(inode, mtime)`` is still the same then, within ``settle_s`` and before the
    scan ends (``prune``): the state it shows is one the dir had moments ago, as if the scan
    had listed it then (and the deletion's guard rails list the dir afresh anyway). Every
    acting cycle at a million segments listed each writer's partition twice. Never one that
    holds ``*.deleted`` files: those are what the sweep removes.
    A hard link made from elsewhere to a cached file does not touch this directory, so the link
    counts kept here can lag until it changes: that only delays reported Kafka bytes, since
    the planner re-stats every segment it considers (``SegmentFileReader``).
    ``trust`` lets one scan take the inotify hints' word instead (the daemon's snapshot while
    quiet): a dir no event touched is as last listed, active segment sizes included, with no
    ``stat`` at all; the periodic consistency rescan checks every dir again.
    """

    def __init__(self, settle_s: float = 2.0, worker: Worker | None = None) -> None:
        self.settle_s = settle_s
        #: List many uncached dirs on two cores (``prefetch``), with this forked worker:
        #: one-shot commands only.
        self.worker = worker
        self._early: EarlyListing | None = None
        #: The partition dirs the worker listed (their listings are also the worker's).
        self.listed_by_worker: frozenset[str] = frozenset()
        #: What of the early listing the next plan may take (``EarlyListing.to_keep``).
        self.to_keep: list[tuple[str, Stamp, PartitionListing]] | None = None
        self._prefetched: dict[str, tuple[tuple[int, int], PartitionListing] | OSError] = {}
        self._entries: dict[str, tuple[tuple[int, int], PartitionListing]] = {}
        #: Listings of dirs changed within ``settle_s``, made since the last ``prune`` (the
        #: end of a scan): see ``listing``.
        self._fresh: dict[str, tuple[tuple[int, int], float, PartitionListing]] = {}
        self._log_dirs: dict[str, tuple[tuple[int, int], list[os.DirEntry[str]]]] = {}
        #: Each log dir's last listing, kept or not (``trust``).
        self._log_dir_last: dict[str, list[os.DirEntry[str]]] = {}
        #: path -> (the listing a scan made the Partition of, that Partition)
        self._partitions: dict[str, tuple[PartitionListing, Partition]] = {}
        #: Dirs whose full listing could not be kept (changed within ``settle_s``): their
        #: closed segments' file stats, for the next full listing (``_list_full``).
        self._closed: dict[str, ClosedStats] = {}
        self._touched: set[str] = set()
        #: path -> (the listing, its active segment files' stats when last read)
        self._active: dict[str, tuple[PartitionListing, list[os.stat_result], int | None]] = {}
        #: Until the next ``prune``: the names of the dirs the hints say may have changed;
        #: every other kept dir is taken as it was (``trust``). None: nothing is taken on trust.
        self._trusted_but: frozenset[str] | None = None
        self.hits = 0
        self.misses = 0
        #: Served from ``_fresh`` (the offline sweep's listing, taken again by the scan).
        self.fresh_hits = 0

    @property
    def parallel(self) -> bool:
        return self.worker is not None

    @classmethod
    def started(
        cls,
        log_dirs: Iterable[str | os.PathLike[str]],
        full: bool,
        worker: Worker | None,
        then: tuple[str, str] | None = None,
    ) -> ListingCache:
        """A cache whose worker lists its share of ``log_dirs`` from now on (``start_early``)."""
        cache = cls(worker=worker)
        cache.start_early([os.fspath(d) for d in log_dirs], full, then)
        return cache

    def start_early(
        self, log_dirs: Iterable[str], full: bool, then: tuple[str, str] | None = None
    ) -> None:
        """With a worker: it starts listing its share of the log dirs' partition dirs now,
        while this process does what comes before the scan (the broker's round trips);
        ``prefetch`` takes what it listed. A log dir that cannot be listed is left to the
        scan, which says why. ``then``: what the worker does with its listings afterwards
        (``parallellisting.listed_plain``)."""
        if self.worker is None:
            return
        from diskguard.kafkalog.parallellisting import EarlyListing

        self._early = EarlyListing.start(self.live_paths(log_dirs), full, self.worker, then=then)

    def live_paths(self, log_dirs: Iterable[str]) -> list[str]:
        """The live partition dirs of ``log_dirs`` the scan will list, in order; a log dir
        that cannot be listed is left to the scan, which says why."""
        paths: list[str] = []
        for log_dir in log_dirs:
            try:
                paths.extend(live_partition_dirs(self.log_dir_entries(log_dir)))
            except OSError:
                continue
        return paths

    def take_early(self, early: EarlyListing) -> None:
        """The worker's listing of ``live_paths``, started by someone else (``planstart``:
        before the config was loaded), is this cache's as if ``start_early`` had sent it."""
        self._early = early

    def prefetch(self, paths: list[str], full: bool) -> None:
        """With a worker: list the dirs among ``paths`` never listed before, on two cores
        (``parallellisting``: what ``start_early`` began, or now); ``listing`` then hands
        each out once."""
        if self.worker is None:
            return
        from diskguard.kafkalog.parallellisting import list_in_parallel

        wanted = [p for p in paths if p not in self._entries and p not in self._prefetched]
        early, self._early = self._early, None
        if early is not None and (early.full or not full):
            self._prefetched.update(early.take(wanted))
            self.listed_by_worker = early.listed_by_worker
            self.to_keep = early.to_keep()
        else:
            if early is not None:
                early.close()  # names only, where this scan stats every file
            self._prefetched.update(list_in_parallel(wanted, full, self.worker))

    def trust(self, touched: frozenset[str] | None) -> None:
        """For the next scan (until ``prune``): a kept dir whose name is not in ``touched``
        (the inotify hints: the names of the dirs that had any event since the last full
        scan began) is taken as it was then, listing and active segment sizes, without a
        ``stat``; the log dir's own listing too (a partition dir made, removed or renamed is
        an event). Only where every dir is watched and no event was lost. None: take
        nothing on trust."""
        self._trusted_but = touched

    @property
    def trusting(self) -> bool:
        """Will the next scan take the hints' word for some dirs (``trust``)?"""
        return self._trusted_but is not None

    def _trusted(self, path: str) -> bool:
        but = self._trusted_but
        return but is not None and path[path.rfind("/") + 1 :] not in but

    def listing(self, path: str, full: bool, hand_on: bool = False) -> PartitionListing:
        """``path``'s listing: kept if its dir is unchanged, else made now. ``hand_on``: the
        offline sweep's call, just before a scan: a listing made now is handed on to that
        scan's call for the same dir (once) if the dir is still the same then, even when it
        changed too recently to be kept (see the class)."""
        self._touched.add(path)
        if self._trusted_but is not None and self._trusted(path):
            kept = self._entries.get(path)
            if kept is not None and (kept[1].full or not full):
                self.hits += 1
                return kept[1]
        pre = self._prefetched.pop(path, None)
        if pre is not None:
            if isinstance(pre, OSError):
                raise pre
            self.misses += 1
            key, listing = pre
            self._keep(self._entries, path, key, listing)
            return listing
        st = os.stat(path, follow_symlinks=False)
        key = (st.st_ino, st.st_mtime_ns)
        cached = self._entries.get(path)
        if cached is not None and cached[0] == key and (cached[1].full or not full):
            self.hits += 1
            return cached[1]
        fresh = self._fresh.pop(path, None)
        if (
            fresh is not None
            and fresh[0] == key
            and (fresh[2].full or not full)
            and time.monotonic() - fresh[1] < self.settle_s
        ):
            self.fresh_hits += 1
            return fresh[2]
        self.misses += 1
        now = time.monotonic()
        if full:
            listing, closed = _list_full(path, self._closed.get(path))
        else:
            listing = list_partition(path, full)
        self._keep(self._entries, path, key, listing)
        if full and path not in self._entries:
            self._closed[path] = closed
        elif full:
            self._closed.pop(path, None)  # kept whole: unchanged, it is not listed again
        if hand_on and path not in self._entries and not listing.deleted_files:
            self._fresh[path] = (key, now, listing)
        return listing

    def partition(
        self,
        path: str,
        log_dir: str,
        listing: PartitionListing,
        log_start_offset: int | None,
        reason: str | None,
    ) -> Partition | None:
        """The ``Partition`` kept for ``path`` if a scan would make the same one now: of the
        same listing (this cache's own object), in the same spelling of its log dir (a
        reloaded config may spell it anew), with the same log start offset and protection
        reason, which is all a scan makes it of. The idle rescan built ~1,000 equal frozen
        dataclasses each cycle, a fifth of its time."""
        kept = self._partitions.get(path)
        if kept is None:
            return None
        made_of, part = kept
        if (
            made_of is listing
            and part.log_dir == log_dir
            and part.log_start_offset == log_start_offset
            and part.protected_reason == reason
        ):
            return part
        return None

    def keep_partition(self, path: str, listing: PartitionListing, part: Partition) -> None:
        """Remember ``part`` as made of ``listing`` (see ``partition``)."""
        self._partitions[path] = (listing, part)

    def active_files(
        self, path: str, listing: PartitionListing
    ) -> tuple[list[os.stat_result], int | None]:
        """The stats of ``listing``'s active segment files: read afresh (they grow without
        the dir changing), unless ``trust`` says no event touched the dir since they were;
        and their allocated bytes where each has a single link (else None: count them per
        inode). Where the bytes are known, no stats are returned nor kept (36,000 of them
        at 9,000 partitions)."""
        kept = self._active.get(path)
        if kept is not None and kept[0] is listing and self._trusted(path):
            return kept[1], kept[2]
        stats = active_stats(path, listing)
        # One loop, no generator: a consistency check runs this for every partition.
        single = 0
        for st in stats:
            if st.st_nlink > 1:
                self._active[path] = (listing, stats, None)
                return stats, None
            single += st.st_blocks * 512  # allocated_bytes, inline
        self._active[path] = (listing, [], single)
        return [], single

    def log_dir_entries(self, path: str) -> list[os.DirEntry[str]]:
        """A log dir's entries sorted by name, kept while the dir is unchanged, by the same
        rule as ``listing``: the idle rescan listed and sorted its ~1,000 partition dirs'
        names every cycle. A partition created, deleted or renamed changes the
        log dir's mtime. The entries' types come from the listing (``d_type``); callers
        ``lstat`` a file afresh rather than use a cached entry's ``stat()``."""
        if self._trusted_but is not None and (last := self._log_dir_last.get(path)):
            return last  # a partition dir made, removed or renamed is an event (``trust``)
        try:
            st = os.stat(path)
            key = (st.st_ino, st.st_mtime_ns)
            cached = self._log_dirs.get(path)
            if cached is not None and cached[0] == key:
                self._log_dir_last[path] = cached[1]
                return cached[1]
            entries = log_dir_entries(path)
        except OSError:
            self._log_dir_last.pop(path, None)  # nothing listed now: ``last_log_dir_entries``
            raise
        self._keep(self._log_dirs, path, key, entries)
        # Whatever its mtime: the broker rewrites its checkpoints here every few seconds.
        self._log_dir_last[path] = entries
        return entries

    def last_log_dir_entries(self, path: str) -> list[os.DirEntry[str]] | None:
        """The log dir's entries as the last scan took them (None: not listed, or it failed)."""
        return self._log_dir_last.get(path)

    def _keep(
        self,
        store: dict[str, tuple[tuple[int, int], _T]],
        path: str,
        key: tuple[int, int],
        value: _T,
    ) -> None:
        """Remember ``value`` for ``path`` under its dir's ``key`` ``(inode, mtime_ns)``, unless
        the dir changed within ``settle_s`` (a change in the same clock tick could go unseen)."""
        if time.time() - key[1] / 1e9 > self.settle_s:
            store[path] = (key, value)
        else:
            store.pop(path, None)

    def prune(self) -> None:
        """Drop entries not asked for since the last prune (deleted partitions)."""
        for path in [p for p in self._entries if p not in self._touched]:
            del self._entries[path]
        for path in [p for p in self._partitions if p not in self._touched]:
            del self._partitions[path]
        for path in [p for p in self._closed if p not in self._touched]:
            del self._closed[path]
        for path in [p for p in self._active if p not in self._touched]:
            del self._active[path]
        self._touched.clear()
        self._trusted_but = None
        self._prefetched.clear()
        self._fresh.clear()


def log_dir_entries(path: str) -> list[os.DirEntry[str]]:
    """A log dir's entries, sorted by name (the order its partition dirs are listed in)."""
    return sorted(os.scandir(path), key=lambda e: e.name)


def live_partition_dirs(entries: Iterable[os.DirEntry[str]]) -> list[str]:
    """The paths ``scan_log_dir`` will list: live partition dirs, no symlink."""
    out = []
    for entry in entries:
        name = parse_partition_dir(entry.name)
        if name is None or name.kind is not PartitionDirKind.LIVE:
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                out.append(entry.path)
        except OSError:
            continue
    return out


def active_stats(path: str, listing: PartitionListing) -> list[os.stat_result]:
    """``lstat`` of the active segment's files (vanished ones skipped). The path joined by
    hand: ``os.path.join`` was a third of a consistency check's time (four files a
    partition, every partition)."""
    out = []
    prefix = path + "/"
    for name in listing.active_files:
        try:
            out.append(os.lstat(prefix + name))
        except FileNotFoundError:
            continue
    return out


def segment_paths(partition_dir: str, base: int) -> list[str]:
    # One join for the stem, not one per file: this runs for every head a plan pops.
    stem = os.path.join(partition_dir, segment_file_name(base, ""))
    return [stem + sfx for sfx in SEGMENT_FILE_SUFFIXES]


def segment_stats(partition_dir: str, base: int) -> list[os.stat_result]:
    """``lstat`` of the segment's regular files (vanished ones skipped)."""
    out = []
    for path in segment_paths(partition_dir, base):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            out.append(st)
    return out
