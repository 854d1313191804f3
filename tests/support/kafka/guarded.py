"""A real three-broker cluster with one diskguard per broker, as a production cluster runs it.

Each broker has its own loop ext4 disk (a disk fills on its own), SASL/PLAIN listeners (so a
producer, a consumer, diskguard and the operator are different principals), the release's
ACL authorizer letting everyone in where no ACL is found (the setup the ``acl`` actuator must
not break), and small heaps so that the three JVMs fit two cores beside the suite. Each
guard's config points at its broker's log dir and ``server.properties``, connects as
``User:diskguard`` and keeps its state in a dir of the test's.

``GuardedCluster`` also says what the cluster holds: every ACL, every client quota, exactly
as the brokers answer (for "exactly as before" comparisons).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.configs import write_config
from support.fsfixtures import fill
from support.kafka.broker import KafkaNode, sasl_client_settings
from support.kafka.cluster import KafkaCluster

#: The accounts of the cluster (``admin`` is the brokers' own identity and the one super user).
USERS = {
    "admin": "admin-secret",
    "diskguard": "diskguard-secret",
    "producer": "producer-secret",
    "consumer": "consumer-secret",
}
#: Every client quota of the cluster: entity -> {quota key: value}.
QuotaMap = dict[tuple[tuple[str, str | None], ...], dict[str, float]]
#: Each broker's own disk; 256 MiB leaves room for a filler that crosses any limit.
DISK_BYTES = 256 * 1024 * 1024
HEAP_MB = 256


@dataclass
class GuardedCluster:
    """A started ``KafkaCluster`` of three nodes and the mount point of each node's disk."""

    cluster: KafkaCluster
    mounts: list[Path]
    fillers: list[Path] = field(default_factory=list)

    # -- nodes --------------------------------------------------------------------------
    def node(self, broker_id: int) -> KafkaNode:
        return self.cluster.nodes[broker_id - 1]

    def log_dir(self, broker_id: int) -> Path:
        return self.node(broker_id).log_dir

    def mount(self, broker_id: int) -> Path:
        return self.mounts[broker_id - 1]

    def client(self, user: str) -> dict[str, Any]:
        """librdkafka settings to reach the cluster as ``user``."""
        return self.cluster.client_config(user)

    # -- a guard's config -----------------------------------------------------------------
    def guard_config(
        self,
        workdir: Path,
        broker_id: int,
        *,
        flow_control: dict[str, Any] | None = None,
        snapshots: dict[str, Any] | None = None,
        metrics: dict[str, Any] | None = None,
        **retention: Any,
    ) -> Path:
        """The config of broker ``broker_id``'s diskguard, in ``workdir/guard-<id>``."""
        home = workdir / f"guard-{broker_id}"
        home.mkdir(parents=True, exist_ok=True)
        retention.setdefault("mode", "dry-run")
        retention.setdefault("check_interval", "1s")
        retention.setdefault("assume_delete_policy", None)
        return write_config(
            home,
            self.log_dir(broker_id),
            broker={
                "bootstrap_servers": self.node(broker_id).bootstrap,
                "server_properties": self.node(broker_id).workdir / "server.properties",
                "client": sasl_client_settings("diskguard", USERS["diskguard"]),
            },
            flow_control=flow_control,
            snapshots={"host": f"kafka-{broker_id}", **(snapshots or {})},
            metrics=metrics,
            **retention,
        )

    def fill(self, broker_id: int, share: float, name: str = "filler.bin") -> Path:
        """Real bytes filling ``share`` of the node's disk capacity (removed by ``clear``)."""
        st = os.statvfs(self.mount(broker_id))
        path = self.mount(broker_id) / name
        fill(path, int((st.f_blocks - st.f_bfree + st.f_bavail) * st.f_frsize * share))
        self.fillers.append(path)
        return path

    def clear(self, broker_id: int | None = None) -> None:
        for path in list(self.fillers):
            if broker_id is None or path.parent == self.mount(broker_id):
                path.unlink(missing_ok=True)
                self.fillers.remove(path)

    # -- what the cluster holds ---------------------------------------------------------
    def _ask_each_broker(self, request: Any) -> dict[int, Any]:
        """One kafka-python request sent to every broker, as admin: each broker's answer."""
        from kafka.admin import KafkaAdminClient

        answers = {}
        for node in self.cluster.nodes:
            admin = KafkaAdminClient(
                bootstrap_servers=node.bootstrap,
                security_protocol="SASL_PLAINTEXT",
                sasl_mechanism="PLAIN",
                sasl_plain_username="admin",
                sasl_plain_password=USERS["admin"],
                request_timeout_ms=15_000,
            )
            try:
                answers[node.node_id] = admin._manager.run(
                    admin._manager.send, request, node.node_id
                )
            finally:
                admin.close()
        return answers

    def _agreed(self, read: Callable[[Any], Any], request: Any, what: str) -> Any:
        """What every broker answers alike. KRaft brokers answer DescribeAcls and
        DescribeClientQuotas from their own replay of the metadata log: right after a change
        (or a broker's restart) they may differ for a moment."""
        deadline = time.monotonic() + 60
        while True:
            answers = {n: read(r) for n, r in self._ask_each_broker(request).items()}
            first = next(iter(answers.values()))
            if all(a == first for a in answers.values()):
                return first
            if time.monotonic() > deadline:
                raise AssertionError(f"the brokers disagree on {what} for 60 s: {answers}")
            time.sleep(0.5)

    def acls(self) -> set[tuple[str, ...]]:
        """Every ACL of the cluster, each as its seven fields, as every broker lists them."""
        from confluent_kafka.admin import (
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )
        from kafka.protocol.admin import DescribeAclsRequest

        def read(response: Any) -> set[tuple[str, ...]]:
            assert not response.error_code, response
            return {
                (
                    ResourceType(r.resource_type).name,
                    r.resource_name,
                    ResourcePatternType(r.pattern_type).name,
                    acl.principal,
                    acl.host,
                    AclOperation(acl.operation).name,
                    AclPermissionType(acl.permission_type).name,
                )
                for r in response.resources
                for acl in r.acls
            }

        any_ = 1  # ANY in each of the filter's enums
        request = DescribeAclsRequest(
            resource_type_filter=any_,
            resource_name_filter=None,
            pattern_type_filter=any_,
            principal_filter=None,
            host_filter=None,
            operation=any_,
            permission_type=any_,
        )
        return set(self._agreed(read, request, "the ACLs"))

    def quotas(self) -> QuotaMap:
        """Every client quota of the cluster (DescribeClientQuotas, no filter), as every
        broker answers."""
        from kafka.protocol.admin import DescribeClientQuotasRequest

        def read(response: Any) -> QuotaMap:
            assert not response.error_code, response
            return {
                tuple(sorted((e.entity_type, e.entity_name) for e in entry.entity)): {
                    v.key: v.value for v in entry.values
                }
                for entry in response.entries or ()
            }

        request = DescribeClientQuotasRequest(components=[], strict=False)
        return dict(self._agreed(read, request, "the client quotas"))

    @contextlib.contextmanager
    def as_it_was(self) -> Iterator[tuple[set[tuple[str, ...]], QuotaMap]]:
        """The cluster's ACLs and quotas now; put back (and fillers removed) when the block
        ends however it ends: a hold left by a guard a failed test killed must not hold the
        next test's producers."""
        acls, quotas = self.acls(), self.quotas()
        try:
            yield acls, quotas
        finally:
            self.clear()
            self.restore(acls, quotas)

    def restore(self, acls: set[tuple[str, ...]], quotas: QuotaMap) -> None:
        from confluent_kafka.admin import (
            AclBinding,
            AclBindingFilter,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        def native(fields: tuple[str, ...], cls: Any) -> Any:
            kind, name, pattern, principal, host, op, permission = fields
            return cls(
                ResourceType[kind],
                name,
                ResourcePatternType[pattern],
                principal,
                host,
                AclOperation[op],
                AclPermissionType[permission],
            )

        now = self.acls()
        admin = self.cluster.admin()
        if now - acls:
            filters = [native(f, AclBindingFilter) for f in sorted(now - acls)]
            for future in admin.delete_acls(filters, request_timeout=15).values():
                future.result(15)
        if acls - now:
            bindings = [native(f, AclBinding) for f in sorted(acls - now)]
            for future in admin.create_acls(bindings, request_timeout=15).values():
                future.result(15)
        # The guards' records too: a killed guard's claim of "the value before" would
        # otherwise outlive the state it described.
        from diskguard.flow.holdsregistry import HoldsRegistry

        registry = HoldsRegistry(
            self.cluster.bootstrap, sasl_client_settings("admin", USERS["admin"])
        )
        try:
            for guard in registry.read():
                registry.remove(guard)
        finally:
            registry.close()
        current = self.quotas()
        for entity in set(current) | set(quotas):
            want = quotas.get(entity, {}).get("producer_byte_rate")
            if current.get(entity, {}).get("producer_byte_rate") != want:
                self.set_quota(dict(entity), want)

    def set_quota(self, entity: dict[str, str | None], rate: float | None) -> None:
        """An operator's own quota (``None`` removes it)."""
        from diskguard.config import BrokerConfig
        from diskguard.flow.kafkaquota import KafkaAdminConnection, KafkaQuotaAdmin

        connection = KafkaAdminConnection(
            BrokerConfig(
                bootstrap_servers=self.cluster.bootstrap,
                client=sasl_client_settings("admin", USERS["admin"]),
            )
        )
        try:
            KafkaQuotaAdmin(connection.send).alter_producer_byte_rate(
                tuple(sorted(entity.items())), rate
            )
        finally:
            connection.reset()

    # -- clients as the tests' principals ---------------------------------------------------
    def write_attempt(self, topic: str, user: str = "producer") -> str | None:
        """One record from a fresh producer: None when it landed, else the error name."""
        from confluent_kafka import KafkaException, Producer

        producer = Producer({**self.client(user), "message.timeout.ms": 5000, "acks": "all"})
        errors: list[Any] = []
        try:
            producer.produce(topic, b"x", on_delivery=lambda err, _m: errors.append(err))
        except KafkaException as exc:
            return str(exc.args[0].name())
        producer.flush(10)
        if not errors:
            return "no delivery report"
        return None if errors[0] is None else str(errors[0].name())

    def read_count(
        self, topic: str, partitions: int, user: str = "consumer", at_least: int | None = None
    ) -> int:
        """Records a fresh consumer reads from the start of every partition in 8 s (or until
        it has ``at_least``)."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer({**self.client(user), "group.id": f"reader-{time.monotonic_ns()}"})
        count = 0
        try:
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is not None and message.error() is None:
                    count += 1
                    if at_least is not None and count >= at_least:
                        break
        finally:
            consumer.close()
        return count


def wait_until(
    check: Callable[[], Any], timeout: float, what: str, show: Callable[[], Any] | None = None
) -> Any:
    """``check()`` once it is true; else an AssertionError naming ``what`` (and ``show()``:
    the state that did not come)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            seen = f"; now: {show()}" if show is not None else ""
            raise AssertionError(f"{what}: not within {timeout} s{seen}")
        time.sleep(0.3)


@contextlib.contextmanager
def guarded_cluster(
    release: Any,
    classpath: Sequence[Path],
    mode: str,
    root: Path,
    mounts: Sequence[Path],
    settings: dict[str, str],
) -> Iterator[GuardedCluster]:
    cluster = KafkaCluster(
        release,
        classpath,
        root,
        [[mount / "kafka-logs"] for mount in mounts],
        mode=mode,
        # The log cleaner's dedupe buffer is 128 MiB by default: half of a small heap, and
        # a node that starts its cleaner beside a busy start-up dies of OutOfMemoryError.
        settings={"log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024), **settings},
        heap_mb=HEAP_MB,
        sasl_users=USERS,
    )
    guarded = GuardedCluster(cluster, list(mounts))
    try:
        cluster.start()
        yield guarded
    finally:
        guarded.clear()
        cluster.stop()
