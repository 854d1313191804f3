"""The offline executor: deletes segment files directly, only while no broker holds the log dir.

This is the rescue path for a broker that cannot start because its disk is full. It is only
ever safe while no other process holds ``<log_dir>/.lock`` (a running broker keeps segments
open: unlinking them frees nothing and corrupts its view), so the lock is *held* for the whole
deletion — a broker started mid-way fails fast instead of loading a half-deleted dir.

Crash safety (borg-style: say what you will do, durably, then do it):

1. a journal entry naming the exact files (``<state_dir>/offline-journal.jsonl``), then the
   audit ``intent`` lines, both fsync'd;
2. rename the segments' own files — ``.log`` first, then ``.index``, ``.timeindex``,
   ``.txnindex``, nothing else — to ``<name>.deleted``;
3. unlink the ``.deleted`` files, fsync the dirs, audit ``done`` lines, journal ``done``.

Deletions are *batched* (up to ``BATCH_MAX`` per log dir and lock hold): one journal entry
(kind ``batch``) names every segment's files, the audit log still gets one intent and one
outcome line per segment but each set is made durable by one fsync, renames run in plan
order, and each partition dir is fsync'd once, after the unlinks — on ext4 with its journal
and XFS only the dir changed last, whose commit covers the others (``removal``).
A segment costs a few renames and unlinks instead of six fsyncs. Where the filesystem commits
its journal in order, a batch's dir fsync, outcomes and ``done`` come after the *next* batch's
unlinks (behind a writer that fsync waits for a journal commit of its data, and the
next batch's space waited with it); every batch's intent is still durable before its first
rename. Recovery resolves a batch
segment by segment: started ones (a prefix of the plan) are finished, untouched ones are
cancelled exactly like an interrupted single entry. Once a deletion of a partition is
refused or fails, its later segments are refused (never a hole); only a failed dir fsync of
an overlapped batch is learnt after the next batch has run, and its entry stays open for
``recover`` to finish.

The journal comes first so that every audit intent has a journal entry: recovery always gives
it an outcome. Where the parts live: ``journal`` (records, owners, lock), ``removal`` (rename,
fsync, unlink), ``guards`` (the checks before each deletion), ``recovery`` (open entries after
a crash), ``sweep`` (what Kafka removes at start-up). Audit lines go through ``executor``'s
``audit_intents``/``audit_outcomes``, as the broker executor's do.
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diskguard.kafkalog import lockfile
from diskguard.kafkalog.listing import ListingCache
from diskguard.logs import get_logger
from diskguard.retention.audit import (
    AuditLog,
    AuditWriteFailed,
    deletion_fields,
    reason_text,
    why_fields,
)
from diskguard.retention.executor import audit_intents, audit_outcomes
from diskguard.retention.mode import OFFLINE as MODE
from diskguard.retention.offline.guards import Checked, Refused, SegmentDirListing, check_deletion
from diskguard.retention.offline.journal import BATCH, Journal, process_identity
from diskguard.retention.offline.recovery import Recovery
from diskguard.retention.offline.removal import SegmentRemover, StartedBatch, StepHook
from diskguard.retention.offline.sweep import Sweeper
from diskguard.retention.planner import Deletion, DeletionResult

log = get_logger("diskguard.offline")

#: Segments per batch: one journal record and one audit fsync each. Bounded so that a batch's
#: audit lines (~700 bytes each) fit in the audit reserve on a 100%-full disk, and a journal
#: record stays small enough to re-read on every journal mutation.
BATCH_MAX = 256
#: The first batch of an ``execute`` is small and each next one twice the size: space comes
#: back after the first few fsyncs (a disk over its ceiling needs only the plan's head to get
#: under it), and the large later batches keep the throughput.
BATCH_FIRST = 16

_HOLE = "an older segment of this partition was not deleted (deleting this one would leave a hole)"


@dataclass
class _Started:
    """A batch between ``_start_batch`` and ``_finish_batch``: its checked deletions, journal
    entry, and the remover's state (its journal subs; files gone, dirs not fsync'd yet)."""

    checked: list[tuple[int, Deletion, Checked, float]]
    entry: dict[str, Any]
    removal: StartedBatch


class FileExecutor:
    """``Executor`` that deletes planned segments directly from log dirs nobody else has
    locked (mode ``offline``)."""

    mode = MODE

    def __init__(
        self,
        state_dir: Path,
        audit: AuditLog,
        on_step: StepHook | None = None,
        listings: ListingCache | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.audit = audit
        self.journal = Journal(self.state_dir, audit)
        #: Test hook (crash points): called with a step name before each step that changes
        #: the disk; read at each step, so a test may set it on a built executor.
        self._on_step = on_step
        self.remover = SegmentRemover(self._step)
        self.sweeper = Sweeper(self.journal, audit, listings)
        self.recovery = Recovery(self.journal, audit, self.remover, self.sweeper)

    def execute(
        self, deletions: Sequence[Deletion], usage_before: Mapping[str, float]
    ) -> list[DeletionResult]:
        """Delete ``deletions`` in order, in batches (``_start_batch``, ``_finish_batch``:
        where the filesystem commits in order, each batch is finished after the next one's
        unlinks, ``_may_overlap``); one result per deletion, in input order.

        Never raises for a per-deletion problem: guard rails, a held ``.lock``, an unwritable
        audit log or an I/O error become a failed (or refused) result.
        """
        results: list[DeletionResult | None] = [None] * len(deletions)
        by_dir: dict[str, list[int]] = {}
        for i, d in enumerate(deletions):
            by_dir.setdefault(d.log_dir, []).append(i)
        for log_dir, indexes in by_dir.items():
            try:
                claimed = self.journal.claim_orphans(os.path.realpath(log_dir))
                with lockfile.hold(log_dir):
                    for entry in claimed:
                        self.recovery.recover_entry(entry)
                    failed_partitions: set[tuple[str, int]] = set()
                    listings: dict[str, SegmentDirListing] = {}
                    at, size = 0, min(BATCH_FIRST, BATCH_MAX)
                    overlap = self._may_overlap(log_dir)
                    unfinished: list[_Started] = []  # at most two: the previous batch, this
                    try:
                        while at < len(indexes):
                            started = self._start_batch(
                                deletions,
                                indexes[at : at + size],
                                usage_before,
                                results,
                                failed_partitions,
                                listings,
                            )
                            if started is not None:
                                unfinished.append(started)
                            # The previous batch is made durable only now, after this one's
                            # unlinks: its dir fsync (a journal commit behind any writer on
                            # that disk) no longer holds back the space this one frees.
                            # Where operations may reach the disk out of order, each batch is
                            # made durable before the next starts (see ``_may_overlap``).
                            keep = 1 if started is not None and overlap else 0
                            self._finish_oldest(
                                unfinished, keep, results, failed_partitions, listings
                            )
                            at, size = at + size, min(2 * size, BATCH_MAX)
                        self._finish_oldest(unfinished, 0, results, failed_partitions, listings)
                    finally:
                        for left in unfinished:  # an exception: their journal entries stay open
                            left.removal.close()
            except lockfile.LockHeld as exc:
                who = lockfile.describe_pid(exc.pid) if exc.pid is not None else None
                held = f"{exc.log_dir}/.lock is held by {who.text}" if who else str(exc)
                why = f"{held}; nothing touched"
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
        self.journal.compact()
        return [r for r in results if r is not None]

    def pending(self) -> int:
        """Journal entries not finished yet: a crash's (``recover`` resolves them) or another
        live process's, in flight."""
        return len(self.journal.open_entries())

    def has_open_entries(self) -> bool:
        """Cheap (one ``stat`` when the journal is empty, as it is between deletions)."""
        return self.journal.has_open_entries()

    def recover(
        self,
        log_dirs: Iterable[str | os.PathLike[str]],
        sweep_deleted: bool = False,
        sweep_paths: Iterable[str | os.PathLike[str]] | None = None,
    ) -> list[DeletionResult]:
        """Finish deletions a crash interrupted, and sweep if asked: ``Recovery.recover``."""
        return self.recovery.recover(log_dirs, sweep_deleted, sweep_paths)

    def finish_interrupted(
        self, log_dirs: Sequence[str], space_needed: Callable[[], bool]
    ) -> list[DeletionResult]:
        """``Executor`` hook, before an offline scan: recover and sweep when the journal has
        open entries (every audit intent must get its outcome, a crashed sweep must finish)
        or ``space_needed()``."""
        if not (self.journal.has_open_entries() or space_needed()):
            return []
        return self.recover(log_dirs, sweep_deleted=True)

    def _may_overlap(self, log_dir: str) -> bool:
        """May a batch be finished after the next one's unlinks (``execute``)? Only where the
        log dir's filesystem commits its journal in order (ext4 with jbd2, XFS:
        ``fsjournal``): what a power loss keeps there is a prefix of the operations, the same
        states a ``kill -9`` leaves, which the crash points cover. Elsewhere the next batch's
        unlinks could be kept and this one's lost: a partition with a hole. Unknown: no."""
        try:
            return self.remover.commits_in_order(os.stat(log_dir).st_dev)
        except OSError:
            return False

    def _start_batch(
        self,
        deletions: Sequence[Deletion],
        indexes: Sequence[int],
        usage_before: Mapping[str, float],
        results: list[DeletionResult | None],
        failed_partitions: set[tuple[str, int]],
        listings: dict[str, SegmentDirListing],
    ) -> _Started | None:
        """Start deleting ``deletions[i]`` for ``i`` in ``indexes`` (plan order, one log dir,
        its ``.lock`` held) as ONE crash-safe batch; ``_finish_batch`` ends it and fills
        ``results[i]`` (refusals are filled here). None when nothing was started.

        Guard rails first, per segment (a refusal stops that partition's later segments);
        then one journal intent naming every file of the batch, one audit intent line per
        segment made durable with one fsync, the renames in plan order and the unlinks
        (``SegmentRemover.start_batch``). Then, in ``_finish_batch``: the partition dirs'
        fsync, the audit outcomes (one fsync), and the journal's ``done``. Renames run in
        plan order, so whatever a crash interrupts, the segments already started form a
        prefix of the plan and recovery finishes exactly those (the others are untouched:
        cancelled, planned again); a crash before the previous batch's ``done`` leaves two
        entries open, that batch's and this one's, and the started segments of both are
        still a prefix of the plan.
        """
        checked: list[tuple[int, Deletion, Checked, float]] = []
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
            return None
        subs: list[dict[str, Any]] = []
        for _, d, c, usage in checked:
            fields = {
                **deletion_fields(d),
                "mode": MODE,
                "reason": reason_text(d),
                "usage_before_percent": round(usage, 3),
                "unconsumed_records": dict(d.unconsumed_records),
                **why_fields(d),
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
            "kind": BATCH,
            "action_id": uuid.uuid4().hex[:16],
            "audit_offset": self.audit.size(),
            "log_dir_real": os.path.realpath(checked[0][1].log_dir),
            "segments": subs,
            "owner": process_identity(),
        }
        try:
            self._step("journal")
            self.journal.append(entry)
        except OSError as exc:
            error = f"journal not writable ({self.journal.path}): {exc.strerror or exc}"
            if exc.errno == errno.ENOSPC:
                error += f" ({self.audit.full_disk_note()})"
            for i, d, _, _ in checked:
                log.error("offline_refused", reason=error, topic=d.topic, partition=d.partition)
                results[i] = DeletionResult(d, False, 0, MODE, error, True)
                failed_partitions.add((d.topic, d.partition))
            return None
        try:
            self._step("audit")
            audit_intents(
                self.audit,
                MODE,
                [
                    (d, usage, sub["action_id"])
                    for (_, d, _, usage), sub in zip(checked, subs, strict=True)
                ],
            )
        except AuditWriteFailed as exc:
            error = f"audit log not writable: {exc}"
            for i, d, _, _ in checked:
                log.error("offline_refused", reason=str(exc), topic=d.topic, partition=d.partition)
                results[i] = DeletionResult(d, False, 0, MODE, error, True)
                failed_partitions.add((d.topic, d.partition))
            self.journal.close(entry, cancelled=error)
            return None
        removal = self.remover.start_batch(subs)
        for (_, d, c, _), err in zip(checked, removal.errors, strict=True):
            if err is not None:
                listings.pop(c.partition_dir, None)
                failed_partitions.add((d.topic, d.partition))  # before the next batch's guards
            elif c.partition_dir in listings:
                # Keep the one listing in step with what was just removed.
                for name in c.names:
                    listings[c.partition_dir].remove(name)
        return _Started(checked, entry, removal)

    def _finish_oldest(
        self,
        unfinished: list[_Started],
        keep: int,
        results: list[DeletionResult | None],
        failed_partitions: set[tuple[str, int]],
        listings: dict[str, SegmentDirListing],
    ) -> None:
        """``_finish_batch`` the oldest started batches, in order, until ``keep`` are left."""
        while len(unfinished) > keep:
            self._finish_batch(unfinished.pop(0), results, failed_partitions, listings)

    def _finish_batch(
        self,
        started: _Started,
        results: list[DeletionResult | None],
        failed_partitions: set[tuple[str, int]],
        listings: dict[str, SegmentDirListing],
    ) -> None:
        """The second half of a batch (``_start_batch``): fsync its dirs, audit outcomes,
        journal ``done`` (or ``settled``); fills its results."""
        checked, subs, entry = started.checked, started.removal.subs, started.entry
        outcomes = self.remover.finish_batch(started.removal)
        for (_, _, c, _), (_, err, _) in zip(checked, outcomes, strict=True):
            if err is not None:
                listings.pop(c.partition_dir, None)
        # Outcomes first, then the journal's done: a crash in between leaves the entry open
        # and recovery finds the outcomes already written (``outcome_of``).
        self._step("audit-done")
        audit_outcomes(
            self.audit,
            [
                (sub["action_id"], err is None, freed, err)
                for sub, (freed, err, _) in zip(subs, outcomes, strict=True)
            ],
            log,
            action_id=entry["action_id"],
        )
        unfinished = {
            sub["action_id"]
            for sub, (_, err, untouched) in zip(subs, outcomes, strict=True)
            if err is not None and not untouched
        }
        if not unfinished:
            self._step("journal-done")
            self.journal.close(entry)
        else:
            # The entry stays open for the segments an I/O error interrupted (``recover``
            # finishes them); the others are settled, so recovery does not report them again.
            settled = [sub["action_id"] for sub in subs if sub["action_id"] not in unfinished]
            with contextlib.suppress(OSError):
                self.journal.append(
                    {"op": "settled", "action_id": entry["action_id"], "segments": settled}
                )
        lasting = started.removal.lasting
        for (i, d, _, _), (freed, err, _), again in zip(checked, outcomes, lasting, strict=True):
            if err is not None:
                failed_partitions.add((d.topic, d.partition))
            ok = err is None
            results[i] = DeletionResult(d, ok, freed if ok else 0, MODE, err, lasting=again)

    def _step(self, name: str) -> None:
        if self._on_step is not None:
            self._on_step(name)

    def quiet(self, log_dirs: frozenset[str]) -> None:
        """Log dirs (as configured) whose filesystem is stuck on failed deletions, said
        already (``stuck.DELETE_FAILED``): a retry refused there (nothing touched) is logged
        at debug and not audited again, or each retry would repeat a line per segment."""
        self.sweeper.quiet_log_dirs = log_dirs

    def _refuse(self, d: Deletion, usage: float, why: str) -> DeletionResult:
        """Nothing was touched: logged and audited, except on a log dir stuck on failed
        deletions (``quiet``), whose retries would repeat the same lines for every segment
        every rescan (2,000 audit lines a minute for a read-only log dir)."""
        result = DeletionResult(d, False, 0, MODE, why, True)
        fields = {"topic": d.topic, "partition": d.partition, "base_offset": d.base_offset}
        if d.log_dir in self.sweeper.quiet_log_dirs:
            log.debug("offline_refused", **fields, reason=why)
            return result
        log.warning("offline_refused", **fields, reason=why)
        try:
            self.audit.refused(d, reason_text(d), usage, MODE, why)
        except AuditWriteFailed as exc:
            log.error("audit_write_failed", error=str(exc))
        return result
