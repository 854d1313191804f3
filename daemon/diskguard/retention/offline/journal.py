"""The offline journal: what the file executor is about to do, durably, before it does it.

``<state_dir>/offline-journal.jsonl`` holds one JSON record per line: an ``intent`` naming the
exact files of a deletion (or a sweep) before anything is touched, ``done`` once it is
resolved, and in between ``claim`` (a new owner), ``audited`` (a sweep item's audit intent is
durable) and ``settled`` (segments of a batch resolved while the batch stays open). An entry
without ``done`` is *open*: ``recovery`` resolves it.

Two processes (the daemon and ``enforce --once``, say) share the journal. Every entry records
its *owner* (pid, the process's start time from ``/proc/PID/stat`` and the boot id, so a
reused pid is not mistaken for it); an entry whose owner is alive is in flight and is left
alone — no abandon, no audit line. An orphaned entry is first *claimed* (a journal record
naming the new owner) and only then acted on, so two recoverers never both finish it.
Every journal mutation holds an flock on ``<state_dir>/offline-journal.lock`` (never the log
dir's ``.lock``: see lockfile's POSIX-lock trap), so compaction cannot truncate another
process's fresh intent.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from diskguard.logs import get_logger
from diskguard.retention.audit import AuditLog, append_line
from diskguard.retention.executor import audit_outcome

log = get_logger("diskguard.offline")

JOURNAL_FILE = "offline-journal.jsonl"
JOURNAL_LOCK_FILE = "offline-journal.lock"

# Journal entry kinds (``kind`` of an ``intent``; absent in old journals = segment).
SEGMENT = "segment"
BATCH = "batch"  # segment deletions of one log dir, one lock hold: ``segments`` sub-entries
SWEEP = "sweep"  # one log dir's sweep; no audit line of its own
SWEEP_DIR = "sweep_dir"  # one -delete dir
SWEEP_FILES = "sweep_files"  # the *.deleted files of one partition dir

CANCELLED = "interrupted before any file was removed; kept, and planned again by the next cycle"


# -- process identity (journal owners) ---------------------------------------------------------
# -- process identity (journal owners) ---------------------------------------------------------
def _proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, starttime)`` of ``pid`` from ``/proc/PID/stat``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = raw.rsplit(b")", 1)[-1].split()
    try:
        return rest[0].decode(), int(rest[19])
    except (IndexError, ValueError):
        return None


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return ""


_identity: tuple[int, dict[str, Any]] | None = None


def process_identity() -> dict[str, Any]:
    """This process as a journal owner: pid, start time (clock ticks after boot), boot id."""
    global _identity
    pid = os.getpid()
    if _identity is None or _identity[0] != pid:  # recomputed in a forked child
        st = _proc_stat(pid)
        _identity = (pid, {"pid": pid, "start": st[1] if st else -1, "boot": _boot_id()})
    return dict(_identity[1])


def owner_alive(owner: object) -> bool:
    """Is the process that wrote (or claimed) a journal entry still running?

    Same boot, same pid, same start time, not a zombie: a reused pid has another start time.
    An entry without an owner (an older journal) counts as orphaned, as before owners were
    recorded.
    """
    if not isinstance(owner, dict):
        return False
    try:
        pid, start, boot = int(owner["pid"]), int(owner["start"]), str(owner["boot"])
    except (KeyError, TypeError, ValueError):
        return False
    if pid <= 0 or start < 0 or boot != _boot_id():
        return False
    st = _proc_stat(pid)
    return st is not None and st[1] == start and st[0] not in ("Z", "X")


def is_self(owner: object) -> bool:
    return isinstance(owner, dict) and owner == process_identity()


class Journal:
    """The journal file of one state dir; its records, lock and open entries."""

    def __init__(self, state_dir: Path, audit: AuditLog) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / JOURNAL_FILE
        self.lock_path = self.state_dir / JOURNAL_LOCK_FILE
        #: Its reserve gives a chunk back on a full disk; abandoned entries get their outcome.
        self.audit = audit
        self._jmutex = threading.RLock()
        self._jdepth = 0

    def has_open_entries(self) -> bool:
        """Cheap (one ``stat`` when the journal is empty, as it is between deletions)."""
        try:
            if self.path.stat().st_size == 0:
                return False
        except OSError:
            return False
        return bool(self.open_entries())

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """flock on ``offline-journal.lock``, re-entrant within this journal."""
        with self._jmutex:
            if self._jdepth:
                self._jdepth += 1
                try:
                    yield
                finally:
                    self._jdepth -= 1
                return
            self.state_dir.mkdir(parents=True, exist_ok=True)
            while True:
                try:
                    fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                    break
                except OSError as exc:
                    # A full state dir: the audit reserve gives a chunk back, as for appends.
                    if exc.errno == errno.ENOSPC and self.audit.make_room():
                        continue
                    raise
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._jdepth = 1
                try:
                    yield
                finally:
                    self._jdepth = 0
            finally:
                os.close(fd)

    def append(self, record: Mapping[str, Any]) -> None:
        data = (json.dumps(dict(record), sort_keys=True) + "\n").encode()
        with self.lock():
            append_line(self.path, data, self.audit.make_room)

    def close(
        self, entry: Mapping[str, Any], cancelled: str | None = None, abandoned: str | None = None
    ) -> None:
        """Journal ``done`` for an entry (best effort: a lost ``done`` only means recovery
        looks at the entry again and finds nothing left to do)."""
        if entry.get("_in_batch"):
            return  # its batch entry is closed once all its segments are resolved
        record: dict[str, Any] = {"op": "done", "action_id": entry["action_id"]}
        if cancelled:
            record["cancelled"] = cancelled
        if abandoned:
            record["abandoned"] = abandoned
        try:
            self.append(record)
        except OSError as exc:
            log.warning("offline_journal_done_failed", error=str(exc))

    def claim_orphans(self, log_dir_real: str) -> list[dict[str, Any]]:
        """Open entries of ``log_dir_real`` whose owner is gone (or is this process), now
        owned by this process — under the journal lock, so no other recoverer takes them too.
        Entries of a live owner are in flight: skipped, untouched, unaudited."""
        claimed: list[dict[str, Any]] = []
        with contextlib.suppress(OSError), self.lock():
            me = process_identity()
            for entry in self.open_entries():
                if entry.get("log_dir_real") != log_dir_real:
                    continue
                owner = entry.get("owner")
                if is_self(owner):
                    claimed.append(entry)
                    continue
                if owner_alive(owner):
                    log.info(
                        "offline_recover_skipped",
                        action_id=entry.get("action_id"),
                        owner_pid=owner.get("pid") if isinstance(owner, dict) else None,
                        reason="its owner process is still running",
                    )
                    continue
                self.append({"op": "claim", "action_id": entry["action_id"], "owner": me})
                claimed.append({**entry, "owner": me})
        claimed.sort(key=lambda e: e.get("kind") == SWEEP)
        return claimed

    def open_entries(self) -> list[dict[str, Any]]:
        """Intents without a ``done``; a torn last line is an intent never made durable, and
        nothing was renamed before an intent was durable, so it is ignored. ``claim`` records
        move an entry to a new owner; ``audited`` marks a sweep entry's audit intent durable."""
        intents: dict[str, dict[str, Any]] = {}
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        for line in raw.split(b"\n")[:-1]:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict) or "action_id" not in rec:
                continue
            action_id = str(rec["action_id"])
            op = rec.get("op")
            if op == "intent":
                intents[action_id] = rec
            elif op == "done":
                intents.pop(action_id, None)
            elif op == "claim" and action_id in intents:
                intents[action_id] = {**intents[action_id], "owner": rec.get("owner")}
            elif op == "audited" and action_id in intents:
                intents[action_id] = {**intents[action_id], "_audited": True}
            elif op == "settled" and action_id in intents:
                # Segments of a batch already resolved (the batch stays open for the rest).
                gone = {str(a) for a in rec.get("segments", []) if isinstance(a, str)}
                subs = intents[action_id].get("segments")
                if isinstance(subs, list):
                    keep = [
                        x for x in subs if not (isinstance(x, dict) and x.get("action_id") in gone)
                    ]
                    intents[action_id] = {**intents[action_id], "segments": keep}
        return list(intents.values())

    def compact(self) -> None:
        """Empty the journal once nothing in it is open (truncating never needs free space).
        Under the journal lock: another process's append cannot land between the check and
        the truncate."""
        try:
            with self.lock():
                if self.path.stat().st_size == 0 or self.open_entries():
                    return
                fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
                try:
                    os.ftruncate(fd, 0)
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("offline_journal_compact_failed", error=str(exc))

    def abandon(self, entry: dict[str, Any], why: str) -> None:
        """Close ``entry`` as abandoned: its audit outcome (``failed``, ``why``) first."""
        log.warning("offline_recover_abandoned", action_id=entry.get("action_id"), reason=why)
        if str(entry.get("kind", SEGMENT)) != SWEEP:  # a sweep session has no audit line
            audit_outcome(
                self.audit, str(entry["action_id"]), False, 0, why, entry.get("fields", {}), log
            )
        self.close(entry, abandoned=why)


def batch_subs(entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A batch entry's segments as segment entries of their own (``_in_batch``: no
    journal record of their own; the batch closes once all are resolved)."""
    subs: list[dict[str, Any]] = []
    raw = entry.get("segments")
    for sub in raw if isinstance(raw, list) else []:
        if not isinstance(sub, dict) or "action_id" not in sub:
            continue
        subs.append(
            {
                **sub,
                "op": "intent",
                "kind": SEGMENT,
                "audit_offset": entry.get("audit_offset", 0),
                "log_dir_real": entry.get("log_dir_real", ""),
                "owner": entry.get("owner"),
                "_in_batch": True,
            }
        )
    return subs
