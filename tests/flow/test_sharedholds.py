"""Many guards, one cluster: the holds protocol at the client boundary (fast, no broker).

Two or three ``Actuators`` (one per broker, each with its own state dir and broker id) share
one in-memory registry (what the compacted topic holds: the latest record per guard, dated
by one clock) and one fake broker (confluent-kafka ACL shapes, kafka-python quota requests).
The same scenarios run against a real three-broker cluster in
``tests/broker/test_realcluster.py``; here every interleaving is cheap to set up.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from diskguard.config import parse_config
from diskguard.flow.actuator import QuotaEntity
from diskguard.flow.holds import AclBinding as Binding
from diskguard.flow.holds import GuardHold, acl_plan, allow_all, deny_write
from diskguard.flow.kafkaacl import ConfluentAclAdmin
from diskguard.flow.kafkaquota import KafkaQuotaAdmin
from diskguard.flow.reconcile import Actuators
from diskguard.flow.state import FlowLimits, FlowState, Transition, step
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.logs import configure_logging
from support.fakes import FakeConfluentAdmin, FakeQuotaBroker

GiB = 1024**3
USER_DEFAULT: QuotaEntity = (("user", None),)
CLIENT_DEFAULT: QuotaEntity = (("client-id", None),)
LEASE = 6.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


class MemoryRegistry:
    """The compacted topic: the latest record per key, dated by the (shared) clock, as the
    broker's LogAppendTime dates them; ``broken`` makes every call fail."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.records: dict[str, tuple[dict[str, Any], int]] = {}
        self.broken = False

    def _check(self) -> None:
        if self.broken:
            raise RuntimeError("holds topic unreachable")

    def read(self) -> dict[str, GuardHold]:
        self._check()
        return {k: GuardHold.from_json(v, ts) for k, (v, ts) in self.records.items()}

    def publish(self, hold: GuardHold) -> None:
        self._check()
        self.records[hold.guard] = (
            json.loads(json.dumps(hold.to_json())),
            int(self.clock() * 1000),
        )

    def remove(self, guard: str) -> None:
        self._check()
        self.records.pop(guard, None)

    def close(self) -> None:
        pass


@pytest.fixture()
def logs() -> Iterator[io.StringIO]:
    saved = structlog.get_config()
    buf = io.StringIO()
    configure_logging("json", "debug", stream=buf)
    try:
        yield buf
    finally:
        structlog.configure(**saved)


def events(buf: io.StringIO, name: str) -> list[dict[str, Any]]:
    return [
        rec
        for rec in (json.loads(line) for line in buf.getvalue().splitlines() if line.strip())
        if rec.get("event") == name
    ]


class Cluster:
    """One fake broker, one registry, one clock; ``guard(n)`` is broker n's diskguard."""

    def __init__(self, tmp_path: Path, permissive: bool | None = True) -> None:
        self.tmp_path = tmp_path
        self.clock = Clock()
        self.registry = MemoryRegistry(self.clock)
        self.acls = FakeConfluentAdmin()
        self.quotas = FakeQuotaBroker()
        self.permissive = permissive
        self.expired: list[int] = []

    def guard(
        self,
        broker_id: int,
        actuators: tuple[str, ...] = ("acl", "quota"),
        said_before: bool = False,
    ) -> Actuators:
        log_dir = self.tmp_path / f"broker-{broker_id}"
        log_dir.mkdir(exist_ok=True)
        (log_dir / "meta.properties").write_text(f"version=1\nnode.id={broker_id}\n")
        cfg = parse_config(
            {
                "broker": {"log_dirs": [str(log_dir)], "bootstrap_servers": "127.0.0.1:9"},
                "flow_control": {
                    "overfull_percent": 90,
                    "underfull_percent": 80,
                    "actuators": list(actuators),
                    "hold_lease": f"{LEASE}s",
                    "quota": {"producer_byte_rate": "1KiB"},
                },
                "snapshots": {"host": f"host-{broker_id}", "topic": "diskguard-snapshots"},
                "daemon": {"state_dir": str(self.tmp_path / f"state-{broker_id}")},
            },
            log_dir / "diskguard.toml",
        )
        return Actuators(
            cfg,
            acl_admin=ConfluentAclAdmin(self.acls),
            quota_admin=KafkaQuotaAdmin(self.quotas.send),
            background=False,
            registry=self.registry,
            acl_permissive=self.permissive,
            on_lease_expired=lambda: self.expired.append(broker_id),
            clock=self.clock,
            said_before=said_before,
        )

    def acl_set(self) -> set[Binding]:
        return {ConfluentAclAdmin._ours(b) for b in self.acls.acls}


