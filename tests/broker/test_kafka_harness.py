"""The project's own real Kafka (``support.kafka``): resolved from Maven Central once, run as
nobody, stopped, killed -9 and started again with its data; and a clear line when it cannot
be had. Everything else that says "real broker" stands on this."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from support import fsfixtures
from support.kafka import Target
from support.kafka.classpath import KafkaResolutionError, Release, classpath, parse_release
from support.kafka.cluster import KafkaCluster, running_broker

pytestmark = pytest.mark.realkafka


def uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


def read_all(broker: KafkaCluster, topic: str, expected: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "h", "log_level": 0})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(values) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
        return values
    finally:
        consumer.close()


@pytest.fixture()
def own_broker(kafka_target: Target) -> Iterator[KafkaCluster]:
    with (
        fsfixtures.loop_ext4(64 * fsfixtures.MiB, 0, name="harness-disk") as mount,
        running_broker(
            kafka_target.release,
            kafka_target.classpath,
            mount / "kafka-logs",
            mode=kafka_target.mode,
        ) as broker,
    ):
        yield broker


def test_a_broker_as_nobody_survives_kill_9_and_a_clean_stop(own_broker: KafkaCluster) -> None:
    broker = own_broker
    pid = broker.pid()
    assert pid is not None and uid_of(pid) == 65534  # nobody: no ext4 root reserve for it
    assert (broker.log_dir / ".lock").stat().st_uid == 65534
    broker.create_topic("h-orders")
    assert broker.produce("h-orders", 300, 100, settings={"acks": "all"}) == []

    broker.kill()  # no shutdown: the next start recovers the log
    assert not broker.alive()
    broker.start()
    assert broker.pid() != pid and broker.alive()
    assert broker.produce("h-orders", 10, 100, settings={"acks": "all"}) == []
    assert len(read_all(broker, "h-orders", 310)) == 310

    broker.stop()
    assert not broker.alive()
    if broker.release.version >= (3, 0, 0):
        # 3.x/4.x remove the lock file at a clean shutdown; diskguard's offline hold must
        # leave the dir the same way (tests/kafkalog/test_lockfile.py).
        assert not (broker.log_dir / ".lock").exists()


def test_the_second_resolution_needs_neither_maven_nor_the_network(
    kafka_target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.environ.get("DISKGUARD_KAFKA_HOME"):
        pytest.skip("DISKGUARD_KAFKA_HOME: a distribution dir, not resolved with Maven")
    monkeypatch.setenv("PATH", "/nonexistent")  # no mvn, no java: only the cache can answer
    assert classpath(kafka_target.release) == kafka_target.classpath
    assert all(os.stat(jar).st_mode & 0o004 for jar in kafka_target.classpath)


def test_a_release_that_cannot_be_had_fails_with_one_line() -> None:
    with pytest.raises(KafkaResolutionError, match=r"not a Kafka release") as bad:
        parse_release("4.x")
    assert "\n" not in str(bad.value)
    with pytest.raises(KafkaResolutionError) as missing:
        classpath(Release((4, 99, 0)))
    text = str(missing.value)
    assert "\n" not in text and "org.apache.kafka:kafka_2.13:4.99.0" in text, text


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _waits_for_flock(path: Path) -> bool:
    """Whether some process is blocked in flock() on ``path`` (a ``->`` line of /proc/locks
    names the inode it waits for)."""
    if not path.exists():  # no lock file: nothing can wait on it
        return False
    inode = f":{path.stat().st_ino} "
    return any(
        "->" in line and " FLOCK " in line and inode in line
        for line in Path("/proc/locks").read_text().splitlines()
    )


def test_runs_that_all_miss_the_cache_resolve_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parallel test workers all start with an empty cache on a fresh machine: one runs mvn,
    the others wait for it and take its classpath, so nothing runs two Mavens into one
    ``~/.m2`` or links the same jars twice. (A stand-in mvn: it waits to be let go.)"""
    work = Path(tempfile.mkdtemp(prefix="diskguard-resolve-"))
    try:
        calls, gate, jar = work / "calls", work / "gate", work / "m2" / "kafka_2.13-4.98.0.jar"
        jar.parent.mkdir()
        jar.write_bytes(b"PK")
        mvn = work / "bin" / "mvn"
        mvn.parent.mkdir()
        mvn.write_text(
            "#!/bin/sh\n"
            f"echo run >> {calls}\n"
            f"for _ in $(seq 1200); do [ -e {gate} ] && break; sleep 0.05; done\n"
            'for arg; do case "$arg" in -Dmdep.outputFile=*) '
            f'printf %s {jar} > "${{arg#*=}}";; esac; done\n'
        )
        mvn.chmod(0o755)
        monkeypatch.setenv("PATH", f"{mvn.parent}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("DISKGUARD_KAFKA_CACHE", str(work / "cache"))
        release = Release((4, 98, 0))
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(classpath, release)
            _until(calls.exists, "the first resolution never ran mvn")
            second = pool.submit(classpath, release)
            try:
                # The second waits on the lock; without one it would run a second mvn.
                _until(
                    lambda: (
                        _waits_for_flock(work / "cache" / ".resolve.lock")
                        or calls.read_text().count("run") > 1
                    ),
                    "the second resolution neither waited nor ran mvn",
                )
            finally:
                gate.touch()  # never leave a stand-in mvn (and this test) waiting
            assert first.result(timeout=60) == second.result(timeout=60)
        assert calls.read_text().count("run") == 1
        assert [p.name for p in first.result()] == [jar.name]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_the_runner_starts_and_stops_a_broker_for_bench_and_the_demo(
    kafka_target: Target,
) -> None:
    """``python -m support.kafka start ROOT`` prints the bootstrap address and leaves the
    broker running; ``stop ROOT`` (another process) ends it."""
    root = Path(tempfile.mkdtemp(prefix="diskguard-runner-"))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    release = str(kafka_target.release)
    try:
        start = subprocess.run(
            [
                sys.executable,
                "-m",
                "support.kafka",
                "start",
                str(root),
                "--release",
                release,
                "--mode",
                kafka_target.mode,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=240,
        )
        assert start.returncode == 0, start.stderr[-2000:]
        assert start.stdout.startswith("bootstrap 127.0.0.1:")
        cluster = KafkaCluster.load(root)
        assert cluster.node.alive()
        stop = subprocess.run(
            [sys.executable, "-m", "support.kafka", "stop", str(root)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert stop.returncode == 0, stop.stderr
        assert not cluster.node.alive()
    finally:
        if (root / "cluster.json").exists():
            KafkaCluster.load(root).stop()
        shutil.rmtree(root, ignore_errors=True)
