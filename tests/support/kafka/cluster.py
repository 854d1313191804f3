"""A Kafka cluster of one or more nodes on 127.0.0.1, and the client calls tests make of it.

KRaft: every node is a combined broker+controller of one static quorum (three nodes keep a
majority when one is killed). ZooKeeper mode: one ZooKeeper and the brokers. A one-node
cluster is "the broker": ``log_dir``, ``kill()``, ``stop()``... act on node 0.

``save()`` writes ``cluster.json`` in the root dir so another process (the runner,
``python -m support.kafka stop ROOT``) can stop or kill what this one started.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from support.kafka.broker import (
    ADMIN_USER,
    KafkaNode,
    ZooKeeper,
    sasl_client_settings,
    small_segments,
)
from support.kafka.classpath import Release, parse_release
from support.kafka.node import ServerSetupError, free_port


class KafkaCluster:
    """Nodes ``1..n``, node ``i`` with its own work dir ``root/node-i`` and ``log_dirs[i-1]``."""

    def __init__(
        self,
        release: Release,
        classpath: Sequence[Path],
        root: Path,
        log_dirs: Sequence[Sequence[Path]],
        *,
        mode: str = "kraft",
        settings: Mapping[str, str] | None = None,
        heap_mb: int = 320,
        sasl_users: Mapping[str, str] | None = None,
    ) -> None:
        self.release = release
        self.classpath = tuple(classpath)
        self.root = root
        self.mode = mode
        self.settings = dict(settings or {})
        #: SASL/PLAIN accounts (name -> password; ``admin`` is the super user), or None for
        #: PLAINTEXT. ``admin()``, ``produce()`` and ``create_topic()`` connect as ``admin``.
        self.sasl_users = dict(sasl_users) if sasl_users is not None else None
        self.zookeeper: ZooKeeper | None = None
        if mode == "zk":
            self.zookeeper = ZooKeeper(release, classpath, root / "zookeeper", free_port(), 192)
        voters = {i: free_port() for i in range(1, len(log_dirs) + 1)} if mode == "kraft" else {}
        self.nodes = [
            KafkaNode(
                release,
                classpath,
                root / f"node-{i}",
                dirs,
                mode=mode,
                node_id=i,
                controller_port=voters.get(i),
                voters=voters,
                zookeeper=self.zookeeper.connect if self.zookeeper else None,
                cluster_size=len(log_dirs),
                settings=self.settings,
                heap_mb=heap_mb,
                sasl_users=self.sasl_users,
            )
            for i, dirs in enumerate(log_dirs, start=1)
        ]

    # -- the cluster --------------------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def start(self, timeout: float = 180) -> None:
        """Start every node (ZooKeeper first) and wait until each is a registered broker."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self.zookeeper is not None and not self.zookeeper.alive():
            self.zookeeper.start(timeout)
        for node in self.nodes:
            if not node.alive():
                node.launch()
        for node in self.nodes:
            node.wait_started(timeout)
        self.wait_brokers(timeout)
        self.save()

    def wait_brokers(self, timeout: float = 120, count: int | None = None) -> None:
        """Until the cluster's metadata lists ``count`` brokers (all nodes by default)."""
        want = len(self.nodes) if count is None else count
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            with contextlib.suppress(Exception):
                seen = len(self.admin().list_topics(timeout=5).brokers)
                if seen >= want:
                    return
            if time.monotonic() > deadline:
                raise ServerSetupError(
                    f"{self.release} cluster: {seen} of {want} brokers registered "
                    f"within {timeout:.0f} s"
                )
            time.sleep(0.3)

    def stop(self, timeout: float = 30) -> None:
        """Every node stopped at once (one after another, the last would wait on a quorum
        already gone), then ZooKeeper; SIGKILL for any node that outstays ``timeout``."""
        for node in self.nodes:
            node.terminate()
        for node in self.nodes:
            node.stop(timeout)
        if self.zookeeper is not None:
            self.zookeeper.stop(timeout)

    # -- node 0 as "the broker" -----------------------------------------------------------------
    @property
    def node(self) -> KafkaNode:
        return self.nodes[0]

    @property
    def log_dir(self) -> Path:
        return self.node.log_dir

    @property
    def workdir(self) -> Path:
        return self.node.workdir

    @property
    def started_at(self) -> float:
        return self.node.started_at

    def pid(self) -> int | None:
        return self.node.pid()

    def alive(self) -> bool:
        return self.node.alive()

    def kill(self) -> None:
        self.node.kill()

    def log_text(self) -> str:
        return self.node.log_text()

    def log_since_start(self) -> str:
        return self.node.log_since_start()

    def wait_retention_check(self) -> None:
        """Sleep until every node's first retention check has run."""
        for node in self.nodes:
            left = node.started_at + node.initial_task_delay_s + 1.0 - time.monotonic()
            if left > 0:
                time.sleep(left)

    # -- the runner's record ------------------------------------------------------------------
    def save(self) -> None:
        record = {
            "release": str(self.release),
            "mode": self.mode,
            "log_dirs": [list(map(str, node.log_dirs)) for node in self.nodes],
            "settings": self.settings,
            "ports": [[n.port, n.controller_port] for n in self.nodes],
            "zookeeper_port": self.zookeeper.port if self.zookeeper else None,
            "bootstrap": self.bootstrap,
            "classpath": list(map(str, self.classpath)),
            "sasl_users": self.sasl_users,
            "heap_mb": self.nodes[0].heap_mb,
        }
        (self.root / "cluster.json").write_text(json.dumps(record, indent=1) + "\n")

    @classmethod
    def load(cls, root: Path) -> KafkaCluster:
        """The cluster a ``save()`` described, its ports and dirs as they were."""
        record = json.loads((root / "cluster.json").read_text())
        release = parse_release(record["release"])
        cluster = cls(
            release,
            [Path(p) for p in record["classpath"]],
            root,
            [[Path(p) for p in dirs] for dirs in record["log_dirs"]],
            mode=record["mode"],
            settings=record["settings"],
            heap_mb=record.get("heap_mb", 320),
            sasl_users=record.get("sasl_users"),
        )
        voters = {i: ports[1] for i, ports in enumerate(record["ports"], start=1)}
        for node, (port, controller) in zip(cluster.nodes, record["ports"], strict=True):
            node.port, node.controller_port = port, controller
            node.voters = voters if cluster.mode == "kraft" else {}
        if cluster.zookeeper is not None:
            cluster.zookeeper.port = record["zookeeper_port"]
            for node in cluster.nodes:
                node.zookeeper = cluster.zookeeper.connect
        return cluster

    # -- clients ------------------------------------------------------------------------------
    def segment_config(self, size: int) -> dict[str, str]:
        """Topic configs that roll a segment every ``size`` bytes on this release."""
        return small_segments(self.release, size)

    def client_config(self, user: str | None = None) -> dict[str, Any]:
        """librdkafka settings to reach the cluster as ``user`` (default ``admin``; on a
        PLAINTEXT cluster everyone is anonymous and ``user`` is ignored)."""
        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "log_level": 0}
        if self.sasl_users is not None:
            name = user or ADMIN_USER
            config |= sasl_client_settings(name, self.sasl_users[name])
        return config

    def admin(self, user: str | None = None) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient(self.client_config(user))

    def create_topic(
        self,
        topic: str,
        partitions: int = 1,
        replication: int = 1,
        assignment: list[list[int]] | None = None,
        **config: str,
    ) -> None:
        """``assignment``: each partition's replicas (broker ids, the preferred leader
        first), instead of ``partitions`` x ``replication`` placed by the controller."""
        from confluent_kafka.admin import NewTopic

        admin = self.admin()  # kept referenced until the futures resolve
        if assignment is not None:
            new = NewTopic(topic, len(assignment), replica_assignment=assignment, config=config)
            partitions = len(assignment)
        else:
            new = NewTopic(
                topic, num_partitions=partitions, replication_factor=replication, config=config
            )
        futures = admin.create_topics([new], request_timeout=30)
        for future in futures.values():
            future.result(30)
        self._wait_leaders(admin, topic, partitions)

    @staticmethod
    def _wait_leaders(admin: Any, topic: str, partitions: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                meta = admin.list_topics(topic, timeout=5).topics[topic]
                if (
                    meta.error is None
                    and len(meta.partitions) == partitions
                    and all(p.leader >= 0 for p in meta.partitions.values())
                ):
                    return
            time.sleep(0.1)
        raise ServerSetupError(f"topic {topic}: no leader for every partition within {timeout} s")

    def first_offsets(
        self, topic: str, partitions: Iterable[int], timeout: float = 30
    ) -> dict[int, tuple[int, int]]:
        """Per partition: its log start offset and the offset a reader assigned there gets
        first (-1 if nothing within ``timeout``): where the partition begins, as a consumer
        sees it (after a DeleteRecords, or an offline deletion and a restart)."""
        from confluent_kafka import Consumer, TopicPartition

        reader = Consumer({**self.client_config(), "group.id": f"first-{time.monotonic_ns()}"})
        out: dict[int, tuple[int, int]] = {}
        try:
            for part in partitions:
                low, _high = reader.get_watermark_offsets(TopicPartition(topic, part), timeout=10)
                reader.assign([TopicPartition(topic, part, low)])
                first = -1
                until = time.monotonic() + timeout
                while first < 0 and time.monotonic() < until:
                    msg = reader.poll(0.5)
                    if msg is not None and msg.error() is None:
                        first = msg.offset()
                out[part] = (low, first)
        finally:
            reader.close()
        return out

    def produce(
        self,
        topic: str,
        count: int,
        size: int = 1000,
        partition: int | None = None,
        settings: dict[str, Any] | None = None,
        key: Callable[[int], bytes] | None = None,
    ) -> list[Any]:
        """Produce ``count`` records of ``size`` bytes and wait for every report; the errors."""
        from confluent_kafka import Producer

        producer = Producer(
            {
                **self.client_config(),
                "linger.ms": 5,
                "message.timeout.ms": 20_000,
                **(settings or {}),
            }
        )
        errors: list[Any] = []

        def report(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(err)

        value = b"v" * size
        extra: dict[str, Any] = {} if partition is None else {"partition": partition}
        for i in range(count):
            while True:
                try:
                    producer.produce(
                        topic, value, key=key(i) if key else None, on_delivery=report, **extra
                    )
                    break
                except BufferError:
                    producer.poll(0.1)
        producer.flush(60)
        return errors

    def read_all(self, topic: str, want: int, timeout: float = 90) -> int:
        """Records a fresh consumer group reads from offset 0 of every partition, until it
        has ``want`` or none came for 20 s (or ``timeout`` in all)."""
        from confluent_kafka import Consumer

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"read-all-{time.monotonic_ns()}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "log_level": 0,
            }
        )
        consumer.subscribe([topic])
        got, start = 0, time.monotonic()
        idle = start
        try:
            while got < want and time.monotonic() - start < timeout:
                if time.monotonic() - idle > 20:
                    break
                msg = consumer.poll(1.0)
                if msg is not None and msg.error() is None:
                    got += 1
                    idle = time.monotonic()
        finally:
            consumer.close()
        return got


