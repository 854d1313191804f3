"""Many guards, one cluster: a REAL three-broker cluster, one diskguard per broker.

The session's ``real_cluster`` (conftest): three brokers on 127.0.0.1 (KRaft where the
release has it), each on its own loop ext4, SASL/PLAIN principals (``producer``,
``consumer``, ``diskguard``, ``admin``), the release's ACL authorizer letting everyone in
where no ACL is found. Each test starts the guards it needs (``diskguard run`` processes with
their own state dirs) and leaves the cluster as it found it: no filler, no hold, no ACL.
"""

from __future__ import annotations

import json
import re
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ConfigResource,
    ResourcePatternType,
    ResourceType,
)

from diskguard.flow.actuator import STATE_FILE
from diskguard.flow.holds import AclBinding as Binding
from diskguard.flow.holds import deny_write
from support.cli import json_events, run_cli
from support.daemonproc import DaemonProc
from support.disks import ceiling_under, df_percent
from support.kafka.guarded import GuardedCluster, wait_until
from support.net import free_port

pytestmark = pytest.mark.realkafka

SEGMENT = 256 * 1024


@pytest.fixture(autouse=True)
def left_as_found(real_cluster: GuardedCluster) -> Iterator[None]:
    """Every test leaves the cluster's ACLs and quotas as it found them, and no filler, even
    when it fails with a killed guard's hold still in place."""
    with real_cluster.as_it_was():
        yield


def flow(
    broker: GuardedCluster, broker_id: int, actuators: list[str], **extra: Any
) -> dict[str, Any]:
    """Limits a little above the disk's usage now: a filler of 20 % makes it overfull."""
    now = df_percent(broker.mount(broker_id))
    return {
        "overfull_percent": round(now + 10, 2),
        "underfull_percent": round(now + 5, 2),
        "min_free_bytes": "1MiB",
        "actuators": actuators,
        **extra,
    }


def operator_acls(cluster: GuardedCluster, topic: str) -> None:
    """An operator's ACLs on ``topic``: who may do what, as a secured topic has them."""
    grants = [
        ("User:producer", AclOperation.WRITE),
        ("User:producer", AclOperation.DESCRIBE),
        ("User:consumer", AclOperation.READ),
        ("User:consumer", AclOperation.DESCRIBE),
        ("User:diskguard", AclOperation.DELETE),
        ("User:diskguard", AclOperation.DESCRIBE),
        ("User:diskguard", AclOperation.DESCRIBE_CONFIGS),
    ]
    bindings = [
        AclBinding(
            ResourceType.TOPIC,
            topic,
            ResourcePatternType.LITERAL,
            principal,
            "*",
            op,
            AclPermissionType.ALLOW,
        )
        for principal, op in grants
    ]
    admin = cluster.cluster.admin()
    for future in admin.create_acls(bindings, request_timeout=15).values():
        future.result(15)


def topic_policy(cluster: GuardedCluster, topic: str, user: str) -> str:
    """DescribeConfigs of ``topic`` as ``user``: its cleanup.policy, or the error."""
    admin = cluster.cluster.admin(user)
    try:
        (future,) = admin.describe_configs(
            [ConfigResource(ResourceType.TOPIC, topic)], request_timeout=15
        ).values()
        return str(future.result(15)["cleanup.policy"].value)
    except Exception as exc:
        return f"failed: {exc}"


