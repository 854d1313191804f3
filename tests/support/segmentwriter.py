"""Writing Kafka's on-disk segment format (edge: writes files).

diskguard itself only ever *reads* segments; this writer exists so that the tests' generator
(``support.kafkagen``) and the stand-in broker (``support.standin``, appending as it goes)
produce the same bytes a Kafka 3.x broker leaves on disk, from one implementation:

- ``.log``: RecordBatch v2 (varint-encoded records, CRC32C over attributes..end);
- ``.index`` (4-byte relative offset + 4-byte position) and ``.timeindex`` (8-byte timestamp
  + 4-byte relative offset), one entry every ``index.interval.bytes`` of log exactly as
  ``LogSegment.append`` decides (``IndexBuilder``);
- the active segment's indexes preallocated *sparse* to ``segment.index.bytes`` and trimmed
  to their entries when the segment rolls (``ActiveSegment``), which is what makes a
  broker's allocated bytes differ from its file sizes;
- the small per-partition and per-log-dir files (producer snapshot, checkpoints, topic id).
"""

from __future__ import annotations

import base64
import os
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import crc32c

from diskguard.kafkalog.model import segment_file_name

__all__ = [
    "DEFAULT_INDEX_INTERVAL_BYTES",
    "DEFAULT_SEGMENT_INDEX_BYTES",
    "OFFSET_INDEX_ENTRY",
    "TIME_INDEX_ENTRY",
    "ActiveSegment",
    "IndexBuilder",
    "empty_producer_snapshot",
    "encode_batch",
    "encode_record",
    "offset_index_entry",
    "preallocate",
    "time_index_entry",
    "topic_id",
    "varint",
    "write_checkpoint",
    "zigzag",
]

DEFAULT_SEGMENT_INDEX_BYTES = 10 * 1024 * 1024
DEFAULT_INDEX_INTERVAL_BYTES = 4096
OFFSET_INDEX_ENTRY = 8
TIME_INDEX_ENTRY = 12
_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")


# --------------------------------------------------------------------------- records


def zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63)


def varint(value: int) -> bytes:
    """Kafka's signed varint/varlong: zigzag, then 7 bits per byte, low bits first."""
    z = zigzag(value) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while True:
        byte = z & 0x7F
        z >>= 7
        if z:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_record(
    offset_delta: int,
    timestamp_delta: int,
    value: bytes | None,
    key: bytes | None = None,
    headers: Sequence[tuple[str, bytes | None]] = (),
) -> bytes:
    """One v2 record, length-prefixed (the body layout of DefaultRecord)."""
    body = bytearray(b"\x00")  # attributes: unused, always 0
    body += varint(timestamp_delta)
    body += varint(offset_delta)
    for blob in (key, value):
        if blob is None:
            body += varint(-1)
        else:
            body += varint(len(blob)) + blob
    body += varint(len(headers))
    for hkey, hvalue in headers:
        raw = hkey.encode()
        body += varint(len(raw)) + raw
        body += varint(-1) if hvalue is None else varint(len(hvalue)) + hvalue
    return varint(len(body)) + bytes(body)


