"""Kafka RecordBatch v2 headers in a segment's ``.log`` (edge: reads a file).

When a segment's ``.timeindex`` is missing, empty or corrupt, its largest timestamp is still
in the ``.log``: every v2 batch header carries ``maxTimestamp``. Only headers are read (61
bytes per batch, in 64 KiB windows); records are skipped by ``batchLength``. A tail cut off
mid-batch (crash, disk full) ends the iteration quietly, as Kafka's own recovery truncates
it; anything else that does not look like a batch raises ``CorruptLog`` naming the file and
byte position.

Header layout (big-endian): baseOffset int64, batchLength int32, partitionLeaderEpoch int32,
magic int8 (=2), crc uint32 (CRC32C of attributes..end), attributes int16, lastOffsetDelta
int32, baseTimestamp int64, maxTimestamp int64, producerId int64, producerEpoch int16,
baseSequence int32, records count int32.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from diskguard.host import safeopen

__all__ = [
    "HEADER_SIZE",
    "LOG_OVERHEAD",
    "BatchHeader",
    "CorruptLog",
    "checksum",
    "iter_batches",
    "last_batch_max_timestamp",
]

#: baseOffset + batchLength: the part of a batch not counted in batchLength.
LOG_OVERHEAD = 12
HEADER_SIZE = 61
#: Where the CRC-covered bytes (attributes onwards) start.
CRC_START = 21


def checksum(data: bytes) -> int:
    """CRC32C of ``data`` (what a batch header's ``crc`` covers).

    The crc32c package is imported here, on first use: its import reads its own version
    from the installed metadata (importlib.metadata, ~15 ms), which ``plan`` and ``status``
    would otherwise pay on every run without ever checking a CRC.
    """
    import crc32c

    return int(crc32c.crc32c(data))


NO_TIMESTAMP = -1
_HEADER = struct.Struct(">qiibIhiqqqhii")
_WINDOW = 64 * 1024
_TIMESTAMP_TYPE_MASK = 0x08
_TRANSACTIONAL_MASK = 0x10
_CONTROL_MASK = 0x20
_COMPRESSION_MASK = 0x07


class CorruptLog(ValueError):
    """Bytes in a ``.log`` that are not a valid v2 record batch."""

    def __init__(self, path: str, position: int, reason: str) -> None:
        super().__init__(f"{path}: corrupt record batch at position {position}: {reason}")
        self.path = path
        self.position = position
        self.reason = reason


@dataclass(frozen=True)
class BatchHeader:
    position: int
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size_in_bytes(self) -> int:
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression(self) -> int:
        """0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd."""
        return self.attributes & _COMPRESSION_MASK

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & _TIMESTAMP_TYPE_MASK)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_MASK)


class _Reader:
    """pread in windows, so walking many small batches is not one syscall per header."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buf = b""
        self._start = 0

    def read(self, position: int, length: int) -> bytes:
        offset = position - self._start
        if offset < 0 or offset + length > len(self._buf):
            self._buf = os.pread(self._fd, max(length, _WINDOW), position)
            self._start = position
            offset = 0
        return self._buf[offset : offset + length]


def iter_batches(
    path: str | os.PathLike[str], start_position: int = 0, verify_crc: bool = False
) -> Iterator[BatchHeader]:
    """Batch headers from ``start_position`` (a batch boundary, e.g. from the offset index).

    Stops quietly at the end of the file, at a batch cut off by the end of the file, and at
    an all-zero header (the zero tail of a preallocated log). Raises CorruptLog for a bad
    length, magic, offset or (with ``verify_crc``) checksum, OSError if the file is unreadable.
    """
    name = os.fspath(path)
    if start_position < 0:
        raise CorruptLog(name, start_position, "negative start position")
    fd = safeopen.open_regular(path)
    try:
        size = os.fstat(fd).st_size
        reader = _Reader(fd)
        position = start_position
        previous_next_offset = -1
        while size - position >= LOG_OVERHEAD:
            head = reader.read(position, min(HEADER_SIZE, size - position))
            if len(head) < LOG_OVERHEAD:
                return  # the file shrank while we read it
            base_offset, batch_length = struct.unpack_from(">qi", head)
            if base_offset == 0 and batch_length == 0:
                return  # zero tail of a preallocated segment: no more data
            if batch_length < HEADER_SIZE - LOG_OVERHEAD:
                raise CorruptLog(name, position, f"batch length {batch_length} is too small")
            if position + LOG_OVERHEAD + batch_length > size or len(head) < HEADER_SIZE:
                return  # truncated tail: Kafka's recovery would cut it off
            header = _decode(name, position, head)
            if header.base_offset < previous_next_offset:
                raise CorruptLog(
                    name,
                    position,
                    f"base offset {header.base_offset} is below the previous batch's next"
                    f" offset {previous_next_offset}",
                )
            if verify_crc:
                body = os.pread(fd, header.size_in_bytes - CRC_START, position + CRC_START)
                actual = checksum(body)
                if actual != header.crc:
                    raise CorruptLog(
                        name,
                        position,
                        f"CRC32C mismatch (stored {header.crc:#010x}, computed {actual:#010x})",
                    )
            yield header
            previous_next_offset = header.next_offset
            position += header.size_in_bytes
    finally:
        os.close(fd)


def _decode(name: str, position: int, head: bytes) -> BatchHeader:
    magic = head[16]
    if magic != 2:
        raise CorruptLog(name, position, f"magic {magic} is not 2 (only RecordBatch v2 is read)")
    header = BatchHeader(position, *_HEADER.unpack_from(head))
    if header.base_offset < 0:
        raise CorruptLog(name, position, f"negative base offset {header.base_offset}")
    if header.last_offset_delta < 0:
        raise CorruptLog(name, position, f"negative last offset delta {header.last_offset_delta}")
    if header.record_count < 0:
        raise CorruptLog(name, position, f"negative record count {header.record_count}")
    return header


def last_batch_max_timestamp(path: str | os.PathLike[str], start_position: int = 0) -> int | None:
    """``maxTimestamp`` of the last batch that has one, walking from ``start_position``.

    Pass the last offset-index entry's position to read only the tail of the log. None when
    no batch from there on carries a timestamp (empty log, or only ``NO_TIMESTAMP`` batches).
    """
    result: int | None = None
    for header in iter_batches(path, start_position):
        if header.max_timestamp != NO_TIMESTAMP:
            result = header.max_timestamp
    return result
