"""diskguard's broker edge against the stand-in Kafka broker (``tests/support/standin``), on tmpfs.

The stand-in behaves like a real Kafka broker's log manager as measured
(``/work/shared/kafka/README.md``): DeleteRecords moves the log start offset at once, the
files are renamed ``*.deleted`` at the next retention check and unlinked after the topic's
``file.delete.delay.ms``; only then does ``statvfs`` show the space free. These tests drive it
through diskguard's own ``BrokerClient`` (confluent-kafka / librdkafka), so the whole closed
loop runs in CI without Kafka. Waits are bounded polls, never timing assertions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_INVALID, Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from diskguard.broker.client import BrokerClient
from diskguard.kafkalog.lockfile import held_by_other
from diskguard.kafkalog.model import segment_file_name
from diskguard.retention.planner import Deletion
from support import standin

MiB = 1024 * 1024
SEGMENT = 64 * 1024
FAST_DELAY_MS = 200  # log.segment.delete.delay.ms (topic "fast" inherits it)


@pytest.fixture()
def disk(tmpfs: Callable[[int], Path]) -> Path:
    return tmpfs(64 * MiB)


@pytest.fixture()
def broker(disk: Path, tmp_path: Path) -> Iterator[standin.Standin]:
    """Retention task effectively off (first check in 10 min, like Kafka's 30 s initial
    delay but out of the test's way): each test triggers or waits for what it needs."""
    handle = standin.start(
        tmp_path / "broker",
        log_dirs=[disk / "kafka"],
        topics={
            "fast": {
                "partitions": 2,
                "configs": {"segment.bytes": SEGMENT},
                "prefill_bytes": 400_000,
            },
            "slow": {
                "partitions": 1,
                "configs": {"segment.bytes": SEGMENT, "file.delete.delay.ms": 600_000},
                "prefill_bytes": 300_000,
            },
            "compacted": {
                "partitions": 1,
                "configs": {"segment.bytes": SEGMENT, "cleanup.policy": "compact"},
                "prefill_bytes": 200_000,
            },
        },
        groups={"readers": [("fast", 0, 40)]},
        initial_delay_ms=600_000,
        check_interval_ms=600_000,
        delete_delay_ms=FAST_DELAY_MS,
    )
    with handle:
        yield handle


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def segment_files(partition_dir: Path, base: int) -> list[Path]:
    return sorted(partition_dir.glob(segment_file_name(base, ".*")))


def allocated(paths: list[Path]) -> int:
    return sum(p.stat().st_blocks * 512 for p in paths)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def deletion_for(log_dir: Path, part: dict[str, Any], upto_index: int) -> list[Deletion]:
    """Deletions for the closed segments ``[0, upto_index]`` of a partition, as the planner
    would make them (``next_offset`` = the next segment's base)."""
    return [
        Deletion(
            log_dir=str(log_dir),
            topic=part["topic"],
            partition=part["partition"],
            base_offset=base,
            next_offset=end,
            max_timestamp_ms=0,
            bytes=SEGMENT,
            files=(),
            mount=str(log_dir.parent),
        )
        for base, end in list(zip(part["segments"], part["segment_ends"], strict=True))[
            : upto_index + 1
        ]
    ]


def test_delete_records_frees_space_only_after_retention_check_and_delete_delay(
    broker: standin.Standin, disk: Path
) -> None:
    log_dir = disk / "kafka"
    client = BrokerClient(broker.bootstrap, timeout=5)
    assert client.reachable()
    fast0, slow0 = broker.partition("fast", 0), broker.partition("slow", 0)
    assert len(fast0["segments"]) >= 3 and len(slow0["segments"]) >= 3
    fast_dir, slow_dir = log_dir / "fast-0", log_dir / "slow-0"
    fast_gone = [f for b in fast0["segments"][:2] for f in segment_files(fast_dir, b)]
    slow_gone = [f for b in slow0["segments"][:2] for f in segment_files(slow_dir, b)]
    fast_bytes = allocated(fast_gone)
    assert fast_bytes >= 2 * SEGMENT * 0.9
    free_before = free_bytes(disk)

    deletions = deletion_for(log_dir, fast0, 1) + deletion_for(log_dir, slow0, 1)
    results = client.delete_records(deletions)
    assert [r.ok for r in results] == [True] * 4, [r.error for r in results]

    # The log start offset moved at once; nothing on disk changed, nothing is free.
    assert broker.partition("fast", 0)["log_start_offset"] == fast0["segment_ends"][1]
    assert broker.partition("slow", 0)["log_start_offset"] == slow0["segment_ends"][1]
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "probe"})
    try:
        low, _ = consumer.get_watermark_offsets(TopicPartition("fast", 0), timeout=5)
    finally:
        consumer.close()
    assert low == fast0["segment_ends"][1]
    assert all(f.exists() for f in fast_gone + slow_gone)
    assert free_bytes(disk) < free_before + fast_bytes // 2
    assert broker.state()["retention_checks"] == 0

    # The retention check renames them *.deleted; the fds stay open, space stays used.
    state = broker.control("retention_check")
    assert not any(f.exists() for f in fast_gone + slow_gone)
    slow_pending = [Path(f"{f}.deleted") for f in slow_gone]
    assert all(f.exists() for f in slow_pending)
    assert {str(f) for f in slow_pending} <= set(state["pending_delete"])
    # Then, file.delete.delay.ms later, the "fast" files are closed and unlinked: free now.
    wait_for(
        lambda: not any(Path(f"{f}.deleted").exists() for f in fast_gone), "fast files unlinked"
    )
    assert free_bytes(disk) >= free_before + fast_bytes - 64 * 1024
    # "slow" (file.delete.delay.ms = 10 min) still holds its *.deleted files.
    assert all(f.exists() for f in slow_pending)
    # The partitions go on from the new log start; later segments untouched.
    assert broker.partition("fast", 0)["segments"] == fast0["segments"][2:]


