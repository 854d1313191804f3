"""Actuators: what diskguard does about an overfull store — the protocol and what they share.

The pure ``flow.state.step`` says *when* a filesystem becomes overfull or clears; the
actuators act on it. Three are configurable (``flow_control.actuators``), one module each:

``exec`` (``flow.hook``)
    Runs ``flow_control.on_change`` (argv, no shell) on every ``overfull`` /
    ``overfull_cleared`` with ``DISKGUARD_*`` variables, on a background thread, killed
    (whole process group) at ``on_change_timeout``. A notification: never retried.
``quota`` (``flow.kafkaquota``)
    Throttles producers with a Kafka client quota (``producer_byte_rate``) through
    AlterClientQuotas while any filesystem is overfull, and restores the values that were
    there before (read with DescribeClientQuotas first) when all have cleared.
``acl`` (``flow.kafkaacl``)
    Adds DENY WRITE ACLs (principal ``flow_control.acl_principal``, host ``*``, TOPIC
    LITERAL) for every topic with a partition on an overfull filesystem (and, on a cluster
    that lets everyone in where no ACL is found, an ALLOW ALL for ``User:*`` on a topic that
    had no ACL, so readers and the guard's own DeleteRecords keep working); removed on clear.

ACLs and quotas are the cluster's, not the broker's: the guards of a cluster share them
through one compacted topic (``flow.holds``, ``flow.holdsregistry``, ``flow.sharedholds``): a
hold is lifted only when no live guard needs it, and what was there before is restored.

Why level-triggered: ``quota`` and ``acl`` are driven by a *desired* state (which mounts are
overfull, which topics live there) that the reconciler (``flow.reconcile``) converges the
broker to, recording what it applied in ``<state_dir>/actuators.json`` (the ``Ledger``)
*before* applying it. A daemon killed with -9 in the middle finds that record on restart,
and the first ``reconcile`` removes what is no longer wanted — producers are never left
blocked by a crashed guard. A failed call is logged as ``actuator_failed``, counted, and
retried on the next pass; nothing ever raises into the daemon loop, and nothing blocks it:
broker calls and hooks run on worker threads.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from diskguard.flow.holds import AclBinding, ClusterHolds, QuotaEntity, deny_write, entity_key
from diskguard.flow.state import Transition
from diskguard.host.atomicfile import read_json, write_json_atomic
from diskguard.logs import get_logger

__all__ = [
    "STATE_FILE",
    "Actuator",
    "ActuatorError",
    "Applied",
    "Ledger",
    "QuotaEntity",
    "ReadBack",
    "actuator_log",
    "entity_key",
]

STATE_FILE: Final = "actuators.json"
_STATE_VERSION: Final = 1


def actuator_log() -> Any:
    """Looked up per call: a module-level logger would keep the import-time configuration."""
    return get_logger("diskguard.actuators")


class ActuatorError(Exception):
    """A broker refused or could not do what an actuator asked; message is one line."""


class Actuator(Protocol):
    """One way of holding producers back; the reconciler drives every configured one alike.

    ``on_transition`` is the edge-triggered part (the hook fires, a new episode starts);
    ``converge`` the level-triggered part (make the broker match ``Ledger.applied``).
    Neither may block the daemon loop for long nor raise into it.
    """

    #: ``exec``, ``quota`` or ``acl``: the config's name and ``actuator_failed``'s field.
    name: str

    def on_transition(self, transition: Transition) -> bool:
        """React to an ``overfull`` / ``overfull_cleared`` at once; True = this one acts on it."""
        ...

    def converge(self, confirmed: bool, holds: ClusterHolds) -> bool:
        """One pass towards the desired state; True when nothing is left to do.

        ``confirmed`` = the last pass succeeded with the same desired state: what is
        recorded is known to be on the broker, so it need not be re-sent. ``holds``: what
        every guard of the cluster needs and owns (this one's from the ledger).
        """
        ...

    def wait_idle(self, timeout_s: float) -> bool:
        """True once queued work (hooks) has finished (tests, shutdown)."""
        ...

    def close(self) -> None: ...


@dataclass
class Applied:
    """What is applied on the broker right now, as persisted in ``actuators.json``."""

    #: Mounts known to be overfull, with the topics that have partitions there (desired).
    overfull: dict[str, list[str]] = field(default_factory=dict)
    #: Quota entities we changed -> their value before (None = had none). Non-empty = throttled.
    quota_previous: dict[str, tuple[QuotaEntity, float | None]] = field(default_factory=dict)
    quota_applied: bool = False
    #: Quota entities (keys) whose ``quota_applied`` was said and whose ``quota_restored``
    #: was not: a throttle announced and not yet seen gone. Needed again before then (a
    #: restore not shown yet, or never sent), it is the same hold, said once.
    quota_said: set[str] = field(default_factory=set)
    #: (topic, principal) pairs this guard holds with a DENY WRITE ACL (its need, applied).
    acl: set[tuple[str, str]] = field(default_factory=set)
    #: ACLs this guard created (or took over from a guard whose lease expired): recorded
    #: before they are created, removed once no guard needs them.
    acl_owned: set[AclBinding] = field(default_factory=set)
    #: Owned ACLs whose DeleteAcls this guard sent but has not yet seen take effect (the
    #: broker still listed them when the call gave up waiting): ``acl_removed`` comes when a
    #: later pass no longer finds them.
    acl_removing: set[AclBinding] = field(default_factory=set)
    #: (topic, principal) holds whose ``acl_applied`` was said and whose ``acl_removed`` was
    #: not: needed again before the removal shows, the same hold, said once.
    acl_said: set[tuple[str, str]] = field(default_factory=set)

    @property
    def throttled(self) -> bool:
        """A quota throttle is recorded: applied, or a restore value saved before applying."""
        return self.quota_applied or bool(self.quota_previous)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "overfull": {m: sorted(t) for m, t in sorted(self.overfull.items())},
            "quota": {
                "applied": self.quota_applied,
                "said": sorted(self.quota_said),
                "previous": [
                    {"entity": [list(p) for p in entity], "value": value}
                    for _key, (entity, value) in sorted(self.quota_previous.items())
                ],
            },
            "acl": [{"topic": t, "principal": p} for t, p in sorted(self.acl)],
            "acl_owned": [b.to_json() for b in sorted(self.acl_owned)],
            "acl_removing": [b.to_json() for b in sorted(self.acl_removing)],
            "acl_said": [{"topic": t, "principal": p} for t, p in sorted(self.acl_said)],
        }

    @classmethod
    def from_json(cls, data: Any) -> Applied:
        if not isinstance(data, dict) or data.get("version") != _STATE_VERSION:
            return cls()
        previous: dict[str, tuple[QuotaEntity, float | None]] = {}
        quota = data.get("quota") or {}
        for item in quota.get("previous") or ():
            entity: QuotaEntity = tuple(
                (str(k), None if n is None else str(n)) for k, n in item["entity"]
            )
            value = item.get("value")
            previous[entity_key(entity)] = (entity, None if value is None else float(value))
        applied = bool(quota.get("applied"))
        if "said" in quota:
            said = {str(k) for k in quota["said"] or ()}
        else:  # written before it was recorded: a throttle in place had been said
            said = set(previous) if applied else set()
        acl = {(str(a["topic"]), str(a["principal"])) for a in data.get("acl") or ()}
        if "acl_said" in data:
            acl_said = {(str(a["topic"]), str(a["principal"])) for a in data["acl_said"] or ()}
        else:
            acl_said = set(acl)
        if "acl_owned" in data:
            owned = {AclBinding.from_json(b) for b in data["acl_owned"] or ()}
        else:  # written before ownership was recorded: its DENYs were all its own
            owned = {deny_write(t, p) for t, p in acl}
        return cls(
            overfull={
                str(m): [str(t) for t in ts] for m, ts in (data.get("overfull") or {}).items()
            },
            quota_previous=previous,
            quota_applied=applied,
            quota_said=said & previous.keys(),
            acl=acl,
            acl_owned=owned,
            acl_removing={AclBinding.from_json(b) for b in data.get("acl_removing") or ()} & owned,
            acl_said=acl_said,
        )


class ReadBack:
    """The silence of an actuator's broker calls that only re-check holds already in place
    (a lease renewal's pass, a restarted guard's): such a call that fails is retried by the
    next pass and reported (``actuator_failed``) only once the brokers have not answered it
    for longer than this guard's lease, as the holds topic's silence is. A broker restarting
    in the cluster can take the request with it, and while nothing is to change, asking again
    loses nothing: the holds stay as they are. A call for a hold still to apply or lift
    (``pending``) is reported at once: producers are not held, or not released, until it
    answers."""

    def __init__(self, ledger: Ledger, actuator: str) -> None:
        self._ledger = ledger
        self._actuator = actuator
        #: When the first call of the current run of failures failed (the holds' clock).
        self._since_ms: int | None = None

    def answered(self) -> None:
        self._since_ms = None

    def failed(
        self, action: str, exc: BaseException, holds: ClusterHolds, *, pending: bool
    ) -> None:
        now = holds.now_ms
        if self._since_ms is None:
            self._since_ms = now
        silent_s = (now - self._since_ms) / 1000
        lease_s = holds.own.lease_s
        if pending:
            self._ledger.broker_failed(self._actuator, action, exc)
        elif silent_s >= lease_s:
            self._ledger.broker_failed(
                self._actuator,
                action,
                ActuatorError(
                    f"{_failure_text(exc)} (the brokers have not answered this guard's "
                    f"read-back for {silent_s:.0f} s, more than the lease of {lease_s:g} s)"
                ),
            )
        else:
            self._ledger.reset_clients()
            actuator_log().debug(
                "holds_readback_retrying",
                actuator=self._actuator,
                action=action,
                error=_failure_text(exc),
                silent_s=round(silent_s, 1),
            )


def _failure_text(exc: BaseException) -> str:
    """``actuator_failed``'s ``error``: our own message as it is, anything else with its type."""
    return str(exc) if isinstance(exc, ActuatorError) else f"{type(exc).__name__}: {exc}"


class Ledger:
    """The crash-safe record every actuator writes to, and where failures are reported.

    ``applied`` is guarded by ``lock``; ``save()`` persists it (call it *before* acting, so a
    crash can only leave recorded actions behind) and must be called without ``lock``.
    """

    def __init__(self, path: Path, on_failure: Callable[[str], None] | None = None) -> None:
        self.path = path
        self.lock = threading.Lock()
        self._on_failure = on_failure
        self._failures: dict[str, int] = {"exec": 0, "quota": 0, "acl": 0, "holds": 0}
        self._failures_lock = threading.Lock()
        self._resets: list[Callable[[], None]] = []
        self.applied = self._load()

    def save(self) -> None:
        with self.lock:
            data = self.applied.to_json()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path, data)

    def failed(self, actuator: str, action: str, error: str) -> None:
        """Log ``actuator_failed`` and count it; the ``on_failure`` callback feeds metrics."""
        with self._failures_lock:
            self._failures[actuator] = self._failures.get(actuator, 0) + 1
            count = self._failures[actuator]
        actuator_log().error(
            "actuator_failed", actuator=actuator, action=action, error=error, failures=count
        )
        if self._on_failure is not None:
            with contextlib.suppress(Exception):
                self._on_failure(actuator)

    def on_broker_failure(self, reset: Callable[[], None]) -> None:
        """Register a client to drop after any broker failure, so the retry reconnects."""
        self._resets.append(reset)

    def broker_failed(self, actuator: str, action: str, exc: BaseException) -> None:
        self.reset_clients()
        self.failed(actuator, action, _failure_text(exc))

    def reset_clients(self) -> None:
        """Drop every registered client, so the next call connects anew (maybe elsewhere)."""
        for reset in self._resets:
            reset()

    def failure_counts(self) -> dict[str, int]:
        with self._failures_lock:
            return dict(self._failures)

    def _load(self) -> Applied:
        try:
            return Applied.from_json(read_json(self.path, None))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            actuator_log().error("actuator_state_unreadable", path=str(self.path), error=repr(exc))
            return Applied()