def overfull(acts: Actuators, topics: list[str], mount: str = "/data") -> None:
    acts.apply(transition("overfull", mount), topics=topics)


def cleared(acts: Actuators, mount: str = "/data") -> None:
    acts.apply(transition("overfull_cleared", mount, 50.0))


def transition(event: str, mount: str = "/data", percent: float = 95.0) -> Transition:
    total = 100 * GiB
    used = int(total * percent / 100)
    limits = FlowLimits(overfull_percent=90, underfull_percent=80, min_free_bytes=0)
    usage = FilesystemUsage(mount, "/dev/x", total, used, total - used)
    _, out = step(FlowState(overfull=event == "overfull_cleared"), usage, limits)
    (found,) = [t for t in out if t.event == event]
    return found


def operator_acl(admin: FakeConfluentAdmin, binding: Binding) -> None:
    admin.acls.add(
        AclBinding(
            ResourceType[binding.resource_type],
            binding.name,
            ResourcePatternType[binding.pattern_type],
            binding.principal,
            binding.host,
            AclOperation[binding.operation],
            AclPermissionType[binding.permission],
        )
    )


# ----------------------------------------------------------------------------- pure plan


def test_plan_keeps_access_on_a_permissive_cluster_and_never_widens_one_with_acls() -> None:
    alice = Binding("TOPIC", "secure", "LITERAL", "User:alice", "*", "READ", "ALLOW")
    prefix = Binding("TOPIC", "pay", "PREFIXED", "User:bob", "*", "READ", "ALLOW")
    theirs = deny_write("dup", "User:*")  # the operator's, identical to what a hold adds
    present = {alice, prefix, theirs}
    needs = {(t, "User:*") for t in ("open", "secure", "payments", "dup")}
    plan = acl_plan(needs, present, owned=set(), permissive=True)
    assert plan.allowed == ("open",)
    assert set(plan.create) == {
        deny_write("open", "User:*"),
        allow_all("open"),
        deny_write("secure", "User:*"),
        deny_write("payments", "User:*"),
    }
    assert plan.delete == () and plan.skipped == ()
    # Nothing needed any more: only what a guard owns goes, the operator's stays.
    after = present | set(plan.create)
    released = acl_plan(set(), after, owned=set(plan.create), permissive=True)
    assert set(released.delete) == set(plan.create)
    assert after - set(released.delete) == present
    # Not permissive: no ALLOW ever; unknown: topics without ACLs are not held at all.
    assert acl_plan(needs, present, set(), permissive=False).allowed == ()
    unknown = acl_plan(needs, present, set(), permissive=None)
    assert unknown.skipped == ("open",) and allow_all("open") not in unknown.desired


def test_a_wildcard_acl_counts_as_the_topics_own() -> None:
    star = Binding("TOPIC", "*", "LITERAL", "User:ops", "*", "DESCRIBE", "ALLOW")
    plan = acl_plan({("orders", "User:*")}, {star}, set(), permissive=True)
    assert plan.allowed == () and plan.create == (deny_write("orders", "User:*"),)


# ----------------------------------------------------------------------------- two guards


