"""This guard's part in the cluster's holds: its record, its lease, the others' leases (edge).

Each converge pass starts with ``refresh()``: read every guard's record, take over what a
guard whose lease expired owned (a ``hold_lease_expired`` event, counted), publish this
guard's own record (which renews its lease), and hand the actuators one ``ClusterHolds``
view. The actuators record what they are about to create in the ledger and call
``publish()`` before creating it, so no guard ever mistakes another's ACL or throttle for
the operator's. Without a registry (no broker configured, or tests) the view is this guard
alone. When the registry cannot be read the view is marked incomplete: the actuators still
hold what this guard needs, but lift nothing (another guard may need it).

A registry that does not answer for less than a lease (its partition's leader restarting,
an ``acks=all`` write waiting for a follower that was just killed) fails nothing: this
guard's record still counts until its lease runs out, so the pass is only retried (at the
next renewal, every ``lease / 3``). Only a registry silent for longer than a lease, when
the other guards may no longer count this guard's holds, is an ``actuator_failed``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from diskguard.flow.actuator import ActuatorError, Ledger, actuator_log
from diskguard.flow.holds import (
    ClusterHolds,
    GuardHold,
    QuotaEntity,
    entity_key,
    settled_claim,
)

__all__ = ["GuardIdentity", "Registry", "SharedHolds", "quota_needs"]


class Registry(Protocol):
    """Where the guards' records live (``flow.holdsregistry.HoldsRegistry``; tests: memory)."""

    def read(self) -> dict[str, GuardHold]: ...

    def publish(self, hold: GuardHold) -> None: ...

    def remove(self, guard: str) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class GuardIdentity:
    guard: str
    broker_id: int | None
    host: str
    lease_s: float


#: What this guard needs now: ((topic, principal) DENY WRITE pairs, quota entity -> rate).
Needs = tuple[frozenset[tuple[str, str]], dict[str, tuple[QuotaEntity, float]]]


