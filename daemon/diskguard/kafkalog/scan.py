"""Scanning real log dirs into the model (edge: with ``listing``, ``dating`` and
``checkpoints``, all the log-dir reads live here).

Cheap by design: listing names (``getdents``) is all a plan needs for most files
(``listing``); only the heads the planner pops are stat'ed and dated (``dating``).
A *full* scan (snapshots, ``max_bytes``) stats every file, still without reading contents.

Safety rules from Kafka's own ``LogManager``: never follow a symlink out of a log dir, skip
``-delete``/``-future``/``-stray`` dirs (their bytes are pending reclaim or other), tolerate
files vanishing mid-scan (the broker deletes and rolls while we look).
"""

from __future__ import annotations

import bisect
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from diskguard.host import fsusage
from diskguard.kafkalog.checkpoints import LOG_START_CHECKPOINT, compacted_topics, read_checkpoint
from diskguard.kafkalog.listing import (
    InodeTally,
    ListingCache,
    active_stats,
    list_partition,
    live_partition_dirs,
    segment_stats,
    tree_stats,
)
from diskguard.kafkalog.model import (
    Filesystem,
    FilesystemUsage,
    LogDir,
    NotLiveDir,
    Partition,
    PartitionDirKind,
    parse_partition_dir,
)
from diskguard.kafkalog.topicpolicy import ProtectionRule, stray_reason


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


def as_rule(protect: ProtectionRule | Sequence[re.Pattern[str] | str]) -> ProtectionRule:
    """Callers that still pass ``protect_topics`` regexes get a rule with no known policies:
    every non-internal topic is then protected as "cleanup.policy unknown"."""
    if isinstance(protect, ProtectionRule):
        return protect
    return ProtectionRule(
        protect_topics=tuple(p if isinstance(p, str) else p.pattern for p in protect)
    )


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
    not_live: list[NotLiveDir] = []
    # Per inode, not per name: a file also linked from outside frees nothing when deleted,
    # and two names of one inode occupy its blocks once (see InodeTally).
    pending = InodeTally()
    kafka = InodeTally()
    try:
        if cache is not None:
            entries = cache.log_dir_entries(log_dir)
        else:
            entries = sorted(os.scandir(log_dir), key=lambda e: e.name)
    except OSError as exc:
        return LogDir(
            path=log_dir,
            mount=mount,
            partitions=(),
            warnings=(f"{log_dir}: cannot list log dir: {exc.strerror or exc}",),
            error=exc.strerror or str(exc),
        )
    if cache is not None and cache.parallel:
        cache.prefetch(live_partition_dirs(entries), full)
    top_files: list[os.stat_result] = []
    for entry in entries:
        try:
            if entry.is_symlink():
                warnings.append(f"{entry.path}: symlink in log dir, not followed")
                continue
            if not entry.is_dir(follow_symlinks=False):
                if full and entry.is_file(follow_symlinks=False):
                    top_files.append(os.lstat(entry.path))  # afresh: entries may be cached
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
            for st in tree_stats(entry.path):
                if use_log_start:
                    pending.add(st)
                kafka.add(st)
            continue
        if name.kind is not PartitionDirKind.LIVE:
            own = InodeTally()
            for st in tree_stats(entry.path):
                own.add(st)
                if full:
                    kafka.add(st)
            not_live.append(
                NotLiveDir(entry.path, name.topic, name.partition, name.kind, own.allocated)
            )
            continue
        try:
            listing = cache.listing(entry.path, full) if cache else list_partition(entry.path, full)
            active: list[os.stat_result] = []
            single: int | None = None  # the active files' bytes, each with one link
            if full and cache is not None:
                active, single = cache.active_files(entry.path, listing)
            elif full:
                active = active_stats(entry.path, listing)
        except FileNotFoundError:
            continue  # partition deleted while we looked
        except OSError as exc:
            warnings.append(f"{entry.path}: cannot list partition: {exc.strerror or exc}; skipped")
            continue
        reason = rule.reason(name.topic, listing.remote_log_state)
        if rule.kraft:
            stray = _stray(rule, name.topic, entry.path, listing.partition_metadata)
            reason = stray or reason
        start = _max_known(
            log_start.get((name.topic, name.partition)),
            (requested_log_start or {}).get((name.topic, name.partition)),
        )
        part = cache.partition(entry.path, log_dir, listing, start, reason) if cache else None
        if part is None:
            part = Partition(
                log_dir=log_dir,
                topic=name.topic,
                partition=name.partition,
                path=entry.path,
                base_offsets=listing.bases,
                log_start_offset=start,
                protected=reason is not None,
                protected_reason=reason,
                remote_log_state=listing.remote_log_state,
                txn_indexes=listing.txn_indexes,
            )
            if cache is not None:
                cache.keep_partition(entry.path, listing, part)
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
            for st in segment_stats(part.path, base):
                pending.add(st)
        # Bytes this partition adds to the log dir's (inodes seen before count there once).
        part_bytes = listing.settled_bytes + listing.deleted_bytes
        if single is not None:
            part_bytes += single  # as ``InodeTally.add`` counts single links: summed
        kafka.single += part_bytes
        if listing.linked:
            part_bytes += sum(kafka.add_linked(linked) for linked in listing.linked)
        if active and single is None:
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
        not_live=tuple(not_live),
    )


def _stray(rule: ProtectionRule, topic: str, path: str, has_metadata: bool) -> str | None:
    """``stray_reason`` for one partition dir of a stopped KRaft broker; its
    ``partition.metadata`` is read only when the complete metadata knows the topic (a
    deleted-and-recreated topic's old dir differs from the new one only by the id there)."""
    kraft = rule.kraft_topics
    dir_id = None
    if has_metadata and kraft is not None and topic in kraft.ids:
        # Loaded here: only a stopped KRaft broker's metadata needs it (``status`` never).
        from diskguard.kafkalog.kraftmeta import partition_topic_id

        dir_id = partition_topic_id(path)
    return stray_reason(topic, has_metadata, dir_id, kraft)


def _max_known(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


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


def still_listed(result: ScanResult) -> Callable[[str, int], bool]:
    """``live(partition_dir, base_offset)`` over a scan: is that segment still there?"""
    bases = {
        p.path: p.base_offsets
        for fs in result.filesystems
        for d in fs.log_dirs
        for p in d.partitions
    }

    def live(path: str, base: int) -> bool:
        offsets = bases.get(path)
        if not offsets:
            return False
        i = bisect.bisect_left(offsets, base)
        return i < len(offsets) and offsets[i] == base

    return live