def test_retention_task_runs_on_its_own_schedule(disk: Path, tmp_path: Path) -> None:
    """The first check after ``initial_delay_ms``, then every ``check_interval_ms``: the
    files go without anyone asking the broker for more than DeleteRecords."""
    log_dir = disk / "kafka"
    with standin.start(
        tmp_path / "b",
        log_dirs=[log_dir],
        topics={
            "t": {"partitions": 1, "configs": {"segment.bytes": SEGMENT}, "prefill_bytes": 300_000}
        },
        initial_delay_ms=300,
        check_interval_ms=200,
        delete_delay_ms=100,
        checkpoint_interval_ms=100,
    ) as broker:
        part = broker.partition("t", 0)
        gone = segment_files(log_dir / "t-0", part["segments"][0])
        results = BrokerClient(broker.bootstrap).delete_records(deletion_for(log_dir, part, 0))
        assert results[0].ok, results[0].error
        wait_for(lambda: not any(f.exists() for f in gone), "segment renamed")
        wait_for(lambda: not list((log_dir / "t-0").glob("*.deleted")), "segment unlinked")
        assert broker.state()["retention_checks"] >= 1
        # Kafka checkpoints only log start offsets above the first segment's base: once the
        # segment is gone the log start is that base again, and the entry is left out.
        recovery = log_dir / "recovery-point-offset-checkpoint"
        wait_for(
            lambda: recovery.read_text() == f"0\n1\nt 0 {part['high_watermark']}\n",
            "recovery point checkpointed",
        )
        assert (log_dir / "log-start-offset-checkpoint").read_text() == "0\n0\n"


