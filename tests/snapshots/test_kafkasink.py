"""The Kafka sink against a REAL Kafka-protocol broker (tansu): outages lose nothing.

tansu notes (checked against tansu 0.6.0): it auto-creates a topic on first produce, but the
tests create theirs explicitly so the partition count is known; consumer-group subscribe
does not work, so reads use ``assign()``; its ListOffsets high watermark is the last
*batch's* base offset + 1, so reads go on until every expected record was seen rather than
stopping at the watermark.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from structlog.testing import capture_logs

from diskguard.kafkalog.model import Filesystem, FilesystemUsage, LogDir
from diskguard.snapshots.kafkasink import KafkaSink
from diskguard.snapshots.record import build_snapshot
from diskguard.snapshots.spool import Spool
from support.net import free_port
from support.tansu import tansu_broker

TOPIC = "diskguard-snapshots"
#: Short timeouts so that an outage turns into failed deliveries within the test.
CLIENT = {"message.timeout.ms": 2500, "reconnect.backoff.max.ms": 300, "linger.ms": 5}


def _create_topic(bootstrap: str, partitions: int = 3) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    future = admin.create_topics(
        [NewTopic(TOPIC, num_partitions=partitions, replication_factor=1)]
    )[TOPIC]
    try:
        future.result(10)
    except Exception as exc:  # the sink's producer may have auto-created it first
        error = exc.args[0] if exc.args else None
        if not (isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS):
            raise


def _read_all(bootstrap: str, expected: int, timeout: float = 20.0) -> list[dict[str, Any]]:
    """Every record in the topic (duplicates included), per partition in offset order."""
    import json

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "diskguard-test", "enable.auto.commit": False}
    )
    try:
        metadata = consumer.list_topics(TOPIC, timeout=10)
        partitions = sorted(metadata.topics[TOPIC].partitions)
        assignment = []
        for p in partitions:
            low, _high = consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)
            assignment.append(TopicPartition(TOPIC, p, low))
        consumer.assign(assignment)
        out: list[dict[str, Any]] = []
        keys: set[tuple[str, str, int]] = set()
        deadline = time.monotonic() + timeout
        quiet_since: float | None = None
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                # Stop once everything expected is in and nothing more arrives for a moment.
                if len(keys) >= expected:
                    quiet_since = quiet_since or time.monotonic()
                    if time.monotonic() - quiet_since > 0.5:
                        break
                continue
            quiet_since = None
            if msg.error():
                continue
            record = json.loads(msg.value())
            assert msg.key() == record["host"].encode()
            out.append(record)
            keys.add((record["host"], record["mount"], record["ts_ms"]))
        return out
    finally:
        consumer.close()


FS = Filesystem(
    usage=FilesystemUsage("/data", "/dev/vdb", 10_000, 4_000, 6_000),
    log_dirs=(LogDir(path="/data/kafka", mount="/data", partitions=()),),
)


def _snapshot(host: str, i: int) -> dict[str, Any]:
    return build_snapshot(
        host=host,
        ts_ms=1_700_000_000_000 + i * 1000,
        fs=FS,
        topic_bytes={"orders": (3, 1000 + i), "logs": (1, 10)},
        kafka_bytes=1010 + i,
        deleted_bytes=0,
        flow_state="normal",
        alert_level=0,
    )


def _drain(sinks: list[KafkaSink], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for sink in sinks:
            sink.ship(timeout=0.05)
        if all(sink.in_flight == 0 and not list(sink.spool.pending()) for sink in sinks):
            return
    pytest.fail("spooled snapshots were not all shipped within the deadline", pytrace=False)


def _assert_exactly_once_in_order(records: list[dict[str, Any]], expected: dict[str, int]) -> None:
    """After dedup by (host, mount, ts_ms): every snapshot once, each host's in order."""
    seen: set[tuple[str, str, int]] = set()
    first_seen: dict[str, list[int]] = {host: [] for host in expected}
    for record in records:
        key = (record["host"], record["mount"], record["ts_ms"])
        if key not in seen:
            seen.add(key)
            first_seen[record["host"]].append(record["ts_ms"])
    for host, count in expected.items():
        want = [_snapshot(host, i)["ts_ms"] for i in range(count)]
        assert first_seen[host] == want, f"{host}: snapshots missing or out of order"
    assert len(seen) == sum(expected.values())