def watermarks(cluster: GuardedCluster, topic: str, partitions: int) -> tuple[list[int], list[int]]:
    """Each partition's log start and end offsets, as the leaders answer (as admin)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**cluster.client("admin"), "group.id": "wm"})
    try:
        marks = [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            for p in range(partitions)
        ]
    finally:
        consumer.close()
    return [low for low, _ in marks], [high for _, high in marks]


def test_a_hold_stops_producers_only(real_cluster: GuardedCluster, tmp_path: Path) -> None:
    """overfull -> the acl actuator holds every topic on the disk: producers are refused, and
    the consumer keeps reading, DescribeConfigs answers and the guard's own DeleteRecords
    trims the held topics, on a topic without ACLs (permissive cluster: the hold adds an
    ALLOW ALL with its DENY) as on one with the operator's own ACLs (the DENY only). Cleared,
    the ACLs are exactly what they were."""
    cluster = real_cluster
    open_topic, secure = "hold-open", "hold-secure"
    cluster.cluster.create_topic(open_topic, 3, 3, **cluster.cluster.segment_config(SEGMENT))
    cluster.cluster.create_topic(secure, 1, 3, **cluster.cluster.segment_config(SEGMENT))
    operator_acls(cluster, secure)
    for topic in (open_topic, secure):
        wait_until(lambda t=topic: cluster.write_attempt(t) is None, 30, f"{topic}: first write")
        assert (
            cluster.cluster.produce(
                topic,
                4000,
                1000,
                settings={**cluster.client("producer"), "acks": "all", "batch.size": 64_000},
            )
            == []
        )
    before = cluster.acls()
    partitions = {open_topic: 3, secure: 1}

    def readable(topic: str) -> bool:
        """A fresh consumer reads every record from the log start to the end."""
        lows, highs = watermarks(cluster, topic, partitions[topic])
        want = sum(highs) - sum(lows)
        return want > 0 and cluster.read_count(topic, partitions[topic], at_least=want) >= want

    assert all(readable(t) for t in partitions)
    config = cluster.guard_config(
        tmp_path,
        1,
        flow_control=flow(cluster, 1, ["acl"]),
        mode="dry-run",
        protect_topics=[f"^(?!({open_topic}|{secure})$)"],
    )
    with DaemonProc(config) as guard:
        guard.wait_for("daemon_started", timeout=60)
        cluster.fill(1, 0.13)
        guard.wait_for("overfull", timeout=30)
        applied = guard.wait_for("acl_applied", timeout=60)
        assert applied["allowed"] == [open_topic], applied
        assert {open_topic, secure} <= set(applied["topics"])
        for topic in partitions:
            wait_until(
                lambda t=topic: cluster.write_attempt(t) == "TOPIC_AUTHORIZATION_FAILED",
                30,
                f"{topic}: producer refused",
            )
            assert readable(topic), f"{topic}: the consumer no longer reads it"
            assert topic_policy(cluster, topic, "diskguard") == "delete"
        added = cluster.acls() - before
        assert ("TOPIC", open_topic, "LITERAL", "User:*", "*", "ALL", "ALLOW") in added
        assert {a for a in added if a[1] == secure} == {
            ("TOPIC", secure, "LITERAL", "User:*", "*", "WRITE", "DENY")
        }

        # Retention on while held, the disk over its ceiling: the guard trims the held topics.
        ceiling = round(df_percent(cluster.mount(1)) - 2, 2)  # more than one topic holds
        config.write_text(
            config.read_text()
            .replace('mode = "dry-run"', 'mode = "broker"')
            .replace("[retention]\n", f"[retention]\ndisk_usage_percent = {ceiling}\n")
        )
        guard.signal(signal.SIGHUP)
        guard.wait_for("config_reloaded", timeout=30)
        for topic in partitions:
            trimmed = guard.wait_for("delete_records", timeout=60, topic=topic)
            assert trimmed["low_watermark"] > 0, trimmed
        assert guard.named("delete_records_failed") == [], guard.named("delete_records_failed")
        assert guard.named("partition_set_aside") == []
        assert guard.named("topic_configs_unavailable") == []
        assert all(readable(t) for t in partitions)
        assert cluster.write_attempt(open_topic) == "TOPIC_AUTHORIZATION_FAILED"

        cluster.clear(1)
        guard.wait_for("overfull_cleared", timeout=30)
        guard.wait_for("acl_removed", timeout=60)
        assert cluster.acls() == before
        for topic in partitions:
            wait_until(lambda t=topic: cluster.write_attempt(t) is None, 30, f"{topic}: writes")
        assert guard.named("actuator_failed") == [], guard.named("actuator_failed")
        assert guard.stop() == 0


# ------------------------------------------------------------------ a hold of many guards


def as_before(cluster: GuardedCluster, acls: set[tuple[str, ...]], quotas: Any) -> None:
    """The cluster's ACLs and client quotas become exactly ``acls`` and ``quotas`` (every
    broker agreeing) within 30 s; else what they are instead."""
    wait_until(lambda: cluster.acls() == acls, 30, "ACLs as before", cluster.acls)
    wait_until(lambda: cluster.quotas() == quotas, 30, f"quotas as {quotas}", cluster.quotas)


def held(cluster: GuardedCluster, topic: str) -> bool:
    return cluster.write_attempt(topic) == "TOPIC_AUTHORIZATION_FAILED"


def released(cluster: GuardedCluster, topic: str) -> bool:
    return cluster.write_attempt(topic) is None


DEFAULT_USER = (("user", None),)


def said(guards: dict[int, DaemonProc], event: str) -> dict[int, int]:
    """How many ``event``s each guard has said so far."""
    return {i: len(g.named(event)) for i, g in guards.items()}


def said_again(guards: dict[int, DaemonProc], event: str, before: dict[int, int]) -> None:
    """One of the guards says ``event`` again within 60 s. A hold no guard needs any more is
    lifted by whichever live guard's pass sees that first (the one that cleared, or another
    at its lease renewal), and that guard says ``acl_removed``."""
    wait_until(
        lambda: any(len(g.named(event)) > before.get(i, 0) for i, g in guards.items()),
        60,
        f"{event} from one of the guards",
        lambda: {i: [e.get("event") for e in g.events] for i, g in guards.items()},
    )


def owned_acls(tmp_path: Path, guard: int) -> set[Binding]:
    """The ACLs guard ``guard``'s ledger says it owns (written before each CreateAcls)."""
    path = tmp_path / f"guard-{guard}" / "state" / STATE_FILE
    try:
        data = json.loads(path.read_text())
    except OSError:
        return set()  # not written yet (it is replaced whole, never read half-written)
    return {Binding.from_json(raw) for raw in data.get("acl_owned", ())}


