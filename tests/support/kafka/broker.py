"""Kafka nodes: a KRaft combined broker+controller, a ZooKeeper-mode broker, and ZooKeeper.

The settings are what a real deployment sets, cut to one machine: loopback listeners on free
ports, internal topics with the replication the node count allows, five offsets partitions
instead of fifty (two cores run the whole suite), and no rebalance delay. Anything else is
Kafka's default unless a test passes its own ``settings`` (``fast_retention``, ``acl_settings``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from support.kafka.classpath import Release
from support.kafka.node import (
    CLUSTER_ID,
    JavaServer,
    free_port,
    hand_to_user,
    properties_text,
    write_readable,
)

_INITIAL_DELAY_KEY = "log.initial.task.delay.ms"
_ZK_SESSION_S = 6.0


def fast_retention(release: Release) -> dict[str, str]:
    """Retention checks every second and deleted files removed half a second later, from the
    first second after start-up where the release can say so (3.8+: log.initial.task.delay.ms;
    earlier releases wait a fixed 30 s before their first check)."""
    settings = {"log.retention.check.interval.ms": "1000", "log.segment.delete.delay.ms": "500"}
    if release.version >= (3, 8, 0):
        settings[_INITIAL_DELAY_KEY] = "1000"
    return settings


def small_segments(release: Release, size: int) -> dict[str, str]:
    """Topic configs that roll segments every ``size`` bytes: from 4.1 a topic's
    ``segment.bytes`` under 1 MiB is refused (KIP-1030) and the internal
    ``internal.segment.bytes`` takes its place; 4.0 refuses only the broker's
    ``log.segment.bytes`` under 1 MiB and has no ``internal.segment.bytes`` (its jars do not
    name it: creating a topic with it fails), so there the topic's ``segment.bytes`` it is."""
    key = (
        "internal.segment.bytes"
        if release.version >= (4, 1, 0) and size < 1 << 20
        else "segment.bytes"
    )
    return {key: str(size)}


def acl_settings(release: Release, mode: str) -> dict[str, str]:
    """The release's own ACL authorizer, permissive where a resource has no ACL (the setup
    diskguard's acl actuator is documented for)."""
    if mode == "kraft":
        name = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    elif release.version >= (2, 4, 0):
        name = "kafka.security.authorizer.AclAuthorizer"
    else:
        name = "kafka.security.auth.SimpleAclAuthorizer"
    return {"authorizer.class.name": name, "allow.everyone.if.no.acl.found": "true"}


#: SASL/PLAIN users of a ``sasl`` cluster: the brokers talk to each other (and the KRaft
#: controllers) as ``admin``, the one super user; tests connect as whom they need to be.
ADMIN_USER = "admin"


def sasl_listener_settings(users: Mapping[str, str], listeners: Sequence[str]) -> dict[str, str]:
    """PLAIN on every listener in ``listeners`` (lower-case names), with ``users`` (name ->
    password) as the only accounts and ``admin`` as the brokers' own identity."""
    accounts = " ".join(f'user_{name}="{secret}"' for name, secret in sorted(users.items()))
    jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{ADMIN_USER}" password="{users[ADMIN_USER]}" {accounts};'
    )
    settings = {"sasl.enabled.mechanisms": "PLAIN", "sasl.mechanism.inter.broker.protocol": "PLAIN"}
    for name in listeners:
        settings[f"listener.name.{name}.plain.sasl.jaas.config"] = jaas
    return settings


def sasl_client_settings(user: str, password: str) -> dict[str, str]:
    """librdkafka's settings (``[broker.client]``) to connect to a ``sasl`` cluster as ``user``."""
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": password,
    }


class ZooKeeper(JavaServer):
    """ZooKeeper (from the broker's own classpath) for ZooKeeper-mode brokers."""

    #: Its INFO lines are turned down to WARN; a client port that answers is the sign.
    started_line = ""

    def main_class(self) -> str:
        return "org.apache.zookeeper.server.quorum.QuorumPeerMain"

    def arguments(self) -> list[str]:
        return [str(self.workdir / "zookeeper.properties")]

    def launch(self) -> None:
        self._prepare_workdir()
        data = self.workdir / "zk-data"
        data.mkdir(exist_ok=True)
        hand_to_user(data)
        write_readable(
            self.workdir / "zookeeper.properties",
            properties_text(
                {
                    "dataDir": data,
                    "clientPort": self.port,
                    "clientPortAddress": "127.0.0.1",
                    "maxClientCnxns": 0,
                    "admin.enableServer": "false",
                    "tickTime": 500,
                }
            ),
        )
        super().launch()

    @property
    def connect(self) -> str:
        return f"127.0.0.1:{self.port}"


