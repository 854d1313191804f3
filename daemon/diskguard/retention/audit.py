"""The append-only audit log: every deletion is written down *before* it happens.

Size: over 400 lines: the writer, its full-disk reserve and the readers share one line format.

One JSON object per line in ``<state_dir>/audit.jsonl``, flushed and fsync'd per line, so that
after a crash the log says what diskguard set out to delete (phase ``intent``) and what came
of it (``done``, ``failed``, ``refused``). An action without its audit line is not allowed:
when the line cannot be written, ``before`` raises ``AuditWriteFailed`` and the executor must
not delete.

The 100%-full-disk case: when the state dir shares the filesystem it guards, the very
situation diskguard exists for (no free block) would make the audit line unwritable and block
every deletion. ``AuditLog`` therefore keeps a small pre-allocated *reserve* file
(``audit.reserve``, 1 MiB by default) next to the log: on ENOSPC it shrinks the reserve by one
chunk and retries, so a full disk still gets its audit lines (thousands of them per MiB). The
reserve is topped up again once deletions have freed space. If the reserve is used up (or was
never allocated because the disk was already full at start), deletions are refused — the
operator then frees space by hand (or uses a ballast file) and the next cycle proceeds.

A failed append never leaves a torn line behind: the file is truncated back to its previous
length, so later lines stay parseable. ``read_audit`` still tolerates a torn last line (power
loss between write and fsync).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import os
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Types only: status reads the audit log without importing the planner (start-up).
    from diskguard.retention.planner import Deletion

AUDIT_FILE = "audit.jsonl"
RESERVE_FILE = "audit.reserve"
DEFAULT_RESERVE_BYTES = 1024 * 1024
_RESERVE_CHUNK = 64 * 1024

INTENT = "intent"
DONE = "done"
FAILED = "failed"
REFUSED = "refused"

#: ``kind`` of the lines of an offline sweep: a ``-delete`` dir or a partition dir's leftover
#: ``*.deleted`` segment files removed (what Kafka itself removes at start-up). Lines without
#: a ``kind`` are segment deletions.
SWEPT = "swept"
SWEPT_DELETE_DIR = "delete_dir"
SWEPT_DELETED_FILES = "deleted_files"


class AuditWriteFailed(Exception):
    """The audit line could not be made durable; the action it describes must not happen."""


def reason_text(d: Deletion) -> str:
    """The human ``why`` for a deletion, shared by both executors' audit lines."""
    if d.reason == "max_bytes":
        return "log dir over retention.max_bytes; globally oldest closed segment"
    return "filesystem over retention.disk_usage_percent; globally oldest closed segment"


#: What a deletion reaches, by executor: DeleteRecords trims every replica of the partition.
SCOPES = {
    "broker": "cluster: DeleteRecords moves the partition's log start offset on every replica",
    "offline": "local: files in this broker's log dir only",
}


def deletion_fields(d: Deletion) -> dict[str, Any]:
    return {
        "mount": d.mount,
        "log_dir": d.log_dir,
        "topic": d.topic,
        "partition": d.partition,
        "base_offset": d.base_offset,
        "next_offset": d.next_offset,
        "bytes": d.bytes,
        "max_timestamp_ms": d.max_timestamp_ms,
        #: The planner's rule ("disk_usage_percent" | "max_bytes"); ``reason`` is the prose.
        "rule": d.reason,
        #: The ladder's last rung: data deleted (evictions and moves are kinds of their own).
        "rung": "delete",
    }


def placement_fields(d: Deletion) -> dict[str, Any]:
    """Broker mode: the partition's leader, its replicas and the other brokers whose replicas
    the trim shortens (``also_trims``); nothing when the cluster did not say."""
    if not d.replicas:
        return {}
    return {"leader": d.leader, "replicas": list(d.replicas), "also_trims": list(d.also_trims)}


def why_fields(d: Deletion) -> dict[str, Any]:
    """``{"why": {...}}`` for a deletion a plan chose (``order.Why``: the limit in force, the
    trigger, the excess, its rank and tie-breaker); nothing for one recovered from the
    journal. The audit lines only gain this field."""
    return {"why": d.why.fields()} if d.why is not None else {}