def start_guards(
    cluster: GuardedCluster, tmp_path: Path, ids: list[int], lease: str = "6s"
) -> dict[int, Path]:
    return {
        i: cluster.guard_config(
            tmp_path,
            i,
            flow_control=flow(cluster, i, ["acl", "quota"], hold_lease=lease),
            metrics={"listen": f"127.0.0.1:{free_port()}"},
        )
        for i in ids
    }


def test_a_hold_lasts_while_any_guard_needs_it(
    real_cluster: GuardedCluster, tmp_path: Path
) -> None:
    """Brokers 1 and 2 overfull: one DENY, one throttle, shared. Guard 2 restarted and broker
    3 killed -9 and restarted in between change nothing. Broker 1 clears: producers are still
    held (``hold_kept``). Broker 2 clears: released, and the ACLs and quotas are exactly what
    they were, the operator's own quota on the default user included (the second guard found
    the first one's throttle and restored the operator's value, not the throttle). No
    ``actuator_failed`` at all: while broker 3 is down the holds topic may not answer (its
    leader there, or an ``acks=all`` write waiting for it until it is fenced), for less than
    the lease (30 s here: longer than a broker's failover, as ``hold_lease`` must be), which
    is retried, not a failure; nor may a renewal's read-back of the ACLs (DescribeAcls), which
    the killed broker can take with it."""
    cluster = real_cluster
    topic = "shared-orders"
    cluster.cluster.create_topic(topic, 3, 3)
    wait_until(lambda: released(cluster, topic), 30, "first write")
    cluster.set_quota({"user": None}, 50_000_000.0)
    cluster.set_quota({"user": "producer"}, 2_000_000.0)
    try:
        before_acls, before_quotas = cluster.acls(), cluster.quotas()
        configs = start_guards(cluster, tmp_path, [1, 2], lease="30s")
        guards = {i: DaemonProc(c) for i, c in configs.items()}
        try:
            for i in (1, 2):
                guards[i].wait_for("daemon_started", timeout=60)
            cluster.fill(1, 0.2)
            guards[1].wait_for("acl_applied", timeout=60)
            first = guards[1].wait_for("quota_applied", timeout=60, entity="user=<default>")
            assert first["previous"] == 50_000_000.0
            wait_until(lambda: held(cluster, topic), 30, "producer refused")
            cluster.fill(2, 0.2)
            guards[2].wait_for("acl_applied", timeout=60)
            second = guards[2].wait_for("quota_applied", timeout=60, entity="user=<default>")
            assert second["previous"] == 50_000_000.0, second  # not guard 1's 1 KiB/s

            # A guard restarted and a broker killed -9 while held change nothing. The restarted
            # guard finds its hold in place (guard 1's ACL, the throttle) and says so.
            assert guards[2].stop() == 0
            guards[2] = DaemonProc(configs[2])
            guards[2].wait_for("daemon_started", timeout=60)
            again = guards[2].wait_for("acl_applied", timeout=60)
            assert topic in again["topics"], again
            again = guards[2].wait_for("quota_applied", timeout=60, entity="user=<default>")
            assert again["previous"] == 50_000_000.0, again
            cluster.node(3).kill()
            cluster.node(3).start()
            cluster.cluster.wait_brokers()
            time.sleep(3)  # the brokers settle: nothing may have been released
            assert held(cluster, topic)
            assert cluster.quotas()[DEFAULT_USER]["producer_byte_rate"] == 1024.0

            cluster.clear(1)
            guards[1].wait_for("overfull_cleared", timeout=30)
            kept = guards[1].wait_for("hold_kept", timeout=60, actuator="acl")
            assert kept["held_by"] == ["broker-2"], kept
            guards[1].wait_for("hold_kept", timeout=60, actuator="quota")
            time.sleep(3)
            assert held(cluster, topic)
            assert cluster.quotas()[DEFAULT_USER]["producer_byte_rate"] == 1024.0
            assert guards[1].named("acl_removed") == [] and guards[1].named("quota_restored") == []

            removals = said(guards, "acl_removed")
            cluster.clear(2)
            guards[2].wait_for("overfull_cleared", timeout=30)
            said_again(guards, "acl_removed", removals)
            guards[2].wait_for("quota_restored", timeout=60, entity="user=<default>")
            wait_until(
                lambda: cluster.quotas() == before_quotas,
                30,
                f"quotas as before ({before_quotas})",
                cluster.quotas,
            )
            assert cluster.acls() == before_acls
            wait_until(lambda: released(cluster, topic), 30, "producer released")
            for guard in guards.values():
                assert [e for e in guard.named("actuator_failed")] == []
                assert guard.stop() == 0
        finally:
            for guard in guards.values():
                guard.kill()
    finally:
        cluster.clear()


