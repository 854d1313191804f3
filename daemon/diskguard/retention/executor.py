"""The ``Executor`` protocol a retention cycle acts through, and the one audit path both
implementations use (``brokerexecutor``: DeleteRecords; ``fileexecutor``: unlink offline).

Every deletion is audited the same way whoever carries it out: an ``intent`` line per
deletion made durable *before* anything is asked or removed (``audit_intents`` raises and the
executor must not act), then an outcome line per deletion (``audit_outcomes``). The file
executor adds its journal around these two calls, never other audit lines for a deletion.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from diskguard.retention.audit import AuditLog, AuditWriteFailed, reason_text
from diskguard.retention.planner import Deletion, DeletionResult


class Executor(Protocol):
    """Carries out a plan's deletions in one mode (``broker`` or ``offline``)."""

    mode: str

    def execute(
        self, deletions: Sequence[Deletion], usage_before: Mapping[str, float]
    ) -> list[DeletionResult]:
        """Delete ``deletions`` in plan order; one result per deletion, in input order.
        ``usage_before``: mount -> usage percent at the scan (for the audit lines). Never
        raises for a per-deletion problem: it becomes a failed or refused result."""
        ...

    def finish_interrupted(
        self, log_dirs: Sequence[str], space_needed: Callable[[], bool]
    ) -> list[DeletionResult]:
        """Before the scan: finish what an earlier run left on its way out (a crash's
        half-done deletions; offline also what Kafka removes at start-up) so the scan sees
        what is left. ``space_needed`` is asked only if there is such work to weigh."""
        ...


def new_action_id() -> str:
    return uuid.uuid4().hex[:16]


def audit_intents(audit: AuditLog, mode: str, items: Sequence[tuple[Deletion, float, str]]) -> None:
    """The intent lines of ``(deletion, usage_before_percent, action_id)`` items, made durable
    together; raises ``AuditWriteFailed`` (then nothing may be deleted)."""
    audit.before_many(
        [(d, reason_text(d), usage, mode, action_id) for d, usage, action_id in items]
    )


def audit_outcomes(
    audit: AuditLog,
    items: Sequence[tuple[str, bool, int, str | None]],
    log: Any,
    **context: Any,
) -> None:
    """The outcome lines of ``(action_id, ok, freed_bytes, error)`` items, made durable
    together. A failure is logged (``audit_write_failed`` with ``context``), not raised: the
    deletions happened, and saying so is all that is left to do."""
    try:
        audit.after_many(items)
    except AuditWriteFailed as exc:
        log.error("audit_write_failed", **context, error=str(exc))


def audit_outcome(
    audit: AuditLog,
    action_id: str,
    ok: bool,
    freed: int,
    error: str | None,
    context: Mapping[str, Any] | None,
    log: Any,
) -> None:
    """One outcome line, for an intent this process may not have written (crash recovery,
    sweeps): ``context`` then supplies the intent's fields. Logged, not raised, on failure."""
    try:
        audit.after(action_id, ok, freed, error, context)
    except AuditWriteFailed as exc:
        log.error("audit_write_failed", action_id=action_id, error=str(exc))
