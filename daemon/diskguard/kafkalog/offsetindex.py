"""Reading the last entry of a segment's ``.index`` (edge: reads a file).

The offset index maps offsets (relative to the segment's base offset) to byte positions in
the ``.log`` (8-byte entries: big-endian int32 relative offset, int32 position). Its last
entry gives the position of a batch near the end of the log, so the log's tail can be read
without walking every batch from the start. Same few-reads binary search as the time index.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from diskguard.host import safeopen
from diskguard.kafkalog.indexfile import IndexCorrupt, read_slot, used_slots

__all__ = ["ENTRY_SIZE", "IndexCorrupt", "OffsetIndexEntry", "entries", "last_entry"]

ENTRY_SIZE = 8
_ENTRY = struct.Struct(">ii")


@dataclass(frozen=True)
class OffsetIndexEntry:
    relative_offset: int
    position: int


def _decode(data: bytes) -> OffsetIndexEntry:
    relative_offset, position = _ENTRY.unpack(data)
    return OffsetIndexEntry(relative_offset, position)


def last_entry(path: str | os.PathLike[str]) -> OffsetIndexEntry | None:
    """The last entry, or None for an index with no entries (empty or all zeros).

    A first entry of ``(0, 0)`` is valid when later entries follow it. Raises IndexCorrupt
    when offsets or positions are negative or go backwards (last vs first entry), and
    OSError when the file cannot be read.
    """
    fd = safeopen.open_regular(path)
    try:
        count = used_slots(fd, ENTRY_SIZE, first_may_be_zero=True)
        if count == 0:
            return None
        last = _decode(read_slot(fd, count - 1, ENTRY_SIZE))
        first = _decode(read_slot(fd, 0, ENTRY_SIZE)) if count > 1 else last
    finally:
        os.close(fd)
    name = os.fspath(path)
    if last.relative_offset < 0 or last.position < 0:
        raise IndexCorrupt(
            f"{name}: corrupt offset index: negative entry {count - 1}"
            f" (relative offset {last.relative_offset}, position {last.position})"
        )
    if count > 1 and (
        last.relative_offset <= first.relative_offset or last.position <= first.position
    ):
        raise IndexCorrupt(
            f"{name}: corrupt offset index: last entry {count - 1} ({last.relative_offset},"
            f" {last.position}) does not follow the first ({first.relative_offset},"
            f" {first.position})"
        )
    return last


def entries(path: str | os.PathLike[str]) -> list[OffsetIndexEntry]:
    """Every entry (tests and diagnostics; reads only the used prefix)."""
    fd = safeopen.open_regular(path)
    try:
        count = used_slots(fd, ENTRY_SIZE, first_may_be_zero=True)
        data = os.pread(fd, count * ENTRY_SIZE, 0)
    finally:
        os.close(fd)
    whole = len(data) - len(data) % ENTRY_SIZE
    return [_decode(data[i : i + ENTRY_SIZE]) for i in range(0, whole, ENTRY_SIZE)]