def test_one_guard_clearing_keeps_the_hold_another_still_needs(
    tmp_path: Path, logs: io.StringIO
) -> None:
    cluster = Cluster(tmp_path)
    other = Binding("TOPIC", "audit", "LITERAL", "User:alice", "*", "READ", "ALLOW")
    operator_acl(cluster.acls, other)
    cluster.quotas.quotas[USER_DEFAULT] = 4096.0
    before_acls, before_quotas = cluster.acl_set(), dict(cluster.quotas.quotas)
    a, b = cluster.guard(1), cluster.guard(2)
    overfull(a, ["orders", "clicks"])
    overfull(b, ["orders"])
    held = {
        deny_write("orders", "User:*"),
        allow_all("orders"),
        deny_write("clicks", "User:*"),
        allow_all("clicks"),
    }
    assert cluster.acl_set() == before_acls | held
    assert cluster.quotas.quotas == {USER_DEFAULT: 1024.0, CLIENT_DEFAULT: 1024.0}
    # The second guard found the first one's throttle, and recorded the value from before it.
    saved = json.loads((tmp_path / "state-2" / "actuators.json").read_text())
    assert {p["value"] for p in saved["quota"]["previous"]} == {4096.0, None}

    cleared(a)  # broker 1 is fine again; broker 2 still is not
    assert cluster.acl_set() == before_acls | {deny_write("orders", "User:*"), allow_all("orders")}
    assert cluster.quotas.quotas == {USER_DEFAULT: 1024.0, CLIENT_DEFAULT: 1024.0}
    kept = {e["actuator"]: e for e in events(logs, "hold_kept")}
    assert kept["acl"]["topics"] == ["orders"] and kept["acl"]["held_by"] == ["broker-2"]
    assert kept["quota"]["held_by"] == ["broker-2"]

    cleared(b)
    assert cluster.acl_set() == before_acls
    assert cluster.quotas.quotas == before_quotas
    # Broker 1's guard still recorded a claim on the quotas it no longer needs: its next
    # pass (the lease renewal) restores the same values and drops it; nothing changes.
    assert a.sync(renewal=True) is False  # the ACL it owned missed once: read again
    assert a.sync()  # missed twice: lifted by broker 2's guard, not ours to remove any more
    assert cluster.quotas.quotas == before_quotas and cluster.acl_set() == before_acls
    assert cluster.registry.records == {}


@pytest.mark.parametrize("why", ["another-guard-holds", "registry-unreadable"])
def test_a_hold_needed_again_before_it_was_lifted_is_said_once(
    tmp_path: Path, logs: io.StringIO, why: str
) -> None:
    """A guard clears while its hold stays (another guard still needs it, or the holds topic
    cannot be read, so nothing is lifted), then needs it again: the hold never lifted, so
    no second ``acl_applied`` / ``quota_applied``."""
    cluster = Cluster(tmp_path)
    a, b = cluster.guard(1), cluster.guard(2)
    overfull(a, ["orders"])
    if why == "another-guard-holds":
        overfull(b, ["orders"])
    else:
        cluster.registry.broken = True
    applied = len(events(logs, "acl_applied")), len(events(logs, "quota_applied"))
    cleared(a)
    assert deny_write("orders", "User:*") in cluster.acl_set()
    overfull(a, ["orders"])
    assert (len(events(logs, "acl_applied")), len(events(logs, "quota_applied"))) == applied
    cluster.registry.broken = False
    cleared(a)
    cleared(b)
    for acts in (a, b, a):
        acts.sync(renewal=True)
    assert cluster.acl_set() == set() and cluster.quotas.quotas == {}
    # One removal of the one ACL (by whichever guard lifts it); each guard's throttle claim
    # (two default entities) restored and said by the guard that said it applied.
    assert len(events(logs, "acl_removed")) == 1
    assert len(events(logs, "quota_restored")) == applied[1]