class SharedHolds:
    """The cluster view each converge pass works from; see the module docstring."""

    def __init__(
        self,
        ledger: Ledger,
        identity: GuardIdentity,
        needs: Callable[[], Needs],
        registry: Registry | None = None,
        *,
        on_expired: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._ledger = ledger
        self.identity = identity
        self._needs = needs
        self.registry = registry
        self._on_expired = on_expired
        self._clock = clock
        self._others: dict[str, GuardHold] = {}
        self._complete = registry is None
        self._published: dict[str, object] | None = None
        self._reported: set[tuple[str, int]] = set()
        self._adopted = False
        #: Since when (this guard's clock, ms) the registry has answered every read and write;
        #: None after a failure. While the topic did not answer, no guard could renew.
        self._answering_since: int | None = None
        #: When the registry last answered a call (this guard's clock, ms); None before the
        #: first call. A silence shorter than a lease is retried, not reported.
        self._answered_ms: int | None = None
        #: The others' records changed since the previous refresh (a pass must re-check).
        self.changed = False

    @property
    def complete(self) -> bool:
        """The last refresh read every guard's record (or there is no registry)."""
        return self._complete

    def own(self) -> GuardHold:
        acl_needs, quota_needs = self._needs()
        applied = self._ledger.applied
        with self._ledger.lock:
            return GuardHold(
                guard=self.identity.guard,
                broker_id=self.identity.broker_id,
                host=self.identity.host,
                lease_s=self.identity.lease_s,
                renewed_ms=self.now_ms(),
                acl_needs=acl_needs,
                quota_needs=dict(quota_needs),
                acl_owned=frozenset(applied.acl_owned),
                quota_owned=dict(applied.quota_previous),
            )

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    def view(self) -> ClusterHolds:
        return ClusterHolds(
            own=self.own(),
            others=dict(self._others),
            now_ms=self.now_ms(),
            complete=self._complete,
        )

    def refresh(self) -> ClusterHolds:
        """Read the registry, take over expired leases, renew this guard's; the view.

        A registry failure is reported (``actuator_failed``, actuator ``holds``) and gives
        an incomplete view built from what was read before."""
        if self.registry is None:
            return self.view()
        try:
            records = self.registry.read()
        except Exception as exc:
            self._complete = False
            self._registry_failed("read", exc)
            return self.view()
        self._answered()
        if self._answering_since is None:
            self._answering_since = self.now_ms()
        mine = records.get(self.identity.guard)
        if mine is not None and not self._adopted:
            # What this guard's earlier run published: a state dir lost or wiped since must
            # not turn its ACLs and restore values into the operator's.
            self._merge_owned(mine)
        self._adopted = True
        others = {k: h for k, h in records.items() if k != self.identity.guard}
        self.changed = others != self._others
        self._others = others
        self._complete = True
        view = self.view()
        # A lease counts as expired only once the topic has answered this guard for that
        # long: while it did not (its leader's broker restarting), no guard could renew, and
        # a guard cut off from it may not judge the others' leases by its own silence.
        answering = view.now_ms - self._answering_since
        expired = [h for h in view.expired_others() if answering > h.lease_s * 1000]
        if expired:
            self._take_over(expired, view.now_ms)
        self.publish(force=True)
        return self.view()

    def _take_over(self, expired: list[GuardHold], now_ms: int) -> None:
        """What a dead guard owned becomes this guard's (so it is undone when nobody needs
        it), then its record goes: its needs no longer hold anything."""
        for hold in expired:
            marker = (hold.guard, hold.renewed_ms)
            if marker not in self._reported:
                self._reported.add(marker)
                actuator_log().warning(
                    "hold_lease_expired",
                    guard=hold.guard,
                    broker_id=hold.broker_id,
                    host=hold.host,
                    expired_for_s=round((now_ms - hold.renewed_ms) / 1000 - hold.lease_s, 1),
                    acl_topics=sorted({t for t, _p in hold.acl_needs}),
                    quota_entities=sorted(hold.quota_needs),
                    # What it held on the cluster, whatever it still said it needed: a
                    # guard killed between creating an ACL and publishing its need for it
                    # leaves needs that name nothing.
                    acls_owned=[str(b) for b in sorted(hold.acl_owned)],
                    held_topics=sorted(
                        {t for t, _p in hold.acl_needs} | {b.name for b in hold.acl_owned}
                    ),
                    quotas_owned={
                        key: previous for key, (_e, previous) in sorted(hold.quota_owned.items())
                    },
                    message="a guard stopped renewing its hold: its holds no longer count, "
                    "and what it added is undone once no live guard needs it",
                )
                if self._on_expired is not None:
                    self._on_expired()
            self._merge_owned(hold, self.own().quota_needs)
        self.publish(force=True)
        assert self.registry is not None
        for hold in expired:
            try:
                self.registry.remove(hold.guard)
            except Exception as exc:
                self._registry_failed("remove", exc)
                continue
            self._answered()
            self._others.pop(hold.guard, None)

    def _merge_owned(
        self, hold: GuardHold, needs: Mapping[str, tuple[QuotaEntity, float]] | None = None
    ) -> None:
        """``hold``'s ACLs and quota claims become this guard's; where both claim a value
        for one entity, ``settled_claim`` says which is the operator's (``needs``: this
        guard's own throttle rates, beside those in ``hold``)."""
        if not hold.acl_owned and not hold.quota_owned:
            return
        with self._ledger.lock:
            self._ledger.applied.acl_owned.update(hold.acl_owned)
            previous = self._ledger.applied.quota_previous
            for key, claim in hold.quota_owned.items():
                throttles = {
                    rate
                    for k, (_e, rate) in [*(needs or {}).items(), *hold.quota_needs.items()]
                    if k == key
                }
                previous[key] = settled_claim(previous.get(key, claim), claim, throttles)
        self._ledger.save()

    def publish(self, force: bool = False) -> bool:
        """Write this guard's record (a tombstone once it needs and owns nothing); False on
        failure (reported). Unchanged records are written again only with ``force`` (the
        renewal of a lease)."""
        if self.registry is None:
            return True
        own = self.own()
        body = own.to_json()
        if body == self._published and not force:
            return True
        if own.empty and self._published == {}:
            return True  # tombstoned already
        try:
            if own.empty:
                self.registry.remove(own.guard)
                self._published = {}
            else:
                self.registry.publish(own)
                self._published = body
        except Exception as exc:
            self._published = None
            self._registry_failed("publish", exc)
            return False
        self._answered()
        return True

    def _answered(self) -> None:
        self._answered_ms = self.now_ms()

    def _registry_failed(self, action: str, exc: BaseException) -> None:
        """A registry call failed: no lease is judged until it answers again for a lease
        (``_answering_since``); reported as ``actuator_failed`` only once the registry has
        not answered for longer than this guard's lease (see the module docstring)."""
        self._answering_since = None
        now = self.now_ms()
        if self._answered_ms is None:
            self._answered_ms = now  # the silence starts with the first call
        silent_s = (now - self._answered_ms) / 1000
        if silent_s < self.identity.lease_s:
            # The registry dropped its clients already; the next pass reconnects.
            actuator_log().debug(
                "holds_registry_retrying", action=action, error=str(exc), silent_s=silent_s
            )
            return
        error = ActuatorError(
            f"{exc} (the holds topic has not answered for {silent_s:.0f} s, "
            f"more than the lease of {self.identity.lease_s:g} s)"
        )
        self._ledger.broker_failed("holds", action, error)


def quota_needs(entities: list[QuotaEntity], rate: float) -> dict[str, tuple[QuotaEntity, float]]:
    return {entity_key(e): (e, rate) for e in entities}
