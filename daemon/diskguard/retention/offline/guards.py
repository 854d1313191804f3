"""The offline guard rails, checked on disk right before each deletion (the plan may be
stale) and on every journal entry before recovery acts on it (the journal is data, and data
can be damaged).

Files must be the segment's own files inside ``<log_dir>/<topic>-<partition>`` (realpath
checks, no symlinks anywhere below the log dir); the segment must not be the active one (a
``.log`` must exist at ``next_offset``, and no other segment may lie between). A failed check
raises ``Refused`` naming the rule, and nothing is touched.
"""

from __future__ import annotations

import bisect
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from diskguard.kafkalog.model import (
    DELETED_SUFFIX,
    SEGMENT_FILE_SUFFIXES,
    SEGMENT_NAME_PATTERN,
    SNAPSHOT_SUFFIX,
    PartitionDirKind,
    parse_partition_dir,
    parse_segment_file,
    segment_file_name,
)
from diskguard.retention.planner import Deletion

#: ``parse_segment_file``'s rule (``SEGMENT_NAME_PATTERN``, the whole name) over a "/"-joined
#: listing: each match is one whole name.
_SEGMENT_NAMES = re.compile(rf"/({SEGMENT_NAME_PATTERN})(?=/)")


class Refused(Exception):
    """A guard rail said no; the message says which, and nothing was touched."""


@dataclass(frozen=True)
class Checked:
    """A deletion that passed the guard rails: the exact files to remove."""

    partition_dir: str
    #: Names (inside ``partition_dir``) to delete, ``.log`` first.
    names: tuple[str, ...]


def started(partition_dir: str, names: Sequence[str]) -> bool:
    """Has a removal (``removal``) visibly begun on ``names``: one of them renamed or gone?"""
    for name in names:
        path = os.path.join(partition_dir, name)
        if not os.path.lexists(path) or os.path.lexists(path + DELETED_SUFFIX):
            return True
    return False


def is_deleted_leftover(name: str) -> bool:
    """``<20 digits><segment or snapshot suffix>.deleted``: what Kafka deletes at start-up."""
    if not name.endswith(DELETED_SUFFIX):
        return False
    parsed = parse_segment_file(name.removesuffix(DELETED_SUFFIX))
    return parsed is not None and parsed[1] in (*SEGMENT_FILE_SUFFIXES, SNAPSHOT_SUFFIX)


def unlink_frees(st: os.stat_result) -> int:
    """Bytes unlinking the file ``st`` describes gives back: its allocated blocks if it is a
    regular file with no other hard link (another link keeps the data), else 0. Segment
    removal, the offline sweep and ``plan``'s preview of the sweep all count with this rule."""
    return st.st_blocks * 512 if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 else 0


