"""When a REAL Kafka broker frees what DeleteRecords asked for (``support.kafka.target``).

DeleteRecords moves the log start offset at once; the files go only at a retention check,
and the first one after a start-up runs ``log.initial.task.delay.ms`` after it (Kafka 3.8+),
a fixed 30 s before 3.8. diskguard's reclaim forecast and ``check-config --connect`` rest on
exactly this, so it is measured, not assumed: one broker with a one-hour check interval (no
periodic check can run during the test), DeleteRecords, a clean stop (nothing freed), a
restart, and the broker's own log says when the first check ran and what it deleted.

Only lower bounds are asserted exactly (a scheduler can run late, never early); the upper
bound that tells 3.8's setting from the old fixed 30 s has a margin of ~25 s.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from diskguard.broker.client import BrokerClient
from diskguard.retention.planner import Deletion
from support import fsfixtures
from support.cli import run_cli
from support.configs import write_config
from support.kafka import Target
from support.kafka.cluster import KafkaCluster, running_broker

pytestmark = pytest.mark.realkafka

TOPIC = "timing-orders"
HOUR_MS = "3600000"
#: log.initial.task.delay.ms of the restart (3.8+): well under the old fixed 30 s.
FIRST_CHECK_MS = 2000
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] INFO (.*)$")


def _when(log: str, pattern: str) -> datetime | None:
    """The time of the broker's first INFO line matching ``pattern`` (its own clock)."""
    for line in log.splitlines():
        match = _STAMP.match(line)
        if match and re.search(pattern, match[2]):
            return datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f")
    return None


def _segment_files(pdir: Path, base: int) -> list[Path]:
    return [
        p
        for p in pdir.glob(f"{base:020d}.*")
        if p.suffix in (".log", ".index", ".timeindex", ".txnindex")
    ]


@pytest.fixture(scope="module")
def broker(kafka_target: Target) -> Iterator[KafkaCluster]:
    release = kafka_target.release
    settings = {"log.retention.check.interval.ms": HOUR_MS, "log.segment.delete.delay.ms": "500"}
    if release.version >= (3, 8, 0):
        settings["log.initial.task.delay.ms"] = HOUR_MS  # no check at all in the first run
    with (
        fsfixtures.loop_ext4(64 * fsfixtures.MiB, 0, name="timing-disk") as mount,
        running_broker(
            release,
            kafka_target.classpath,
            mount / "kafka-logs",
            mode=kafka_target.mode,
            settings=settings,
        ) as cluster,
    ):
        yield cluster


def test_delete_records_frees_at_the_first_retention_check_after_start(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    release = broker.release
    broker.create_topic(TOPIC, **broker.segment_config(20_000))
    settings = {"batch.size": 8_000, "linger.ms": 0}
    assert broker.produce(TOPIC, 200, 500, settings=settings) == []
    pdir = broker.log_dir / f"{TOPIC}-0"
    bases = sorted(int(p.name[:-4]) for p in pdir.glob("*.log"))
    assert len(bases) >= 4, bases
    doomed = [f for base in bases[:2] for f in _segment_files(pdir, base)]
    chosen = [
        Deletion(
            log_dir=str(broker.log_dir),
            topic=TOPIC,
            partition=0,
            base_offset=bases[i],
            next_offset=bases[i + 1],
            max_timestamp_ms=0,
            bytes=0,
            files=(),
            mount=str(broker.log_dir.parent),
        )
        for i in (0, 1)
    ]

    (first, second) = BrokerClient(broker.bootstrap, timeout=10).delete_records(chosen)

    assert first.ok and second.ok, (first.error, second.error)
    # The log start moved at once (ListOffsets answers the new one) ...
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "t", "log_level": 0})
    low, _high = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10)
    consumer.close()
    assert low == bases[2]
    # ... and nothing is freed while no retention check runs (3.8+: none in this run; before
    # 3.8 the fixed first check comes 30 s after start-up, long after this).
    broker.stop()
    assert all(f.exists() for f in doomed), (
        "the segments went before the restart: the first run outlived its first retention check"
    )

    # Restart: the first check runs log.initial.task.delay.ms after start-up (3.8+).
    if release.version >= (3, 8, 0):
        broker.node.settings["log.initial.task.delay.ms"] = str(FIRST_CHECK_MS)
    broker.start()
    deadline = time.monotonic() + 90
    while any(f.exists() for f in doomed):
        assert time.monotonic() < deadline, "the restarted broker did not free the segments"
        time.sleep(0.2)
    log = broker.log_since_start()
    started = _when(log, rf"Starting log cleanup with a period of {HOUR_MS} ms")
    deleting = _when(log, r"Deleting segments due to log start offset \d+ breach")
    assert started is not None and deleting is not None, log[-3000:]
    first_check_s = (deleting - started).total_seconds()
    print(f"{release.text}: first retention check {first_check_s:.1f} s after start-up")
    if release.version >= (3, 8, 0):
        assert FIRST_CHECK_MS / 1000 <= first_check_s < 27, first_check_s
    else:
        assert 30 <= first_check_s < 60, first_check_s
    assert sorted(int(p.name[:-4]) for p in pdir.glob("*.log"))[0] == bases[2]

    # check-config --connect says the same, from the broker's own DescribeConfigs answer.
    config = write_config(tmp_path, broker.log_dir, broker={"bootstrap_servers": broker.bootstrap})
    proc = run_cli("check-config", "--connect", "-c", str(config), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert any(
        line.startswith(
            "ok: broker reclaim latency: retention check every 3600 s + delete delay 0.5 s"
        )
        for line in lines
    ), lines
    first_line = (
        f"ok: first retention check {FIRST_CHECK_MS / 1000:g} s after the broker starts "
        "(log.initial.task.delay.ms): right after a broker start, space asked is freed after "
        f"up to {FIRST_CHECK_MS / 1000 + 0.5:g} s"
        if release.version >= (3, 8, 0)
        else "ok: first retention check 30 s after the broker starts (fixed before Kafka 3.8)"
    )
    assert any(line.startswith(first_line) for line in lines), lines
