"""Offline sweeps: what Kafka removes itself at start-up, removed early (audited) while no
broker runs — ``-delete`` dirs first, then leftover ``<segment file>.deleted`` files.

``recover(sweep_deleted=True)`` (which offline cycles run before planning) sweeps, so only
what is still missing comes from live segments. Each swept dir (or a partition dir's set of
``*.deleted`` files) is one audited action (``kind: swept``), journalled like a segment:
entry, audit intent, an ``audited`` mark, removal, ``done``. A sweep of a log dir is itself an
entry, so a crash anywhere in it makes the next offline run sweep again even if the disk is
below its limit by then. ``-future`` and ``-stray`` dirs are never touched.
"""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from diskguard.kafkalog import lockfile
from diskguard.kafkalog.kraftmeta import METADATA_DIR
from diskguard.kafkalog.listing import ListingCache
from diskguard.kafkalog.model import PartitionDirKind, parse_partition_dir
from diskguard.logs import get_logger
from diskguard.retention.audit import (
    SWEPT_DELETE_DIR,
    SWEPT_DELETED_FILES,
    AuditLog,
    AuditWriteFailed,
    sweep_fields,
)
from diskguard.retention.executor import audit_outcome
from diskguard.retention.offline.guards import Refused, is_deleted_leftover
from diskguard.retention.offline.journal import (
    CANCELLED,
    SWEEP,
    SWEEP_DIR,
    SWEEP_FILES,
    Journal,
    process_identity,
)
from diskguard.retention.offline.removal import unlink_regular
from diskguard.retention.offline.sweeptargets import leftovers, targets, tree_size, walk_below

log = get_logger("diskguard.offline")


