"""Many guards, one cluster: a REAL three-broker cluster, one diskguard per broker.

The session's ``real_cluster`` (conftest): three brokers on 127.0.0.1 (KRaft where the
release has it), each on its own loop ext4, SASL/PLAIN principals (``producer``,
``consumer``, ``diskguard``, ``admin``), the release's ACL authorizer letting everyone in
where no ACL is found. Each test starts the guards it needs (``diskguard run`` processes with
their own state dirs) and leaves the cluster as it found it: no filler, no hold, no ACL.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ConfigResource,
    ResourcePatternType,
    ResourceType,
)

from support.daemonproc import DaemonProc
from support.disks import df_percent
from support.kafka.guarded import GuardedCluster, wait_until

pytestmark = pytest.mark.realkafka

SEGMENT = 256 * 1024


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
