"""Rung 1 against the broker (edge): lower a tiered topic's local retention, and restore the
operator's value once the disk is back under its target.

Lowering ``local.retention.ms`` makes the broker drop, at its next retention check, the local
copies of uploaded segments older than the new value: consumers read them from remote
storage, nothing is lost. What was asked is recorded (``ladderstate``: the operator's own
topic-level value, None when the topic followed the broker default) *before* the broker is
asked, and the segments it will drop count as on their way out (``requested``) until the
scan no longer shows them. A crash between the record and the request leaves a record of a
change that may not have happened; restoring it is then harmless (the value it restores is
the one in force).

Restored once every disk it was lowered for is at or under its target and the broker has
dropped what was asked; if the broker never does (not uploaded after all), what was asked
stops counting as on its way out after a bound, or it would hide a disk that keeps filling.
A value the operator changed meanwhile stays as the operator set it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Set
from dataclasses import replace

from diskguard.broker.ladderapi import LOCAL_RETENTION_MS, LadderApi, LadderCallFailed
from diskguard.logs import get_logger
from diskguard.retention.audit import AuditLog
from diskguard.retention.ladder import TIERED, TopicEviction
from diskguard.retention.ladderstate import LadderState, Lowered, with_value
from diskguard.retention.mode import BROKER
from diskguard.retention.requested import RequestedLogStart
from diskguard.retention.rungaudit import RungResult, rung_intent, rung_outcome

log = get_logger("diskguard.ladder")


class TieredRung:
    """Evictions and their restores, through ``api``; ``state`` remembers what was lowered."""

    def __init__(
        self,
        api: LadderApi,
        state: LadderState,
        audit: AuditLog,
        requested: RequestedLogStart,
    ) -> None:
        self.api = api
        self.state = state
        self.audit = audit
        self.requested = requested
        self._restore_failing = False

    def evict(self, ev: TopicEviction, usage_before: Mapping[str, float]) -> RungResult:
        """Lower ``ev.topic``'s local retention (never raise it: a lower value already set
        by an earlier cycle stays)."""
        value = str(ev.local_retention_ms)
        known = self.state.lowered().get(ev.topic)
        try:
            previous = (
                known.previous if known else self.api.topic_override(ev.topic, LOCAL_RETENTION_MS)
            )
        except LadderCallFailed as exc:
            return _failed(ev, str(exc))
        if known is not None and int(known.value) <= ev.local_retention_ms:
            value = known.value  # already lower: the broker drops these at its next check
        action = rung_intent(
            self.audit,
            {
                "kind": "evict",
                "rung": TIERED,
                "mode": BROKER,
                "topic": ev.topic,
                "key": LOCAL_RETENTION_MS,
                "value": value,
                "previous": previous,
                "cutoff_ms": ev.cutoff_ms,
                "segments": len(ev.segments),
                "bytes": ev.bytes,
                "mounts": list(ev.mounts),
                "usage_before_percent": {m: round(usage_before.get(m, 0.0), 3) for m in ev.mounts},
                "reason": "filesystem over retention.disk_usage_percent; uploaded to remote "
                "storage, so dropped locally without loss (consumers read it from remote)",
                "scope": "cluster: the topic's local retention applies on every replica; "
                "only local copies of uploaded segments go",
            },
        )
        if action is None:
            return RungResult(TIERED, ev.topic, False, 0, "audit log not writable")
        now_ms = int(time.time() * 1000)
        with self.state.change() as data:
            entry = data.lowered.get(ev.topic)
            data.lowered[ev.topic] = (
                replace(with_value(entry, value, ev.mounts), since_ms=now_ms)
                if entry
                else Lowered(LOCAL_RETENTION_MS, value, previous, ev.mounts, now_ms)
            )
        try:
            if known is None or known.value != value:
                self.api.set_topic_config(ev.topic, LOCAL_RETENTION_MS, value)
        except LadderCallFailed as exc:
            rung_outcome(self.audit, action, False, 0, str(exc))
            if known is None:
                with self.state.change() as data:
                    data.lowered.pop(ev.topic, None)
            return _failed(ev, str(exc))
        self.requested.record(list(ev.segments))
        rung_outcome(self.audit, action, True, ev.bytes, None)
        log.info(
            "tiered_eviction",
            topic=ev.topic,
            local_retention_ms=int(value),
            previous=previous,
            cutoff_ms=ev.cutoff_ms,
            segments=len(ev.segments),
            bytes=ev.bytes,
            mounts=list(ev.mounts),
        )
        by_mount: dict[str, int] = {}
        for d in ev.segments:
            by_mount[d.mount] = by_mount.get(d.mount, 0) + d.bytes
        return RungResult(TIERED, ev.topic, True, ev.bytes, None, by_mount)

    def settle(self, over: Set[str], late_after_s: float) -> None:
        """Restore each lowered topic whose disks are all at or under their target (``over``:
        the mounts still above it) and whose eviction the broker carried out."""
        for topic, entry in self.state.lowered().items():
            self._settle(topic, entry, over, late_after_s)

    def _settle(self, topic: str, entry: Lowered, over: Set[str], late_after_s: float) -> None:
        if self.requested.waiting(topic):
            waited = time.time() - entry.since_ms / 1000
            if waited < late_after_s:
                return
            self.requested.forget(topic)
            log.warning(
                "tiered_eviction_late",
                topic=topic,
                waited_s=round(waited, 1),
                consequence="the segments asked for no longer count as on their way out; "
                "the ladder goes on (not uploaded after all? see tiered_upload_stalled)",
            )
        if any(m in over for m in entry.mounts):
            return
        try:
            current = self.api.topic_override(topic, entry.key)
            if current != entry.value:
                with self.state.change() as data:
                    data.lowered.pop(topic, None)
                log.warning(
                    "tiered_restore_skipped",
                    topic=topic,
                    key=entry.key,
                    found=current,
                    set_by_diskguard=entry.value,
                    reason="changed since diskguard lowered it: the new value stays",
                )
                return
            action = rung_intent(
                self.audit,
                {
                    "kind": "restore",
                    "rung": TIERED,
                    "mode": BROKER,
                    "topic": topic,
                    "key": entry.key,
                    "value": entry.previous,
                    "replaced": entry.value,
                    "mounts": list(entry.mounts),
                    "bytes": 0,
                    "reason": "every filesystem it was lowered for is at or under its target",
                },
            )
            if action is None:
                return
            self.api.set_topic_config(topic, entry.key, entry.previous)
        except LadderCallFailed as exc:
            if not self._restore_failing:
                self._restore_failing = True
                log.warning("tiered_restore_failed", topic=topic, error=str(exc))
            return
        self._restore_failing = False
        rung_outcome(self.audit, action, True, 0, None)
        with self.state.change() as data:
            data.lowered.pop(topic, None)
        log.info("tiered_retention_restored", topic=topic, key=entry.key, value=entry.previous)


def _failed(ev: TopicEviction, error: str) -> RungResult:
    log.error("tiered_eviction_failed", topic=ev.topic, error=error)
    return RungResult(TIERED, ev.topic, False, 0, error)