class SegmentDirListing:
    """Segment-named entries of one partition dir with their file type (``st_mode`` type
    bits, links not followed), and the base offsets of its regular ``.log`` files, sorted.

    Listed once per partition for all of an ``execute``'s deletions and kept in step with
    each removal (``remove``): checking n deletions against it costs n binary searches, not
    n re-parses of every name (which made a cycle quadratic in segments per partition).
    """

    def __init__(self, modes: dict[str, int]) -> None:
        self.modes = modes
        # Segment names are 20 digits and a suffix: the ``.log`` ones are exactly those
        # ending in ".log" (``of`` keeps segment names only; a caller's dict is parsed).
        self.logs: list[int] = sorted(
            seg[0]
            for name, mode in modes.items()
            if name.endswith(".log")
            and stat.S_ISREG(mode)
            and (seg := parse_segment_file(name)) is not None
        )

    @classmethod
    def of(cls, part_dir: str) -> SegmentDirListing:
        """The file type of each entry comes from the directory itself (``d_type``), not a
        ``stat`` per entry: a writer's partition holds hundreds of segments and the guard
        rails list it on every cycle. Where the filesystem does not give types
        (``DT_UNKNOWN``), ``DirEntry`` falls back to ``lstat`` by itself. Only the type bits
        are kept: all the rails ask is "a regular file?"."""
        with os.scandir(part_dir) as listed:
            entries = {entry.name: entry for entry in listed}
        # One regex over all names at once ("/" cannot occur in a name, so it delimits them
        # exactly), not ``parse_segment_file`` per name: a writer's partition holds
        # thousands of names, and this runs on every acting cycle.
        modes: dict[str, int] = {}
        for name in _SEGMENT_NAMES.findall("/" + "/".join(entries) + "/"):
            try:
                modes[name] = _file_type(entries[name])
            except FileNotFoundError:
                continue
        return cls(modes)

    def has_log(self, base: int) -> bool:
        i = bisect.bisect_left(self.logs, base)
        return i < len(self.logs) and self.logs[i] == base

    def has_log_from(self, low: int) -> bool:
        """Is there a ``.log`` at or after ``low`` (the newest one is, if any is)?"""
        return bool(self.logs) and self.logs[-1] >= low

    def logs_between(self, low: int, high: int) -> list[int]:
        """Base offsets of ``.log`` files strictly between ``low`` and ``high``."""
        return self.logs[bisect.bisect_right(self.logs, low) : bisect.bisect_left(self.logs, high)]

    def remove(self, name: str) -> None:
        mode = self.modes.pop(name, None)
        seg = parse_segment_file(name)
        if mode is not None and seg is not None and seg[1] == ".log" and self.has_log(seg[0]):
            del self.logs[bisect.bisect_left(self.logs, seg[0])]


def _file_type(entry: os.DirEntry[str]) -> int:
    """``S_IFREG``/``S_IFDIR``/``S_IFLNK`` for what ``entry`` is (links not followed), 0 for
    anything else (a FIFO, a socket, a device: never a segment file)."""
    if entry.is_symlink():
        return stat.S_IFLNK
    if entry.is_file(follow_symlinks=False):
        return stat.S_IFREG
    if entry.is_dir(follow_symlinks=False):
        return stat.S_IFDIR
    return 0


