"""The snapshot record: the wire contract with the Spark job, fixed field by field."""

from __future__ import annotations

import json

import pytest

from diskguard.kafkalog.model import Filesystem, FilesystemUsage, LogDir
from diskguard.snapshots.record import (
    SCHEMA_VERSION,
    DeletedBytesCounter,
    build_snapshot,
    encode_record,
)

FS = Filesystem(
    usage=FilesystemUsage(
        mount="/data1",
        device="/dev/sdb1",
        total_bytes=1000,
        used_bytes=700,
        available_bytes=250,
    ),
    log_dirs=(
        LogDir(path="/data1/kafka-a", mount="/data1", partitions=(), pending_reclaim_bytes=30),
        LogDir(path="/data1/kafka-b", mount="/data1", partitions=(), pending_reclaim_bytes=12),
    ),
)


def _build(**overrides: object) -> dict[str, object]:
    args: dict[str, object] = {
        "host": "broker-7",
        "ts_ms": 1_700_000_000_123,
        "fs": FS,
        "topic_bytes": {"small": (1, 10), "big": (6, 500), "mid": (3, 100), "also-mid": (2, 100)},
        "kafka_bytes": 610,
        "deleted_bytes": 64,
        "flow_state": "overfull",
        "alert_level": 1,
    }
    args.update(overrides)
    return build_snapshot(**args)  # type: ignore[arg-type]


def test_record_has_exactly_the_contract_fields() -> None:
    record = _build()
    assert record == {
        "schema": SCHEMA_VERSION,
        "host": "broker-7",
        "ts_ms": 1_700_000_000_123,
        "mount": "/data1",
        "device": "/dev/sdb1",
        "log_dirs": ["/data1/kafka-a", "/data1/kafka-b"],
        "total_bytes": 1000,
        "used_bytes": 700,
        "available_bytes": 250,
        "kafka_bytes": 610,
        "pending_reclaim_bytes": 42,
        "deleted_bytes": 64,
        "flow_state": "overfull",
        "alert_level": 1,
        "topics": [
            {"topic": "big", "partitions": 6, "bytes": 500},
            {"topic": "also-mid", "partitions": 2, "bytes": 100},
            {"topic": "mid", "partitions": 3, "bytes": 100},
            {"topic": "small", "partitions": 1, "bytes": 10},
        ],
        "reclaim": None,
    }
    assert SCHEMA_VERSION == 1


def test_encoded_record_is_one_compact_json_line_that_round_trips() -> None:
    record = _build(host="브로커-1")
    line = encode_record(record)
    assert b"\n" not in line
    assert json.loads(line) == record


def test_no_topics_gives_an_empty_list() -> None:
    assert _build(topic_bytes={})["topics"] == []


@pytest.mark.parametrize(
    "overrides",
    [
        {"flow_state": "blocked"},
        {"ts_ms": -1},
        {"deleted_bytes": -5},
        {"kafka_bytes": -1},
        {"alert_level": -1},
    ],
)
def test_bad_values_are_refused(overrides: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        _build(**overrides)


def test_deleted_bytes_counter_takes_and_resets_per_mount() -> None:
    counter = DeletedBytesCounter()
    counter.add("/data1", 100)
    counter.add("/data1", 50)
    counter.add("/data2", 7)
    assert counter.peek("/data1") == 150
    assert counter.take("/data1") == 150
    assert counter.take("/data1") == 0
    assert counter.take("/data2") == 7
    assert counter.take("/never") == 0
    with pytest.raises(ValueError):
        counter.add("/data1", -1)
