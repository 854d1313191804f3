"""The durable snapshot spool: JSON lines on local disk until Kafka has them.

Snapshots matter most when things go wrong (a broker down, a disk filling), which is exactly
when shipping them fails. So every record goes to disk first, fsynced, and the Kafka sink
ships from here, advancing a cursor only over records the broker acknowledged.

Layout under the spool dir (``<state_dir>/spool``)::

    00000000000000000007.jsonl   one record per line, appended with flush + fsync
    00000000000000000008.jsonl   the current file (highest sequence number)
    shipped.json                 {"seq": 7, "offset": 1234}: everything before is delivered
    .lock                        flock: one daemon per spool

Rules that keep it safe:

- Bounded: the spool never holds more than ``max_bytes``; past that, the OLDEST file goes,
  counted and logged (``spool_dropped``). The daemon must never fill the disk it guards.
- A write that fails (ENOSPC, EIO, ...) is logged (``spool_write_failed``), never raised into
  the daemon loop, and the record waits in a small in-memory queue for the next append.
  A half-written line is truncated away at once so the next record starts clean.
- A torn last line (the process killed mid-write) is cut off when the spool is opened, and
  any line that is not a complete JSON object is skipped when reading. A record whose
  ``append`` returned is on disk and is never lost to a later crash.

Size: one class over one directory; its rules (bound, cursor, torn tails, the memory queue)
hold each other up, and split apart they would each need the others' invariants.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from diskguard.host.atomicfile import fsync_dir, write_json_atomic
from diskguard.logs import get_logger
from diskguard.snapshots.record import encode_record

log = get_logger("diskguard.spool")

CURSOR_NAME = "shipped.json"
LOCK_NAME = ".lock"
SUFFIX = ".jsonl"
#: Records kept in memory while the disk refuses writes; beyond this the oldest are dropped.
MEMORY_QUEUE_RECORDS = 1000


class SpoolError(Exception):
    """The spool cannot be used at all (dir not creatable, locked by another process)."""


@dataclass(frozen=True, order=True)
class SpoolPosition:
    """Just past one record: file sequence number and byte offset after its newline.

    Positions order like the records they follow, so "shipped up to P" is one comparison.
    """

    seq: int
    offset: int


def _file_name(seq: int) -> str:
    return f"{seq:020d}{SUFFIX}"


class Spool:
    """Append-only, size-bounded, crash-safe record spool with a shipping cursor.

    Not thread-safe: the daemon loop owns it. ``file_bytes`` is clamped to half of
    ``max_bytes`` so that dropping the oldest file can always bring the spool back under its
    bound.
    """

    def __init__(self, dir: Path, max_bytes: int, file_bytes: int) -> None:
        if max_bytes <= 0 or file_bytes <= 0:
            raise ValueError("spool max_bytes and file_bytes must be positive")
        self.dir = dir
        self.max_bytes = max_bytes
        self.file_bytes = max(1, min(file_bytes, max_bytes // 2))
        #: Unshipped records lost to the size bound or to the in-memory queue overflowing.
        self.dropped_records = 0
        #: Spool files removed to keep under ``max_bytes``.
        self.dropped_files = 0
        #: Appends that failed to reach the disk (each retried later from memory).
        self.write_failures = 0
        self._queue: deque[bytes] = deque()
        self._read_failed = False
        self._failing_since: float | None = None
        self._last_failure_log = 0.0
        self._fd: int | None = None
        self._lock_fd: int | None = None
        try:
            dir.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise SpoolError(f"spool dir {dir}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise SpoolError(f"spool dir {dir} is in use by another process") from None
        self._cursor = self._read_cursor()
        #: seq -> size in bytes of every spool file, oldest first.
        self._sizes: dict[int, int] = {}
        try:
            for path in sorted(dir.glob("*" + SUFFIX)):
                stem = path.name.removesuffix(SUFFIX)
                if stem.isdigit():
                    self._sizes[int(stem)] = self._repair_tail(path)
        except OSError as exc:
            self.close()
            raise SpoolError(f"spool file {exc.filename}: {exc.strerror or exc}") from None
        if self._sizes:
            self._seq = max(self._sizes)
        else:
            self._seq = self._cursor.seq + 1 if self._cursor is not None else 0
        #: Set when a failed write could not be undone; the next append starts a new file.
        self._needs_rotation = False
        self._remove_shipped_files()

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> Spool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- state -----------------------------------------------------------------------------

    @property
    def cursor(self) -> SpoolPosition | None:
        """Everything up to here was delivered; None = nothing shipped yet."""
        return self._cursor

    @property
    def total_bytes(self) -> int:
        return sum(self._sizes.values())

    @property
    def queued_in_memory(self) -> int:
        """Records waiting for the disk to accept writes again."""
        return len(self._queue)

    def files(self) -> list[Path]:
        return [self.dir / _file_name(seq) for seq in self._sizes]

    # -- writing ---------------------------------------------------------------------------

    def append(self, record: Mapping[str, Any]) -> SpoolPosition | None:
        """Write one record durably; its position, or None if it is only queued in memory.

        Records queued by earlier failed appends are written first, so order is kept.
        Never raises for I/O errors: the daemon loop must not die because its own disk
        is full.
        """
        line = encode_record(record) + b"\n"
        self._queue.append(line)
        if len(self._queue) > MEMORY_QUEUE_RECORDS:
            self._queue.popleft()
            self.dropped_records += 1
            log.warning(
                "spool_dropped",
                reason="memory_queue_full",
                records=1,
                dropped_records=self.dropped_records,
            )
        return self.flush_queue()

    def flush_queue(self) -> SpoolPosition | None:
        """Write queued records to disk; the position of the last one if all were written."""
        position: SpoolPosition | None = None
        while self._queue:
            line = self._queue[0]
            try:
                position = self._write_line(line)
            except OSError as exc:
                self.write_failures += 1
                now = time.monotonic()
                # Once when the trouble starts, then at most once a minute: a full disk
                # retried every cycle must not flood the journal on that same disk.
                if self._failing_since is None or now - self._last_failure_log >= 60.0:
                    self._last_failure_log = now
                    log.error(
                        "spool_write_failed",
                        path=str(self.dir / _file_name(self._seq)),
                        error=exc.strerror or str(exc),
                        errno=errno.errorcode.get(exc.errno or 0, str(exc.errno)),
                        queued=len(self._queue),
                        failures=self.write_failures,
                    )
                if self._failing_since is None:
                    self._failing_since = now
                return None
            self._queue.popleft()
        if self._failing_since is not None:
            log.info(
                "spool_write_recovered",
                failed_for_s=round(time.monotonic() - self._failing_since, 3),
                failures=self.write_failures,
            )
            self._failing_since = None
        return position

    def _write_line(self, line: bytes) -> SpoolPosition:
        size = self._sizes.get(self._seq, 0)
        if self._needs_rotation or (size > 0 and size + len(line) > self.file_bytes):
            self._rotate()
            size = 0
        self._enforce_bound(len(line))
        fd = self._open_current()
        size = self._sizes[self._seq]
        written = 0
        try:
            view = memoryview(line)
            while written < len(line):
                written += os.write(fd, view[written:])
            os.fsync(fd)
        except OSError:
            if written:
                self._undo_partial(fd, size)
            raise
        self._sizes[self._seq] = size + len(line)
        return SpoolPosition(self._seq, size + len(line))

    def _undo_partial(self, fd: int, good_size: int) -> None:
        """Cut a half-written line so the next record does not get glued onto it."""
        try:
            os.ftruncate(fd, good_size)
        except OSError:
            # Leave the torn bytes (readers skip them) and move on to a fresh file.
            self._needs_rotation = True
            self._sizes[self._seq] = os.fstat(fd).st_size

    def _open_current(self) -> int:
        if self._fd is None:
            path = self.dir / _file_name(self._seq)
            created = not path.exists()
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._sizes[self._seq] = os.fstat(self._fd).st_size
            if created:
                fsync_dir(self.dir)
        return self._fd

    def _rotate(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._needs_rotation = False
        self._seq += 1
        self._remove_shipped_files()

    def _enforce_bound(self, incoming: int) -> None:
        """Drop the oldest files (never the current one) until ``incoming`` more bytes fit."""
        while self.total_bytes + incoming > self.max_bytes:
            oldest = next(iter(self._sizes), None)
            if oldest is None or oldest == self._seq:
                return
            records = self._unshipped_records(oldest)
            self._remove(oldest)
            self.dropped_files += 1
            self.dropped_records += records
            log.warning(
                "spool_dropped",
                reason="max_bytes",
                path=str(self.dir / _file_name(oldest)),
                records=records,
                dropped_records=self.dropped_records,
                dropped_files=self.dropped_files,
                max_bytes=self.max_bytes,
            )

    def _unshipped_records(self, seq: int) -> int:
        start = 0
        if self._cursor is not None:
            if self._cursor.seq > seq:
                return 0
            if self._cursor.seq == seq:
                start = self._cursor.offset
        try:
            with open(self.dir / _file_name(seq), "rb") as fh:
                fh.seek(start)
                return fh.read().count(b"\n")
        except OSError:
            return 0

    def _remove(self, seq: int) -> None:
        path = self.dir / _file_name(seq)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            # Forget it anyway: retrying every cycle would not help and must not raise.
            log.warning("spool_remove_failed", path=str(path), error=exc.strerror or str(exc))
        self._sizes.pop(seq, None)

    # -- reading and shipping --------------------------------------------------------------

    def pending(
        self, after: SpoolPosition | None = None
    ) -> Iterator[tuple[SpoolPosition, dict[str, Any]]]:
        """Unshipped records in append order, starting after the cursor (or ``after``).

        Lines that are not a complete JSON object are skipped with a warning, so one bad
        line never stops shipping. Reads only what was fully written when each file is
        opened.
        """
        start = self._cursor
        if after is not None and (start is None or after > start):
            start = after
        for seq in list(self._sizes):
            if start is not None and seq < start.seq:
                continue
            offset = start.offset if start is not None and seq == start.seq else 0
            self._read_failed = False
            yield from self._read_file(seq, offset)
            if self._read_failed:
                return

    def _read_file(self, seq: int, offset: int) -> Iterator[tuple[SpoolPosition, dict[str, Any]]]:
        path = self.dir / _file_name(seq)
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                pos = offset
                for raw in fh:
                    if not raw.endswith(b"\n"):
                        return  # torn or still being written: not a record yet
                    pos += len(raw)
                    record = _parse(raw)
                    if record is None:
                        log.warning("spool_corrupt_line", path=str(path), end_offset=pos)
                        continue
                    yield SpoolPosition(seq, pos), record
        except FileNotFoundError:
            return  # dropped for the size bound while we were reading
        except OSError as exc:
            # Stop here rather than skip ahead: order is kept, and if the file stays
            # unreadable the size bound eventually drops it (counted) and shipping resumes.
            log.error("spool_read_failed", path=str(path), error=exc.strerror or str(exc))
            self._read_failed = True

    def mark_shipped(self, position: SpoolPosition) -> None:
        """Everything up to ``position`` was delivered: persist it, free rotated files."""
        if self._cursor is not None and position <= self._cursor:
            return
        try:
            write_json_atomic(
                self.dir / CURSOR_NAME, {"seq": position.seq, "offset": position.offset}
            )
        except OSError as exc:
            # Not fatal: the cursor lives on in memory; a crash now only means duplicates.
            log.error("spool_cursor_write_failed", error=exc.strerror or str(exc))
        self._cursor = position
        self._remove_shipped_files()

    def _remove_shipped_files(self) -> None:
        cursor = self._cursor
        if cursor is None:
            return
        for seq, size in list(self._sizes.items()):
            if seq == self._seq:
                break
            if seq < cursor.seq or (seq == cursor.seq and cursor.offset >= size):
                self._remove(seq)

    def _read_cursor(self) -> SpoolPosition | None:
        path = self.dir / CURSOR_NAME
        try:
            data = json.loads(path.read_bytes())
            return SpoolPosition(int(data["seq"]), int(data["offset"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Replaying from the start only costs duplicates, which the Spark job removes.
            log.warning("spool_cursor_unreadable", path=str(path), error=str(exc))
            return None

    def _repair_tail(self, path: Path) -> int:
        """Cut a torn last line (killed mid-write); the size of what is left."""
        with open(path, "r+b") as fh:
            size = fh.seek(0, os.SEEK_END)
            if size == 0:
                return 0
            fh.seek(size - 1)
            if fh.read(1) == b"\n":
                return size
            # Scan back in blocks for the last newline; records are small.
            end = size
            keep = 0
            while end > 0:
                start = max(0, end - 65536)
                fh.seek(start)
                block = fh.read(end - start)
                idx = block.rfind(b"\n")
                if idx >= 0:
                    keep = start + idx + 1
                    break
                end = start
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())
        log.warning("spool_torn_tail", path=str(path), truncated_bytes=size - keep)
        return keep


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
