"""Reading a segment's largest timestamp from its ``.timeindex`` (edge: reads a file).

KIP-61 orders segments by their *largest* timestamp, which Kafka keeps as the last entry of
the segment's time index (12-byte entries: big-endian int64 timestamp, int32 offset relative
to the segment's base offset; timestamps never decrease). Only a handful of entries are read,
so a preallocated 10 MiB index left by an unclean stop costs the same as a trimmed one.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from diskguard.host import safeopen
from diskguard.kafkalog.indexfile import IndexCorrupt, read_slot, used_slots

__all__ = [
    "ENTRY_SIZE",
    "IndexCorrupt",
    "TimeIndexEntry",
    "TimeIndexTail",
    "clean_last",
    "entries",
    "last_entry",
    "read_tail",
    "tail_of",
]

ENTRY_SIZE = 12
_ENTRY = struct.Struct(">qi")


@dataclass(frozen=True)
class TimeIndexEntry:
    timestamp_ms: int
    relative_offset: int


def _decode(data: bytes) -> TimeIndexEntry:
    timestamp_ms, relative_offset = _ENTRY.unpack(data)
    return TimeIndexEntry(timestamp_ms, relative_offset)


@dataclass(frozen=True)
class TimeIndexTail:
    """The last entry of a time index and how full the file is.

    ``used_slots * ENTRY_SIZE == file_size`` means the index was trimmed to its entries, as
    Kafka does when a segment rolls cleanly (``onBecomeInactiveSegment``); a larger file is
    still preallocated (the segment is active, or was when the broker stopped uncleanly).
    """

    entry: TimeIndexEntry | None
    used_slots: int
    file_size: int

    @property
    def trimmed(self) -> bool:
        return self.used_slots * ENTRY_SIZE == self.file_size


def last_entry(path: str | os.PathLike[str]) -> TimeIndexEntry | None:
    """The last entry, or None for an index with no entries (empty or all zeros).

    Raises IndexCorrupt when the last entry is older than the first (Kafka's own sanity
    check: the broker rebuilds such an index) or has a negative relative offset, and
    OSError (FileNotFoundError, ...) when the file cannot be read.
    """
    return read_tail(path).entry


def read_tail(path: str | os.PathLike[str]) -> TimeIndexTail:
    """``last_entry`` plus the used slots and file size, from one open of the file."""
    fd, st = safeopen.open_regular_stat(path)
    try:
        return tail_of(fd, st.st_size, path)
    finally:
        os.close(fd)


#: An index up to this size is read in one ``pread`` and searched in memory (a closed
#: segment's is usually a few entries); a larger one is probed slot by slot.
_READ_WHOLE = 4096
_ZERO_ENTRY = bytes(ENTRY_SIZE)


def tail_of(fd: int, size: int, path: str | os.PathLike[str]) -> TimeIndexTail:
    """``read_tail`` of an index already open as ``fd`` (``size``: its ``fstat`` size).

    Why separate: the dating of a segment opens its ``.timeindex`` once, and takes the
    file's identity from that descriptor's ``fstat`` instead of an ``lstat`` of its own.
    """
    data = os.pread(fd, size, 0) if 0 < size <= _READ_WHOLE else None
    count = used_slots(fd, ENTRY_SIZE, size=size, data=data)
    if count == 0:
        return TimeIndexTail(None, 0, size)
    read = data if data is not None and len(data) >= count * ENTRY_SIZE else None

    def entry(slot: int) -> tuple[int, int]:
        if read is not None:
            return _ENTRY.unpack_from(read, slot * ENTRY_SIZE)
        return _ENTRY.unpack(read_slot(fd, slot, ENTRY_SIZE))

    last_ts, last_rel = entry(count - 1)
    first_ts, first_rel = entry(0) if count > 1 else (last_ts, last_rel)
    if last_ts < first_ts:
        raise IndexCorrupt(
            f"{os.fspath(path)}: corrupt time index: last timestamp {last_ts}"
            f" (entry {count - 1}) is lower than the first {first_ts}"
        )
    if last_rel < 0 or last_rel < first_rel:
        raise IndexCorrupt(
            f"{os.fspath(path)}: corrupt time index: last relative offset {last_rel}"
            f" (entry {count - 1}) is below the first {first_rel}"
        )
    return TimeIndexTail(TimeIndexEntry(last_ts, last_rel), count, size)


def clean_last(fd: int, size: int) -> tuple[int, int] | None:
    """The last entry ``(timestamp_ms, relative_offset)`` of a small index Kafka trimmed to
    its entries (every slot used, read in one ``pread``) whose entries pass ``tail_of``'s
    checks; None for anything else, which ``tail_of`` then reads and explains.

    Why: that is nearly every closed segment, and dating 10,000 heads for a plan spent more
    time building ``tail_of``'s records than reading the files.
    """
    if not 0 < size <= _READ_WHOLE or size % ENTRY_SIZE:
        return None
    data = os.pread(fd, size, 0)
    total = size // ENTRY_SIZE
    if len(data) != size:
        return None
    # No 12 zero bytes anywhere: no slot is empty, so every slot is used (what the search
    # below would say, without its probes).
    if _ZERO_ENTRY in data and used_slots(fd, ENTRY_SIZE, size=size, data=data) != total:
        return None
    last_ts, last_rel = _ENTRY.unpack_from(data, size - ENTRY_SIZE)
    first_ts, first_rel = _ENTRY.unpack_from(data, 0)
    if last_ts < 0 or last_ts < first_ts or last_rel < 0 or last_rel < first_rel:
        return None
    return last_ts, last_rel


def entries(path: str | os.PathLike[str]) -> list[TimeIndexEntry]:
    """Every entry (tests and diagnostics; reads only the used prefix)."""
    fd = safeopen.open_regular(path)
    try:
        count = used_slots(fd, ENTRY_SIZE)
        data = os.pread(fd, count * ENTRY_SIZE, 0)
    finally:
        os.close(fd)
    whole = len(data) - len(data) % ENTRY_SIZE
    return [_decode(data[i : i + ENTRY_SIZE]) for i in range(0, whole, ENTRY_SIZE)]
