"""A rung action's audit lines and result: what the ladder's edges share (``tieredrung``,
``moverung``, ``cordon``). An action is asked of the broker only once its intent line is
durable; an outcome line that cannot be written is said, not raised (the action happened)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from diskguard.logs import get_logger
from diskguard.retention.audit import AuditLog, AuditWriteFailed
from diskguard.retention.executor import new_action_id

log = get_logger("diskguard.ladder")


@dataclass(frozen=True)
class RungResult:
    """What came of one rung action: ``subject`` a topic (evict) or a topic-partition (move)."""

    rung: str
    subject: str
    ok: bool
    bytes: int
    error: str | None = None
    #: mount -> bytes the broker will free there (what the action asked for, when ok).
    mounts: Mapping[str, int] = field(default_factory=dict)


def asked_by_mount(results: Iterable[RungResult]) -> dict[str, int]:
    """Per mount, the bytes the broker accepted to free through the ladder's actions: on
    their way out from now on, like accepted DeleteRecords."""
    out: dict[str, int] = {}
    for res in results:
        if res.ok:
            for mount, nbytes in res.mounts.items():
                out[mount] = out.get(mount, 0) + nbytes
    return out


def rung_intent(audit: AuditLog, fields: Mapping[str, Any]) -> str | None:
    """The intent line, durable; None when it cannot be written (then nothing is asked)."""
    try:
        return audit.intent(fields, new_action_id())
    except AuditWriteFailed as exc:
        log.error("retention_refused", reason=f"audit log not writable: {exc}")
        return None


def rung_outcome(audit: AuditLog, action: str, ok: bool, freed: int, error: str | None) -> None:
    try:
        audit.after(action, ok, freed, error)
    except AuditWriteFailed as exc:
        log.error("audit_write_failed", action_id=action, error=str(exc))