def test_delete_records_errors_surface_as_failed_results(broker: standin.Standin) -> None:
    client = BrokerClient(broker.bootstrap, timeout=5)
    log_dir = Path(broker.partition("fast", 0)["log_dir"])
    compacted = deletion_for(log_dir, broker.partition("compacted", 0), 0)
    fast1 = broker.partition("fast", 1)
    beyond = deletion_for(log_dir, fast1, 0)[0]
    beyond = dataclasses.replace(beyond, next_offset=fast1["high_watermark"] + 1)

    results = client.delete_records([*compacted, beyond])

    assert [(r.deletion.topic, r.ok) for r in results] == [("compacted", False), ("fast", False)]
    assert results[0].error is not None and results[0].error.startswith("POLICY_VIOLATION")
    assert results[1].error is not None and results[1].error.startswith("OFFSET_OUT_OF_RANGE")
    assert broker.partition("compacted", 0)["log_start_offset"] == 0
    assert broker.partition("fast", 1)["log_start_offset"] == 0


def test_committed_offsets_per_group(broker: standin.Standin) -> None:
    broker.commit("loader", [("slow", 0, 3)])
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "real", "enable.auto.commit": False}
    )
    try:  # a real OffsetCommit, as an assign()-style consumer sends it
        consumer.commit(offsets=[TopicPartition("fast", 1, 9)], asynchronous=False)
    finally:
        consumer.close()

    offsets = BrokerClient(broker.bootstrap, timeout=5).committed_offsets(["fast", "slow"])

    # OffsetFetch for all of a group's offsets (what BrokerClient asks) lists only what the
    # group committed, as Kafka does.
    assert offsets == {
        ("fast", 0): {"readers": 40},
        ("fast", 1): {"real": 9},
        ("slow", 0): {"loader": 3},
    }
    # Asked for named partitions, a partition the group never committed answers -1
    # (librdkafka's OFFSET_INVALID, -1001).
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    request = ConsumerGroupTopicPartitions(
        "readers", [TopicPartition("fast", 0), TopicPartition("fast", 1)]
    )
    answer = admin.list_consumer_group_offsets([request])["readers"].result(timeout=10)
    assert [(tp.partition, tp.offset) for tp in answer.topic_partitions] == [
        (0, 40),
        (1, OFFSET_INVALID),
    ]


def test_describe_configs_topic_and_broker(broker: standin.Standin, disk: Path) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.describe_configs(
        [
            ConfigResource(ResourceType.TOPIC, "compacted"),
            ConfigResource(ResourceType.BROKER, "0"),
        ],
        request_timeout=5,
    )
    topic, brokerconf = (
        {k: e.value for k, e in f.result(timeout=10).items()} for f in futures.values()
    )
    assert topic["cleanup.policy"] == "compact"
    assert topic["segment.bytes"] == str(SEGMENT)
    assert topic["retention.ms"] == "604800000"
    assert topic["remote.storage.enable"] == "false"
    assert topic["file.delete.delay.ms"] == str(FAST_DELAY_MS)
    assert brokerconf["log.retention.check.interval.ms"] == "600000"
    assert brokerconf["log.segment.delete.delay.ms"] == str(FAST_DELAY_MS)
    assert brokerconf["log.dirs"] == str(disk / "kafka")

    policies = BrokerClient(broker.bootstrap).describe_topic_configs(["fast", "compacted", "nope"])
    assert policies == {
        "fast": {"cleanup.policy": "delete", "remote.storage.enable": "false"},
        "compacted": {"cleanup.policy": "compact", "remote.storage.enable": "false"},
    }


