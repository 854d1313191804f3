"""The rescue, end to end, with a REAL Apache Kafka broker (the newest 4.x unless the
environment names another: ``support.kafka.target``).

A broker (run as nobody) fills its 160 MiB loop ext4 through ordinary produce requests until
it shuts itself down ("Shutdown broker because all log dirs in ... have failed"). Then
``diskguard enforce --once`` — auto mode, ``bootstrap_servers`` configured but the broker
down, ``.lock`` free — deletes offline, and the broker must start again, stay up, accept
writes and serve from the new log start offsets, with no ERROR in its log.

What was deleted is checked against the files themselves, independently of diskguard's
own parsers: only a prefix of closed segments of the delete-policy topic, globally oldest
first (by each segment's largest batch timestamp read from the ``.log``), never the active
segment, never ``__consumer_offsets``, never the compacted topic.
"""

from __future__ import annotations

import json
import re
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from support import fsfixtures
from support.cli import run_cli
from support.configs import write_config
from support.disks import df_percent
from support.kafka import Target
from support.kafka.broker import fast_retention
from support.kafka.cluster import KafkaCluster, running_broker

pytestmark = pytest.mark.realkafka

ORDERS = "rescue-orders"
COMPACT = "rescue-compact"
CEILING = 85.0


def batch_max_timestamps(log: Path) -> int:
    """The largest ``maxTimestamp`` of the RecordBatch v2 headers in a ``.log`` (-1 if none).

    Header: baseOffset i64, batchLength i32, leaderEpoch i32, magic i8, crc u32,
    attributes i16, lastOffsetDelta i32, firstTimestamp i64, maxTimestamp i64, ...
    """
    data = log.read_bytes()
    pos, best = 0, -1
    while pos + 61 <= len(data):
        length = struct.unpack_from(">i", data, pos + 8)[0]
        if length <= 0:
            break
        best = max(best, struct.unpack_from(">q", data, pos + 35)[0])
        pos += 12 + length
    return best


def files_of(pdir: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in pdir.iterdir() if p.is_file()}


def bases(pdir: Path) -> list[int]:
    return sorted(int(p.name[:-4]) for p in pdir.glob("*.log"))


@dataclass(frozen=True)
class Rescue:
    shutdown_logged: bool
    usage_full: float
    enforce_rc: int
    enforce_output: str
    usage_after: float
    #: partition dir -> {file: size} before and after the rescue.
    before: dict[str, dict[str, int]]
    after: dict[str, dict[str, int]]
    #: (partition, base offset) -> largest batch timestamp, for ORDERS before the rescue.
    timestamps: dict[tuple[int, int], int]
    alive_after_10s: bool
    write_errors: list[str]
    #: partition -> (low watermark, first offset read from there)
    reads: dict[int, tuple[int, int]]
    errors_in_log: list[str]


def fill_until_shutdown(broker: KafkaCluster, deadline_s: float = 180) -> None:
    """Produce 1 MB chunks until the broker has shut itself down (or fail)."""
    deadline = time.monotonic() + deadline_s
    settings = {"batch.size": 200_000, "message.timeout.ms": 8000, "linger.ms": 5}
    while broker.alive():
        assert time.monotonic() < deadline, "the broker did not shut down on a full disk"
        broker.produce(ORDERS, 1000, 1000, settings=settings)
    # It halts right after logging; give the JVM a moment to be reaped.
    for _ in range(100):
        if not broker.alive():
            break
        time.sleep(0.2)