def test_outage_mid_stream_loses_nothing_and_keeps_order(tmp_path: Path) -> None:
    hosts = ("broker-a", "broker-b")
    with tansu_broker() as broker:
        _create_topic(broker.bootstrap)
        spools = [Spool(tmp_path / h / "spool", 1 << 20, 64 << 10) for h in hosts]
        sinks = [
            KafkaSink(broker.bootstrap, TOPIC, CLIENT, spool, retry_backoff_s=0.2)
            for spool in spools
        ]
        try:
            with capture_logs() as logs:
                for i in range(60):
                    if i == 20:
                        broker.pause()
                        stopped_at = time.monotonic()
                    if i == 25:
                        during_outage = [s.shipped_total for s in sinks]
                        assert all(n < 25 for n in during_outage)
                    if i == 40:
                        # Long enough for deliveries to time out: the failure path must run.
                        time.sleep(max(0.0, stopped_at + 3.5 - time.monotonic()))
                        # Nothing moves the cursor while the broker is frozen.
                        assert [s.shipped_total for s in sinks] == during_outage
                        broker.resume()
                    for host, spool, sink in zip(hosts, spools, sinks, strict=True):
                        assert spool.append(_snapshot(host, i)) is not None
                        sink.ship(timeout=0.02)
                    time.sleep(0.05)
                _drain(sinks)
            for sink in sinks:
                sink.close(5)
            assert all(s.failed_total > 0 for s in sinks), "the outage caused no failed delivery"
            assert all(s.shipped_total >= 60 for s in sinks)
            assert [e for e in logs if e["event"] == "snapshot_ship_failed"]
            assert sum(e["count"] for e in logs if e["event"] == "snapshot_shipped") >= 120
            records = _read_all(broker.bootstrap, expected=120)
            _assert_exactly_once_in_order(records, {h: 60 for h in hosts})
        finally:
            for spool in spools:
                spool.close()


def test_broker_absent_at_start_then_catches_up(tmp_path: Path) -> None:
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    spool_dir = tmp_path / "spool"
    spool = Spool(spool_dir, 1 << 20, 64 << 10)
    sink = KafkaSink(bootstrap, TOPIC, CLIENT, spool, max_in_flight=4, retry_backoff_s=0.2)
    try:
        for i in range(15):
            spool.append(_snapshot("broker-a", i))
            assert sink.ship(timeout=0.05) == 0
            assert sink.in_flight <= 4  # the rest waits in the spool, not in librdkafka
        assert len(list(spool.pending())) == 15
        assert spool.cursor is None
        with tansu_broker(port) as broker:
            _create_topic(broker.bootstrap)
            for i in range(15, 30):
                spool.append(_snapshot("broker-a", i))
                sink.ship(timeout=0.05)
            _drain([sink])
            sink.close(5)
            spool.close()
            # The cursor is durable: a restarted daemon has nothing left to send.
            with Spool(spool_dir, 1 << 20, 64 << 10) as reopened:
                assert list(reopened.pending()) == []
            records = _read_all(broker.bootstrap, expected=30)
            _assert_exactly_once_in_order(records, {"broker-a": 30})
    finally:
        spool.close()


def test_restart_replays_from_the_cursor(tmp_path: Path) -> None:
    """Records spooled by a daemon that died before shipping go out after restart."""
    spool_dir = tmp_path / "spool"
    with Spool(spool_dir, 1 << 20, 64 << 10) as spool:
        for i in range(10):
            spool.append(_snapshot("broker-a", i))
    with tansu_broker() as broker:
        _create_topic(broker.bootstrap, partitions=1)
        with Spool(spool_dir, 1 << 20, 64 << 10) as spool:
            sink = KafkaSink(broker.bootstrap, TOPIC, CLIENT, spool)
            _drain([sink])
            assert sink.close(5) == 0
            assert sink.shipped_total == 10
        records = _read_all(broker.bootstrap, expected=10)
        _assert_exactly_once_in_order(records, {"broker-a": 10})


def test_bad_client_settings_are_a_clear_error(tmp_path: Path) -> None:
    with Spool(tmp_path / "spool", 1 << 20, 64 << 10) as spool, pytest.raises(ValueError) as exc:
        KafkaSink("127.0.0.1:1", TOPIC, {"no.such.setting": 1}, spool)
    assert "no.such.setting" in str(exc.value)


def test_oversized_record_is_stepped_over_not_blocking(tmp_path: Path) -> None:
    """A snapshot bigger than the producer may send can never ship; later ones still must."""
    with tansu_broker() as broker, Spool(tmp_path / "spool", 1 << 22, 1 << 20) as spool:
        _create_topic(broker.bootstrap, partitions=1)
        sink = KafkaSink(broker.bootstrap, TOPIC, {**CLIENT, "message.max.bytes": 20_000}, spool)
        huge = _snapshot("broker-a", 1)
        huge["topics"] = [{"topic": f"t{n:05d}", "partitions": 1, "bytes": n} for n in range(2000)]
        spool.append(_snapshot("broker-a", 0))
        spool.append(huge)
        spool.append(_snapshot("broker-a", 2))
        with capture_logs() as logs:
            _drain([sink])
        sink.close(5)
        assert sink.skipped_total == 1
        skipped = [e for e in logs if e["event"] == "snapshot_ship_failed" and e.get("skipped")]
        assert len(skipped) == 1
        records = _read_all(broker.bootstrap, expected=2)
        assert [r["ts_ms"] for r in records] == [_snapshot("broker-a", i)["ts_ms"] for i in (0, 2)]