def test_writes_roll_segments_and_keep_every_file_open(broker: standin.Standin, disk: Path) -> None:
    log_dir = disk / "kafka"
    before = broker.partition("fast", 0)
    broker.set_rate(2 * MiB)
    wait_for(
        lambda: len(broker.partition("fast", 0)["segments"]) >= len(before["segments"]) + 2,
        "the producer thread to roll segments",
    )
    broker.set_rate(0)
    after = broker.partition("fast", 0)
    assert after["high_watermark"] > before["high_watermark"]
    # The active segment's indexes are preallocated sparse; closed ones are trimmed.
    active_index = log_dir / "fast-0" / segment_file_name(after["active_base"], ".index")
    assert active_index.stat().st_size == 10 * MiB
    closed_index = log_dir / "fast-0" / segment_file_name(after["segments"][-1], ".index")
    assert closed_index.stat().st_size < 10 * MiB

    open_files = set()
    for fd in Path(f"/proc/{broker.pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):  # an fd closed while we list them
            open_files.add(os.readlink(fd))
    for base in after["segments"]:
        for suffix in (".log", ".index", ".timeindex"):
            assert str(log_dir / "fast-0" / segment_file_name(base, suffix)) in open_files
    # So unlinking a segment under the running broker frees nothing.
    victim = log_dir / "fast-0" / segment_file_name(after["segments"][0], ".log")
    size = allocated([victim])
    free_before = free_bytes(disk)
    victim.unlink()
    assert free_bytes(disk) < free_before + size // 2


def test_lock_meta_checkpoints_stop_kill_and_restart(disk: Path, tmp_path: Path) -> None:
    log_dirs = [disk / "a", disk / "b"]
    topics = {
        "t": {"partitions": 2, "configs": {"segment.bytes": SEGMENT}, "prefill_bytes": 200_000}
    }
    broker = standin.start(tmp_path / "1", log_dirs=log_dirs, topics=topics)
    try:
        assert all(held_by_other(d) for d in log_dirs)
        for d in log_dirs:
            assert (d / "meta.properties").read_text() == "version=0\nbroker.id=0\n"
            assert (d / "cleaner-offset-checkpoint").stat().st_size == 0
        assert (disk / "a" / "t-0").is_dir() and (disk / "b" / "t-1").is_dir()
        # A second broker on the same log dirs is refused, as Kafka's FileLock refuses it.
        with pytest.raises(standin.StandinError, match="Failed to acquire lock"):
            standin.start(tmp_path / "2", log_dirs=log_dirs, topics=topics)
        part = broker.partition("t", 0)
        assert (
            BrokerClient(broker.bootstrap).delete_records(deletion_for(disk / "a", part, 0))[0].ok
        )
        assert broker.stop() == 0
    finally:
        broker.kill()
    assert not any(held_by_other(d) for d in log_dirs)
    for d in log_dirs:
        assert (d / ".kafka_cleanshutdown").exists()
    assert (disk / "a" / "log-start-offset-checkpoint").read_text() == (
        f"0\n1\nt 0 {part['segment_ends'][0]}\n"
    )
    assert (disk / "b" / "replication-offset-checkpoint").read_text().startswith("0\n1\nt 1 ")
    # The clean stop trimmed the active segment's preallocated index.
    active_index = disk / "a" / "t-0" / segment_file_name(part["active_base"], ".index")
    assert active_index.stat().st_size < 10 * MiB

    # Restart: reloads the partitions and the checkpointed log start offset; kill -9 then
    # leaves the lock to the kernel.
    again = standin.start(tmp_path / "3", log_dirs=log_dirs, topics=topics)
    try:
        assert not (disk / "a" / ".kafka_cleanshutdown").exists()
        reloaded = again.partition("t", 0)
        assert reloaded["log_start_offset"] == part["segment_ends"][0]
        assert reloaded["high_watermark"] == part["high_watermark"]
        assert held_by_other(disk / "a")
        again.kill()
    finally:
        again.kill()
    assert not any(held_by_other(d) for d in log_dirs)


def test_api_versions_newer_than_supported_gets_unsupported_version_in_v0(
    broker: standin.Standin,
) -> None:
    """Kafka answers an ApiVersions request version it does not know with error 35 in the
    v0 format plus its own range, so a client can retry with a version it supports."""
    host, port = broker.bootstrap.split(":")
    client_id = b"probe"
    body = struct.pack(">hhih", 18, 99, 7, len(client_id)) + client_id + b"\x00" * 4
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", sock.recv(4))[0]
        data = b""
        while len(data) < size:
            data += sock.recv(size - len(data))
    correlation_id, error_code, count = struct.unpack_from(">ihi", data)
    entries = [struct.unpack_from(">hhh", data, 10 + 6 * i) for i in range(count)]
    assert (correlation_id, error_code) == (7, 35)
    assert (18, 0, 3) in entries
