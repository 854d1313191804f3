"""Holds shared by every guard of a cluster: who needs what, who added what (pure).

ACLs and client quotas are cluster-wide: the DENY WRITE one guard adds is the same ACL the
guard of another broker adds, and a quota one guard sets is the "previous value" the next one
would read. So each guard publishes one record (``GuardHold``) to a compacted topic, keyed by
guard: what it *needs* now (the holds of its overfull disks) and what it *owns* (the ACLs it
created, the quota values it found before any guard changed them), renewed within a lease.
Every guard then converges the cluster to the same function of all records:

- a hold is applied while at least one **live** record needs it (an expired lease counts as
  not needing: a guard killed -9 cannot hold producers forever);
- what any record owns is diskguard's; everything else on the cluster was there before and
  is never removed, and decides what the hold may add: on a cluster that lets everyone in
  where no ACL is found, a topic none of whose ACLs predate the hold gets an ALLOW ALL for
  ``User:*`` beside the DENY WRITE (the DENY alone would end reads, DescribeConfigs and
  DeleteRecords for everyone); a topic that had ACLs only gets the DENY;
- a quota goes back to the value owned for it (the one found before the first hold).

Nothing here does I/O: ``flow.holdsregistry`` reads and writes the topic, the actuators act.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "ALLOW_ALL_PRINCIPAL",
    "AclBinding",
    "AclPlan",
    "ClusterHolds",
    "GuardHold",
    "QuotaEntity",
    "acl_plan",
    "allow_all",
    "deny_write",
    "entity_key",
    "settled_claim",
]

#: The record shape's version; a record of another version is read as needing nothing.
HOLD_VERSION: Final = 1
ALLOW_ALL_PRINCIPAL: Final = "User:*"

#: Who a quota applies to: sorted ``(entity_type, name)`` pairs, ``None`` = the default entity.
QuotaEntity = tuple[tuple[str, str | None], ...]


def entity_key(entity: QuotaEntity) -> str:
    return ",".join(f"{kind}={'<default>' if name is None else name}" for kind, name in entity)


def entity_from_json(raw: Any) -> QuotaEntity:
    return tuple((str(k), None if n is None else str(n)) for k, n in raw)


@dataclass(frozen=True, order=True)
class AclBinding:
    """One ACL exactly as Kafka keys it (names as Kafka spells them: TOPIC, LITERAL, WRITE...)."""

    resource_type: str
    name: str
    pattern_type: str
    principal: str
    host: str
    operation: str
    permission: str

    def matches_topic(self, topic: str) -> bool:
        """Does this ACL take part in authorizing ``topic``? (literal, ``*``, or a prefix:
        any of them ends ``allow.everyone.if.no.acl.found`` for the topic)."""
        if self.resource_type != "TOPIC":
            return False
        if self.pattern_type == "LITERAL":
            return self.name in (topic, "*")
        if self.pattern_type == "PREFIXED":
            return topic.startswith(self.name)
        return False

    def to_json(self) -> list[str]:
        return [
            self.resource_type,
            self.name,
            self.pattern_type,
            self.principal,
            self.host,
            self.operation,
            self.permission,
        ]

    @classmethod
    def from_json(cls, raw: Any) -> AclBinding:
        fields = [str(x) for x in raw]
        if len(fields) != 7:
            raise ValueError(f"an ACL binding has 7 fields, got {len(fields)}")
        return cls(*fields)

    def __str__(self) -> str:
        return (
            f"{self.permission} {self.operation} {self.principal}@{self.host} on "
            f"{self.resource_type}:{self.pattern_type}:{self.name}"
        )


def deny_write(topic: str, principal: str) -> AclBinding:
    return AclBinding("TOPIC", topic, "LITERAL", principal, "*", "WRITE", "DENY")


def allow_all(topic: str) -> AclBinding:
    return AclBinding("TOPIC", topic, "LITERAL", ALLOW_ALL_PRINCIPAL, "*", "ALL", "ALLOW")


@dataclass(frozen=True)
class GuardHold:
    """One guard's record: what it needs held now and what it owns on the cluster."""

    guard: str
    broker_id: int | None = None
    host: str = ""
    lease_s: float = 60.0
    #: When the record was written (the topic's LogAppendTime: the broker's clock), ms.
    renewed_ms: int = 0
    #: (topic, principal) pairs whose DENY WRITE this guard needs.
    acl_needs: frozenset[tuple[str, str]] = frozenset()
    #: Quota entity key -> (entity, producer byte rate) this guard needs.
    quota_needs: Mapping[str, tuple[QuotaEntity, float]] = field(default_factory=dict)
    #: ACLs this guard (or a guard whose lease it took over) created.
    acl_owned: frozenset[AclBinding] = frozenset()
    #: Quota entity key -> (entity, its value before any guard changed it; None = unset).
    quota_owned: Mapping[str, tuple[QuotaEntity, float | None]] = field(default_factory=dict)

    @property
    def needs_anything(self) -> bool:
        return bool(self.acl_needs or self.quota_needs)

    @property
    def empty(self) -> bool:
        return not (self.needs_anything or self.acl_owned or self.quota_owned)

    def expired(self, now_ms: int) -> bool:
        return now_ms - self.renewed_ms > self.lease_s * 1000

    def to_json(self) -> dict[str, Any]:
        return {
            "version": HOLD_VERSION,
            "guard": self.guard,
            "broker_id": self.broker_id,
            "host": self.host,
            "lease_s": self.lease_s,
            "acl_needs": [[t, p] for t, p in sorted(self.acl_needs)],
            "quota_needs": [
                {"entity": [list(p) for p in e], "rate": r}
                for _k, (e, r) in sorted(self.quota_needs.items())
            ],
            "acl_owned": [b.to_json() for b in sorted(self.acl_owned)],
            "quota_owned": [
                {"entity": [list(p) for p in e], "previous": v}
                for _k, (e, v) in sorted(self.quota_owned.items())
            ],
        }

    @classmethod
    def from_json(cls, data: Any, renewed_ms: int) -> GuardHold:
        """A record as published; raises ValueError/KeyError/TypeError on another shape."""
        if not isinstance(data, dict) or data.get("version") != HOLD_VERSION:
            raise ValueError("not a version-1 hold record")
        quota_needs: dict[str, tuple[QuotaEntity, float]] = {}
        for item in data.get("quota_needs") or ():
            entity = entity_from_json(item["entity"])
            quota_needs[entity_key(entity)] = (entity, float(item["rate"]))
        quota_owned: dict[str, tuple[QuotaEntity, float | None]] = {}
        for item in data.get("quota_owned") or ():
            entity = entity_from_json(item["entity"])
            value = item.get("previous")
            quota_owned[entity_key(entity)] = (entity, None if value is None else float(value))
        broker_id = data.get("broker_id")
        return cls(
            guard=str(data["guard"]),
            broker_id=None if broker_id is None else int(broker_id),
            host=str(data.get("host") or ""),
            lease_s=float(data.get("lease_s") or 60.0),
            renewed_ms=int(renewed_ms),
            acl_needs=frozenset((str(t), str(p)) for t, p in data.get("acl_needs") or ()),
            quota_needs=quota_needs,
            acl_owned=frozenset(AclBinding.from_json(b) for b in data.get("acl_owned") or ()),
            quota_owned=quota_owned,
        )