def test_a_guard_killed_while_holding_stops_counting_at_its_lease(
    real_cluster: GuardedCluster, tmp_path: Path
) -> None:
    """Guards 1 and 2 hold; guard 1 is killed -9 with its disk still overfull. It lifts
    nothing (guard 2 still needs the hold); after its lease guard 2 says so
    (``hold_lease_expired``, counted) and takes over what it owned, and when broker 2 clears
    everything goes, guard 1's part included. Guard 1 restarted on its still overfull disk
    holds again; cleared, released: ACLs and quotas exactly as before."""
    cluster = real_cluster
    topic = "lease-orders"
    cluster.cluster.create_topic(topic, 3, 3)
    wait_until(lambda: released(cluster, topic), 30, "first write")
    before_acls, before_quotas = cluster.acls(), cluster.quotas()
    configs = start_guards(cluster, tmp_path, [1, 2])
    guards = {i: DaemonProc(c) for i, c in configs.items()}
    try:
        for i in (1, 2):
            guards[i].wait_for("daemon_started", timeout=60)
        cluster.fill(1, 0.2)
        cluster.fill(2, 0.2)
        applied = {i: guards[i].wait_for("acl_applied", timeout=60) for i in (1, 2)}
        guards[1].proc.kill()
        guards[1].proc.wait(10)
        expired = guards[2].wait_for("hold_lease_expired", timeout=60, guard="broker-1")
        assert topic in expired["held_topics"], expired
        # Identical bindings are one ACL, owned by the guard that created it: recorded in its
        # ledger before the CreateAcls (the first ``acl_applied`` may say created=0: a create
        # that timed out but landed is found there by the next pass). What the registry says
        # the dead guard owned is what its ledger says; guard 2 owns it now either way.
        deny = deny_write(topic, "User:*")
        assert (str(deny) in expired["acls_owned"]) == (deny in owned_acls(tmp_path, 1)), (
            expired,
            applied,
            owned_acls(tmp_path, 1),
        )
        wait_until(lambda: deny in owned_acls(tmp_path, 2), 30, "guard 2 owns the DENY")
        assert held(cluster, topic)  # guard 2 still needs it
        port = configs[2].read_text().split('listen = "127.0.0.1:')[1].split('"')[0]
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        assert re.search(rb"diskguard_hold_leases_expired_total 1\.0", scraped), scraped

        cluster.clear(2)  # disk 1 is still full, but its guard is dead: its hold is gone
        guards[2].wait_for("acl_removed", timeout=60)
        guards[2].wait_for("quota_restored", timeout=60, entity="user=<default>")
        as_before(cluster, before_acls, before_quotas)
        wait_until(lambda: released(cluster, topic), 30, "producer released")

        guards[1] = DaemonProc(configs[1])  # restarted on its overfull disk: holds again
        guards[1].wait_for("acl_applied", timeout=60)
        wait_until(lambda: held(cluster, topic), 30, "held again")
        removals = said(guards, "acl_removed")
        cluster.clear(1)
        said_again(guards, "acl_removed", removals)
        as_before(cluster, before_acls, before_quotas)
        for guard in guards.values():
            assert guard.stop() == 0
    finally:
        for guard in guards.values():
            guard.kill()
        cluster.clear()