class KafkaNode(JavaServer):
    """One Kafka server: ``mode="kraft"`` a combined broker+controller of a static quorum
    (``voters``: node id -> controller port), ``mode="zk"`` a broker of ``zookeeper``."""

    def __init__(
        self,
        release: Release,
        classpath: Sequence[Path],
        workdir: Path,
        log_dirs: Sequence[Path],
        *,
        mode: str = "kraft",
        node_id: int = 1,
        port: int | None = None,
        controller_port: int | None = None,
        voters: Mapping[int, int] | None = None,
        zookeeper: str | None = None,
        cluster_size: int = 1,
        settings: Mapping[str, str] | None = None,
        heap_mb: int = 320,
        sasl_users: Mapping[str, str] | None = None,
    ) -> None:
        if sasl_users is not None and ADMIN_USER not in sasl_users:
            raise ValueError(f"sasl_users needs {ADMIN_USER!r}: the brokers' own identity")
        if mode not in release.modes():
            raise ValueError(f"{release} has no {mode} mode (it has: {', '.join(release.modes())})")
        super().__init__(release, classpath, workdir, port or free_port(), heap_mb)
        self.mode = mode
        self.node_id = node_id
        self.log_dirs = tuple(log_dirs)
        self.controller_port = controller_port or (free_port() if mode == "kraft" else 0)
        self.voters = dict(voters or {node_id: self.controller_port})
        self.zookeeper = zookeeper
        self.cluster_size = cluster_size
        self.settings = dict(settings or {})
        #: Name -> password of every SASL/PLAIN account; None = PLAINTEXT listeners.
        self.sasl_users = dict(sasl_users) if sasl_users is not None else None
        self.started_line = (
            "Kafka Server started" if mode == "kraft" else f"[KafkaServer id={node_id}] started"
        )

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_dir(self) -> Path:
        return self.log_dirs[0]

    @property
    def initial_task_delay_s(self) -> float:
        """Seconds from start-up to the broker's first retention check."""
        if self.release.version >= (3, 8, 0) and _INITIAL_DELAY_KEY in self.settings:
            return int(self.settings[_INITIAL_DELAY_KEY]) / 1000
        return 30.0

    def properties(self) -> dict[str, object]:
        replicas = min(3, self.cluster_size)
        common: dict[str, object] = {
            "log.dirs": ",".join(map(str, self.log_dirs)),
            "num.partitions": 1,
            "default.replication.factor": 1,
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": 5,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": 1,
            "group.initial.rebalance.delay.ms": 0,
            "auto.create.topics.enable": "false",
        }
        # With SASL every listener (the controllers' too) is SASL_PLAINTEXT with PLAIN, so
        # the only super user is ``admin``: nobody gets in anonymously.
        proto = "PLAINTEXT" if self.sasl_users is None else "SASL_PLAINTEXT"
        client = "PLAINTEXT" if self.sasl_users is None else "SASL"
        if self.mode == "kraft":
            voters = ",".join(f"{n}@127.0.0.1:{p}" for n, p in sorted(self.voters.items()))
            common |= {
                "process.roles": "broker,controller",
                "node.id": self.node_id,
                "controller.quorum.voters": voters,
                "listeners": f"{client}://127.0.0.1:{self.port},"
                f"CONTROLLER://127.0.0.1:{self.controller_port}",
                "advertised.listeners": f"{client}://127.0.0.1:{self.port}",
                "controller.listener.names": "CONTROLLER",
                "inter.broker.listener.name": client,
                "listener.security.protocol.map": f"{client}:{proto},CONTROLLER:{proto}",
            }
            if self.sasl_users is not None:
                common |= sasl_listener_settings(self.sasl_users, ("sasl", "controller"))
                common["sasl.mechanism.controller.protocol"] = "PLAIN"
            if self.release.version >= (4, 0, 0):
                common |= {
                    "share.coordinator.state.topic.replication.factor": replicas,
                    "share.coordinator.state.topic.min.isr": 1,
                }
        else:
            common |= {
                "broker.id": self.node_id,
                "zookeeper.connect": self.zookeeper,
                "zookeeper.session.timeout.ms": int(_ZK_SESSION_S * 1000),
                "listeners": f"{client}://127.0.0.1:{self.port}",
                "advertised.listeners": f"{client}://127.0.0.1:{self.port}",
            }
            if self.sasl_users is not None:
                common |= sasl_listener_settings(self.sasl_users, ("sasl",))
                common |= {
                    "listener.security.protocol.map": f"{client}:{proto}",
                    "inter.broker.listener.name": client,
                }
        if self.sasl_users is not None and "authorizer.class.name" in self.settings:
            common["super.users"] = f"User:{ADMIN_USER}"
        return common | self.settings

    def main_class(self) -> str:
        return "kafka.Kafka"

    def arguments(self) -> list[str]:
        return [str(self.workdir / "server.properties")]

    def _formatted(self) -> bool:
        return (self.log_dirs[0] / "meta.properties").exists()

    def launch(self) -> None:
        self._prepare_workdir()
        for log_dir in self.log_dirs:
            log_dir.mkdir(parents=True, exist_ok=True)
            hand_to_user(log_dir)
        write_readable(self.workdir / "server.properties", properties_text(self.properties()))
        self.wait_session_expiry()
        if self.mode == "kraft" and not self._formatted():
            self.run_tool(
                "kafka.tools.StorageTool",
                "format",
                "-t",
                CLUSTER_ID,
                "-c",
                str(self.workdir / "server.properties"),
            )
        super().launch()

    def kill(self) -> None:
        super().kill()
        self.killed_at = time.monotonic()

    def wait_session_expiry(self) -> None:
        """After a kill -9, a ZooKeeper-mode broker cannot register again until its old
        session expired (``zookeeper.session.timeout.ms``): it would exit at start-up."""
        left = getattr(self, "killed_at", 0.0) + _ZK_SESSION_S + 1.5 - time.monotonic()
        if self.mode == "zk" and left > 0:
            time.sleep(left)

    def restart(self, timeout: float = 120) -> None:
        """Stop (cleanly if it runs) and start again on the same ports and log dirs."""
        self.stop()
        self.start(timeout)