@contextlib.contextmanager
def running_cluster(
    release: Release,
    classpath: Sequence[Path],
    root: Path,
    log_dirs: Sequence[Sequence[Path]],
    **options: Any,
) -> Iterator[KafkaCluster]:
    """A started cluster, stopped when the block ends (killed where a stop hangs)."""
    cluster = KafkaCluster(release, classpath, root, log_dirs, **options)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@contextlib.contextmanager
def running_broker(
    release: Release,
    classpath: Sequence[Path],
    log_dir: Path,
    *,
    mode: str = "kraft",
    settings: Mapping[str, str] | None = None,
    sasl_users: Mapping[str, str] | None = None,
) -> Iterator[KafkaCluster]:
    """One started broker on ``log_dir`` (work dir: a fresh temp dir, removed afterwards
    unless ``DISKGUARD_KAFKA_KEEP`` is set, to read its ``server.log`` after a failure);
    ``sasl_users``: SASL/PLAIN listeners with these accounts (``KafkaCluster``)."""
    root = Path(tempfile.mkdtemp(prefix="diskguard-kafka-"))
    try:
        with running_cluster(
            release,
            classpath,
            root,
            [[log_dir]],
            mode=mode,
            settings=settings,
            sasl_users=sasl_users,
        ) as broker:
            yield broker
    finally:
        if not os.environ.get("DISKGUARD_KAFKA_KEEP"):
            shutil.rmtree(root, ignore_errors=True)