# ------------------------------------------------------------------ check-config --connect


def test_check_config_says_what_the_hold_will_do_and_what_diskguard_may(
    real_cluster: GuardedCluster, tmp_path: Path
) -> None:
    """``check-config --connect`` as ``User:diskguard``: who it is, the authorizer, that the
    cluster is permissive (server.properties) and what the acl hold adds there, and whether
    it may DELETE/DESCRIBE_CONFIGS the topics of its disk and ALTER the cluster. A topic whose
    ACLs grant diskguard nothing is named, and the check fails."""
    cluster = real_cluster
    cluster.cluster.create_topic("check-open", 1, 3)
    config = cluster.guard_config(
        tmp_path, 1, flow_control=flow(cluster, 1, ["acl", "quota"]), mode="broker"
    )
    proc = run_cli("check-config", "--connect", "-c", str(config))
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = [
        "ok: diskguard's principal: User:diskguard (SASL_PLAINTEXT PLAIN)",
        "ok: may ALTER the cluster (CreateAcls/DeleteAcls): yes",
        "ok: may ALTER_CONFIGS the cluster (AlterClientQuotas): yes",
    ]
    for line in expected:
        assert line in lines, lines
    assert any(x.startswith("ok: may DELETE (DeleteRecords): yes, on all") for x in lines), lines
    assert any(
        x.startswith("ok: may DESCRIBE_CONFIGS (cleanup.policy): yes, on all") for x in lines
    ), lines
    assert any(
        "allow.everyone.if.no.acl.found=true: a topic with no ACL also gets" in x for x in lines
    )
    assert any(
        x.startswith("ok: acl actuator: authorizer org.apache")
        or x.startswith("ok: acl actuator: authorizer kafka.")
        for x in lines
    ), lines

    # A topic only its consumer may touch: diskguard may neither trim nor describe it.
    cluster.cluster.create_topic("check-locked", 1, 3)
    admin = cluster.cluster.admin()
    grant = AclBinding(
        ResourceType.TOPIC,
        "check-locked",
        ResourcePatternType.LITERAL,
        "User:consumer",
        "*",
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )
    for future in admin.create_acls([grant], request_timeout=15).values():
        future.result(15)
    try:
        wait_until(
            lambda: (cluster.log_dir(1) / "check-locked-0").is_dir(), 30, "check-locked on disk 1"
        )
        proc = run_cli("check-config", "--connect", "-c", str(config))
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "FAIL: may DELETE (DeleteRecords): NO on 1 topic: check-locked" in proc.stdout
    finally:
        for future in admin.delete_acls(
            [
                AclBindingFilter(
                    ResourceType.TOPIC,
                    "check-locked",
                    ResourcePatternType.LITERAL,
                    None,
                    None,
                    AclOperation.ANY,
                    AclPermissionType.ANY,
                )
            ],
            request_timeout=15,
        ).values():
            future.result(15)


# ------------------------------------------------------------------ retention across brokers


