"""The broker executor: deletions through the running broker (DeleteRecords).

The broker removes the files itself at its next retention check; what it accepted is
remembered (``RequestedLogStart``) so the next cycle does not ask again, and timed
(``ReclaimWatch``) to learn the broker's reclaim latency.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from diskguard.broker.client import BrokerClient
from diskguard.logs import get_logger
from diskguard.retention.audit import AuditLog, AuditWriteFailed
from diskguard.retention.executor import audit_intents, audit_outcomes, new_action_id
from diskguard.retention.mode import BROKER
from diskguard.retention.planner import Deletion, DeletionResult
from diskguard.retention.reclaimwatch import ReclaimWatch
from diskguard.retention.requested import RequestedLogStart

log = get_logger("diskguard.retention")


class BrokerExecutor:
    """``Executor`` through one broker client: one DeleteRecords request per plan."""

    mode = BROKER

    def __init__(
        self,
        broker: BrokerClient,
        audit: AuditLog,
        requested: RequestedLogStart,
        reclaim: ReclaimWatch,
    ) -> None:
        self.broker = broker
        self.audit = audit
        self.requested = requested
        self.reclaim = reclaim

    def execute(
        self, deletions: Sequence[Deletion], usage_before: Mapping[str, float]
    ) -> list[DeletionResult]:
        ids = [new_action_id() for _ in deletions]
        try:
            audit_intents(
                self.audit,
                BROKER,
                [
                    (d, usage_before.get(d.mount, 0.0), a)
                    for d, a in zip(deletions, ids, strict=True)
                ],
            )
        except AuditWriteFailed as exc:
            log.error("retention_refused", reason=f"audit log not writable: {exc}")
            return []
        results = self.broker.delete_records(list(deletions))
        accepted = [r.deletion for r in results if r.ok]
        self.reclaim.requested(accepted, time.monotonic())
        audit_outcomes(
            self.audit,
            [(a, r.ok, r.freed_bytes, r.error) for a, r in zip(ids, results, strict=True)],
            log,
        )
        self.requested.record(accepted)
        return results

    def finish_interrupted(
        self, log_dirs: Sequence[str], space_needed: Callable[[], bool]
    ) -> list[DeletionResult]:
        """Nothing: a DeleteRecords request is never half done on diskguard's side."""
        return []
