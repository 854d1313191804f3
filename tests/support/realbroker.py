"""A real Apache Kafka broker for tests, from a distribution named by ``DISKGUARD_KAFKA_HOME``.

Nothing of Kafka is in this repository: ``DISKGUARD_KAFKA_HOME`` names a distribution
directory (``bin/kafka-server-start.sh``, ``libs/``; tested with 2.2.0 on Java 17), and the
broker is started and stopped by the shared ``kafka-test-broker`` script (ZooKeeper mode,
loopback only). Without the variable the tests that need it are skipped and pytest's
terminal summary says so in one loud line (see the conftest block).

The broker runs as ``nobody`` on a loop-mounted ext4, as production brokers run as a
non-root user: run as root it would write into ext4's reserved blocks and a "full" disk
would not be full to it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ENV = "DISKGUARD_KAFKA_HOME"
#: The shared start/stop script (not part of this repository's package).
_SCRIPT = Path(
    os.environ.get("DISKGUARD_KAFKA_TEST_BROKER", "/work/shared/kafka/kafka-test-broker")
)
_USER = "nobody"
#: Ports of the session broker; the rescue test's own broker uses the next ones.
PORT, ZK_PORT = 29092, 22181

#: Short retention-check settings: DeleteRecords'd files go ~0.6 s after the broker's next
#: check (the first check still runs 30 s after start-up).
FAST_RETENTION = (
    "log.retention.check.interval.ms=1000",
    "log.segment.delete.delay.ms=500",
)
ACL_SETTINGS = (
    "authorizer.class.name=kafka.security.auth.SimpleAclAuthorizer",
    "allow.everyone.if.no.acl.found=true",
)


def kafka_home() -> Path | None:
    """The distribution dir from the environment, or None (tests are then skipped)."""
    value = os.environ.get(ENV, "").strip()
    return Path(value) if value else None


class BrokerSetupError(RuntimeError):
    """The broker could not be started (the message has the end of its log)."""


class RealBroker:
    """One broker (plus its ZooKeeper) in ``workdir``, with ``log_dir`` as its only log dir."""

    def __init__(
        self,
        dist: Path,
        workdir: Path,
        log_dir: Path,
        port: int = PORT,
        zk_port: int = ZK_PORT,
        settings: Sequence[str] = FAST_RETENTION,
    ) -> None:
        self.dist = dist
        self.workdir = workdir
        self.log_dir = log_dir
        self.port = port
        self.zk_port = zk_port
        self.settings = tuple(settings)
        self.started_at = 0.0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def kafka_out(self) -> Path:
        return self.workdir / "logs" / "kafka.out"

    def _script(self, *args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
        if not _SCRIPT.is_file():
            raise BrokerSetupError(f"{_SCRIPT} not found (set DISKGUARD_KAFKA_TEST_BROKER)")
        return subprocess.run(
            [str(_SCRIPT), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "KAFKA_DIST": str(self.dist)},
        )

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        uid = pwd.getpwnam(_USER).pw_uid
        os.chown(self.log_dir, uid, -1)
        result = self._script(
            "start",
            str(self.workdir),
            "--port",
            str(self.port),
            "--zk-port",
            str(self.zk_port),
            "--log-dirs",
            str(self.log_dir),
            "--user",
            _USER,
            *self.settings,
        )
        if result.returncode != 0 or f"bootstrap {self.bootstrap}" not in result.stdout:
            raise BrokerSetupError(
                f"kafka-test-broker start exited {result.returncode}: "
                f"{(result.stderr or result.stdout).strip()[-3000:]}"
            )
        self.started_at = time.monotonic()

    def stop(self) -> None:
        self._script("stop", str(self.workdir))

    def kill(self) -> None:
        """kill -9 of the broker only (ZooKeeper stays up)."""
        self._script("kill", str(self.workdir))

    def pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            for line in (self.workdir / "pids").read_text().splitlines():
                kind, _, pid = line.partition(" ")
                if kind == "kafka":
                    return int(pid)
        return None

    def alive(self) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        with contextlib.suppress(OSError):
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            return state != "Z"
        return False

    def log_text(self) -> str:
        try:
            return self.kafka_out.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_retention_check(self) -> None:
        """Sleep until the broker's first retention check has run (30 s after start-up)."""
        left = self.started_at + 31.0 - time.monotonic()
        if left > 0:
            time.sleep(left)

    # -- clients ------------------------------------------------------------------------
    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})

    def create_topic(self, topic: str, partitions: int = 1, **config: str) -> None:
        from confluent_kafka.admin import NewTopic

        admin = self.admin()  # kept referenced until the futures resolve
        futures = admin.create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=1, config=config)],
            request_timeout=30,
        )
        for future in futures.values():
            future.result(30)

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
                "bootstrap.servers": self.bootstrap,
                "linger.ms": 5,
                "message.timeout.ms": 20_000,
                "log_level": 0,
                **(settings or {}),
            }
        )
        errors: list[Any] = []

        def report(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(err)

        value = b"v" * size
        for i in range(count):
            extra: dict[str, Any] = {} if partition is None else {"partition": partition}
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


def _reachable_by_broker_user(path: Path) -> None:
    """Make every directory above ``path`` traversable: pytest's and fsfixtures' temp dirs
    are 0700 root, and the broker runs as nobody."""
    for parent in [path, *path.parents]:
        if parent == Path("/"):
            break
        mode = parent.stat().st_mode
        if mode & 0o001 == 0:
            os.chmod(parent, (mode & 0o7777) | 0o011)


@contextlib.contextmanager
def running_broker(
    dist: Path,
    log_dir: Path,
    port: int = PORT,
    zk_port: int = ZK_PORT,
    settings: Sequence[str] = FAST_RETENTION,
) -> Iterator[RealBroker]:
    """A started broker (work dir: a fresh temp dir), stopped — then killed if need be —
    when the block ends."""
    workdir = Path(tempfile.mkdtemp(prefix="diskguard-kafka-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    _reachable_by_broker_user(workdir)
    _reachable_by_broker_user(log_dir)
    broker = RealBroker(dist, workdir, log_dir, port, zk_port, settings)
    try:
        broker.start()
        yield broker
    finally:
        try:
            broker.stop()
        finally:
            if broker.alive():
                broker.kill()
                broker.stop()  # ZooKeeper
            shutil.rmtree(workdir, ignore_errors=True)