def encode_batch(
    base_offset: int,
    timestamps_ms: Sequence[int],
    values: Sequence[bytes | None],
    *,
    keys: Sequence[bytes | None] | None = None,
    partition_leader_epoch: int = 0,
    attributes: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """A RecordBatch v2 with one record per value; CRC32C over attributes..end as Kafka does.

    ``baseTimestamp`` is the first record's timestamp and ``maxTimestamp`` the largest, as
    ``MemoryRecordsBuilder`` writes them for CreateTime batches.
    """
    if not values or len(values) != len(timestamps_ms):
        raise ValueError("a batch needs one timestamp per value and at least one record")
    base_ts = timestamps_ms[0]
    records = b"".join(
        encode_record(i, ts - base_ts, value, None if keys is None else keys[i])
        for i, (ts, value) in enumerate(zip(timestamps_ms, values, strict=True))
    )
    after_crc = struct.pack(
        ">hiqqqhii",
        attributes,
        len(values) - 1,
        base_ts,
        max(timestamps_ms),
        producer_id,
        producer_epoch,
        base_sequence,
        len(values),
    )
    crc_body = after_crc + records
    crc = crc32c.crc32c(crc_body)
    batch_length = 4 + 1 + 4 + len(crc_body)  # leader epoch + magic + crc + rest
    return (
        struct.pack(">qiibI", base_offset, batch_length, partition_leader_epoch, 2, crc) + crc_body
    )


# --------------------------------------------------------------------------- indexes


def offset_index_entry(relative_offset: int, position: int) -> bytes:
    return _OFFSET_ENTRY.pack(relative_offset, position)


def time_index_entry(timestamp_ms: int, relative_offset: int) -> bytes:
    return _TIME_ENTRY.pack(timestamp_ms, relative_offset)


def preallocate(path: str | os.PathLike[str], nbytes: int, entry_size: int) -> None:
    """Grow to ``segment.index.bytes`` rounded down to whole entries, as a sparse tail.

    Kafka's ``AbstractIndex`` sets the file length (``RandomAccessFile.setLength``), which
    allocates nothing: the tail is a hole until entries are written into it.
    """
    os.truncate(path, nbytes - nbytes % entry_size)


@dataclass
class IndexBuilder:
    """``LogSegment.append``'s index bookkeeping for one segment (pure, mutable builder).

    Kept apart from any file so that a whole-file writer (the tests' generator) and an
    appending one (``ActiveSegment``) decide index entries by the same rule: an offset entry
    and, if the max timestamp grew, a time entry once *more than* ``index_interval_bytes``
    were appended since the last entry; on roll the segment's max timestamp ends the time
    index (``onBecomeInactiveSegment``).
    """

    base_offset: int
    index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES
    max_timestamp_ms: int = -1
    offset_of_max_timestamp: int = field(init=False)
    bytes_since_entry: int = 0
    offset_entries: list[tuple[int, int]] = field(default_factory=list)
    time_entries: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.offset_of_max_timestamp = self.base_offset

    def append(
        self, position: int, last_offset: int, batch_max_timestamp_ms: int, batch_size: int
    ) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
        """Account one appended batch; returns the (offset, time) entries it adds, if any."""
        if batch_max_timestamp_ms > self.max_timestamp_ms:
            self.max_timestamp_ms = batch_max_timestamp_ms
            self.offset_of_max_timestamp = last_offset
        offset_entry: tuple[int, int] | None = None
        time_entry: tuple[int, int] | None = None
        if self.bytes_since_entry > self.index_interval_bytes:
            offset_entry = (last_offset - self.base_offset, position)
            self.offset_entries.append(offset_entry)
            time_entry = self._maybe_time_entry()
            self.bytes_since_entry = 0
        self.bytes_since_entry += batch_size
        return offset_entry, time_entry

    def close(self) -> tuple[int, int] | None:
        """The final time entry a clean roll appends (None when it would not grow the index)."""
        return self._maybe_time_entry()

    def _maybe_time_entry(self) -> tuple[int, int] | None:
        if self.time_entries and self.max_timestamp_ms <= self.time_entries[-1][0]:
            return None
        entry = (self.max_timestamp_ms, self.offset_of_max_timestamp - self.base_offset)
        self.time_entries.append(entry)
        return entry


class ActiveSegment:
    """The segment a broker is appending to, on disk as the broker keeps it at every moment.

    Created with an empty ``.log`` and both indexes preallocated sparse; each ``append``
    writes one batch with one ``write`` (a reader sees whole batches or a cut-off tail, which
    Kafka's readers tolerate) and its index entries in place. ``roll`` finishes it the way a
    clean roll does, *before* the caller creates the next segment: only then may a reader
    see a newer segment and treat this one as closed (deletable).
    """

    def __init__(
        self,
        partition_dir: str | os.PathLike[str],
        base_offset: int,
        *,
        leader_epoch: int = 0,
        index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
        segment_index_bytes: int = DEFAULT_SEGMENT_INDEX_BYTES,
    ) -> None:
        directory = Path(partition_dir)
        self.base_offset = base_offset
        self.next_offset = base_offset
        self.size = 0
        self.leader_epoch = leader_epoch
        self.log_path = directory / segment_file_name(base_offset, ".log")
        self.index_path = directory / segment_file_name(base_offset, ".index")
        self.timeindex_path = directory / segment_file_name(base_offset, ".timeindex")
        self.indexes = IndexBuilder(base_offset, index_interval_bytes)
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
        self._index_fd = os.open(self.index_path, flags, 0o644)
        self._timeindex_fd = os.open(self.timeindex_path, flags, 0o644)
        preallocate(self.index_path, segment_index_bytes, OFFSET_INDEX_ENTRY)
        preallocate(self.timeindex_path, segment_index_bytes, TIME_INDEX_ENTRY)
        self._log_fd = os.open(self.log_path, flags | os.O_APPEND | os.O_EXCL, 0o644)
        self._closed = False

    def append(self, timestamps_ms: Sequence[int], values: Sequence[bytes | None]) -> int:
        """Append one batch of records; returns its size in bytes."""
        if self._closed:
            raise ValueError(f"{self.log_path}: segment already rolled")
        batch = encode_batch(
            self.next_offset, timestamps_ms, values, partition_leader_epoch=self.leader_epoch
        )
        position = self.size
        os.write(self._log_fd, batch)
        last_offset = self.next_offset + len(values) - 1
        offset_entry, time_entry = self.indexes.append(
            position, last_offset, max(timestamps_ms), len(batch)
        )
        if offset_entry is not None:
            slot = len(self.indexes.offset_entries) - 1
            os.pwrite(self._index_fd, offset_index_entry(*offset_entry), slot * OFFSET_INDEX_ENTRY)
        if time_entry is not None:
            self._write_time_entry(time_entry)
        self.size += len(batch)
        self.next_offset = last_offset + 1
        return len(batch)

    def _write_time_entry(self, entry: tuple[int, int]) -> None:
        slot = len(self.indexes.time_entries) - 1
        os.pwrite(self._timeindex_fd, time_index_entry(*entry), slot * TIME_INDEX_ENTRY)

    def roll(self) -> None:
        """Close cleanly: final time entry, indexes trimmed to their entries, files closed."""
        if self._closed:
            return
        final = self.indexes.close()
        if final is not None:
            self._write_time_entry(final)
        os.ftruncate(self._index_fd, len(self.indexes.offset_entries) * OFFSET_INDEX_ENTRY)
        os.ftruncate(self._timeindex_fd, len(self.indexes.time_entries) * TIME_INDEX_ENTRY)
        self.close()

    def close(self) -> None:
        """Close the files without rolling: what a broker that stops uncleanly leaves."""
        if self._closed:
            return
        self._closed = True
        for fd in (self._log_fd, self._index_fd, self._timeindex_fd):
            os.close(fd)


# --------------------------------------------------------------------------- small files


def empty_producer_snapshot() -> bytes:
    """A valid producer-state snapshot with no producers (version 1, CRC32C, 0 entries)."""
    entries = struct.pack(">i", 0)
    return struct.pack(">hI", 1, crc32c.crc32c(entries)) + entries


def topic_id(topic: str) -> str:
    """A stable Kafka-style topic id (base64url UUID without padding) for ``topic``."""
    raw = uuid.uuid5(uuid.NAMESPACE_URL, f"kafka-topic:{topic}").bytes
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def write_checkpoint(path: str | os.PathLike[str], entries: Sequence[tuple[str, int, int]]) -> None:
    """Kafka's OffsetCheckpointFile: version ``0``, count, then ``topic partition offset``."""
    lines = ["0", str(len(entries))] + [f"{t} {p} {o}" for t, p, o in entries]
    Path(path).write_text("\n".join(lines) + "\n")