def sweep_fields(
    what: str,
    log_dir: str,
    path: str,
    topic: str,
    partition: int,
    files: int,
    nbytes: int,
    names: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The fields of a ``swept`` audit line: ``path`` is the ``-delete`` dir, or the partition
    dir whose ``names`` (``*.deleted`` files) go; ``bytes`` as measured just before."""
    why = (
        "a -delete dir (topic or replica already deleted; Kafka removes it after start-up)"
        if what == SWEPT_DELETE_DIR
        else "leftover *.deleted segment files (Kafka removes them at start-up)"
    )
    fields: dict[str, Any] = {
        "kind": SWEPT,
        "what": what,
        "mode": "offline",
        "log_dir": log_dir,
        "path": path,
        "topic": topic,
        "partition": partition,
        "files": files,
        "bytes": nbytes,
        "rule": SWEPT,
        "reason": why,
    }
    if names:
        fields["names"] = list(names)
    return fields


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def append_line(path: Path, data: bytes, make_room: Any = None) -> None:
    """Append ``data`` (one full line) durably; on failure restore the previous length.

    ``make_room`` (optional) is called on ENOSPC and returns True if it freed something
    worth a retry.
    """
    while True:
        try:
            _append_once(path, data)
            return
        except OSError as exc:
            if exc.errno == errno.ENOSPC and make_room is not None and make_room():
                continue
            raise


def _append_once(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        # Two processes (a daemon and ``enforce --once``) may append to the same file: the
        # torn-line repair and the truncate-back on failure below must not cut the other's
        # line. flock (BSD) is per open file, so closing other fds never drops it.
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            # A torn line from a crash/power loss: end it, so it stays one unparseable line
            # (readers skip it) instead of swallowing the line written now.
            data = b"\n" + data
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


class AuditLog:
    """Appends audit lines to ``path`` (``<state_dir>/audit.jsonl``)."""

    def __init__(self, path: Path, reserve_bytes: int = DEFAULT_RESERVE_BYTES) -> None:
        self.path = Path(path)
        self.reserve_path = self.path.with_name(RESERVE_FILE)
        self.reserve_bytes = reserve_bytes
        self._lock = threading.Lock()
        #: action id -> the intent's deletion fields, repeated on the outcome line.
        self._pending: dict[str, dict[str, Any]] = {}

    # -- reserve -------------------------------------------------------------
    def ensure_reserve(self) -> bool:
        """Top the reserve file up to ``reserve_bytes`` (best effort); True when it is full."""
        if self.reserve_bytes <= 0 or not self.path.parent.is_dir():
            return False
        try:
            fd = os.open(self.reserve_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            return False
        try:
            have = os.fstat(fd).st_size
            if have >= self.reserve_bytes:
                return True
            st = os.fstatvfs(fd)
            if st.f_bavail * st.f_frsize < 8 * (self.reserve_bytes - have):
                # Not while space is short: a failed fallocate may keep what it grabbed.
                return False
            os.posix_fallocate(fd, 0, self.reserve_bytes)
            os.fsync(fd)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    def prepare(self) -> bool:
        """Make the reserve now, whenever the state dir exists, not at the first deletion:
        a routine run that deleted nothing used to leave a state dir without one, and the
        rescue of that disk at 100 % then could not write its journal or audit line, so
        nothing went. False (and ``audit_reserve_unavailable`` says why) when it cannot."""
        if self.ensure_reserve():
            return True
        from diskguard.logs import get_logger  # the rare path; readers never log

        get_logger("diskguard.retention").warning(
            "audit_reserve_unavailable",
            path=str(self.reserve_path),
            reason=f"could not be made ({self._free_text()}): {self.consequence}",
        )
        return False

    #: What a missing or used-up reserve means, said wherever it shows.
    consequence = (
        "on a full disk shared with the state dir, deletions cannot be audited and are "
        "refused until space is freed by hand (or `diskguard ballast release`)"
    )

    def _free_text(self) -> str:
        try:
            st = os.statvfs(self.path.parent)
        except OSError as exc:
            return f"its filesystem cannot be read: {exc.strerror or exc}"
        return f"{st.f_bavail * st.f_frsize} bytes free on its filesystem"

    def full_disk_note(self) -> str:
        """Said with an ENOSPC of the audit log or the journal: the reserve is spent or was
        never made, rather than the bare error (which reads like any other failure)."""
        try:
            size = os.stat(self.reserve_path).st_size
        except OSError:
            size = -1
        state = "is used up" if size >= 0 else "does not exist"
        return f"the audit reserve {self.reserve_path} {state}; {self.consequence}"

    def make_room(self) -> bool:
        """Give one chunk of the reserve back to the filesystem; False when nothing is left."""
        try:
            size = os.stat(self.reserve_path).st_size
        except OSError:
            return False
        if size <= 0:
            return False
        try:
            os.truncate(self.reserve_path, max(0, size - _RESERVE_CHUNK))
        except OSError:
            return False
        return True

    # -- writing -------------------------------------------------------------
    def append(self, record: Mapping[str, Any]) -> None:
        """Write one line durably or raise ``AuditWriteFailed``."""
        self.append_many([record])

    def append_many(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Write several lines with ONE write and ONE fsync, or none of them (the append is
        rolled back on failure). Offline batches use it: one audit record per segment
        deletion, but one durability point per batch instead of one per line."""
        data = b"".join(
            (json.dumps(dict(r), sort_keys=False, default=str) + "\n").encode() for r in records
        )
        if not data:
            return
        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                append_line(self.path, data, self.make_room)
            except OSError as exc:
                note = f" ({self.full_disk_note()})" if exc.errno == errno.ENOSPC else ""
                raise AuditWriteFailed(
                    f"cannot write {self.path}: {exc.strerror or exc}{note}"
                ) from exc

    def before_many(self, items: Sequence[tuple[Deletion, str, float, str, str]]) -> None:
        """``before`` for ``(deletion, why, usage_before_percent, mode, action_id)`` items:
        the same intent lines, made durable together (``append_many``)."""
        if not self.reserve_path.exists():
            self.ensure_reserve()
        records: list[dict[str, Any]] = []
        pending: dict[str, dict[str, Any]] = {}
        for deletion, why, usage, mode, action_id in items:
            fields = {
                **deletion_fields(deletion),
                "mode": mode,
                "scope": SCOPES.get(mode, mode),
                "reason": why,
                "usage_before_percent": round(usage, 3),
                "unconsumed_records": dict(deletion.unconsumed_records),
                **placement_fields(deletion),
                **why_fields(deletion),
            }
            records.append({"ts": _now(), "action_id": action_id, "phase": INTENT, **fields})
            pending[action_id] = fields
        self.append_many(records)
        self._pending.update(pending)

    def after_many(self, items: Sequence[tuple[str, bool, int, str | None]]) -> None:
        """``after`` for ``(action_id, ok, freed_bytes, error)`` items of intents this
        process wrote: the same outcome lines, made durable together."""
        records = [
            {
                "ts": _now(),
                "action_id": action_id,
                "phase": DONE if ok else FAILED,
                **self._pending.get(action_id, {}),
                "freed_bytes": freed,
                "error": error,
            }
            for action_id, ok, freed, error in items
        ]
        self.append_many(records)
        for action_id, *_ in items:
            self._pending.pop(action_id, None)
        if any(ok and freed > 0 for _, ok, freed, _ in items):
            self.ensure_reserve()

    def intent(self, fields: Mapping[str, Any], action_id: str | None = None) -> str:
        """Record the intent of an action that is not a segment deletion (``sweep_fields``);
        returns the action id for ``after`` (``action_id`` when the caller chose it, e.g. to
        journal it first)."""
        if not self.reserve_path.exists():
            self.ensure_reserve()
        action_id = action_id or uuid.uuid4().hex[:16]
        self.append({"ts": _now(), "action_id": action_id, "phase": INTENT, **fields})
        self._pending[action_id] = dict(fields)
        return action_id

    def before(
        self,
        deletion: Deletion,
        why: str,
        usage_before_percent: float,
        mode: str,
        action_id: str | None = None,
    ) -> str:
        """Record the intent to delete; returns the action id for ``after`` (``action_id``
        when the caller chose it, e.g. to journal it first)."""
        if not self.reserve_path.exists():
            self.ensure_reserve()
        action_id = action_id or uuid.uuid4().hex[:16]
        fields = {
            **deletion_fields(deletion),
            "mode": mode,
            "scope": SCOPES.get(mode, mode),
            "reason": why,
            "usage_before_percent": round(usage_before_percent, 3),
            "unconsumed_records": dict(deletion.unconsumed_records),
            **placement_fields(deletion),
            **why_fields(deletion),
        }
        self.append({"ts": _now(), "action_id": action_id, "phase": INTENT, **fields})
        self._pending[action_id] = fields
        return action_id

    def after(
        self,
        action_id: str,
        ok: bool,
        freed_bytes: int,
        error: str | None,
        context: Mapping[str, Any] | None = None,
    ) -> None:
        """Record the outcome of ``action_id``; ``context`` supplies the intent's fields when
        this process did not write the intent (crash recovery)."""
        fields = self._pending.pop(action_id, None) or dict(context or {})
        self.append(
            {
                "ts": _now(),
                "action_id": action_id,
                "phase": DONE if ok else FAILED,
                **fields,
                "freed_bytes": freed_bytes,
                "error": error,
            }
        )
        if ok and freed_bytes > 0:
            self.ensure_reserve()

    def size(self) -> int:
        """The log's current length: where lines written from now on start."""
        try:
            return os.stat(self.path).st_size
        except OSError:
            return 0

    def outcome_of(self, action_id: str, offset: int = 0) -> dict[str, Any] | None:
        """The outcome line of ``action_id`` written at or after ``offset`` (see ``size``), or
        None. Crash recovery asks before writing one, so an action never gets two outcomes
        when the process died between its audit outcome and its journal ``done``."""
        try:
            with open(self.path, "rb") as fh:
                end = fh.seek(0, os.SEEK_END)
                fh.seek(offset if 0 <= offset <= end else 0)
                data = fh.read()
        except OSError:
            return None
        found: dict[str, Any] | None = None
        for raw in data.split(b"\n")[:-1]:
            if action_id.encode() not in raw:
                continue
            try:
                value = json.loads(raw)
            except ValueError:
                continue
            if (
                isinstance(value, dict)
                and value.get("action_id") == action_id
                and value.get("phase") != INTENT
            ):
                found = value
        return found

    def refused(
        self, deletion: Deletion, why: str, usage_before_percent: float, mode: str, error: str
    ) -> str:
        """Record a deletion that was chosen but not attempted (one line, no intent)."""
        action_id = uuid.uuid4().hex[:16]
        self.append(
            {
                "ts": _now(),
                "action_id": action_id,
                "phase": REFUSED,
                **deletion_fields(deletion),
                "mode": mode,
                "scope": SCOPES.get(mode, mode),
                "reason": why,
                "usage_before_percent": round(usage_before_percent, 3),
                "unconsumed_records": dict(deletion.unconsumed_records),
                **placement_fields(deletion),
                **why_fields(deletion),
                "freed_bytes": 0,
                "error": error,
            }
        )
        return action_id


def read_audit(path: Path) -> Iterator[dict[str, Any]]:
    """Every well-formed line of the audit log, oldest first.

    A torn last line (crash between write and fsync) is skipped, as is any line that is not
    a JSON object: the reader of an audit log must never fail on the log's own damage.
    """
    try:
        fh = open(path, "rb")  # noqa: SIM115 - iterated lazily below
    except FileNotFoundError:
        return
    with fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                return  # torn last line
            try:
                value = json.loads(raw)
            except ValueError:
                continue
            if isinstance(value, dict):
                yield value


@dataclass(frozen=True)
class AuditAction:
    """One action as the log tells it: its intent (absent for a bare ``refused`` line) and
    its outcome (absent when the process died in between, or the outcome line was lost)."""

    action_id: str
    intent: Mapping[str, Any] | None
    outcome: Mapping[str, Any] | None

    @property
    def first(self) -> Mapping[str, Any]:
        line = self.intent or self.outcome
        assert line is not None
        return line

    @property
    def lines(self) -> tuple[Mapping[str, Any], ...]:
        return tuple(x for x in (self.intent, self.outcome) if x is not None)


def pair_actions(lines: Iterator[dict[str, Any]] | list[dict[str, Any]]) -> list[AuditAction]:
    """Intent and outcome lines joined by ``action_id``, in the order actions started. Pure."""
    intents: dict[str, dict[str, Any]] = {}
    outcomes: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    for line in lines:
        action_id = str(line.get("action_id", ""))
        if not action_id:
            continue
        if action_id not in intents and action_id not in outcomes:
            order.append(action_id)
        if line.get("phase") == INTENT:
            intents[action_id] = line
        else:
            outcomes[action_id] = line
    return [AuditAction(a, intents.get(a), outcomes.get(a)) for a in order]
