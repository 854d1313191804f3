"""A generated fleet of usage snapshots with a known truth, for the Spark job's tests.

Five disks on three hosts grow exactly linearly (so least-squares results are exact), with
hand-placed overfull episodes, plus duplicate, malformed and unknown-schema lines: the
spool a fleet of daemons would leave. ``make_fleet()`` gives the records and the lines,
``write_spool()`` writes the lines as a spool directory.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diskguard.fleet.aggregation import MS_PER_HOUR

T0 = 1_790_000_000_000
_STEP_MS = 60_000
N = 120
_TOTAL = 1_000_000_000_000
_RESERVED = 50_000_000_000
HOUR = int(MS_PER_HOUR)

# (host, mount) -> used-bytes growth per hour (exact), overfull snapshot indexes
DISKS: dict[tuple[str, str], tuple[int, set[int]]] = {
    ("broker-1", "/data1"): (2_000_000_000, set(range(20, 40)) | set(range(80, 90))),
    ("broker-1", "/data2"): (500_000_000, set()),
    ("broker-2", "/data1"): (8_000_000_000, set(range(0, 10)) | set(range(110, N))),
    ("broker-2", "/data2"): (-1_000_000_000, set()),
    ("broker-3", "/data1"): (0, {50}),
}
EXPECTED_EPISODES = {
    ("broker-1", "/data1"): (2, (20 + 10) * 60.0),
    ("broker-1", "/data2"): (0, 0.0),
    ("broker-2", "/data1"): (2, (10 + 9) * 60.0),  # starts overfull; ends overfull
    ("broker-2", "/data2"): (0, 0.0),
    ("broker-3", "/data1"): (1, 60.0),
}
MALFORMED_LINES = [
    "this is not json",
    '{"schema": 1, "host": "broker-1", "ts_m',
    '{"schema": 1, "host": "broker-9", "mount": "/x"}',
    '{"schema": 1, "host": "broker-9", "mount": "/x", "ts_ms": "yesterday"}',
    "[1, 2, 3]",
]
UNKNOWN_SCHEMA_LINES = [
    '{"schema": 2, "host": "broker-1", "mount": "/data1", "ts_ms": 1, "used": {"new": 1}}',
    '{"schema": 99, "host": "broker-4"}',
]
DUPLICATES = 37


def snapshot_ts(disk_index: int, i: int) -> int:
    # irregular spacing per disk, so the fit is not a trivially even grid
    return T0 + i * _STEP_MS + (i % 7) * 1_500 + disk_index * 333


def _make_records() -> list[dict[str, Any]]:
    records = []
    for d, ((host, mount), (rate, overfull)) in enumerate(sorted(DISKS.items())):
        used0 = 400_000_000_000 + d * 10_000_000_000
        for i in range(N):
            ts = snapshot_ts(d, i)
            used = used0 + round(rate * (ts - T0) / MS_PER_HOUR)
            orders = 100_000_000_000 + round(rate * 0.5 * (ts - T0) / MS_PER_HOUR)
            records.append(
                {
                    "schema": 1,
                    "host": host,
                    "ts_ms": ts,
                    "mount": mount,
                    "device": f"/dev/sd{'abcde'[d]}1",
                    "log_dirs": [f"{mount}/kafka"],
                    "total_bytes": _TOTAL,
                    "used_bytes": used,
                    "available_bytes": _TOTAL - _RESERVED - used,
                    "kafka_bytes": used - 1_000_000_000,
                    "pending_reclaim_bytes": 0,
                    "deleted_bytes": 1_000 if i % 10 == 0 else 0,
                    "flow_state": "overfull" if i in overfull else "normal",
                    "alert_level": 2 if i in overfull else (1 if i % 30 == 0 else 0),
                    "topics": [
                        {"topic": "orders", "partitions": 6, "bytes": orders},
                        {"topic": "logs", "partitions": 3, "bytes": 50_000_000_000 + d},
                    ],
                }
            )
    return records


@dataclass(frozen=True)
class Fleet:
    records: list[dict[str, Any]]
    lines: list[str]  # every line written, in order: valid, duplicates, bad


def make_fleet() -> Fleet:
    rng = random.Random(7)
    records = _make_records()
    lines = [json.dumps(r) for r in records]
    lines += [json.dumps(r) for r in rng.sample(records, DUPLICATES)]
    lines += MALFORMED_LINES + UNKNOWN_SCHEMA_LINES
    rng.shuffle(lines)
    return Fleet(records, lines)


def write_spool(directory: Path, lines: list[str], files: int = 3) -> None:
    directory.mkdir(parents=True)
    for f in range(files):
        chunk = lines[f::files]
        # a blank line is not a record and is not counted as bad
        (directory / f"{f:08d}.jsonl").write_text("\n".join(chunk) + "\n\n")


# ----------------------------------------------------------------- a fleet over several days

DAY_MS = 86_400_000
DAY0 = 20_718 * DAY_MS  # 2026-09-22 00:00 UTC
DAYS = 3
_DAY_STEP_MS = 600_000  # a snapshot every 10 minutes
PER_DAY = DAY_MS // _DAY_STEP_MS


def _overfull_days(disk: str, ts: int) -> bool:
    """Hand-placed overfull stretches that cross midnight, start the window and end it."""
    hour = (ts - DAY0) / 3_600_000
    if disk == "crosses":  # day 0 23:00 to day 1 01:30, and day 1 12:00-12:20
        return 23 <= hour < 25.5 or 36 <= hour < 36.34
    if disk == "starts":  # the window starts overfull; again at the very end (open)
        return hour < 2 or hour >= 71.5
    if disk == "gap":  # overfull at the end of day 0, no snapshot on day 1, normal on day 2
        return 22 <= hour < 24
    return False


def make_days_fleet() -> tuple[list[dict[str, Any]], dict[int, list[str]]]:
    """Snapshots of 5 disks over :data:`DAYS` UTC days, and the lines a shipper would have
    delivered each day: duplicates within and across days, some of day 0's snapshots
    arriving only with day 2 (late), one of day 0's delivered again with day 2, bad lines.

    Returns (the unique records, {day: lines}).
    """
    rng = random.Random(11)
    disks = {  # name -> (host, mount, growth bytes per hour)
        "crosses": ("broker-1", "/data1", 3_000_000_000),
        "starts": ("broker-1", "/data2", 1_000_000_000),
        "gap": ("broker-2", "/data1", 500_000_000),
        "late": ("broker-3", "/data1", -200_000_000),  # appears on day 1 only, shrinking
        "saw": ("broker-3", "/data2", 0),
    }
    records: list[dict[str, Any]] = []
    for d, (name, (host, mount, rate)) in enumerate(sorted(disks.items())):
        for i in range(DAYS * PER_DAY):
            ts = DAY0 + i * _DAY_STEP_MS + (i % 7) * 1_500 + d * 333
            day = (ts - DAY0) // DAY_MS
            if name == "gap" and day == 1:
                continue
            if name == "late" and day != 1:
                continue
            hours = (ts - DAY0) / MS_PER_HOUR
            used = 300_000_000_000 + d * 1_000_000_000 + round(rate * hours)
            if name == "saw":
                used += (i % 12) * 2_000_000_000
            record: dict[str, Any] = {
                "schema": 1,
                "host": host,
                "ts_ms": ts,
                "mount": mount,
                "device": f"/dev/sd{'abcde'[d]}1",
                "total_bytes": _TOTAL,
                "used_bytes": used,
                "available_bytes": _TOTAL - _RESERVED - used,
                "pending_reclaim_bytes": i % 3,
                "deleted_bytes": 4_096 if i % 9 == 0 else 0,
                "flow_state": "overfull" if _overfull_days(name, ts) else "normal",
                "alert_level": 2 if _overfull_days(name, ts) else i % 2,
                "topics": [
                    {"topic": "orders", "partitions": 6, "bytes": used // 2},
                    *(
                        [{"topic": "clicks", "partitions": 2, "bytes": 7_000_000 * (i % 50)}]
                        if not (name == "starts" and day == 2)
                        else []
                    ),
                ],
            }
            if not (name == "saw" and i % 5 == 0):  # some snapshots lack kafka_bytes
                record["kafka_bytes"] = used - 2_000_000_000
            records.append(record)
    by_day: dict[int, list[str]] = {d: [] for d in range(DAYS)}
    late: list[str] = []
    for record in records:
        day = (int(record["ts_ms"]) - DAY0) // DAY_MS
        line = json.dumps(record)
        if day == 0 and rng.random() < 0.05:
            late.append(line)
            continue
        by_day[day].append(line)
        if rng.random() < 0.02:
            by_day[rng.choice([day, min(day + 1, DAYS - 1)])].append(line)  # delivered twice
    by_day[2] += late + rng.sample(by_day[0], 3) + MALFORMED_LINES[:2] + UNKNOWN_SCHEMA_LINES[:1]
    by_day[1].append(json.dumps({**records[0], "ts_ms": 9_000_000_000_000}))  # out of range
    for lines in by_day.values():
        rng.shuffle(lines)
    return records, by_day
