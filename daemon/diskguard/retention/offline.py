"""The offline executor: deletes segment files directly, only while no broker holds the log dir.

This is the rescue path for a broker that cannot start because its disk is full. It is only
ever safe while no other process holds ``<log_dir>/.lock`` (a running broker keeps segments
open: unlinking them frees nothing and corrupts its view), so the lock is *held* for the whole
deletion — a broker started mid-way fails fast instead of loading a half-deleted dir.

Crash safety (borg-style: say what you will do, durably, then do it):

1. a journal entry naming the exact files (``<state_dir>/offline-journal.jsonl``), then the
   audit ``intent`` lines, both fsync'd;
2. rename the segments' own files — ``.log`` first, then ``.index``, ``.timeindex``,
   ``.txnindex``, nothing else — to ``<name>.deleted``, fsync the partition dirs;
3. unlink the ``.deleted`` files, fsync the dirs, audit ``done`` lines, journal ``done``.

Deletions are *batched* (up to ``BATCH_MAX`` per log dir and lock hold): one journal entry
(kind ``batch``) names every segment's files, the audit log still gets one intent and one
outcome line per segment but each set is made durable by one fsync, renames run in plan
order, and each partition dir is fsync'd once after the renames and once after the unlinks.
A segment costs a few renames and unlinks instead of six fsyncs. Recovery resolves a batch
segment by segment: started ones (a prefix of the plan) are finished, untouched ones are
cancelled exactly like an interrupted single entry.

The journal comes first so that every audit intent has a journal entry: ``recover`` always
gives it an outcome. Nothing is renamed before the audit intent is durable, so an entry whose
files are all still in place (a crash before the first rename) is *cancelled* — audit
``failed``, the segment kept and simply planned again — and one whose deletion visibly
started is finished. ``.log`` goes first because from that moment Kafka no longer sees the
segment: if the broker starts before ``recover`` has run, its log loading deletes
``*.deleted`` files and orphaned index files by itself instead of rebuilding indexes of a
half-deleted segment. ``recover`` (daemon start-up; ``enforce --once`` in offline mode) finishes
every journal entry left open by a crash, touching only the files the journal names; the next
``execute`` in the same log dir does the same for that dir, so ``enforce --once`` from cron
heals too.

Sweeps (``recover(sweep_deleted=True)``, which offline cycles run before planning): ``-delete``
dirs and leftover ``*.deleted`` segment files are exactly what Kafka removes itself after
start-up, so with no broker running they go first and only what is still missing comes from
live segments. Each swept dir (or a partition dir's set of ``*.deleted`` files) is one audited
action (``kind: swept``), journalled like a segment: entry, audit intent, an ``audited`` mark,
removal, ``done``. A sweep of a log dir is itself an entry, so a crash anywhere in it makes
the next offline run sweep again even if the disk is below its limit by then.

Two processes (the daemon and ``enforce --once``, say) share the journal. Every entry records
its *owner* (pid, the process's start time from ``/proc/PID/stat`` and the boot id, so a
reused pid is not mistaken for it); an entry whose owner is alive is in flight and is left
alone — no abandon, no audit line. An orphaned entry is first *claimed* (a journal record
naming the new owner) and only then acted on, so two recoverers never both finish it.
Every journal mutation holds an flock on ``<state_dir>/offline-journal.lock`` (never the log
dir's ``.lock``: see lockfile's POSIX-lock trap), so compaction cannot truncate another
process's fresh intent.

Guard rails, re-checked on disk right before each deletion because the plan may be stale:
files must be the segment's own files inside ``<log_dir>/<topic>-<partition>`` (realpath
checks, no symlinks anywhere below the log dir); the segment must not be the active one (a
``.log`` must exist at ``next_offset``, and no other segment may lie between); once a
deletion of a partition fails, later segments of that partition are refused (never a hole).
A file that vanished meanwhile is fine and counts 0 bytes. Freed bytes are allocated blocks
(``st_blocks * 512``) of files with a single link.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diskguard.kafkalog import lockfile
from diskguard.kafkalog.model import (
    DELETED_SUFFIX,
    SEGMENT_FILE_SUFFIXES,
    SNAPSHOT_SUFFIX,
    PartitionDirKind,
    parse_partition_dir,
    parse_segment_file,
    segment_file_name,
)
from diskguard.logs import get_logger
from diskguard.retention.audit import (
    SWEPT_DELETE_DIR,
    SWEPT_DELETED_FILES,
    AuditLog,
    AuditWriteFailed,
    DeletionResult,
    append_line,
    deletion_fields,
    reason_text,
    sweep_fields,
)
from diskguard.retention.planner import Deletion

__all__ = [
    "JOURNAL_FILE",
    "JOURNAL_LOCK_FILE",
    "MODE",
    "DeletionResult",
    "OfflineExecutor",
    "Refused",
    "owner_alive",
    "process_identity",
]

log = get_logger("diskguard.offline")

MODE = "offline"
JOURNAL_FILE = "offline-journal.jsonl"
JOURNAL_LOCK_FILE = "offline-journal.lock"

# Journal entry kinds (``kind`` of an ``intent``; absent in old journals = segment).
_SEGMENT = "segment"
_BATCH = "batch"  # segment deletions of one log dir, one lock hold: ``segments`` sub-entries
_SWEEP = "sweep"  # one log dir's sweep; no audit line of its own
_SWEEP_DIR = "sweep_dir"  # one -delete dir
_SWEEP_FILES = "sweep_files"  # the *.deleted files of one partition dir

#: Segments per batch: one journal record and one audit fsync each. Bounded so that a batch's
#: audit lines (~700 bytes each) fit in the audit reserve on a 100%-full disk, and a journal
#: record stays small enough to re-read on every journal mutation.
BATCH_MAX = 256
#: The first batch of an ``execute`` is small and each next one twice the size: space comes
#: back after the first few fsyncs (a disk over its ceiling needs only the plan's head to get
#: under it), and the large later batches keep the throughput.
BATCH_FIRST = 16

_HOLE = "an older segment of this partition was not deleted (deleting this one would leave a hole)"
_HOLE_IO = "not deleted: an older segment of this partition failed first (no hole)"

CANCELLED = "interrupted before any file was removed; kept, and planned again by the next cycle"


class Refused(Exception):
    """A guard rail said no; the message says which, and nothing was touched."""


@dataclass(frozen=True)
class _Checked:
    partition_dir: str
    #: Names (inside ``partition_dir``) to delete, ``.log`` first.
    names: tuple[str, ...]


#: Test hook: called with a step name before each step that changes the disk.
StepHook = Callable[[str], None]


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


def _is_self(owner: object) -> bool:
    return isinstance(owner, dict) and owner == process_identity()


class OfflineExecutor:
    """Deletes planned segments directly from log dirs nobody else has locked."""

    def __init__(self, state_dir: Path, audit: AuditLog, on_step: StepHook | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.journal_path = self.state_dir / JOURNAL_FILE
        self.journal_lock_path = self.state_dir / JOURNAL_LOCK_FILE
        self.audit = audit
        self._on_step = on_step
        self._jmutex = threading.RLock()
        self._jdepth = 0

    # -- public ----------------------------------------------------------------------------
    def execute(
        self, deletions: Sequence[Deletion], usage_before: Mapping[str, float]
    ) -> list[DeletionResult]:
        """Delete ``deletions`` in order, in batches (``_delete_batch``); one result per
        deletion, in input order.

        Never raises for a per-deletion problem: guard rails, a held ``.lock``, an unwritable
        audit log or an I/O error become a failed (or refused) result.
        """
        results: list[DeletionResult | None] = [None] * len(deletions)
        by_dir: dict[str, list[int]] = {}
        for i, d in enumerate(deletions):
            by_dir.setdefault(d.log_dir, []).append(i)
        for log_dir, indexes in by_dir.items():
            try:
                claimed = self._claim_orphans(os.path.realpath(log_dir))
                with lockfile.hold(log_dir):
                    for entry in claimed:
                        self._recover_entry(entry)
                    failed_partitions: set[tuple[str, int]] = set()
                    listings: dict[str, dict[str, int]] = {}
                    at, size = 0, min(BATCH_FIRST, BATCH_MAX)
                    while at < len(indexes):
                        self._delete_batch(
                            deletions,
                            indexes[at : at + size],
                            usage_before,
                            results,
                            failed_partitions,
                            listings,
                        )
                        at, size = at + size, min(2 * size, BATCH_MAX)
            except lockfile.LockHeld as exc:
                why = f"{exc} (is the broker running?); nothing touched"
                for i in indexes:
                    if results[i] is None:
                        d = deletions[i]
                        results[i] = self._refuse(d, usage_before.get(d.mount, 0.0), why)
            except OSError as exc:
                why = f"cannot lock {log_dir}: {exc.strerror or exc}"
                for i in indexes:
                    if results[i] is None:
                        d = deletions[i]
                        results[i] = self._refuse(d, usage_before.get(d.mount, 0.0), why)
        self._compact_journal()
        return [r for r in results if r is not None]

    def pending(self) -> int:
        """Journal entries not finished yet: a crash's (``recover`` resolves them) or another
        live process's, in flight."""
        return len(self._open_entries())

    def has_open_entries(self) -> bool:
        """Cheap (one ``stat`` when the journal is empty, as it is between deletions)."""
        try:
            if self.journal_path.stat().st_size == 0:
                return False
        except OSError:
            return False
        return bool(self._open_entries())

    def recover(
        self,
        log_dirs: Iterable[str | os.PathLike[str]],
        sweep_deleted: bool = False,
        sweep_paths: Iterable[str | os.PathLike[str]] | None = None,
    ) -> list[DeletionResult]:
        """Finish deletions a crash interrupted; call at start-up, before the first cycle.

        Only files named in the journal are touched, only inside ``log_dirs`` and only while
        no other process holds the log dir's ``.lock``. An entry whose owner process is still
        alive is in flight (another diskguard is deleting right now) and is left alone. If a
        broker got the lock first, an orphaned entry is abandoned: the broker's own start-up
        already deleted ``*.deleted`` files and orphaned indexes, or took the segment back as
        a whole (its ``.log`` not yet renamed).

        ``sweep_deleted``: also remove, audited, what Kafka removes itself at start-up:
        ``-delete`` dirs directly in each log dir (``<topic>-<partition>.<uid>-delete`` or the
        legacy ``<topic>-<partition>-delete``) first, then leftover ``<segment file>.deleted``
        files in live partition dirs (``\\d{20}`` + a segment or snapshot suffix +
        ``.deleted``). Removing them early only brings the space back sooner. Off by default:
        it deletes files diskguard did not choose. ``-future`` and ``-stray`` dirs are never
        touched: a future dir is a replica move between log dirs in progress, and stray dirs
        are KRaft's, for the broker to decide about.

        ``sweep_paths``: sweep only these partition dirs' ``*.deleted`` files (those in which
        the caller's scan saw ``*.deleted`` names) instead of listing every partition dir of
        every log dir; a dir outside ``log_dirs``, not a live partition dir, or a symlink is
        skipped. Implies ``sweep_deleted`` for those dirs only (no ``-delete`` dirs); an empty
        list sweeps nothing (the cheap idle case).
        """
        allowed = {os.path.realpath(d) for d in log_dirs}
        results: list[DeletionResult] = []
        dirs = sorted({str(e.get("log_dir_real", "")) for e in self._open_entries()})
        for log_dir in dirs:
            claimed = self._claim_orphans(log_dir)
            if not claimed:
                continue  # nothing open, or only live owners' entries: not ours to touch
            if log_dir not in allowed:
                for entry in claimed:
                    results.extend(
                        self._abandon_entry(entry, f"log dir {log_dir} is not configured any more")
                    )
                continue
            try:
                with lockfile.hold(log_dir):
                    for entry in claimed:
                        results.extend(self._recover_entry(entry))
            except lockfile.LockHeld as exc:
                for entry in claimed:
                    res = self._abandon_entry(
                        entry,
                        f"abandoned: {exc}; the broker cleans up a partly deleted segment "
                        "at start-up",
                    )
                    if str(entry.get("kind", _SEGMENT)) in (_SEGMENT, _BATCH):
                        results.extend(res)
            except OSError as exc:
                log.error("offline_recover_failed", log_dir=log_dir, error=str(exc))
        if sweep_paths is not None:
            self._sweep_only(allowed, sweep_paths)
        elif sweep_deleted:
            for log_dir in sorted(allowed):
                self._sweep(log_dir)
        self._compact_journal()
        return results

    # -- one batch of deletions -------------------------------------------------------------
    def _delete_batch(
        self,
        deletions: Sequence[Deletion],
        indexes: Sequence[int],
        usage_before: Mapping[str, float],
        results: list[DeletionResult | None],
        failed_partitions: set[tuple[str, int]],
        listings: dict[str, dict[str, int]],
    ) -> None:
        """Delete ``deletions[i]`` for ``i`` in ``indexes`` (plan order, one log dir, its
        ``.lock`` held) as ONE crash-safe batch; fills ``results[i]``.

        Guard rails first, per segment (a refusal stops that partition's later segments);
        then one journal intent naming every file of the batch, one audit intent line per
        segment made durable with one fsync, the renames in plan order, one fsync per
        partition dir, the unlinks, one fsync per partition dir, the audit outcomes (one
        fsync), and the journal's ``done``. Renames run in plan order, so whatever a crash
        interrupts, the segments already started form a prefix of the plan and recovery
        finishes exactly those (the others are untouched: cancelled, planned again).
        """
        checked: list[tuple[int, Deletion, _Checked, float]] = []
        for i in indexes:
            d = deletions[i]
            usage = usage_before.get(d.mount, 0.0)
            if (d.topic, d.partition) in failed_partitions:
                results[i] = self._refuse(d, usage, _HOLE)
                continue
            try:
                checked.append((i, d, check_deletion(d, listings), usage))
            except Refused as exc:
                results[i] = self._refuse(d, usage, str(exc))
                failed_partitions.add((d.topic, d.partition))
            except OSError as exc:
                why = f"cannot inspect {d.log_dir}: {exc.strerror or exc}"
                results[i] = self._refuse(d, usage, why)
                failed_partitions.add((d.topic, d.partition))
        if not checked:
            return
        subs: list[dict[str, Any]] = []
        for _, d, c, usage in checked:
            fields = {
                **deletion_fields(d),
                "mode": MODE,
                "reason": reason_text(d),
                "usage_before_percent": round(usage, 3),
                "unconsumed_records": dict(d.unconsumed_records),
            }
            subs.append(
                {
                    "action_id": uuid.uuid4().hex[:16],
                    "partition_dir": c.partition_dir,
                    "names": list(c.names),
                    "fields": fields,
                }
            )
        entry = {
            "op": "intent",
            "kind": _BATCH,
            "action_id": uuid.uuid4().hex[:16],
            "audit_offset": self.audit.size(),
            "log_dir_real": os.path.realpath(checked[0][1].log_dir),
            "segments": subs,
            "owner": process_identity(),
        }
        try:
            self._step("journal")
            self._journal(entry)
        except OSError as exc:
            error = f"journal not writable ({self.journal_path}): {exc.strerror or exc}"
            for i, d, _, _ in checked:
                log.error("offline_refused", reason=error, topic=d.topic, partition=d.partition)
                results[i] = DeletionResult(d, False, 0, MODE, error, True)
                failed_partitions.add((d.topic, d.partition))
            return
        try:
            self._step("audit")
            self.audit.before_many(
                [
                    (d, reason_text(d), usage, MODE, sub["action_id"])
                    for (_, d, _, usage), sub in zip(checked, subs, strict=True)
                ]
            )
        except AuditWriteFailed as exc:
            error = f"audit log not writable: {exc}"
            for i, d, _, _ in checked:
                log.error("offline_refused", reason=str(exc), topic=d.topic, partition=d.partition)
                results[i] = DeletionResult(d, False, 0, MODE, error, True)
                failed_partitions.add((d.topic, d.partition))
            self._close(entry, cancelled=error)
            return
        outcomes = self._remove_batch(subs)
        for (_, _, c, _), (_, err, _) in zip(checked, outcomes, strict=True):
            if err is not None:
                listings.pop(c.partition_dir, None)
            elif c.partition_dir in listings:
                # Keep the one listing in step with what was just removed.
                for name in c.names:
                    listings[c.partition_dir].pop(name, None)
        # Outcomes first, then the journal's done: a crash in between leaves the entry open
        # and recovery finds the outcomes already written (``outcome_of``).
        try:
            self._step("audit-done")
            self.audit.after_many(
                [
                    (sub["action_id"], err is None, freed, err)
                    for sub, (freed, err, _) in zip(subs, outcomes, strict=True)
                ]
            )
        except AuditWriteFailed as exc:
            log.error("audit_write_failed", action_id=entry["action_id"], error=str(exc))
        unfinished = {
            sub["action_id"]
            for sub, (_, err, untouched) in zip(subs, outcomes, strict=True)
            if err is not None and not untouched
        }
        if not unfinished:
            self._step("journal-done")
            self._close(entry)
        else:
            # The entry stays open for the segments an I/O error interrupted (``recover``
            # finishes them); the others are settled, so recovery does not report them again.
            settled = [sub["action_id"] for sub in subs if sub["action_id"] not in unfinished]
            with contextlib.suppress(OSError):
                self._journal(
                    {"op": "settled", "action_id": entry["action_id"], "segments": settled}
                )
        for (i, d, _, _), (freed, err, _) in zip(checked, outcomes, strict=True):
            if err is not None:
                failed_partitions.add((d.topic, d.partition))
            results[i] = DeletionResult(d, err is None, freed if err is None else 0, MODE, err)

    def _remove_batch(
        self, subs: Sequence[Mapping[str, Any]]
    ) -> list[tuple[int, str | None, bool]]:
        """``_remove`` for a whole batch: every rename (plan order), one fsync per partition
        dir, every unlink, one fsync per partition dir; ``(freed, error, untouched)`` per
        segment.

        An I/O error renaming one segment stops that partition's later segments (never a
        hole): they are left untouched. A segment that failed once started is left to
        ``recover``, which finishes it."""
        freed = [0] * len(subs)
        errors: list[str | None] = [None] * len(subs)
        untouched = [False] * len(subs)
        fds: dict[str, int] = {}
        stopped: dict[str, str] = {}  # partition dir -> the rename error that stopped it
        unsynced: dict[str, str] = {}  # partition dir -> its failed fsync after the renames
        renamed: list[list[tuple[str, bool]]] = [[] for _ in subs]  # (name, unlinked already)
        try:
            for k, sub in enumerate(subs):
                pd = str(sub["partition_dir"])
                if pd in stopped:
                    errors[k], untouched[k] = f"{_HOLE_IO}: {stopped[pd]}", True
                    continue
                try:
                    if pd not in fds:
                        fds[pd] = os.open(
                            pd, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
                        )
                    freed[k] = self._rename_all(fds[pd], sub["names"], renamed[k])
                except OSError as exc:
                    errors[k] = stopped[pd] = f"{exc.strerror or exc} ({exc.filename or pd})"
            for pd, dfd in fds.items():
                self._step("fsync-renamed")
                try:
                    os.fsync(dfd)
                except OSError as exc:
                    unsynced[pd] = f"{exc.strerror or exc} ({pd})"
            for k, sub in enumerate(subs):
                pd = str(sub["partition_dir"])
                if errors[k] is not None:
                    continue
                if pd in unsynced:
                    errors[k] = unsynced[pd]
                    continue
                try:
                    for name, unlinked in renamed[k]:
                        if unlinked:
                            continue
                        self._step(f"unlink:{name}")
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(name + DELETED_SUFFIX, dir_fd=fds[pd])
                except OSError as exc:
                    # Its .log is renamed already: to Kafka it is gone, like the later ones.
                    errors[k] = f"{exc.strerror or exc} ({exc.filename or pd})"
            for pd, dfd in fds.items():
                self._step("fsync-unlinked")
                try:
                    os.fsync(dfd)
                except OSError as exc:
                    for k, sub in enumerate(subs):
                        if sub["partition_dir"] == pd and errors[k] is None:
                            errors[k] = f"{exc.strerror or exc} ({pd})"
        finally:
            for dfd in fds.values():
                os.close(dfd)
        return list(zip(freed, errors, untouched, strict=True))

    def _rename_all(self, dfd: int, names: Sequence[str], renamed: list[tuple[str, bool]]) -> int:
        """Rename a segment's files (``.log`` first) to ``.deleted``; the bytes they hold."""
        freed = 0
        for name in names:
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue  # never ours (checked before; a race must not make it ours)
            self._step(f"rename:{name}")
            try:
                os.rename(name, name + DELETED_SUFFIX, src_dir_fd=dfd, dst_dir_fd=dfd)
                renamed.append((name, False))
            except FileNotFoundError:
                continue
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                # A longer name may need a new directory block on a full disk: the journal
                # already names the file, so unlinking it directly is just as recoverable.
                os.unlink(name, dir_fd=dfd)
                renamed.append((name, True))
            if st.st_nlink == 1:
                freed += st.st_blocks * 512
        return freed

    def _remove(self, partition_dir: str, names: Sequence[str]) -> int:
        """Rename every name to ``.deleted``, fsync, unlink, fsync; the bytes freed."""
        dfd = os.open(partition_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            freed = 0
            gone: list[str] = []
            unlinked_directly: set[str] = set()
            for name in names:
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue  # never ours (checked before; a race must not make it ours)
                self._step(f"rename:{name}")
                try:
                    os.rename(name, name + DELETED_SUFFIX, src_dir_fd=dfd, dst_dir_fd=dfd)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    # A longer name may need a new directory block on a full disk: the journal
                    # already names the file, so unlinking it directly is just as recoverable.
                    os.unlink(name, dir_fd=dfd)
                    unlinked_directly.add(name)
                if st.st_nlink == 1:
                    freed += st.st_blocks * 512
                gone.append(name)
            self._step("fsync-renamed")
            os.fsync(dfd)
            for name in gone:
                if name in unlinked_directly:
                    continue
                self._step(f"unlink:{name}")
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name + DELETED_SUFFIX, dir_fd=dfd)
            self._step("fsync-unlinked")
            os.fsync(dfd)
            return freed
        finally:
            os.close(dfd)

    # -- recovery --------------------------------------------------------------------------
    def _batch_subs(self, entry: Mapping[str, Any]) -> list[dict[str, Any]]:
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
                    "kind": _SEGMENT,
                    "audit_offset": entry.get("audit_offset", 0),
                    "log_dir_real": entry.get("log_dir_real", ""),
                    "owner": entry.get("owner"),
                    "_in_batch": True,
                }
            )
        return subs

    def _recover_entry(self, entry: dict[str, Any]) -> list[DeletionResult]:
        """``_recover_one`` for any entry; a batch is resolved segment by segment, in plan
        order: those a crash had started are finished, the untouched ones cancelled (kept,
        planned again). Started ones are a prefix of the plan (renames run in plan order),
        so no partition is left with a hole."""
        if entry.get("kind") != _BATCH:
            res = self._recover_one(entry)
            return [] if res is None else [res]
        results: list[DeletionResult] = []
        for sub in self._batch_subs(entry):
            res = self._recover_one(sub)
            if res is not None:
                results.append(res)
        self._close(entry)
        return results

    def _abandon_entry(self, entry: dict[str, Any], why: str) -> list[DeletionResult]:
        if entry.get("kind") != _BATCH:
            return [self._abandon(entry, why)]
        results: list[DeletionResult] = []
        for sub in self._batch_subs(entry):
            # A segment whose outcome is written already (a kill between the outcomes and
            # the journal's done) keeps it: one outcome per intent.
            if self.audit.outcome_of(str(sub["action_id"]), int(sub.get("audit_offset") or 0)):
                continue
            results.append(self._abandon(sub, why))
        self._close(entry, abandoned=why)
        return results

    def _recover_one(self, entry: dict[str, Any]) -> DeletionResult | None:
        """Finish (or cancel) one claimed entry; the caller holds its log dir's ``.lock``.
        A segment entry gives a result; sweep entries give None (they are audited, and the
        runtime reports what recovery did per segment)."""
        kind = str(entry.get("kind", _SEGMENT))
        if kind != _SWEEP:
            outcome = self.audit.outcome_of(
                str(entry["action_id"]), int(entry.get("audit_offset", 0) or 0)
            )
            if outcome is not None and not self._finish_after_failure(entry, outcome):
                # Died between the audit outcome and the journal's done: only the latter.
                self._close(entry)
                if kind != _SEGMENT:
                    return None
                ok = outcome.get("phase") == "done"
                freed = int(outcome.get("freed_bytes") or 0)
                error = None if ok else str(outcome.get("error"))
                return DeletionResult(_deletion_from_entry(entry), ok, freed, MODE, error)
        if kind == _SEGMENT:
            return self._recover_segment(entry)
        if kind == _SWEEP:
            # The crashed sweep is done again now (what is left of it), then its entry closes
            # (claimed entries come sweep sessions last: their items are finished first).
            self._sweep(str(entry.get("log_dir_real", "")))
            self._close(entry)
            return None
        if kind in (_SWEEP_DIR, _SWEEP_FILES):
            self._recover_sweep_item(entry)
            return None
        self._abandon(entry, f"abandoned: unknown journal entry kind {kind!r}")
        return None

    def _finish_after_failure(self, entry: Mapping[str, Any], outcome: Mapping[str, Any]) -> bool:
        """A segment deletion that failed on an I/O error mid-way (``failed``, journal left
        open on purpose) is still finished by recovery, which then records ``done``; every
        other recorded outcome is final."""
        if entry.get("kind", _SEGMENT) != _SEGMENT or outcome.get("phase") != "failed":
            return False
        error = str(outcome.get("error") or "")
        if error == CANCELLED or error.startswith(("abandoned", "audit log not writable")):
            return False
        names = [str(n) for n in entry.get("names", [])]
        partition_dir = str(entry.get("partition_dir", ""))
        return os.path.lexists(partition_dir) and _started(partition_dir, names)

    def _recover_segment(self, entry: dict[str, Any]) -> DeletionResult:
        d = _deletion_from_entry(entry)
        partition_dir = str(entry.get("partition_dir", ""))
        names = [str(n) for n in entry.get("names", [])]
        try:
            _check_journal_entry(str(entry.get("log_dir_real", "")), partition_dir, names)
            if os.path.lexists(partition_dir) and not _started(partition_dir, names):
                # Crashed between the journal entry and the first rename: the audit intent
                # may or may not have been written, so nothing may be removed on its word.
                why = CANCELLED
                self._after(str(entry["action_id"]), False, 0, why, entry.get("fields", {}))
                self._close(entry, cancelled=why)
                log.info("offline_recover_cancelled", action_id=entry.get("action_id"))
                return DeletionResult(d, False, 0, MODE, why, True)
            log_name = next((n for n in names if n.endswith(".log")), None)
            if log_name is not None and os.path.lexists(os.path.join(partition_dir, log_name)):
                # The segment is still whole to Kafka's eyes: if a broker ran since the crash
                # it may have been taken back, rolled or re-created; act only if it still
                # passes every guard rail (closed, next segment where the plan said).
                check_deletion(d)
        except Refused as exc:
            return self._abandon(entry, f"abandoned: {exc}")
        except OSError as exc:
            return self._abandon(entry, f"abandoned: cannot inspect {partition_dir}: {exc}")
        freed = 0
        try:
            if os.path.lexists(partition_dir):
                freed = self._remove_recovering(partition_dir, names)
        except OSError as exc:
            error = f"recovery failed: {exc.strerror or exc} ({exc.filename or partition_dir})"
            log.error("offline_recover_failed", partition_dir=partition_dir, error=error)
            return DeletionResult(d, False, 0, MODE, error)
        self._after(
            str(entry["action_id"]), True, freed, None, {**entry["fields"], "recovered": True}
        )
        self._close(entry)
        log.info(
            "offline_recovered",
            topic=d.topic,
            partition=d.partition,
            base_offset=d.base_offset,
            freed_bytes=freed,
        )
        return DeletionResult(d, True, freed, MODE)

    def _remove_recovering(self, partition_dir: str, names: Sequence[str]) -> int:
        """Finish an interrupted ``_remove``: rename what is left, unlink every ``.deleted``."""
        freed = self._remove(partition_dir, names)
        dfd = os.open(partition_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            changed = False
            for name in names:
                deleted = name + DELETED_SUFFIX
                try:
                    st = os.stat(deleted, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                os.unlink(deleted, dir_fd=dfd)
                changed = True
                if st.st_nlink == 1:
                    freed += st.st_blocks * 512
            if changed:
                os.fsync(dfd)
        finally:
            os.close(dfd)
        return freed

    def _abandon(self, entry: dict[str, Any], why: str) -> DeletionResult:
        log.warning("offline_recover_abandoned", action_id=entry.get("action_id"), reason=why)
        if str(entry.get("kind", _SEGMENT)) != _SWEEP:  # a sweep session has no audit line
            self._after(str(entry["action_id"]), False, 0, why, entry.get("fields", {}))
        self._close(entry, abandoned=why)
        return DeletionResult(_deletion_from_entry(entry), False, 0, MODE, why)

    # -- sweeps ----------------------------------------------------------------------------
    def _sweep(self, log_dir: str) -> None:
        """Remove ``-delete`` dirs, then ``<segment file>.deleted`` leftovers (what Kafka
        deletes at start-up), each audited, while holding the log dir's ``.lock``."""
        real = os.path.realpath(log_dir)
        try:
            with lockfile.hold(real):
                with os.scandir(real) as it:
                    entries = sorted(it, key=lambda e: e.name)
                session: list[dict[str, Any]] = []
                for part in entries:
                    parsed = parse_partition_dir(part.name)
                    # Only -delete dirs: a -future dir is a replica move between log dirs in
                    # progress (its data is the partition's future), and -stray dirs are
                    # KRaft's, left for the broker to decide about.
                    if parsed is None or parsed.kind is not PartitionDirKind.DELETE:
                        continue
                    if not part.is_dir(follow_symlinks=False):
                        continue
                    self._sweep_delete_dir(real, part.name, session)
                for part in entries:
                    parsed = parse_partition_dir(part.name)
                    if parsed is None or parsed.kind is not PartitionDirKind.LIVE:
                        continue
                    if not part.is_dir(follow_symlinks=False):
                        continue
                    self._sweep_partition(real, part.path, session)
                for entry in session:
                    self._close(entry)
        except lockfile.LockHeld:
            return
        except OSError as exc:
            log.warning("offline_sweep_failed", log_dir=log_dir, error=str(exc))

    def _sweep_only(self, allowed: set[str], sweep_paths: Iterable[str | os.PathLike[str]]) -> None:
        """Sweep the given partition dirs, grouped per log dir so each lock is taken once."""
        by_log_dir: dict[str, list[str]] = {}
        for raw in sweep_paths:
            path = os.path.abspath(os.fspath(raw))
            parent = os.path.realpath(os.path.dirname(path))
            name = os.path.basename(path)
            parsed = parse_partition_dir(name)
            if parent not in allowed or parsed is None or parsed.kind is not PartitionDirKind.LIVE:
                log.warning("offline_sweep_path_refused", partition_dir=path)
                continue
            by_log_dir.setdefault(parent, []).append(os.path.join(parent, name))
        for log_dir, paths in sorted(by_log_dir.items()):
            try:
                with lockfile.hold(log_dir):
                    session: list[dict[str, Any]] = []
                    for path in sorted(set(paths)):
                        if os.path.islink(path) or not os.path.isdir(path):
                            continue
                        self._sweep_partition(log_dir, path, session)
                    for entry in session:
                        self._close(entry)
            except lockfile.LockHeld:
                continue
            except OSError as exc:
                log.warning("offline_sweep_failed", log_dir=log_dir, error=str(exc))

    def _open_session(self, log_dir_real: str, session: list[dict[str, Any]]) -> None:
        """Journal the sweep of ``log_dir_real`` before its first removal (lazily: a sweep
        that finds nothing writes nothing)."""
        if session:
            return
        entry = {
            "op": "intent",
            "kind": _SWEEP,
            "action_id": uuid.uuid4().hex[:16],
            "log_dir_real": log_dir_real,
            "owner": process_identity(),
        }
        self._journal(entry)
        session.append(entry)

    def _sweep_delete_dir(
        self, log_dir_real: str, name: str, session: list[dict[str, Any]]
    ) -> None:
        path = os.path.join(log_dir_real, name)
        parsed = parse_partition_dir(name)
        assert parsed is not None
        try:
            nbytes, nfiles = _tree_size(log_dir_real, name)
        except Refused as exc:
            log.warning("offline_sweep_refused", path=path, reason=str(exc))
            return
        except OSError as exc:
            log.warning("offline_sweep_failed", path=path, error=str(exc))
            return
        fields = sweep_fields(
            SWEPT_DELETE_DIR, log_dir_real, path, parsed.topic, parsed.partition, nfiles, nbytes
        )
        entry = {"kind": _SWEEP_DIR, "path": path, "names": []}
        self._sweep_item(log_dir_real, entry, fields, session)

    def _sweep_partition(self, log_dir_real: str, path: str, session: list[dict[str, Any]]) -> None:
        names: list[str] = []
        nbytes = 0
        with os.scandir(path) as entries:
            for entry in entries:
                name = entry.name
                if not _is_deleted_leftover(name):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                names.append(name)
                nbytes += st.st_blocks * 512 if st.st_nlink == 1 else 0
        if not names:
            return
        names.sort()
        parsed = parse_partition_dir(os.path.basename(path))
        assert parsed is not None
        fields = sweep_fields(
            SWEPT_DELETED_FILES,
            log_dir_real,
            path,
            parsed.topic,
            parsed.partition,
            len(names),
            nbytes,
            tuple(names),
        )
        item = {"kind": _SWEEP_FILES, "path": path, "names": names}
        self._sweep_item(log_dir_real, item, fields, session)

    def _sweep_item(
        self,
        log_dir_real: str,
        item: dict[str, Any],
        fields: dict[str, Any],
        session: list[dict[str, Any]],
    ) -> None:
        """One audited sweep action: journal, audit intent, ``audited`` mark, remove, done."""
        action_id = uuid.uuid4().hex[:16]
        entry = {
            "op": "intent",
            **item,
            "action_id": action_id,
            "audit_offset": self.audit.size(),
            "log_dir_real": log_dir_real,
            "fields": fields,
            "owner": process_identity(),
        }
        try:
            self._open_session(log_dir_real, session)
            self._journal(entry)
        except OSError as exc:
            log.warning("offline_sweep_failed", path=item["path"], error=str(exc))
            return
        try:
            self.audit.intent(fields, action_id=action_id)
        except AuditWriteFailed as exc:
            log.error("offline_sweep_refused", path=item["path"], reason=str(exc))
            self._close(entry, cancelled=f"audit log not writable: {exc}")
            return
        try:
            self._journal({"op": "audited", "action_id": action_id})
        except OSError as exc:
            log.warning("offline_sweep_failed", path=item["path"], error=str(exc))
            return  # the entry stays open and un-audited: recovery cancels it
        self._finish_sweep_item(entry, recovered=False)

    def _finish_sweep_item(self, entry: dict[str, Any], recovered: bool) -> None:
        path = str(entry.get("path", ""))
        try:
            if entry.get("kind") == _SWEEP_DIR:
                freed = _remove_tree(str(entry["log_dir_real"]), os.path.basename(path))
            else:
                freed = _remove_names(path, [str(n) for n in entry.get("names", [])])
        except (OSError, Refused) as exc:
            error = str(exc) if isinstance(exc, Refused) else f"{exc.strerror or exc}"
            log.error("offline_sweep_failed", path=path, error=error)
            self._after(str(entry["action_id"]), False, 0, error, entry.get("fields", {}))
            self._close(entry, abandoned=error)
            return
        context = {**entry.get("fields", {}), **({"recovered": True} if recovered else {})}
        self._after(str(entry["action_id"]), True, freed, None, context)
        self._close(entry)
        log.info(
            "offline_swept",
            what=entry.get("fields", {}).get("what"),
            path=path,
            freed_bytes=freed,
            recovered=recovered,
        )

    def _recover_sweep_item(self, entry: dict[str, Any]) -> None:
        log_dir_real = str(entry.get("log_dir_real", ""))
        path = str(entry.get("path", ""))
        if not entry.get("_audited"):
            # The audit intent may be missing: nothing was removed on its word; the sweep
            # that follows recovery finds what is still there.
            self._after(str(entry["action_id"]), False, 0, CANCELLED, entry.get("fields", {}))
            self._close(entry, cancelled=CANCELLED)
            return
        parsed = parse_partition_dir(os.path.basename(path))
        want = PartitionDirKind.DELETE if entry.get("kind") == _SWEEP_DIR else PartitionDirKind.LIVE
        names = [str(n) for n in entry.get("names", [])]
        if (
            os.path.dirname(path) != log_dir_real
            or parsed is None
            or parsed.kind is not want
            or not all(_is_deleted_leftover(n) and "/" not in n for n in names)
        ):
            self._abandon(entry, f"abandoned: {path} is not a sweepable path of {log_dir_real}")
            return
        self._finish_sweep_item(entry, recovered=True)

    # -- helpers ---------------------------------------------------------------------------
    def _refuse(self, d: Deletion, usage: float, why: str) -> DeletionResult:
        log.warning(
            "offline_refused",
            topic=d.topic,
            partition=d.partition,
            base_offset=d.base_offset,
            reason=why,
        )
        try:
            self.audit.refused(d, reason_text(d), usage, MODE, why)
        except AuditWriteFailed as exc:
            log.error("audit_write_failed", error=str(exc))
        return DeletionResult(d, False, 0, MODE, why, True)

    def _after(
        self,
        action_id: str,
        ok: bool,
        freed: int,
        error: str | None,
        context: Mapping[str, Any] | None = None,
    ) -> None:
        try:
            self.audit.after(action_id, ok, freed, error, context)
        except AuditWriteFailed as exc:
            log.error("audit_write_failed", action_id=action_id, error=str(exc))

    def _step(self, name: str) -> None:
        if self._on_step is not None:
            self._on_step(name)

    # -- the journal -----------------------------------------------------------------------
    @contextlib.contextmanager
    def _journal_lock(self) -> Iterator[None]:
        """flock on ``offline-journal.lock``, re-entrant within this executor."""
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
                    fd = os.open(
                        self.journal_lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644
                    )
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

    def _journal(self, record: Mapping[str, Any]) -> None:
        data = (json.dumps(dict(record), sort_keys=True) + "\n").encode()
        with self._journal_lock():
            append_line(self.journal_path, data, self.audit.make_room)

    def _close(
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
            self._journal(record)
        except OSError as exc:
            log.warning("offline_journal_done_failed", error=str(exc))

    def _claim_orphans(self, log_dir_real: str) -> list[dict[str, Any]]:
        """Open entries of ``log_dir_real`` whose owner is gone (or is this process), now
        owned by this process — under the journal lock, so no other recoverer takes them too.
        Entries of a live owner are in flight: skipped, untouched, unaudited."""
        claimed: list[dict[str, Any]] = []
        with contextlib.suppress(OSError), self._journal_lock():
            me = process_identity()
            for entry in self._open_entries():
                if entry.get("log_dir_real") != log_dir_real:
                    continue
                owner = entry.get("owner")
                if _is_self(owner):
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
                self._journal({"op": "claim", "action_id": entry["action_id"], "owner": me})
                claimed.append({**entry, "owner": me})
        claimed.sort(key=lambda e: e.get("kind") == _SWEEP)
        return claimed

    def _open_entries(self) -> list[dict[str, Any]]:
        """Intents without a ``done``; a torn last line is an intent never made durable, and
        nothing was renamed before an intent was durable, so it is ignored. ``claim`` records
        move an entry to a new owner; ``audited`` marks a sweep entry's audit intent durable."""
        intents: dict[str, dict[str, Any]] = {}
        try:
            raw = self.journal_path.read_bytes()
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

    def _compact_journal(self) -> None:
        """Empty the journal once nothing in it is open (truncating never needs free space).
        Under the journal lock: another process's append cannot land between the check and
        the truncate."""
        try:
            with self._journal_lock():
                if self.journal_path.stat().st_size == 0 or self._open_entries():
                    return
                fd = os.open(self.journal_path, os.O_RDWR | os.O_CLOEXEC)
                try:
                    os.ftruncate(fd, 0)
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("offline_journal_compact_failed", error=str(exc))


def _started(partition_dir: str, names: Sequence[str]) -> bool:
    """Has ``_remove`` visibly begun on ``names``: one of them renamed or gone?"""
    for name in names:
        path = os.path.join(partition_dir, name)
        if not os.path.lexists(path) or os.path.lexists(path + DELETED_SUFFIX):
            return True
    return False


def _is_deleted_leftover(name: str) -> bool:
    """``<20 digits><segment or snapshot suffix>.deleted``: what Kafka deletes at start-up."""
    if not name.endswith(DELETED_SUFFIX):
        return False
    parsed = parse_segment_file(name.removesuffix(DELETED_SUFFIX))
    return parsed is not None and parsed[1] in (*SEGMENT_FILE_SUFFIXES, SNAPSHOT_SUFFIX)


def _tree_size(log_dir_real: str, name: str) -> tuple[int, int]:
    """Allocated bytes and file count of dir ``name`` in the log dir, never following a
    symlink; Refused if it is not a directory or anything below it is on another device (a
    mount point inside a ``-delete`` dir is never ours to empty)."""
    dfd = os.open(log_dir_real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dev = os.fstat(dfd).st_dev
        return _walk_size(dfd, name, dev)
    finally:
        os.close(dfd)


def _open_dir_at(parent_fd: int, name: str, dev: int) -> int:
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd
        )
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Refused(f"{name} is not a directory (symlink?)") from None
        raise
    if os.fstat(fd).st_dev != dev:
        os.close(fd)
        raise Refused(f"{name} is on another filesystem (a mount point); not swept")
    return fd


def _walk_size(parent_fd: int, name: str, dev: int) -> tuple[int, int]:
    fd = _open_dir_at(parent_fd, name, dev)
    try:
        nbytes, nfiles = 0, 0
        with os.scandir(fd) as it:
            children = [e.name for e in it]
        for child in children:
            try:
                st = os.stat(child, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                b, n = _walk_size(fd, child, dev)
                nbytes, nfiles = nbytes + b, nfiles + n
            else:
                nfiles += 1
                if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                    nbytes += st.st_blocks * 512
        return nbytes, nfiles
    finally:
        os.close(fd)


def _remove_tree(log_dir_real: str, name: str) -> int:
    """Remove the ``-delete`` dir ``name`` of the log dir bottom-up through dir fds (a
    symlink inside is unlinked, never followed; another device is refused); bytes freed.

    No rename first: the name already says "deleted" to Kafka, so a half-removed dir is
    still one the broker removes at start-up, and recovery simply removes the rest."""
    dfd = os.open(log_dir_real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dev = os.fstat(dfd).st_dev
        try:
            freed = _remove_below(dfd, name, dev)
        except FileNotFoundError:
            return 0
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(name, dir_fd=dfd)
        os.fsync(dfd)
        return freed
    finally:
        os.close(dfd)


def _remove_below(parent_fd: int, name: str, dev: int) -> int:
    fd = _open_dir_at(parent_fd, name, dev)
    try:
        freed = 0
        with os.scandir(fd) as it:
            children = sorted(e.name for e in it)
        for child in children:
            try:
                st = os.stat(child, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                freed += _remove_below(fd, child, dev)
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(child, dir_fd=fd)
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(child, dir_fd=fd)
                if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                    freed += st.st_blocks * 512
        return freed
    finally:
        os.close(fd)


def _remove_names(partition_dir: str, names: Sequence[str]) -> int:
    """Unlink ``*.deleted`` leftovers of one partition dir (regular files only), fsync it."""
    dfd = os.open(partition_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        freed = 0
        for name in names:
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dfd)
                freed += st.st_blocks * 512 if st.st_nlink == 1 else 0
        os.fsync(dfd)
        return freed
    finally:
        os.close(dfd)


def _segment_modes(part_dir: str) -> dict[str, int]:
    """Segment-named entries of a partition dir and their ``st_mode`` (not following links)."""
    modes: dict[str, int] = {}
    with os.scandir(part_dir) as entries:
        for entry in entries:
            if parse_segment_file(entry.name) is None:
                continue
            try:
                modes[entry.name] = entry.stat(follow_symlinks=False).st_mode
            except FileNotFoundError:
                continue
    return modes


def check_deletion(d: Deletion, listings: dict[str, dict[str, int]] | None = None) -> _Checked:
    """The guard rails, on disk, right now; raises ``Refused`` naming the rule.

    ``listings`` lets one ``execute`` list each partition dir once for all its deletions
    (it holds the ``.lock``, so only the broker could change the dir, and it cannot run):
    without it, deleting n segments of one partition listed the dir n times.
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
    for f in d.files:
        name = os.path.basename(f)
        if name not in wanted:
            raise Refused(f"{f} is not one of segment {d.base_offset}'s own files")
        if os.path.realpath(os.path.dirname(os.path.abspath(f))) != part_dir:
            raise Refused(f"{f} is not inside {part_dir}")
    if listings is not None and part_dir in listings:
        modes = listings[part_dir]
    else:
        modes = _segment_modes(part_dir)
        if listings is not None:
            listings[part_dir] = modes
    logs = {
        seg[0]
        for name, mode in modes.items()
        if (seg := parse_segment_file(name)) is not None and seg[1] == ".log" and stat.S_ISREG(mode)
    }
    kinds = {name: mode for name, mode in modes.items() if name in wanted}
    if d.next_offset not in logs:
        raise Refused(
            f"{part_name}: no segment starts at next offset {d.next_offset}: segment "
            f"{d.base_offset} may be the active one (stale plan?)"
        )
    between = sorted(b for b in logs if d.base_offset < b < d.next_offset)
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
    return _Checked(part_dir, names)


def _check_journal_entry(log_dir_real: str, partition_dir: str, names: Sequence[str]) -> None:
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


def _deletion_from_entry(entry: Mapping[str, Any]) -> Deletion:
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
