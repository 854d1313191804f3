"""The offline executor: deletes segment files directly, only while no broker holds the log dir.

This is the rescue path for a broker that cannot start because its disk is full. It is only
ever safe while no other process holds ``<log_dir>/.lock`` (a running broker keeps segments
open: unlinking them frees nothing and corrupts its view), so the lock is *held* for the whole
deletion — a broker started mid-way fails fast instead of loading a half-deleted dir.

Crash safety (borg-style: say what you will do, durably, then do it):

1. audit ``intent`` line and a journal entry naming the exact files (``<state_dir>/
   offline-journal.jsonl``), both fsync'd;
2. rename the segment's own files — ``.log`` first, then ``.index``, ``.timeindex``,
   ``.txnindex``, nothing else — to ``<name>.deleted``, fsync the partition dir;
3. unlink the ``.deleted`` files, fsync the dir, journal ``done``, audit ``done``.

``.log`` goes first because from that moment Kafka no longer sees the segment: if the broker
starts before ``recover`` has run, its log loading deletes ``*.deleted`` files and orphaned
index files by itself instead of rebuilding indexes of a half-deleted segment.
``recover`` (daemon start-up) finishes every journal entry left open by a crash, touching
only the files the journal names; the next ``execute`` in the same log dir does the same for
that dir, so ``enforce --once`` from cron heals too.

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
import json
import os
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diskguard import lockfile
from diskguard.atomicfile import fsync_dir
from diskguard.audit import (
    AuditLog,
    AuditWriteFailed,
    DeletionResult,
    append_line,
    deletion_fields,
    reason_text,
)
from diskguard.logs import get_logger
from diskguard.model import (
    DELETED_SUFFIX,
    SEGMENT_FILE_SUFFIXES,
    SNAPSHOT_SUFFIX,
    PartitionDirKind,
    parse_partition_dir,
    parse_segment_file,
    segment_file_name,
)
from diskguard.planner import Deletion

__all__ = ["JOURNAL_FILE", "MODE", "DeletionResult", "OfflineExecutor", "Refused"]

log = get_logger("diskguard.offline")

MODE = "offline"
JOURNAL_FILE = "offline-journal.jsonl"


class Refused(Exception):
    """A guard rail said no; the message says which, and nothing was touched."""


@dataclass(frozen=True)
class _Checked:
    partition_dir: str
    #: Names (inside ``partition_dir``) to delete, ``.log`` first.
    names: tuple[str, ...]


#: Test hook: called with a step name before each step that changes the disk.
StepHook = Callable[[str], None]


class OfflineExecutor:
    """Deletes planned segments directly from log dirs nobody else has locked."""

    def __init__(self, state_dir: Path, audit: AuditLog, on_step: StepHook | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.journal_path = self.state_dir / JOURNAL_FILE
        self.audit = audit
        self._on_step = on_step

    # -- public ----------------------------------------------------------------------------
    def execute(
        self, deletions: Sequence[Deletion], usage_before: Mapping[str, float]
    ) -> list[DeletionResult]:
        """Delete ``deletions`` in order; one result per deletion, in input order.

        Never raises for a per-deletion problem: guard rails, a held ``.lock``, an unwritable
        audit log or an I/O error become a failed (or refused) result.
        """
        results: list[DeletionResult | None] = [None] * len(deletions)
        by_dir: dict[str, list[int]] = {}
        for i, d in enumerate(deletions):
            by_dir.setdefault(d.log_dir, []).append(i)
        for log_dir, indexes in by_dir.items():
            done_here: set[int] = set()
            try:
                with lockfile.hold(log_dir):
                    self._finish_open_entries(log_dir)
                    failed_partitions: set[tuple[str, int]] = set()
                    listings: dict[str, dict[str, int]] = {}
                    for i in indexes:
                        d = deletions[i]
                        usage = usage_before.get(d.mount, 0.0)
                        if (d.topic, d.partition) in failed_partitions:
                            res = self._refuse(
                                d,
                                usage,
                                "an older segment of this partition was not deleted "
                                "(deleting this one would leave a hole)",
                            )
                        else:
                            res = self._delete_one(d, usage, listings)
                        if not res.ok:
                            failed_partitions.add((d.topic, d.partition))
                        results[i] = res
                        done_here.add(i)
            except lockfile.LockHeld as exc:
                why = f"{exc} (is the broker running?); nothing touched"
                for i in indexes:
                    if i not in done_here:
                        d = deletions[i]
                        results[i] = self._refuse(d, usage_before.get(d.mount, 0.0), why)
            except OSError as exc:
                why = f"cannot lock {log_dir}: {exc.strerror or exc}"
                for i in indexes:
                    if i not in done_here:
                        d = deletions[i]
                        results[i] = self._refuse(d, usage_before.get(d.mount, 0.0), why)
        self._compact_journal()
        return [r for r in results if r is not None]

    def pending(self) -> int:
        """Journal entries a crash left unfinished (``recover`` resolves them)."""
        return len(self._open_entries())

    def recover(
        self,
        log_dirs: Iterable[str | os.PathLike[str]],
        sweep_deleted: bool = False,
        sweep_paths: Iterable[str | os.PathLike[str]] | None = None,
    ) -> list[DeletionResult]:
        """Finish deletions a crash interrupted; call at start-up, before the first cycle.

        Only files named in the journal are touched, only inside ``log_dirs`` and only while
        no other process holds the log dir's ``.lock``. If a broker got the lock first, the
        entry is abandoned: the broker's own start-up already deleted ``*.deleted`` files and
        orphaned indexes, or took the segment back as a whole (its ``.log`` not yet renamed).

        ``sweep_deleted``: also remove leftover ``<segment file>.deleted`` files in live
        partition dirs (``\\d{20}`` + a segment or snapshot suffix + ``.deleted``) — exactly the
        files Kafka deletes itself at start-up, so removing them early only brings the space
        back sooner. Off by default: it deletes files diskguard did not choose.

        ``sweep_paths``: sweep only these partition dirs (those in which the caller's scan saw
        ``*.deleted`` names) instead of listing every partition dir of every log dir; a dir
        outside ``log_dirs``, not a live partition dir, or a symlink is skipped. Implies
        ``sweep_deleted``; an empty list sweeps nothing (the cheap idle case).
        """
        allowed = {os.path.realpath(d) for d in log_dirs}
        entries = self._open_entries()
        results: list[DeletionResult] = []
        by_dir: dict[str, list[dict[str, Any]]] = {}
        for entry in entries:
            by_dir.setdefault(str(entry.get("log_dir_real", "")), []).append(entry)
        for log_dir, group in by_dir.items():
            if log_dir not in allowed:
                for entry in group:
                    results.append(
                        self._abandon(entry, f"log dir {log_dir} is not configured any more")
                    )
                continue
            try:
                with lockfile.hold(log_dir):
                    for entry in group:
                        results.append(self._recover_one(entry))
            except lockfile.LockHeld as exc:
                for entry in group:
                    results.append(
                        self._abandon(
                            entry,
                            f"abandoned: {exc}; the broker cleans up a partly deleted segment "
                            "at start-up",
                        )
                    )
            except OSError as exc:
                log.error("offline_recover_failed", log_dir=log_dir, error=str(exc))
        if sweep_paths is not None:
            self._sweep_only(allowed, sweep_paths)
        elif sweep_deleted:
            for log_dir in sorted(allowed):
                self._sweep(log_dir)
        self._compact_journal()
        return results

    def _finish_open_entries(self, log_dir: str) -> None:
        """A crash's leftovers in this log dir are finished the next time we hold its lock, so
        ``enforce --once`` from cron heals as well as a daemon restart (``recover``) does."""
        real = os.path.realpath(log_dir)
        for entry in self._open_entries():
            if entry.get("log_dir_real") == real:
                self._recover_one(entry)

    # -- one deletion ----------------------------------------------------------------------
    def _delete_one(
        self, d: Deletion, usage: float, listings: dict[str, dict[str, int]] | None = None
    ) -> DeletionResult:
        try:
            checked = check_deletion(d, listings)
        except Refused as exc:
            return self._refuse(d, usage, str(exc))
        except OSError as exc:
            return self._refuse(d, usage, f"cannot inspect {d.log_dir}: {exc.strerror or exc}")
        try:
            action_id = self.audit.before(d, reason_text(d), usage, MODE)
        except AuditWriteFailed as exc:
            log.error("offline_refused", reason=str(exc), topic=d.topic, partition=d.partition)
            return DeletionResult(d, False, 0, MODE, f"audit log not writable: {exc}", True)
        entry = {
            "op": "intent",
            "action_id": action_id,
            "log_dir_real": os.path.realpath(d.log_dir),
            "partition_dir": checked.partition_dir,
            "names": list(checked.names),
            "fields": {
                **deletion_fields(d),
                "mode": MODE,
                "reason": reason_text(d),
                "usage_before_percent": round(usage, 3),
                "unconsumed_records": dict(d.unconsumed_records),
            },
        }
        try:
            self._step("journal")
            self._journal(entry)
        except OSError as exc:
            error = f"journal not writable ({self.journal_path}): {exc.strerror or exc}"
            self._after(action_id, False, 0, error)
            return DeletionResult(d, False, 0, MODE, error, True)
        try:
            freed = self._remove(checked.partition_dir, checked.names)
            if listings is not None and checked.partition_dir in listings:
                # Keep the one listing in step with what we just removed.
                for name in checked.names:
                    listings[checked.partition_dir].pop(name, None)
        except OSError as exc:
            if listings is not None:
                listings.pop(checked.partition_dir, None)
            # The journal entry stays open: ``recover`` finishes it later.
            error = f"{exc.strerror or exc} ({exc.filename or checked.partition_dir})"
            self._after(action_id, False, 0, error)
            return DeletionResult(d, False, 0, MODE, error)
        try:
            self._step("journal-done")
            self._journal({"op": "done", "action_id": action_id})
        except OSError as exc:
            log.warning("offline_journal_done_failed", error=str(exc))
        self._after(action_id, True, freed, None)
        return DeletionResult(d, True, freed, MODE)

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
    def _recover_one(self, entry: dict[str, Any]) -> DeletionResult:
        d = _deletion_from_entry(entry)
        partition_dir = str(entry.get("partition_dir", ""))
        names = [str(n) for n in entry.get("names", [])]
        try:
            _check_journal_entry(str(entry.get("log_dir_real", "")), partition_dir, names)
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
        try:
            self._journal({"op": "done", "action_id": entry["action_id"]})
        except OSError as exc:
            log.warning("offline_journal_done_failed", error=str(exc))
        self._after(
            str(entry["action_id"]), True, freed, None, {**entry["fields"], "recovered": True}
        )
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
        try:
            self._journal({"op": "done", "action_id": entry["action_id"], "abandoned": why})
        except OSError as exc:
            log.warning("offline_journal_done_failed", error=str(exc))
        self._after(str(entry["action_id"]), False, 0, why, entry.get("fields", {}))
        return DeletionResult(_deletion_from_entry(entry), False, 0, MODE, why)

    def _sweep(self, log_dir: str) -> None:
        """Remove ``<segment file>.deleted`` leftovers (what Kafka deletes at start-up)."""
        try:
            with lockfile.hold(log_dir), os.scandir(log_dir) as parts:
                for part in parts:
                    parsed = parse_partition_dir(part.name)
                    if parsed is None or parsed.kind is not PartitionDirKind.LIVE:
                        continue
                    if not part.is_dir(follow_symlinks=False):
                        continue
                    self._sweep_partition(part.path)
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
                    for path in sorted(set(paths)):
                        if os.path.islink(path) or not os.path.isdir(path):
                            continue
                        self._sweep_partition(path)
            except lockfile.LockHeld:
                continue
            except OSError as exc:
                log.warning("offline_sweep_failed", log_dir=log_dir, error=str(exc))

    def _sweep_partition(self, path: str) -> None:
        freed = 0
        removed = 0
        with os.scandir(path) as entries:
            for entry in entries:
                name = entry.name
                if not name.endswith(DELETED_SUFFIX):
                    continue
                parsed = parse_segment_file(name.removesuffix(DELETED_SUFFIX))
                if parsed is None or parsed[1] not in (*SEGMENT_FILE_SUFFIXES, SNAPSHOT_SUFFIX):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    os.unlink(entry.path)
                except FileNotFoundError:
                    continue
                removed += 1
                freed += st.st_blocks * 512 if st.st_nlink == 1 else 0
        if removed:
            fsync_dir(path)
            log.info("offline_swept_deleted_files", partition_dir=path, files=removed, bytes=freed)

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

    def _journal(self, record: Mapping[str, Any]) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        data = (json.dumps(dict(record), sort_keys=True) + "\n").encode()
        append_line(self.journal_path, data, self.audit.make_room)

    def _open_entries(self) -> list[dict[str, Any]]:
        """Intents without a ``done``; a torn last line is an intent never made durable, and
        nothing was renamed before an intent was durable, so it is ignored."""
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
            if rec.get("op") == "intent":
                intents[str(rec["action_id"])] = rec
            elif rec.get("op") == "done":
                intents.pop(str(rec["action_id"]), None)
        return list(intents.values())

    def _compact_journal(self) -> None:
        """Empty the journal once nothing in it is open (truncating never needs free space)."""
        try:
            if self.journal_path.stat().st_size == 0 or self._open_entries():
                return
            os.truncate(self.journal_path, 0)
            fd = os.open(self.journal_path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("offline_journal_compact_failed", error=str(exc))


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