def check_deletion(
    d: Deletion,
    listings: dict[str, SegmentDirListing] | None = None,
    next_removed: bool = False,
) -> Checked:
    """The guard rails, on disk, right now; raises ``Refused`` naming the rule.

    ``listings`` lets one ``execute`` list each partition dir once for all its deletions
    (it holds the ``.lock``, so only the broker could change the dir, and it cannot run):
    without it, deleting n segments of one partition listed the dir n times.
    ``next_removed`` (recovery closing a hole): the segment at the next offset is one the
    same journal batch removed already, so the proof that this one is closed is a ``.log``
    at or after the next offset instead of exactly at it.
    """
    log_dir_real = os.path.realpath(d.log_dir)
    if not os.path.isdir(log_dir_real):
        raise Refused(f"log dir {d.log_dir} does not exist")
    part_name = f"{d.topic}-{d.partition}"
    parsed = parse_partition_dir(part_name)
    if (
        parsed is None
        or parsed.kind is not PartitionDirKind.LIVE
        or (parsed.topic, parsed.partition) != (d.topic, d.partition)
    ):
        raise Refused(f"{part_name!r} is not a live Kafka partition dir name")
    part_dir = os.path.join(log_dir_real, part_name)
    try:
        st = os.lstat(part_dir)
    except FileNotFoundError:
        raise Refused(f"partition dir {part_dir} does not exist any more") from None
    if stat.S_ISLNK(st.st_mode):
        raise Refused(f"partition dir {part_dir} is a symlink; never followed out of a log dir")
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(f"{part_dir} is not a directory")
    if d.next_offset <= d.base_offset:
        raise Refused(f"next offset {d.next_offset} is not after base offset {d.base_offset}")
    wanted = {segment_file_name(d.base_offset, s) for s in SEGMENT_FILE_SUFFIXES}
    # A segment's files share one dir: each distinct dir is resolved once (``realpath``
    # lstats every component of the path, and a batch checks thousands of files).
    resolved: dict[str, str] = {}
    for f in d.files:
        name = os.path.basename(f)
        if name not in wanted:
            raise Refused(f"{f} is not one of segment {d.base_offset}'s own files")
        parent = os.path.dirname(os.path.abspath(f))
        real = resolved.get(parent)
        if real is None:
            real = resolved[parent] = os.path.realpath(parent)
        if real != part_dir:
            raise Refused(f"{f} is not inside {part_dir}")
    if listings is not None and part_dir in listings:
        listing = listings[part_dir]
    else:
        listing = SegmentDirListing.of(part_dir)
        if listings is not None:
            listings[part_dir] = listing
    kinds = {name: listing.modes[name] for name in wanted if name in listing.modes}
    if next_removed and not listing.has_log_from(d.next_offset):
        raise Refused(
            f"{part_name}: no segment at or after next offset {d.next_offset}: segment "
            f"{d.base_offset} may be the active one"
        )
    if not next_removed and not listing.has_log(d.next_offset):
        raise Refused(
            f"{part_name}: no segment starts at next offset {d.next_offset}: segment "
            f"{d.base_offset} may be the active one (stale plan?)"
        )
    between = listing.logs_between(d.base_offset, d.next_offset)
    if between:
        raise Refused(
            f"{part_name}: segment {between[0]} lies between {d.base_offset} and "
            f"{d.next_offset} (stale plan?)"
        )
    for name, mode in kinds.items():
        if not stat.S_ISREG(mode):
            raise Refused(f"{os.path.join(part_dir, name)} is not a regular file (symlink?)")
    names = tuple(
        segment_file_name(d.base_offset, s)
        for s in SEGMENT_FILE_SUFFIXES
        if segment_file_name(d.base_offset, s) in kinds
    )
    return Checked(part_dir, names)


def check_journal_entry(log_dir_real: str, partition_dir: str, names: Sequence[str]) -> None:
    """A journal entry is only acted on if it still names segment files in a live partition
    dir directly under its log dir (the journal is data, and data can be damaged)."""
    if os.path.dirname(partition_dir) != log_dir_real:
        raise Refused(f"{partition_dir} is not directly inside {log_dir_real}")
    parsed = parse_partition_dir(os.path.basename(partition_dir))
    if parsed is None or parsed.kind is not PartitionDirKind.LIVE:
        raise Refused(f"{partition_dir} is not a live partition dir")
    if os.path.lexists(partition_dir) and (
        os.path.islink(partition_dir) or os.path.realpath(partition_dir) != partition_dir
    ):
        raise Refused(f"{partition_dir} is a symlink")
    for name in names:
        seg = parse_segment_file(name)
        if seg is None or seg[1] not in SEGMENT_FILE_SUFFIXES or "/" in name:
            raise Refused(f"{name!r} is not a segment file name")


def deletion_from_entry(entry: Mapping[str, Any]) -> Deletion:
    f = entry.get("fields", {})
    partition_dir = str(entry.get("partition_dir", ""))
    return Deletion(
        log_dir=str(f.get("log_dir", entry.get("log_dir_real", ""))),
        topic=str(f.get("topic", "")),
        partition=int(f.get("partition", -1)),
        base_offset=int(f.get("base_offset", -1)),
        next_offset=int(f.get("next_offset", -1)),
        max_timestamp_ms=int(f.get("max_timestamp_ms", 0)),
        bytes=int(f.get("bytes", 0)),
        files=tuple(os.path.join(partition_dir, str(n)) for n in entry.get("names", [])),
        mount=str(f.get("mount", "")),
        reason="disk_usage_percent",
        unconsumed_records=dict(f.get("unconsumed_records", {})),
    )
