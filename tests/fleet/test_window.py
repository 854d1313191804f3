"""The report's figures over daily summaries (pure) and the driver's Arrow decoding.

The Spark tests (test_incremental, test_sparkjob) hold the whole report to the plain-Python
reference; these check the pieces a small fleet does not reach: decimals past 64 bits and
below zero, episodes stitched across days, ties in the topics' order.
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pytest

from diskguard.fleet import window
from diskguard.fleet.columns import columns_of

DAY = window.DAY_MS
T0 = 20_000 * DAY


def test_decimals_become_exact_integers() -> None:
    values = [0, 1, -1, 2**64, -(2**64) - 5, 10**37, None, -(10**37) + 3, 2**63 - 1, -(2**63)]
    column = pa.array(values, type=pa.decimal128(38, 0))
    table = pa.table({"d": pa.chunked_array([column.slice(0, 3), column.slice(3)])})
    assert columns_of(table) == {"d": values}
    sliced = pa.table({"d": column.slice(4, 4)})
    assert columns_of(sliced) == {"d": values[4:8]}


def _day(
    day: int,
    first: int,
    last: int,
    runs: list[tuple[int, int, bool]],
    first_of: bool,
    last_of: bool,
) -> dict[str, Any]:
    return {
        "host": "h",
        "mount": "/d",
        "day": f"day-{day:02d}",
        "first_ts_ms": T0 + day * DAY + first,
        "last_ts_ms": T0 + day * DAY + last,
        "first_overfull": first_of,
        "last_overfull": last_of,
        "runs": [
            {"start_ts_ms": T0 + day * DAY + s, "end_ts_ms": T0 + day * DAY + e, "open": o}
            for s, e, o in runs
        ],
    }


def _columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {name: [r[name] for r in rows] for name in rows[0]}


def test_an_episode_open_at_midnight_continues_into_the_next_day() -> None:
    rows = [
        _day(2, 0, 900, [(100, 900, True)], False, True),  # overfull from 100 to midnight
        _day(0, 0, 900, [(200, 300, False)], False, False),  # given out of order
        _day(3, 50, 900, [(50, 400, False), (800, 900, True)], True, True),
        _day(5, 10, 900, [], False, False),  # the open run ends at this day's first snapshot
    ]
    episodes = window.overfull_episodes(_columns(rows), 10)
    assert [(e["start_ts_ms"] - T0, e["end_ts_ms"] - T0, e["open"]) for e in episodes] == [
        (3 * DAY + 800, 5 * DAY + 10, False),
        (2 * DAY + 100, 3 * DAY + 400, False),
        (200, 300, False),
    ]
    assert window.overfull_episodes(_columns(rows), 1) == episodes[:1]
    last_open = window.overfull_episodes(_columns(rows[:3]), 10)
    assert last_open[0]["open"] and last_open[0]["end_ts_ms"] == T0 + 3 * DAY + 900


def test_topics_rank_their_disks_biggest_first_and_sum_their_slopes() -> None:
    disks = [{"host": h, "mount": "/d", "last_ts_ms": 5} for h in ("a", "b", "c")]
    per_disk = [
        {
            "host": "a",
            "mount": "/d",
            "topic": "t",
            "seen_ts_ms": 5,
            "seen_bytes": 10,
            "seen_partitions": 1,
            "growth_bytes_per_hour": 0.1,
        },
        {
            "host": "b",
            "mount": "/d",
            "topic": "t",
            "seen_ts_ms": 5,
            "seen_bytes": 10,
            "seen_partitions": 2,
            "growth_bytes_per_hour": None,
        },
        # no longer on c at its latest snapshot: 0 bytes there, its slope still counts
        {
            "host": "c",
            "mount": "/d",
            "topic": "t",
            "seen_ts_ms": 4,
            "seen_bytes": 99,
            "seen_partitions": 3,
            "growth_bytes_per_hour": 0.2,
        },
        {
            "host": "zz",
            "mount": "/d",
            "topic": "t",
            "seen_ts_ms": 5,
            "seen_bytes": 7,
            "seen_partitions": 1,
            "growth_bytes_per_hour": 1.0,
        },  # not a disk of the window
    ]
    (topic,) = window.topic_rows(per_disk, disks)
    assert (topic["bytes"], topic["partitions"], topic["disk_count"]) == (20, 3, 2)
    assert topic["growth_bytes_per_hour"] == math.fsum([0.1, 0.2])  # b has no slope
    assert [(d["host"], d["bytes"], d["share"]) for d in topic["disks"]] == [
        ("b", 10, 0.5),
        ("a", 10, 0.5),
        ("c", 0, 0.0),
    ]


def test_hosts_skew_is_against_the_mean_of_hosts() -> None:
    def disk(host: str, used: int, available: int, hours: float | None) -> dict[str, Any]:
        return {
            "host": host,
            "last_ts_ms": 1,
            "total_bytes": used + available,
            "used_bytes": used,
            "available_bytes": available,
            "kafka_bytes": None,
            "growth_bytes_per_hour": None,
            "hours_to_full": hours,
            "overfull_episodes": 1,
        }

    hosts = window.host_rows(
        [disk("b", 30, 70, 5.0), disk("a", 10, 90, None), disk("a", 10, 90, 2.0)]
    )
    assert [h["host"] for h in hosts] == ["a", "b"]
    a, b = hosts
    assert (a["disks"], a["used_ratio"], a["min_hours_to_full"], a["kafka_bytes"]) == (
        2,
        0.1,
        2.0,
        None,
    )
    assert a["fleet_mean_used_ratio"] == b["fleet_mean_used_ratio"] == 0.2
    assert (a["skew"], b["skew"]) == (pytest.approx(0.5), pytest.approx(1.5))
    assert a["overfull_episodes"] == 2 and a["growth_bytes_per_hour"] is None