def test_one_brokers_trims_are_pending_reclaim_on_the_others(
    real_cluster: GuardedCluster, tmp_path: Path
) -> None:
    """Broker 1's disk holds a partition it leads (RF 1) and one it follows (leader 2,
    replicas 2, 1, 3). Its guard trims both through DeleteRecords, which the client routes to
    each partition's leader; the plan and the audit say whose replicas each trim shortens.
    Brokers 2 and 3 still hold the trimmed segments (the broker removes them only at its next
    retention check, its checkpoint says so a minute later): their guards, over their ceilings
    by less than that, count them as pending reclaim (the leaders' log start offsets) and trim
    nothing again."""
    cluster = real_cluster
    follow, led = "trim-follow", "trim-led"
    segments = cluster.cluster.segment_config(SEGMENT)
    cluster.cluster.create_topic(follow, assignment=[[2, 1, 3]], **segments)
    cluster.cluster.create_topic(led, assignment=[[1]], **segments)
    producer = {**cluster.client("producer"), "acks": "all", "batch.size": 64_000}
    for topic in (follow, led):  # the followed partition's segments are the oldest
        wait_until(lambda t=topic: released(cluster, t), 30, f"{topic}: first write")
        assert cluster.cluster.produce(topic, 3000, 1000, settings=producer) == []
    only_these = [f"^(?!({follow}|{led})$)"]
    MiB = 1024 * 1024

    def pending(broker_id: int) -> int:
        """What the guard of ``broker_id`` counts as on its way out of its disk now (earlier
        tests' trims included: the brokers remove nothing during the session)."""
        config = cluster.guard_config(
            tmp_path / "pending",
            broker_id,
            mode="broker",
            disk_usage_percent=1,
            protect_topics=only_these,
        )
        planned = json.loads(run_cli("plan", "--json", "-c", str(config)).stdout)
        return int(planned["filesystems"][0]["pending_reclaim_bytes"])

    before = {i: pending(i) for i in (2, 3)}
    config = cluster.guard_config(
        tmp_path,
        1,
        mode="broker",
        disk_usage_percent=ceiling_under(cluster.mount(1), 4 * MiB + pending(1)),
        protect_topics=only_these,
    )
    planned = json.loads(run_cli("plan", "--json", "-c", str(config)).stdout)
    by_topic = {d["topic"]: d for d in planned["deletions"]}
    assert by_topic[follow]["leader"] == 2 and by_topic[follow]["replicas"] == [2, 1, 3]
    assert by_topic[follow]["also_trims"] == [2, 3]
    assert by_topic[led]["leader"] == 1 and by_topic[led]["also_trims"] == []
    enforced = run_cli("enforce", "--once", "--json", "-c", str(config))
    assert enforced.returncode == 0, enforced.stdout + enforced.stderr
    trimmed = {
        e["topic"]: e for e in json_events(enforced.stdout) if e["event"] == "delete_records"
    }
    assert set(trimmed) == {follow, led}, enforced.stdout
    lows, _highs = watermarks(cluster, follow, 1)
    assert lows[0] == trimmed[follow]["low_watermark"] > 0
    audit = json_events(run_cli("audit", "--json", "-c", str(config)).stdout)
    done = [r for r in audit if r.get("phase") == "done" and r.get("topic") == follow]
    assert done and all(r["also_trims"] == [2, 3] and r["leader"] == 2 for r in done), done

    for other in (2, 3):
        # Still on this broker's disk: the trimmed segments below the new log start.
        on_disk = sorted(
            int(p.name[:-4]) for p in (cluster.log_dir(other) / f"{follow}-0").glob("*.log")
        )
        assert on_disk[0] < lows[0], (other, on_disk, lows)
        config = cluster.guard_config(
            tmp_path,
            other,
            mode="broker",
            # Over by 1 MiB beyond what was pending before broker 1's trim.
            disk_usage_percent=ceiling_under(cluster.mount(other), 1 * MiB + before[other]),
            protect_topics=only_these,
        )
        proc = run_cli("plan", "--json", "-c", str(config))
        planned = json.loads(proc.stdout)
        assert planned["deletions"] == [], (other, planned["deletions"][:3])
        assert planned["filesystems"][0]["pending_reclaim_bytes"] >= before[other] + MiB, planned
        assert "cluster_trims_pending" in proc.stderr, proc.stderr
        enforced = run_cli("enforce", "--once", "--json", "-c", str(config))
        assert enforced.returncode == 0, enforced.stdout + enforced.stderr
        assert [e for e in json_events(enforced.stdout) if e["event"] == "delete_records"] == []
        assert watermarks(cluster, follow, 1)[0] == lows