def test_operator_acls_stay_byte_identical(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    mine = [
        Binding("TOPIC", "secure", "LITERAL", "User:alice", "*", "READ", "ALLOW"),
        deny_write("dup", "User:*"),
        Binding("TOPIC", "pay", "PREFIXED", "User:bob", "*", "WRITE", "ALLOW"),
        Binding("GROUP", "g", "LITERAL", "User:alice", "*", "READ", "ALLOW"),
    ]
    for binding in mine:
        operator_acl(cluster.acls, binding)
    before = cluster.acl_set()
    a = cluster.guard(1, ("acl",))
    overfull(a, ["secure", "dup", "payments", "open"])
    added = cluster.acl_set() - before
    assert added == {
        deny_write("secure", "User:*"),
        deny_write("payments", "User:*"),
        deny_write("open", "User:*"),
        allow_all("open"),
    }
    cleared(a)
    assert cluster.acl_set() == before


def test_a_guard_killed_while_holding_is_let_go_when_its_lease_expires(
    tmp_path: Path, logs: io.StringIO
) -> None:
    cluster = Cluster(tmp_path)
    before = cluster.acl_set()
    a, b = cluster.guard(1), cluster.guard(2)
    overfull(a, ["orders"])
    overfull(b, ["clicks"])
    del a  # kill -9: no release, no renewal
    cluster.clock.now += LEASE / 2
    b.sync(renewal=True)  # within the lease: nothing of A's is touched
    assert deny_write("orders", "User:*") in cluster.acl_set()
    assert cluster.expired == []
    cluster.clock.now += LEASE
    b.sync(renewal=True)
    (expired,) = events(logs, "hold_lease_expired")
    assert expired["guard"] == "broker-1" and expired["acl_topics"] == ["orders"]
    assert expired["held_topics"] == ["orders"]
    assert expired["acls_owned"] == [str(allow_all("orders")), str(deny_write("orders", "User:*"))]
    assert expired["quotas_owned"] == {"client-id=<default>": None, "user=<default>": None}
    assert cluster.expired == [2]  # counted by the guard that saw it (the metric)
    assert cluster.acl_set() == before | {deny_write("clicks", "User:*"), allow_all("clicks")}
    assert cluster.quotas.quotas == {USER_DEFAULT: 1024.0, CLIENT_DEFAULT: 1024.0}  # B's
    assert set(cluster.registry.records) == {"broker-2"}
    cleared(b)
    assert cluster.acl_set() == before and cluster.quotas.quotas == {}
    assert cluster.registry.records == {}


def test_an_expired_lease_says_what_it_held_though_its_needs_name_nothing(
    tmp_path: Path, logs: io.StringIO
) -> None:
    """A guard killed after it created its ACL and before its record said it needed it: the
    event names the ACL it owned and the topic it held, not only its (empty) needs."""
    cluster = Cluster(tmp_path)
    a, b = cluster.guard(1, ("acl",)), cluster.guard(2, ("acl",))
    overfull(b, ["clicks"])
    overfull(a, ["orders"])
    body, ts = cluster.registry.records["broker-1"]
    cluster.registry.records["broker-1"] = ({**body, "acl_needs": []}, ts)
    del a
    cluster.clock.now += LEASE + 1
    b.sync(renewal=True)
    (expired,) = events(logs, "hold_lease_expired")
    assert expired["acl_topics"] == [] and expired["held_topics"] == ["orders"]
    assert str(deny_write("orders", "User:*")) in expired["acls_owned"]
    # taken over, and nobody needs it: undone
    assert {x.name for x in cluster.acl_set()} == {"clicks"}


def test_a_restarted_guard_takes_its_hold_back(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    a = cluster.guard(1)
    overfull(a, ["orders"])
    del a
    restarted = cluster.guard(1)  # the same state dir: its ledger says overfull
    restarted.reconcile({"/data": True}, {"/data": ["orders"]})
    assert deny_write("orders", "User:*") in cluster.acl_set()
    restarted.reconcile({"/data": False})
    assert cluster.acl_set() == set() and cluster.quotas.quotas == {}


def test_a_guard_restarted_while_another_holds_says_its_hold_is_in_place(
    tmp_path: Path, logs: io.StringIO
) -> None:
    """Restarted on a disk still overfull, a guard finds its hold in place (another guard's
    pass put it back, or never lifted it): it creates nothing, and still says that its
    topics are held and producers throttled, as it would in a new episode. Rebuilt at a
    config reload it has said so already, and does not again."""
    cluster = Cluster(tmp_path)
    a, b = cluster.guard(1), cluster.guard(2)
    overfull(a, ["orders"])
    overfull(b, ["orders"])
    held = cluster.acl_set()
    del b  # kill -9, or a stop: a stop keeps the hold of a disk still overfull
    logs.truncate(0)
    logs.seek(0)
    restarted = cluster.guard(2)  # the same state dir: its ledger says held
    restarted.reconcile({"/data": True}, {"/data": ["orders"]})
    assert cluster.acl_set() == held
    (applied,) = events(logs, "acl_applied")
    assert applied["topics"] == ["orders"] and applied["created"] == 0, applied
    assert {e["entity"] for e in events(logs, "quota_applied")} == {
        "user=<default>",
        "client-id=<default>",
    }
    assert restarted.sync(renewal=True) and events(logs, "acl_applied") == [applied]

    logs.truncate(0)
    logs.seek(0)
    reloaded = cluster.guard(2, said_before=True)
    reloaded.reconcile({"/data": True}, {"/data": ["orders"]})
    assert events(logs, "acl_applied") == [] and events(logs, "quota_applied") == []
    cleared(reloaded)
    cleared(a)
    assert cluster.acl_set() == set() and cluster.quotas.quotas == {}


def test_nothing_is_lifted_while_the_registry_cannot_be_read(
    tmp_path: Path, logs: io.StringIO
) -> None:
    cluster = Cluster(tmp_path)
    a, b = cluster.guard(1), cluster.guard(2)
    overfull(a, ["orders"])
    overfull(b, ["orders"])
    cluster.registry.broken = True
    cleared(b)
    cleared(a)  # both clear, but neither can see the other: the hold stays
    assert deny_write("orders", "User:*") in cluster.acl_set()
    assert cluster.quotas.quotas == {USER_DEFAULT: 1024.0, CLIENT_DEFAULT: 1024.0}
    # Silent for less than a lease (a leader restarting): retried, not a failure.
    assert events(logs, "actuator_failed") == []
    assert {e["action"] for e in events(logs, "holds_registry_retrying")} >= {"read"}
    cluster.clock.now += LEASE + 1
    a.sync(renewal=True)
    failed = events(logs, "actuator_failed")
    assert {(e["actuator"], e["action"]) for e in failed} == {
        ("holds", "read"),
        ("holds", "publish"),
    }
    assert all("has not answered for 7 s, more than the lease" in e["error"] for e in failed)
    assert deny_write("orders", "User:*") in cluster.acl_set()
    cluster.registry.broken = False
    a.sync()
    b.sync()
    assert cluster.acl_set() == set() and cluster.quotas.quotas == {}


def test_unknown_default_holds_only_topics_with_acls(tmp_path: Path, logs: io.StringIO) -> None:
    cluster = Cluster(tmp_path, permissive=None)
    alice = Binding("TOPIC", "secure", "LITERAL", "User:alice", "*", "READ", "ALLOW")
    operator_acl(cluster.acls, alice)
    a = cluster.guard(1, ("acl",))
    overfull(a, ["secure", "open"])
    assert cluster.acl_set() == {alice, deny_write("secure", "User:*")}
    (skipped,) = events(logs, "acl_hold_skipped")
    assert skipped["topics"] == ["open"] and "broker.server_properties" in skipped["reason"]
    cleared(a)
    assert cluster.acl_set() == {alice}


def test_internal_and_snapshot_topics_are_never_held(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    a = cluster.guard(1, ("acl",))
    overfull(a, ["orders", "__consumer_offsets", "__diskguard_holds", "diskguard-snapshots"])
    assert {b.name for b in cluster.acl_set()} == {"orders"}


def test_a_guard_whose_state_dir_was_lost_undoes_what_it_published(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    a = cluster.guard(1)
    overfull(a, ["orders"])
    del a
    (tmp_path / "state-1" / "actuators.json").unlink()  # reinstalled: no ledger
    fresh = cluster.guard(1)
    fresh.reconcile({"/data": False})
    assert cluster.acl_set() == set() and cluster.quotas.quotas == {}
    assert cluster.registry.records == {}


def test_a_throttle_in_place_is_never_taken_for_the_value_before(
    tmp_path: Path, logs: io.StringIO
) -> None:
    """Guard 2 goes overfull while the holds topic cannot be read: the 1 KiB/s it finds is
    guard 1's throttle, which only guard 1's record says. It waits for the record rather
    than restore the throttle for good later."""
    cluster = Cluster(tmp_path)
    a, b = cluster.guard(1), cluster.guard(2)
    overfull(a, ["orders"])
    cluster.registry.broken = True
    overfull(b, ["orders"])
    waiting = [e for e in events(logs, "actuator_failed") if e["actuator"] == "quota"]
    assert "value before the throttle is unknown" in waiting[0]["error"]
    cluster.registry.broken = False
    b.sync()
    saved = json.loads((tmp_path / "state-2" / "actuators.json").read_text())
    assert {p["value"] for p in saved["quota"]["previous"]} == {None}
    cleared(a)
    cleared(b)
    assert cluster.quotas.quotas == {}


def raced(tmp_path: Path) -> tuple[Cluster, Actuators, Actuators, dict[str, Any]]:
    """Guards 1 and 2 go overfull at once: guard 2 reads the registry before guard 1's claim
    is there, then describes the quota after guard 1's throttle, and claims the throttle."""
    cluster = Cluster(tmp_path)
    cluster.quotas.quotas[USER_DEFAULT] = 4096.0
    a, b = cluster.guard(1), cluster.guard(2)
    overfull(a, ["orders"])
    record = cluster.registry.records.pop("broker-1")  # not there yet when guard 2 reads
    overfull(b, ["orders"])
    saved = json.loads((tmp_path / "state-2" / "actuators.json").read_text())
    assert {p["value"] for p in saved["quota"]["previous"]} == {1024.0}
    cluster.registry.records["broker-1"] = record
    return cluster, a, b, record


def test_two_guards_overfull_at_once_restore_what_was_there(
    tmp_path: Path, logs: io.StringIO
) -> None:
    cluster, a, b, _record = raced(tmp_path)
    b.sync()  # guard 1's record is read: its claim is the operator's value
    settled = events(logs, "quota_claim_settled")
    assert {(e["claimed"], e["previous"]) for e in settled} == {(1024.0, 4096.0), (1024.0, None)}
    cleared(b)
    cleared(a)
    assert cluster.quotas.quotas == {USER_DEFAULT: 4096.0}
    b.sync(renewal=True)  # its claim, kept while guard 1 still held, goes at its renewal
    assert cluster.registry.records == {}


def test_a_guard_killed_after_the_race_leaves_its_claim_to_the_survivor(tmp_path: Path) -> None:
    cluster, a, b, _record = raced(tmp_path)
    del a  # kill -9; guard 2 has not read guard 1's record before its lease expires
    cluster.clock.now += LEASE + 1
    cleared(b)
    assert cluster.quotas.quotas == {USER_DEFAULT: 4096.0}
    assert cluster.registry.records == {}


def test_no_lease_expires_while_the_holds_topic_did_not_answer(
    tmp_path: Path, logs: io.StringIO
) -> None:
    """The topic's leader restarts: for longer than a lease no guard can renew. Back, a guard
    gives the others a whole lease to renew before it judges any record expired."""
    cluster = Cluster(tmp_path)
    a, b = cluster.guard(1), cluster.guard(2)
    overfull(a, ["orders"])
    overfull(b, ["orders"])
    cluster.registry.broken = True
    cluster.clock.now += LEASE + 1
    b.sync(renewal=True)  # fails: nobody renews
    cluster.registry.broken = False
    b.sync(renewal=True)  # guard 1's record is a lease old, but the topic just came back
    assert events(logs, "hold_lease_expired") == []
    a.sync(renewal=True)  # guard 1 renews within the lease
    cluster.clock.now += LEASE / 2
    b.sync(renewal=True)
    assert events(logs, "hold_lease_expired") == []
    cleared(a)
    assert cluster.acl_set() >= {deny_write("orders", "User:*")}  # guard 2 still holds


def test_a_read_back_that_times_out_is_retried_and_reported_only_after_a_lease(
    tmp_path: Path, logs: io.StringIO
) -> None:
    """A broker of the cluster restarts while a guard reads its holds back (a renewal): the
    DescribeAcls it took with it is asked again by the next pass, not an ``actuator_failed``,
    unless the brokers stay silent for longer than the lease. A read for a hold still to
    apply is reported at once: producers are not held until it answers."""
    cluster = Cluster(tmp_path)
    a = cluster.guard(1, actuators=("acl",))
    overfull(a, ["orders"])
    held = cluster.acl_set()
    cluster.acls.fail_describes = 1
    assert not a.sync(renewal=True)
    assert events(logs, "actuator_failed") == []
    (retrying,) = events(logs, "holds_readback_retrying")
    assert "TIMED_OUT" in retrying["error"] and retrying["silent_s"] == 0, retrying
    cluster.clock.now += 1
    assert a.sync(renewal=True)  # answered: the silence is over
    assert cluster.acl_set() == held and events(logs, "actuator_failed") == []

    cluster.acls.fail_describes = 3
    assert not a.sync(renewal=True)
    cluster.clock.now += LEASE / 2
    assert not a.sync(renewal=True)
    assert events(logs, "actuator_failed") == []
    cluster.clock.now += LEASE / 2
    assert not a.sync(renewal=True)
    (failed,) = events(logs, "actuator_failed")
    assert failed["action"] == "describe" and "more than the lease" in failed["error"], failed
    assert cluster.acl_set() == held  # nothing lifted while unanswered

    cluster.acls.fail_describes = 1
    overfull(a, ["orders", "payments"], mount="/other")  # a new hold: said at once
    assert [e["action"] for e in events(logs, "actuator_failed")] == ["describe", "describe"]
    assert a.sync()
    assert {"orders", "payments"} <= cluster.acls.topics()


def test_a_throttle_re_sent_in_vain_is_retried_and_reported_only_after_a_lease(
    tmp_path: Path, logs: io.StringIO
) -> None:
    """The same for the ``quota`` actuator: its renewal re-sends the throttle in place; a
    broker that times out on it is asked again, and said only once silent for a lease. The
    restore, a change, is said at once."""
    cluster = Cluster(tmp_path)
    a = cluster.guard(1, actuators=("quota",))
    overfull(a, ["orders"])
    throttled = dict(cluster.quotas.quotas)
    cluster.quotas.fail_next = [7]  # REQUEST_TIMED_OUT
    assert not a.sync(renewal=True)
    (retrying,) = events(logs, "holds_readback_retrying")
    assert retrying["actuator"] == "quota" and retrying["action"] == "throttle", retrying
    assert events(logs, "actuator_failed") == []
    cluster.quotas.fail_next = [7] * 4
    cluster.clock.now += LEASE
    assert not a.sync(renewal=True)
    (failed,) = events(logs, "actuator_failed")
    assert "more than the lease" in failed["error"], failed
    assert cluster.quotas.quotas == throttled
    cluster.quotas.fail_next = [7]
    cleared(a)  # the restore: said at once
    assert [e["action"] for e in events(logs, "actuator_failed")] == ["throttle", "restore"]
    assert a.sync()
    assert cluster.quotas.quotas == {}