class Sweeper:
    """Sweeps log dirs, journalled in ``journal`` and audited in ``audit``."""

    def __init__(
        self, journal: Journal, audit: AuditLog, listings: ListingCache | None = None
    ) -> None:
        self.journal = journal
        self.audit = audit
        #: The scan's partition listings (``ListingCache``): a partition dir whose listing
        #: holds no ``*.deleted`` name is not listed again. The cache re-lists any dir whose
        #: mtime changed, and renaming a file to ``*.deleted`` changes it.
        self.listings = listings
        #: Log dirs (as configured) whose filesystem is stuck on failed deletions, said
        #: already (``stuck.DELETE_FAILED``): a sweep that cannot take ``.lock`` there is
        #: logged at debug, or every retry would say it again.
        self.quiet_log_dirs: frozenset[str] = frozenset()

    def sweep(self, log_dir: str) -> None:
        """Remove ``-delete`` dirs, then ``<segment file>.deleted`` leftovers (what Kafka
        deletes at start-up), each audited, while holding the log dir's ``.lock``."""
        real = os.path.realpath(log_dir)

        def sweep_dirs(session: list[dict[str, Any]]) -> None:
            delete_dirs, partitions = targets(real, self.listings)
            for part in delete_dirs:
                self._sweep_delete_dir(real, part.name, session)
            for part in partitions:
                self._sweep_partition(real, part.path, session)

        self._locked(real, log_dir, sweep_dirs)

    def sweep_only(self, allowed: set[str], sweep_paths: Iterable[str | os.PathLike[str]]) -> None:
        """Sweep the given partition dirs, grouped per log dir so each lock is taken once."""
        by_log_dir: dict[str, list[str]] = {}
        for raw in sweep_paths:
            path = os.path.abspath(os.fspath(raw))
            parent = os.path.realpath(os.path.dirname(path))
            name = os.path.basename(path)
            if name == METADATA_DIR:
                continue  # the metadata log is never swept (``sweeptargets.targets``)
            parsed = parse_partition_dir(name)
            if parent not in allowed or parsed is None or parsed.kind is not PartitionDirKind.LIVE:
                log.warning("offline_sweep_path_refused", partition_dir=path)
                continue
            by_log_dir.setdefault(parent, []).append(os.path.join(parent, name))
        for log_dir, paths in sorted(by_log_dir.items()):
            self._locked(log_dir, log_dir, functools.partial(self._sweep_paths, log_dir, paths))

    def _sweep_paths(
        self, log_dir_real: str, paths: list[str], session: list[dict[str, Any]]
    ) -> None:
        for path in sorted(set(paths)):
            if os.path.islink(path) or not os.path.isdir(path):
                continue
            self._sweep_partition(log_dir_real, path, session)

    def _locked(
        self, log_dir_real: str, label: str, body: Callable[[list[dict[str, Any]]], None]
    ) -> None:
        """``body(session)`` while holding the log dir's ``.lock`` (not at all if another
        process holds it); then the journal entries of the sweep session close."""
        try:
            with lockfile.hold(log_dir_real):
                session: list[dict[str, Any]] = []
                body(session)
                for entry in session:
                    self.journal.close(entry)
        except lockfile.LockHeld:
            return
        except OSError as exc:
            emit = log.debug if label in self.quiet_log_dirs else log.warning
            emit("offline_sweep_failed", log_dir=label, error=str(exc))

    def _open_session(self, log_dir_real: str, session: list[dict[str, Any]]) -> None:
        """Journal the sweep of ``log_dir_real`` before its first removal (lazily: a sweep
        that finds nothing writes nothing)."""
        if session:
            return
        entry = {
            "op": "intent",
            "kind": SWEEP,
            "action_id": uuid.uuid4().hex[:16],
            "log_dir_real": log_dir_real,
            "owner": process_identity(),
        }
        self.journal.append(entry)
        session.append(entry)

    def _sweep_delete_dir(
        self, log_dir_real: str, name: str, session: list[dict[str, Any]]
    ) -> None:
        path = os.path.join(log_dir_real, name)
        parsed = parse_partition_dir(name)
        assert parsed is not None
        try:
            nbytes, nfiles = tree_size(log_dir_real, name)
        except Refused as exc:
            log.warning("offline_sweep_refused", path=path, reason=str(exc))
            return
        except OSError as exc:
            log.warning("offline_sweep_failed", path=path, error=str(exc))
            return
        fields = sweep_fields(
            SWEPT_DELETE_DIR, log_dir_real, path, parsed.topic, parsed.partition, nfiles, nbytes
        )
        entry = {"kind": SWEEP_DIR, "path": path, "names": []}
        self._sweep_item(log_dir_real, entry, fields, session)

    def _sweep_partition(self, log_dir_real: str, path: str, session: list[dict[str, Any]]) -> None:
        names, nbytes = leftovers(path)
        if not names:
            return
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
        item = {"kind": SWEEP_FILES, "path": path, "names": names}
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
            self.journal.append(entry)
        except OSError as exc:
            log.warning("offline_sweep_failed", path=item["path"], error=str(exc))
            return
        try:
            self.audit.intent(fields, action_id=action_id)
        except AuditWriteFailed as exc:
            log.error("offline_sweep_refused", path=item["path"], reason=str(exc))
            self.journal.close(entry, cancelled=f"audit log not writable: {exc}")
            return
        try:
            self.journal.append({"op": "audited", "action_id": action_id})
        except OSError as exc:
            log.warning("offline_sweep_failed", path=item["path"], error=str(exc))
            return  # the entry stays open and un-audited: recovery cancels it
        self._finish_item(entry, recovered=False)

    def _finish_item(self, entry: dict[str, Any], recovered: bool) -> None:
        path = str(entry.get("path", ""))
        try:
            if entry.get("kind") == SWEEP_DIR:
                freed = _remove_tree(str(entry["log_dir_real"]), os.path.basename(path))
            else:
                freed = _remove_names(path, [str(n) for n in entry.get("names", [])])
        except (OSError, Refused) as exc:
            error = str(exc) if isinstance(exc, Refused) else f"{exc.strerror or exc}"
            log.error("offline_sweep_failed", path=path, error=error)
            audit_outcome(
                self.audit, str(entry["action_id"]), False, 0, error, entry.get("fields", {}), log
            )
            self.journal.close(entry, abandoned=error)
            return
        context = {**entry.get("fields", {}), **({"recovered": True} if recovered else {})}
        audit_outcome(self.audit, str(entry["action_id"]), True, freed, None, context, log)
        self.journal.close(entry)
        log.info(
            "offline_swept",
            what=entry.get("fields", {}).get("what"),
            path=path,
            freed_bytes=freed,
            recovered=recovered,
        )

    def recover_item(self, entry: dict[str, Any]) -> None:
        log_dir_real = str(entry.get("log_dir_real", ""))
        path = str(entry.get("path", ""))
        if not entry.get("_audited"):
            # The audit intent may be missing: nothing was removed on its word; the sweep
            # that follows recovery finds what is still there.
            audit_outcome(
                self.audit,
                str(entry["action_id"]),
                False,
                0,
                CANCELLED,
                entry.get("fields", {}),
                log,
            )
            self.journal.close(entry, cancelled=CANCELLED)
            return
        parsed = parse_partition_dir(os.path.basename(path))
        want = PartitionDirKind.DELETE if entry.get("kind") == SWEEP_DIR else PartitionDirKind.LIVE
        names = [str(n) for n in entry.get("names", [])]
        if (
            os.path.dirname(path) != log_dir_real
            or parsed is None
            or parsed.kind is not want
            or not all(is_deleted_leftover(n) and "/" not in n for n in names)
        ):
            self.journal.abandon(
                entry, f"abandoned: {path} is not a sweepable path of {log_dir_real}"
            )
            return
        self._finish_item(entry, recovered=True)


def _remove_tree(log_dir_real: str, name: str) -> int:
    """Remove the ``-delete`` dir ``name`` of the log dir bottom-up through dir fds (a
    symlink inside is unlinked, never followed; another device is refused); bytes freed.

    No rename first: the name already says "deleted" to Kafka, so a half-removed dir is
    still one the broker removes at start-up, and recovery simply removes the rest."""
    dfd = os.open(log_dir_real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dev = os.fstat(dfd).st_dev
        try:
            freed, _ = walk_below(dfd, name, dev, remove=True)
        except FileNotFoundError:
            return 0
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(name, dir_fd=dfd)
        os.fsync(dfd)
        return freed
    finally:
        os.close(dfd)


def _remove_names(partition_dir: str, names: Sequence[str]) -> int:
    """Unlink ``*.deleted`` leftovers of one partition dir (regular files only), fsync it."""
    dfd = os.open(partition_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        freed, _ = unlink_regular(dfd, names)
        os.fsync(dfd)
        return freed
    finally:
        os.close(dfd)