@dataclass(frozen=True)
class ClusterHolds:
    """Every guard's record as last read (``own`` is this guard's, as it is about to publish).

    ``others`` excludes this guard's key: what this guard knows of itself is its ledger, not
    what it last published.
    """

    own: GuardHold
    others: Mapping[str, GuardHold]
    now_ms: int
    #: Every guard's record was read: False after a failed read (nothing is then lifted,
    #: since another guard may need it).
    complete: bool = True

    def live_others(self) -> list[GuardHold]:
        return [h for _k, h in sorted(self.others.items()) if not h.expired(self.now_ms)]

    def expired_others(self) -> list[GuardHold]:
        return [h for _k, h in sorted(self.others.items()) if h.expired(self.now_ms)]

    def _live(self) -> list[GuardHold]:
        return [self.own, *self.live_others()]

    def acl_needs(self) -> set[tuple[str, str]]:
        return {need for hold in self._live() for need in hold.acl_needs}

    def acl_owned(self) -> set[AclBinding]:
        """Everything any guard created, live or not: never taken for the operator's."""
        return set(self.own.acl_owned).union(*(h.acl_owned for h in self.others.values()))

    def quota_needs(self) -> dict[str, tuple[QuotaEntity, float]]:
        """Per entity the strictest rate any live guard needs."""
        out: dict[str, tuple[QuotaEntity, float]] = {}
        for hold in self._live():
            for key, (entity, rate) in hold.quota_needs.items():
                if key not in out or rate < out[key][1]:
                    out[key] = (entity, rate)
        return out

    def quota_owned(self) -> dict[str, tuple[QuotaEntity, float | None]]:
        """Per entity the value found before the first hold (this guard's claim first)."""
        out: dict[str, tuple[QuotaEntity, float | None]] = {}
        for hold in [self.own, *(h for _k, h in sorted(self.others.items()))]:
            for key, claim in hold.quota_owned.items():
                out.setdefault(key, claim)
        return out

    def throttle_rates(self, key: str) -> set[float]:
        """The rates guards write for ``key`` while holding (every record, live or not)."""
        return {
            rate
            for hold in [self.own, *self.others.values()]
            for k, (_e, rate) in hold.quota_needs.items()
            if k == key
        }

    def needed_by(self, topic: str) -> list[str]:
        """The other live guards that still need ``topic`` held (for the events)."""
        return [h.guard for h in self.live_others() if any(t == topic for t, _p in h.acl_needs)]

    def quota_needed_by(self) -> list[str]:
        return [h.guard for h in self.live_others() if h.quota_needs]


