"""Offline crash recovery: every journal entry a crash left open is resolved.

Nothing is renamed before the audit intent is durable, so an entry whose files are all still
in place (a crash before the first rename) is *cancelled* — audit ``failed``, the segment kept
and simply planned again — and one whose deletion visibly started is finished. A batch is
resolved segment by segment: started ones (a prefix of the plan) are finished, untouched ones
cancelled, except one that a later started segment of its partition follows: a power loss may
keep a later rename or unlink and lose an earlier one (a batch fsyncs its partition dirs once,
after the unlinks), and leaving it would be a hole, so it is finished too (``_holes``).
``recover`` runs at daemon start-up and in offline cycles; the next ``execute`` in the same
log dir does the same for that dir, so ``enforce --once`` from cron heals too.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from diskguard.kafkalog import lockfile
from diskguard.logs import get_logger
from diskguard.retention.audit import AuditLog
from diskguard.retention.executor import audit_outcome
from diskguard.retention.mode import OFFLINE as MODE
from diskguard.retention.offline.guards import (
    Refused,
    check_deletion,
    check_journal_entry,
    deletion_from_entry,
    started,
)
from diskguard.retention.offline.journal import (
    BATCH,
    CANCELLED,
    SEGMENT,
    SWEEP,
    SWEEP_DIR,
    SWEEP_FILES,
    Journal,
    batch_subs,
)
from diskguard.retention.offline.removal import SegmentRemover, SegmentRestored, os_error_text
from diskguard.retention.offline.sweep import Sweeper
from diskguard.retention.planner import DeletionResult

log = get_logger("diskguard.offline")


class Recovery:
    """Resolves open journal entries (and runs the sweeps ``recover`` is asked for)."""

    def __init__(
        self, journal: Journal, audit: AuditLog, remover: SegmentRemover, sweeper: Sweeper
    ) -> None:
        self.journal = journal
        self.audit = audit
        self.remover = remover
        self.sweeper = sweeper

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
        dirs = sorted({str(e.get("log_dir_real", "")) for e in self.journal.open_entries()})
        for log_dir in dirs:
            claimed = self.journal.claim_orphans(log_dir)
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
                        results.extend(self.recover_entry(entry))
            except lockfile.LockHeld as exc:
                for entry in claimed:
                    res = self._abandon_entry(
                        entry,
                        f"abandoned: {exc}; the broker cleans up a partly deleted segment "
                        "at start-up",
                    )
                    if str(entry.get("kind", SEGMENT)) in (SEGMENT, BATCH):
                        results.extend(res)
            except OSError as exc:
                log.error("offline_recover_failed", log_dir=log_dir, error=str(exc))
        if sweep_paths is not None:
            self.sweeper.sweep_only(allowed, sweep_paths)
        elif sweep_deleted:
            for log_dir in sorted(allowed):
                self.sweeper.sweep(log_dir)
        self.journal.compact()
        return results

    def recover_entry(self, entry: dict[str, Any]) -> list[DeletionResult]:
        """``_recover_one`` for any entry; a batch is resolved segment by segment, in plan
        order: those a crash had started are finished, the untouched ones cancelled (kept,
        planned again). Started ones are a prefix of the plan (renames run in plan order),
        so no partition is left with a hole."""
        if entry.get("kind") != BATCH:
            res = self._recover_one(entry)
            return [] if res is None else [res]
        results: list[DeletionResult] = []
        subs = batch_subs(entry)
        for sub, hole in zip(subs, _holes(subs), strict=True):
            res = self._recover_one(sub, close_hole=hole)
            if res is not None:
                results.append(res)
        self.journal.close(entry)
        return results

    def _abandon_entry(self, entry: dict[str, Any], why: str) -> list[DeletionResult]:
        if entry.get("kind") != BATCH:
            return [self._abandon(entry, why)]
        results: list[DeletionResult] = []
        for sub in batch_subs(entry):
            # A segment whose outcome is written already (a kill between the outcomes and
            # the journal's done) keeps it: one outcome per intent.
            if self.audit.outcome_of(str(sub["action_id"]), int(sub.get("audit_offset") or 0)):
                continue
            results.append(self._abandon(sub, why))
        self.journal.close(entry, abandoned=why)
        return results

    def _recover_one(
        self, entry: dict[str, Any], close_hole: bool = False
    ) -> DeletionResult | None:
        """Finish (or cancel) one claimed entry; the caller holds its log dir's ``.lock``.
        A segment entry gives a result; sweep entries give None (they are audited, and the
        runtime reports what recovery did per segment). ``close_hole``: a later segment of
        this partition in the same batch was started, so this one is finished even if
        untouched (see ``_holes``)."""
        kind = str(entry.get("kind", SEGMENT))
        if kind != SWEEP:
            outcome = self.audit.outcome_of(
                str(entry["action_id"]), int(entry.get("audit_offset", 0) or 0)
            )
            if outcome is not None and not self._finish_after_failure(entry, outcome):
                # Died between the audit outcome and the journal's done: only the latter.
                self.journal.close(entry)
                if kind != SEGMENT:
                    return None
                ok = outcome.get("phase") == "done"
                freed = int(outcome.get("freed_bytes") or 0)
                error = None if ok else str(outcome.get("error"))
                return DeletionResult(deletion_from_entry(entry), ok, freed, MODE, error)
        if kind == SEGMENT:
            return self._recover_segment(entry, close_hole)
        if kind == SWEEP:
            # The crashed sweep is done again now (what is left of it), then its entry closes
            # (claimed entries come sweep sessions last: their items are finished first).
            self.sweeper.sweep(str(entry.get("log_dir_real", "")))
            self.journal.close(entry)
            return None
        if kind in (SWEEP_DIR, SWEEP_FILES):
            self.sweeper.recover_item(entry)
            return None
        self._abandon(entry, f"abandoned: unknown journal entry kind {kind!r}")
        return None

    def _finish_after_failure(self, entry: Mapping[str, Any], outcome: Mapping[str, Any]) -> bool:
        """A segment deletion that failed on an I/O error mid-way (``failed``, journal left
        open on purpose) is still finished by recovery, which then records ``done``; every
        other recorded outcome is final."""
        if entry.get("kind", SEGMENT) != SEGMENT or outcome.get("phase") != "failed":
            return False
        error = str(outcome.get("error") or "")
        if error == CANCELLED or error.startswith(("abandoned", "audit log not writable")):
            return False
        names = [str(n) for n in entry.get("names", [])]
        partition_dir = str(entry.get("partition_dir", ""))
        return os.path.lexists(partition_dir) and started(partition_dir, names)

    def _recover_segment(self, entry: dict[str, Any], close_hole: bool = False) -> DeletionResult:
        d = deletion_from_entry(entry)
        partition_dir = str(entry.get("partition_dir", ""))
        names = [str(n) for n in entry.get("names", [])]
        try:
            check_journal_entry(str(entry.get("log_dir_real", "")), partition_dir, names)
            if (
                not close_hole
                and os.path.lexists(partition_dir)
                and not started(partition_dir, names)
            ):
                # Crashed between the journal entry and the first rename: the audit intent
                # may or may not have been written, so nothing may be removed on its word.
                why = CANCELLED
                audit_outcome(
                    self.audit, str(entry["action_id"]), False, 0, why, entry.get("fields", {}), log
                )
                self.journal.close(entry, cancelled=why)
                log.info("offline_recover_cancelled", action_id=entry.get("action_id"))
                return DeletionResult(d, False, 0, MODE, why, True)
            log_name = next((n for n in names if n.endswith(".log")), None)
            if log_name is not None and os.path.lexists(os.path.join(partition_dir, log_name)):
                # The segment is still whole to Kafka's eyes: if a broker ran since the crash
                # it may have been taken back, rolled or re-created; act only if it still
                # passes every guard rail (closed, next segment where the plan said; when
                # closing a hole, that next segment is one this batch removed already, so a
                # newer segment must exist instead).
                check_deletion(d, next_removed=close_hole)
        except Refused as exc:
            return self._abandon(entry, f"abandoned: {exc}")
        except OSError as exc:
            return self._abandon(entry, f"abandoned: cannot inspect {partition_dir}: {exc}")
        freed = 0
        try:
            if os.path.lexists(partition_dir):
                freed = self.remover.remove_recovering(partition_dir, names)
        except SegmentRestored as exc:
            # A file of it cannot be renamed (an immutable index): the segment is whole
            # again, and staying so is safer than an entry retried at every start.
            return self._abandon(
                entry, f"abandoned: {os_error_text(exc, partition_dir)}; its files are kept"
            )
        except OSError as exc:
            error = f"recovery failed: {os_error_text(exc, partition_dir)}"
            log.error("offline_recover_failed", partition_dir=partition_dir, error=error)
            return DeletionResult(d, False, 0, MODE, error)
        audit_outcome(
            self.audit,
            str(entry["action_id"]),
            True,
            freed,
            None,
            {**entry["fields"], "recovered": True},
            log,
        )
        self.journal.close(entry)
        log.info(
            "offline_recovered",
            topic=d.topic,
            partition=d.partition,
            base_offset=d.base_offset,
            freed_bytes=freed,
        )
        return DeletionResult(d, True, freed, MODE)

    def _abandon(self, entry: dict[str, Any], why: str) -> DeletionResult:
        self.journal.abandon(entry, why)
        return DeletionResult(deletion_from_entry(entry), False, 0, MODE, why)


def _holes(subs: list[dict[str, Any]]) -> list[bool]:
    """Per segment of a batch (plan order): is it untouched while a later segment of its
    partition dir was started? Such a segment is finished with the started ones: its intent
    was durable before anything moved, and keeping it would leave its partition with a hole.
    A ``kill -9`` never gives this (renames and unlinks run in plan order); a power loss on a
    filesystem that does not keep directory operations in order could."""
    touched = [
        os.path.lexists(str(sub.get("partition_dir", "")))
        and started(str(sub.get("partition_dir", "")), [str(n) for n in sub.get("names", [])])
        for sub in subs
    ]
    holes = [False] * len(subs)
    later_started: set[str] = set()
    for k in range(len(subs) - 1, -1, -1):
        pd = str(subs[k].get("partition_dir", ""))
        if touched[k]:
            later_started.add(pd)
        elif pd in later_started:
            holes[k] = True
    return holes