@pytest.fixture(scope="module")
def rescue(kafka_target: Target, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rescue]:
    state = tmp_path_factory.mktemp("rescue-state")
    with (
        fsfixtures.loop_ext4(160 * fsfixtures.MiB, 0, name="rescue-disk") as mount,
        running_broker(
            kafka_target.release,
            kafka_target.classpath,
            mount / "kafka-logs",
            mode=kafka_target.mode,
            settings=fast_retention(kafka_target.release),
        ) as broker,
    ):
        log_dir = broker.log_dir
        # Oldest data first: a compacted topic the cleaner will not touch yet (so it is in no
        # cleaner-offset-checkpoint, as on a fresh broker), then a committing consumer group
        # (__consumer_offsets), then the delete-policy topic that fills the disk.
        broker.create_topic(
            COMPACT,
            **{
                "cleanup.policy": "compact",
                "segment.bytes": str(1 << 20),
                "min.compaction.lag.ms": "3600000",
            },
        )
        assert (
            broker.produce(
                COMPACT,
                3000,
                1000,
                settings={"batch.size": 200_000},
                key=lambda i: f"key-{i}".encode(),
            )
            == []
        )
        consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": "rescue-readers",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "log_level": 0,
            }
        )
        consumer.subscribe([COMPACT])
        got = 0
        until = time.monotonic() + 60
        while got < 100 and time.monotonic() < until:
            msg = consumer.poll(0.5)
            got += msg is not None and msg.error() is None
        consumer.commit(asynchronous=False)
        consumer.close()
        broker.create_topic(ORDERS, 2, **{"segment.bytes": str(2 << 20)})

        config = write_config(
            state,
            log_dir,
            broker={"bootstrap_servers": broker.bootstrap},
            state_dir=state,
            assume_delete_policy=None,
            disk_usage_percent=CEILING,
        )
        # As in production, diskguard ran beside the broker before the disk filled: one
        # broker-mode cycle learns every topic's cleanup.policy (DescribeConfigs) into the
        # state dir's cache, which is what lets the offline rescue tell delete from compact.
        learn = run_cli("enforce", "--once", "-c", str(config), timeout=120)
        assert learn.returncode == 0, learn.stdout + learn.stderr
        assert (state / "topic-policies.json").exists()

        fill_until_shutdown(broker)
        log_before = broker.log_text()
        usage_full = df_percent(mount)
        pdirs = sorted(p for p in log_dir.iterdir() if p.is_dir())
        before = {p.name: files_of(p) for p in pdirs}
        timestamps = {
            (part, base): batch_max_timestamps(log_dir / f"{ORDERS}-{part}" / f"{base:020d}.log")
            for part in (0, 1)
            for base in bases(log_dir / f"{ORDERS}-{part}")
        }

        proc = run_cli("enforce", "--once", "-c", str(config), timeout=120)
        usage_after = df_percent(mount)
        after = {p.name: files_of(p) for p in pdirs if p.is_dir()}

        broker.start()
        time.sleep(10)
        alive = broker.alive()
        write_errors = [
            str(e) for e in broker.produce(ORDERS, 10, 100, partition=0, settings={"acks": "all"})
        ]
        reads: dict[int, tuple[int, int]] = {}
        reader = Consumer(
            {"bootstrap.servers": broker.bootstrap, "group.id": "rescue-check", "log_level": 0}
        )
        try:
            for part in (0, 1):
                low, _high = reader.get_watermark_offsets(TopicPartition(ORDERS, part), timeout=10)
                reader.assign([TopicPartition(ORDERS, part, low)])
                first = -1
                until = time.monotonic() + 30
                while first < 0 and time.monotonic() < until:
                    msg = reader.poll(0.5)
                    if msg is not None and msg.error() is None:
                        first = msg.offset()
                reads[part] = (low, first)
        finally:
            reader.close()
        errors = [
            line
            for line in broker.log_since_start().splitlines()
            if re.match(r"^\[[^]]+\] ERROR ", line)
        ]
        yield Rescue(
            shutdown_logged="Shutdown broker because all log dirs in" in log_before,
            usage_full=usage_full,
            enforce_rc=proc.returncode,
            enforce_output=proc.stdout[-3000:] + proc.stderr[-3000:],
            usage_after=usage_after,
            before=before,
            after=after,
            timestamps=timestamps,
            alive_after_10s=alive,
            write_errors=write_errors,
            reads=reads,
            errors_in_log=errors,
        )


def test_rescue_after_the_broker_died_of_a_full_disk(rescue: Rescue) -> None:
    assert rescue.shutdown_logged, "the broker did not log its full-disk shutdown"
    assert rescue.usage_full > 99.0, rescue.usage_full
    assert rescue.enforce_rc == 0, rescue.enforce_output
    cycles = [
        json.loads(line)
        for line in rescue.enforce_output.splitlines()
        if line.startswith("{") and '"retention_cycle"' in line
    ]
    assert cycles and all(c["mode"] == "offline" for c in cycles), rescue.enforce_output
    assert rescue.usage_after <= CEILING, rescue.usage_after

    # Only a prefix of closed delete-policy segments went, never an active one.
    deleted: list[tuple[int, int]] = []
    kept_closed: list[tuple[int, int]] = []
    for part in (0, 1):
        name = f"{ORDERS}-{part}"
        was = sorted(int(f[:-4]) for f in rescue.before[name] if f.endswith(".log"))
        now = sorted(int(f[:-4]) for f in rescue.after[name] if f.endswith(".log"))
        assert now == was[len(was) - len(now) :], f"{name}: not a prefix: {was} -> {now}"
        assert now and now[-1] == was[-1], f"{name}: the active segment went"
        deleted += [(part, b) for b in was[: len(was) - len(now)]]
        kept_closed += [(part, b) for b in now[:-1]]
    assert deleted, "nothing was deleted"
    print(
        f"rescue: disk {rescue.usage_full:.1f}% -> {rescue.usage_after:.1f}%, deleted "
        f"{len(deleted)} of {len(deleted) + len(kept_closed) + 2} {ORDERS} segments"
    )
    # Globally oldest first: nothing kept (closed) is older than anything deleted.
    newest_deleted = max(rescue.timestamps[s] for s in deleted)
    oldest_kept = min((rescue.timestamps[s] for s in kept_closed), default=newest_deleted)
    assert newest_deleted <= oldest_kept, (deleted, kept_closed)

    # Internal topics untouched.
    for name, files in rescue.before.items():
        if name.startswith("__consumer_offsets-"):
            assert rescue.after[name] == files, name

    # The broker came back, stayed up, takes writes, serves from the new log start.
    assert rescue.alive_after_10s
    assert rescue.write_errors == []
    for part in (0, 1):
        first_kept = min(
            int(f[:-4]) for f in rescue.after[f"{ORDERS}-{part}"] if f.endswith(".log")
        )
        assert rescue.reads[part] == (first_kept, first_kept), (part, rescue.reads)
    assert rescue.errors_in_log == []


def test_rescue_keeps_the_compacted_topic(rescue: Rescue) -> None:
    for name, files in rescue.before.items():
        if name.startswith(f"{COMPACT}-"):
            print(f"{name}: {sorted(files)} -> {sorted(rescue.after[name])}")
            assert rescue.after[name] == files, json.dumps(
                {"before": files, "after": rescue.after[name]}
            )