@dataclass(frozen=True)
class AclPlan:
    """What one converge pass does to the cluster's ACLs."""

    desired: frozenset[AclBinding]
    create: tuple[AclBinding, ...]
    delete: tuple[AclBinding, ...]
    #: Topics that get an ALLOW ALL for ``User:*`` with their DENY (they had no ACL).
    allowed: tuple[str, ...]
    #: Topics left without a hold: no ACL of their own and the cluster's default unknown.
    skipped: tuple[str, ...]


def acl_plan(
    needs: Iterable[tuple[str, str]],
    present: Iterable[AclBinding],
    owned: Iterable[AclBinding],
    permissive: bool | None,
) -> AclPlan:
    """The ACLs the cluster should have for ``needs`` and the steps from ``present`` to them.

    ``permissive``: the authorizer lets everyone in where no ACL is found (``True``), does not
    (``False``: a topic without ACLs is closed to all but super users already; the DENY adds
    nothing but harms nothing), or it is unknown (``None``: a topic without ACLs cannot be
    held safely — the DENY alone would close it to readers if the cluster is permissive, an
    ALLOW would open it if it is not — so it is skipped and reported).
    Only ACLs someone owns are ever deleted; the operator's, even one identical to ours, stay.
    """
    present_set = set(present)
    owned_set = set(owned)
    before = present_set - owned_set  # the operator's ACLs: what was there before any hold
    desired: set[AclBinding] = set()
    allowed: set[str] = set()
    skipped: set[str] = set()
    by_topic: dict[str, set[str]] = {}
    for topic, principal in needs:
        by_topic.setdefault(topic, set()).add(principal)
    for topic, principals in sorted(by_topic.items()):
        had_acls = any(b.matches_topic(topic) for b in before)
        if not had_acls and permissive is None:
            skipped.add(topic)
            continue
        desired.update(deny_write(topic, p) for p in principals)
        if not had_acls and permissive:
            desired.add(allow_all(topic))
            allowed.add(topic)
    create = tuple(sorted(desired - present_set))
    delete = tuple(sorted((owned_set & present_set) - desired))
    return AclPlan(
        frozenset(desired), create, delete, tuple(sorted(allowed)), tuple(sorted(skipped))
    )


def settled_claim(
    mine: tuple[QuotaEntity, float | None],
    theirs: tuple[QuotaEntity, float | None],
    throttles: set[float],
) -> tuple[QuotaEntity, float | None]:
    """Of two guards' "value before the throttle" for one entity, the true one.

    Each guard publishes its claim before it throttles, but two guards going overfull at
    once can each read the registry before the other's claim is there; the later one then
    describes the quota after the first one's throttle and claims the throttle. So when two
    claims differ and one is a rate some guard throttles with while the other is not, the
    other is what the operator had (restoring the throttle would hold producers for good).
    Otherwise ``mine`` stands."""
    if mine[1] != theirs[1] and mine[1] in throttles and theirs[1] not in throttles:
        return theirs
    return mine
