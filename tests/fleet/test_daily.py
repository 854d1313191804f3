"""The daily summaries' exact sums on real Spark (local[2]), at the bounds the job accepts.

The sums are computed as long sums of 32-bit halves, weighed and added once per disk-day
(:mod:`diskguard.fleet.daily`); here they must be the very integers Python's sums give,
for byte counts up to 8 PiB and timestamps anywhere in the day.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from diskguard.fleet import daily
from diskguard.fleet.aggregation import MAX_BYTES
from diskguard.fleet.inputs import STATUS_OK, classify, read_records, resolve_input

pytestmark = pytest.mark.spark

DAY = 1_790_035_200_000  # 2026-09-22T00:00:00Z
BYTES = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40 + 12345, MAX_BYTES - 1, MAX_BYTES]
OFFSETS = [0, 1, 2**26 - 1, 2**26, 45_296_789, daily.DAY_MS - 2, daily.DAY_MS - 1]
HALF = daily.DAY_MS // 2


def _snapshots() -> list[dict[str, Any]]:
    """Two disks: every offset in the day against every byte count, Kafka's bytes left out
    of every third snapshot (its sums are then over the others)."""
    found = []
    for disk, mount in enumerate(("/a", "/b")):
        for i, offset in enumerate(OFFSETS):
            for j, used in enumerate(BYTES):
                n = i * len(BYTES) + j
                record: dict[str, Any] = {
                    "schema": 1,
                    "host": "h",
                    "mount": mount,
                    # distinct timestamps, all in the day: the offset, moved inwards
                    "ts_ms": DAY + (offset + 100 * j if offset < HALF else offset - 100 * j),
                    "total_bytes": MAX_BYTES,
                    "used_bytes": used,
                    "available_bytes": MAX_BYTES - used,
                    "deleted_bytes": BYTES[(n + disk) % len(BYTES)],
                    "flow_state": "normal",
                    "topics": [{"topic": "t", "partitions": 1, "bytes": BYTES[-1 - j]}],
                }
                if n % 3:
                    record["kafka_bytes"] = BYTES[(j + 4) % len(BYTES)]
                found.append(record)
    return found


def _expected(records: list[dict[str, Any]]) -> dict[str, int]:
    xs = [r["ts_ms"] % daily.DAY_MS for r in records]
    ys = [r["used_bytes"] for r in records]
    known = [(x, r["kafka_bytes"]) for x, r in zip(xs, records, strict=True) if "kafka_bytes" in r]
    unknown = [(x, y) for x, y, r in zip(xs, ys, records, strict=True) if "kafka_bytes" not in r]
    return {
        "snapshots": len(records),
        "sum_x": sum(xs),
        "sum_xx": sum(x * x for x in xs),
        "sum_y": sum(ys),
        "sum_xy": sum(x * y for x, y in zip(xs, ys, strict=True)),
        "sum_yy": sum(y * y for y in ys),
        "kafka_snapshots": len(known),
        "sum_k": sum(k for _, k in known),
        "sum_xk": sum(x * k for x, k in known),
        "unk_sum_x": sum(x for x, _ in unknown),
        "unk_sum_xx": sum(x * x for x, _ in unknown),
        "unk_sum_y": sum(y for _, y in unknown),
        "unk_sum_xy": sum(x * y for x, y in unknown),
        "deleted_bytes": sum(r["deleted_bytes"] for r in records),
    }


def test_exact_sums_at_the_bounds(spark: Any, tmp_path: Path) -> None:
    records = _snapshots()
    assert {r["ts_ms"] // daily.DAY_MS for r in records} == {DAY // daily.DAY_MS}
    assert len({(r["mount"], r["ts_ms"]) for r in records}) == len(records)
    path = tmp_path / "spool.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    classified = classify(read_records(spark, resolve_input(str(path))))
    valid = classified.where(F.col("status") == F.lit(STATUS_OK)).drop("status", "origin", "offset")
    disks, topics = daily.fold(valid, None, None)

    found = {r["mount"]: r.asDict() for r in disks.collect()}
    assert set(found) == {"/a", "/b"}
    for mount, row in found.items():
        mine = [r for r in records if r["mount"] == mount]
        got = {name: int(row[name]) for name in ("snapshots", *daily.DISK_SUMS)}
        assert got == _expected(mine), mount

    for row in topics.collect():
        mine = [r for r in records if r["mount"] == row["mount"]]
        xs = [r["ts_ms"] % daily.DAY_MS for r in mine]
        bs = [r["topics"][0]["bytes"] for r in mine]
        assert (row["snapshots"], row["sum_x"]) == (len(mine), sum(xs))
        assert int(row["sum_xx"]) == sum(x * x for x in xs)
        assert int(row["sum_y"]) == sum(bs)
        assert int(row["sum_xy"]) == sum(x * b for x, b in zip(xs, bs, strict=True))
        latest = max(mine, key=lambda r: r["ts_ms"])
        assert (row["seen_bytes"], row["seen_partitions"]) == (latest["topics"][0]["bytes"], 1)
