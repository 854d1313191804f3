"""Finding the last entry of a Kafka index file without reading it whole.

Shared by ``offsetindex`` and ``timeindex``. A Kafka index is a prefix of non-zero fixed-size
entries followed, in a segment that was active when the broker stopped (cleanly or not), by
the zero tail of a file preallocated to ``segment.index.bytes`` (10 MiB: ~870k time-index
slots). Scanning that tail backwards would read megabytes per segment on every rescan; a
binary search over the "is this slot non-zero" predicate reads ~20 slots. ``SEEK_HOLE``
first narrows the search to the file's data (on ext4/xfs/tmpfs a sparse tail is a hole), so a
fresh preallocated file costs one ``lseek``.
"""

from __future__ import annotations

import os

__all__ = ["IndexCorrupt", "read_slot", "used_slots"]


class IndexCorrupt(ValueError):
    """An index file whose entries break Kafka's invariants; the message names the file."""


def read_slot(fd: int, slot: int, entry_size: int) -> bytes:
    """Entry ``slot`` of an open index file (exactly ``entry_size`` bytes)."""
    data = os.pread(fd, entry_size, slot * entry_size)
    if len(data) != entry_size:  # the file shrank under us (broker trimmed it on roll)
        return bytes(entry_size)
    return data


_SEEK_HOLE: int | None = getattr(os, "SEEK_HOLE", None)


def _data_end(fd: int, size: int) -> int:
    """Offset where the file's data ends and a trailing hole begins (``size`` if unknown).

    Only an upper bound on the non-zero prefix: a filesystem may report the whole file as
    data, and a written block may hold zeros. The binary search below stays the authority.
    """
    if _SEEK_HOLE is None or size == 0:
        return size
    try:
        return min(size, os.lseek(fd, 0, _SEEK_HOLE))
    except OSError:
        return size


def used_slots(
    fd: int,
    entry_size: int,
    *,
    first_may_be_zero: bool = False,
    size: int | None = None,
    data: bytes | None = None,
) -> int:
    """How many leading slots of the open index hold entries.

    Kafka writes entries front to back and never leaves a gap, so "slot is non-zero" is true
    for a prefix of slots: binary search finds its end. ``first_may_be_zero`` is for the
    offset index, whose first entry may legitimately be ``(0, 0)``: slot 0 then counts
    only if slot 1 is non-zero (a file of nothing but zeros has no entries).
    A size that is not a multiple of ``entry_size`` is treated as Kafka treats it: only
    whole entries count. ``size``: the file's size if the caller has just ``fstat``'ed it;
    ``data``: the file's bytes from offset 0 if the caller has read them (a small index in
    one ``pread``): the same search then probes them instead of the file.
    """
    if size is None:
        size = os.fstat(fd).st_size
    total = size // entry_size
    if total == 0:
        return 0
    zero = bytes(entry_size)

    def slot(i: int) -> bytes:
        if data is None:
            return read_slot(fd, i, entry_size)
        chunk = data[i * entry_size : (i + 1) * entry_size]
        return chunk if len(chunk) == entry_size else zero  # shrank: as read_slot

    # Read whole, the bytes are the authority already: no hole to ask the filesystem about.
    data_end = size if data is not None and len(data) >= size else _data_end(fd, size)
    # Slots starting at or after data_end lie in a hole: all zeros. Trust the filesystem's
    # answer only after checking the first slot it calls a hole (one read), so a filesystem
    # that misreports holes costs speed, never a missed entry.
    hi = min(total, -(-data_end // entry_size))
    if hi < total and slot(hi) != zero:
        hi = total
    lo = 1 if first_may_be_zero else 0
    if hi <= lo:
        # Nothing or only slot 0 can hold data (a lone all-zero slot 0 is not an entry).
        if hi == 0:
            return 0
        return 1 if slot(0) != zero else 0
    # Invariant: every slot < lo is "in" (or slot 0 under first_may_be_zero), every slot
    # >= hi is zero. Find the first zero slot in [lo, hi).
    while lo < hi:
        mid = (lo + hi) // 2
        if slot(mid) != zero:
            lo = mid + 1
        else:
            hi = mid
    if first_may_be_zero and lo == 1:
        # Slot 1 is zero: slot 0 is an entry only if it is non-zero itself.
        return 1 if slot(0) != zero else 0
    return lo