# ------------------------------------------------------------------ the fleet, for real


@pytest.mark.spark
def test_the_fleet_report_says_which_broker_filled_first(
    real_cluster: GuardedCluster, tmp_path: Path
) -> None:
    """The three guards ship their snapshots to ONE topic of the cluster (spool, then Kafka,
    as ``User:diskguard``); ``diskguard aggregate`` (Spark local mode, the Kafka source, the
    cluster's SASL settings from ``--kafka-config``) reads every record of it once and
    reports three hosts, each one's growth and time to full, and which broker filled first:
    broker 2, whose disk grows twice as fast as broker 1's (broker 3's never goes overfull).
    It also stands for the Kafka source on a real broker (what the single-broker aggregate
    test used to show: every record read, none twice)."""
    from support.kafka.broker import sasl_client_settings
    from support.kafka.guarded import USERS

    cluster = real_cluster
    topic = "fleet-snapshots"
    cluster.cluster.create_topic(topic, 3, 3)
    configs = {
        i: cluster.guard_config(
            tmp_path,
            i,
            flow_control=flow(cluster, i, []),
            snapshots={"topic": topic, "interval": "1s"},
        )
        for i in (1, 2, 3)
    }
    step = {1: 0.02, 2: 0.04, 3: 0.01}  # of each disk per second: broker 2 fills first
    guards = {i: DaemonProc(c) for i, c in configs.items()}
    try:
        for guard in guards.values():
            guard.wait_for("daemon_started", timeout=60)
            guard.wait_for("snapshot_shipped", timeout=60)
        for n in range(8):
            for i, share in step.items():
                cluster.fill(i, share, name=f"growth-{n}.bin")
            time.sleep(1)
        first = guards[2].wait_for("overfull", timeout=30)
        second = guards[1].wait_for("overfull", timeout=30)
        assert first["_t"] < second["_t"]
        assert guards[3].named("overfull") == []
        time.sleep(2)  # a last snapshot of each disk, shipped
        for guard in guards.values():
            assert guard.stop() == 0
    finally:
        for guard in guards.values():
            guard.kill()
    client = tmp_path / "aggregate.properties"
    client.write_text(
        "".join(
            f"{k}={v}\n" for k, v in sasl_client_settings("diskguard", USERS["diskguard"]).items()
        )
    )
    out = tmp_path / "fleet"
    proc = run_cli(
        "aggregate",
        "--input",
        f"kafka://{cluster.cluster.bootstrap}/{topic}",
        "--kafka-config",
        str(client),
        "--output",
        str(out),
        "--master",
        "local[2]",
        # ~2-4 min on two cores beside other brokers (load 20-35); 300 s was once too few.
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    lows, highs = watermarks(cluster, topic, 3)
    assert summary["records"] == sum(highs) - sum(lows) > 0, summary["records"]
    assert summary["duplicates"] == 0 and sum(summary["bad_records"].values()) == 0
    disks = {d["host"]: d for d in summary["disks"]}
    assert set(disks) == {"kafka-1", "kafka-2", "kafka-3"}, sorted(disks)
    growth = {host: d["growth_bytes_per_hour"] for host, d in disks.items()}
    assert growth["kafka-2"] > growth["kafka-1"] > growth["kafka-3"] > 0, growth
    hours = {host: d["hours_to_full"] for host, d in disks.items()}
    assert all(h is not None and h > 0 for h in hours.values()), hours
    assert hours["kafka-2"] < hours["kafka-1"] < hours["kafka-3"], hours
    order = summary["fill_order"]
    assert order["fills_first"]["host"] == "kafka-2", order
    assert order["fills_first"]["basis"] == "overfull"
    assert [d["host"] for d in order["disks"]] == ["kafka-2", "kafka-1"], order
    page = (out / "report.html").read_text()
    text = " ".join(re.sub(r"<[^>]+>", " ", page).split())
    assert f"kafka-2:{disks['kafka-2']['mount']} filled first" in text
    assert "3 hosts, 3 disks" in text
    for host in disks:
        assert f'<td class="l">{host}</td>' in page, host
