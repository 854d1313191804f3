"""diskguard on a secured REAL Kafka broker, with only the ACLs the docs list for it
(``support.kafka.target``; docs/broker-calls.md, "A secured cluster").

Every listener SASL/PLAIN, the release's authorizer with Kafka's default
``allow.everyone.if.no.acl.found=false``, the brokers' own principal ``User:admin`` as the only
super user (without it a KRaft broker cannot even register with its controller). diskguard
logs in as ``User:diskguard``, which holds exactly the ACLs the docs list, and every call it
makes works: Metadata, DescribeConfigs (topic and broker), DescribeAcls, DeleteRecords,
ListGroups + OffsetFetch, CreateAcls/DeleteAcls (the ``acl`` actuator, in its child process)
and Describe/AlterClientQuotas (the ``quota`` actuator, through kafka-python with the
``[broker.client]`` SASL keys translated). A DENY WRITE stops the application's principal and
not the super user: producers meant to be held back must not be super users.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from diskguard.broker.client import BrokerClient
from diskguard.config import BrokerConfig
from diskguard.flow.acladmin import ProcessAclAdmin
from diskguard.flow.holds import deny_write
from diskguard.flow.kafkaquota import KafkaAdminConnection
from support import fsfixtures
from support.cli import run_cli
from support.configs import write_config
from support.disks import ceiling_under
from support.kafka import Target
from support.kafka.broker import acl_settings, fast_retention, sasl_client_settings
from support.kafka.cluster import KafkaCluster, running_broker
from support.kafka.groups import commit_offsets
from support.kafka.guarded import wait_until

pytestmark = pytest.mark.realkafka

USERS = {"admin": "admin-secret", "diskguard": "dg-secret", "app": "app-secret"}
TOPIC = "sec-orders"
GROUP = "sec-readers"
HOLDS = "__diskguard_holds"


def diskguard_acls() -> list[tuple[str, str, str, str]]:
    """(resource type, name, pattern, operation) allowed to ``User:diskguard``: the list
    docs/broker-calls.md gives an operator."""
    return [
        ("CLUSTER", "kafka-cluster", "LITERAL", "DESCRIBE"),  # DescribeAcls, ListGroups
        ("CLUSTER", "kafka-cluster", "LITERAL", "DESCRIBE_CONFIGS"),  # broker configs, quotas
        ("CLUSTER", "kafka-cluster", "LITERAL", "ALTER"),  # CreateAcls / DeleteAcls
        ("CLUSTER", "kafka-cluster", "LITERAL", "ALTER_CONFIGS"),  # AlterClientQuotas
        ("TOPIC", "*", "LITERAL", "DESCRIBE"),  # Metadata, OffsetFetch
        ("TOPIC", "*", "LITERAL", "DESCRIBE_CONFIGS"),  # cleanup.policy
        ("TOPIC", "*", "LITERAL", "DELETE"),  # DeleteRecords
        ("GROUP", "*", "LITERAL", "DESCRIBE"),  # ListGroups, OffsetFetch
        # The holds topic the acl and quota actuators share with the cluster's other guards.
        ("CLUSTER", "kafka-cluster", "LITERAL", "CREATE"),  # created at the first hold
        ("TOPIC", HOLDS, "LITERAL", "READ"),
        ("TOPIC", HOLDS, "LITERAL", "WRITE"),
    ]


def app_acls() -> list[tuple[str, str, str, str]]:
    return [
        ("TOPIC", TOPIC, "LITERAL", "WRITE"),
        ("TOPIC", TOPIC, "LITERAL", "DESCRIBE"),
        ("TOPIC", TOPIC, "LITERAL", "READ"),
        ("GROUP", GROUP, "LITERAL", "READ"),
    ]


def allow(broker: KafkaCluster, principal: str, acls: list[tuple[str, str, str, str]]) -> None:
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    bindings = [
        AclBinding(
            # librdkafka names Kafka's CLUSTER resource BROKER (same wire value, 4).
            ResourceType["BROKER" if rtype == "CLUSTER" else rtype],
            name,
            ResourcePatternType[pattern],
            principal,
            "*",
            AclOperation[operation],
            AclPermissionType.ALLOW,
        )
        for rtype, name, pattern, operation in acls
    ]
    admin = broker.admin()  # referenced until the futures resolve
    for future in admin.create_acls(bindings, request_timeout=30).values():
        future.result(30)


@pytest.fixture(scope="module")
def secured(kafka_target: Target) -> Iterator[KafkaCluster]:
    release, mode = kafka_target.release, kafka_target.mode
    with (
        fsfixtures.loop_ext4(64 * fsfixtures.MiB, 0, name="secured-disk") as mount,
        running_broker(
            release,
            kafka_target.classpath,
            mount / "kafka-logs",
            mode=mode,
            # Kafka's default: no ACL found means denied (the harness's admin is super user).
            settings=fast_retention(release)
            | acl_settings(release, mode)
            | {"allow.everyone.if.no.acl.found": "false"},
            sasl_users=USERS,
        ) as broker,
    ):
        allow(broker, "User:diskguard", diskguard_acls())
        allow(broker, "User:app", app_acls())
        yield broker


def write_as(broker: KafkaCluster, user: str) -> str | None:
    """One record to TOPIC as ``user``: None when it landed, else the error name."""
    producer = Producer({**broker.client_config(user), "message.timeout.ms": 10_000})
    errors: list[Any] = []
    producer.produce(TOPIC, b"x", on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(15)
    if not errors:
        return "no delivery report"
    return None if errors[0] is None else str(errors[0].name())


def throttle_ms(broker: KafkaCluster, user: str) -> float:
    """The longest produce throttle the broker put on ``user`` for one 20 kB record."""
    seen = [0.0]
    producer = Producer(
        {
            **broker.client_config(user),
            "throttle_cb": lambda event: seen.append(event.throttle_time * 1000),
        }
    )
    errors: list[Any] = []
    producer.produce(TOPIC, b"t" * 20_000, on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(30)
    producer.poll(0.5)
    assert errors == [None], errors
    return max(seen)


def test_diskguard_with_only_its_documented_acls_on_a_secured_broker(
    secured: KafkaCluster, tmp_path: Path
) -> None:
    broker = secured
    broker.create_topic(TOPIC, **broker.segment_config(200_000))
    assert broker.produce(TOPIC, 1200, 500, settings={"batch.size": 50_000}) == []
    bases = sorted(int(p.name[:-4]) for p in (broker.log_dir / f"{TOPIC}-0").glob("*.log"))
    assert len(bases) >= 3, bases
    # The application commits offsets as itself.
    consumer = Consumer(
        {**broker.client_config("app"), "group.id": GROUP, "enable.auto.commit": False}
    )
    commit_offsets(consumer, [TopicPartition(TOPIC, 0, 100)])
    consumer.close()

    client = sasl_client_settings("diskguard", USERS["diskguard"])
    config = write_config(
        tmp_path,
        broker.log_dir,
        broker={
            "bootstrap_servers": broker.bootstrap,
            "client": client,
            "server_properties": broker.workdir / "server.properties",
        },
        flow_control={
            "overfull_percent": 99,
            "underfull_percent": 98,
            "actuators": ["acl", "quota"],
            "acl_principal": "User:app",
        },
        assume_delete_policy=None,
        protect_topics=[f"^(?!{TOPIC}$)"],
        mode="broker",
        disk_usage_percent=round(ceiling_under(broker.log_dir, 60_000), 6),
    )
    # check-config --connect: every check passes as User:diskguard.
    proc = run_cli("check-config", "--connect", "-c", str(config), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "DescribeAcls answers; super.users is set" in proc.stdout, proc.stdout

    # DescribeConfigs learns the policy; DeleteRecords trims the oldest segment.
    proc = run_cli("plan", "--json", "-c", str(config), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["mode"] == "broker", plan["mode_reason"]
    assert [(d["topic"], d["base_offset"]) for d in plan["deletions"]] == [(TOPIC, bases[0])]
    proc = run_cli("enforce", "--once", "-c", str(config), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    dg = BrokerClient(broker.bootstrap, client, timeout=10)
    reader = Consumer({**broker.client_config(), "group.id": "sec-check"})
    low, _high = reader.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10)
    reader.close()
    assert low == bases[1]

    # The authorizer does deny by default: the application may not DeleteRecords.
    from diskguard.retention.planner import Deletion

    refused = Deletion(
        str(broker.log_dir), TOPIC, 0, bases[1], bases[2], 0, 0, (), str(broker.log_dir.parent)
    )
    app_client = BrokerClient(
        broker.bootstrap, sasl_client_settings("app", USERS["app"]), timeout=10
    )
    (denied,) = app_client.delete_records([refused])
    assert not denied.ok and "TOPIC_AUTHORIZATION_FAILED" in (denied.error or ""), denied

    # ListGroups + OffsetFetch see the application's group.
    assert dg.committed_offsets([TOPIC]) == {(TOPIC, 0): {GROUP: 100}}

    # The acl actuator's own calls (CreateAcls, DescribeAcls, DeleteAcls in its child).
    broker_config = BrokerConfig(bootstrap_servers=broker.bootstrap, client=dict(client))
    acl = ProcessAclAdmin(broker_config)
    deny = deny_write(TOPIC, "User:app")
    assert write_as(broker, "app") is None
    acl.create([deny])
    try:
        assert deny in acl.topic_acls()
        assert write_as(broker, "app") == "TOPIC_AUTHORIZATION_FAILED"
        # A DENY never applies to a super user.
        assert write_as(broker, "admin") is None
    finally:
        acl.delete([deny])
    assert write_as(broker, "app") is None

    # The quota actuator's calls, through kafka-python with the SASL keys translated.
    connection = KafkaAdminConnection(broker_config)
    quotas = connection.quota_admin()
    entity = (("user", "app"),)
    try:
        assert quotas.describe_producer_byte_rate(entity) is None
        quotas.alter_producer_byte_rate(entity, 1024.0)
        assert quotas.describe_producer_byte_rate(entity) == 1024.0
        # Enforced once the broker applied it: at once on KRaft (the describe above reads the
        # same metadata image), a moment later in ZooKeeper mode (a change notification).
        wait_until(lambda: throttle_ms(broker, "app"), 60, "the broker throttling app")
        assert throttle_ms(broker, "admin") == 0  # the quota is app's alone
        quotas.alter_producer_byte_rate(entity, None)
        assert quotas.describe_producer_byte_rate(entity) is None
    finally:
        connection.reset()
