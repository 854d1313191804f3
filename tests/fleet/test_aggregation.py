"""The pure fleet-aggregation math: slopes, time to full, overfull episodes, dedup, skew."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diskguard.fleet.aggregation import (
    FORECAST_MIN_POINTS,
    FORECAST_MIN_SPAN_MS,
    FORECAST_NOT_ENOUGH_DATA,
    FORECAST_NOT_GROWING,
    FORECAST_OK,
    FORECAST_WEAK_FIT,
    MS_PER_HOUR,
    Episode,
    dedup_snapshots,
    downsample_bucket,
    fleet_skew,
    forecast_full_ts_ms,
    forecast_status,
    growth_bytes_per_hour,
    growth_split,
    hours_to_full,
    least_squares_slope,
    line_fit,
    overfull_history,
    summarize_disks,
    used_ratio,
)
from diskguard.fleet.fillorder import fill_order

T0 = 1_790_000_000_000


def test_slope_of_exact_line() -> None:
    xs = [0.0, 1.0, 2.0, 3.0]
    assert least_squares_slope(xs, [5.0 + 2.5 * x for x in xs]) == pytest.approx(2.5)


def test_slope_needs_two_distinct_x() -> None:
    assert least_squares_slope([], []) is None
    assert least_squares_slope([1.0], [1.0]) is None
    assert least_squares_slope([1.0, 1.0], [1.0, 2.0]) is None
    with pytest.raises(ValueError, match="differ in length"):
        least_squares_slope([1.0, 2.0], [1.0])


def test_slope_through_noise_is_the_least_squares_one() -> None:
    # y = 2x with residuals +1, -1, -1, +1 (symmetric): the fit is exactly 2.
    assert least_squares_slope([0, 1, 2, 3], [1, 1, 3, 7]) == pytest.approx(2.0)


@given(
    start=st.integers(min_value=1_500_000_000_000, max_value=2_000_000_000_000),
    step_s=st.integers(min_value=1, max_value=3600),
    n=st.integers(min_value=2, max_value=200),
    rate=st.floats(min_value=-1e9, max_value=1e9, allow_nan=False),
)
def test_growth_survives_epoch_millisecond_timestamps(
    start: int, step_s: int, n: int, rate: float
) -> None:
    """Textbook sums of ts_ms^2 (~3e24) would cancel catastrophically; centred sums do not."""
    ts = [start + i * step_s * 1000 for i in range(n)]
    used = [10**12 + rate * (t - start) / MS_PER_HOUR for t in ts]
    growth = growth_bytes_per_hour(ts, [round(u) for u in used])
    assert growth is not None
    # integer rounding of used bytes perturbs the slope by at most ~1 byte per sample span
    tolerance = 1e-6 * abs(rate) + 2.0 / ((ts[-1] - ts[0]) / MS_PER_HOUR)
    assert math.isclose(growth, rate, abs_tol=tolerance)


def test_hours_to_full() -> None:
    assert hours_to_full(1000, 100.0) == pytest.approx(10.0)
    assert hours_to_full(1000, 0.0) is None
    assert hours_to_full(1000, -5.0) is None
    assert hours_to_full(1000, None) is None
    assert hours_to_full(-10, 100.0) == 0.0


def test_used_ratio_is_dfs() -> None:
    assert used_ratio(75, 25) == pytest.approx(0.75)
    assert used_ratio(0, 0) is None


def test_no_overfull() -> None:
    history = overfull_history([(0, "normal"), (1000, "normal")])
    assert history.count == 0
    assert history.seconds == 0.0


def test_episodes_and_seconds_step_function() -> None:
    points = [
        (0, "normal"),
        (10_000, "overfull"),
        (20_000, "overfull"),
        (30_000, "normal"),
        (40_000, "overfull"),
        (45_000, "normal"),
    ]
    history = overfull_history(points)
    assert history.episodes == (
        Episode(10_000, 30_000, open=False),
        Episode(40_000, 45_000, open=False),
    )
    assert history.seconds == pytest.approx(25.0)


def test_window_starting_overfull_counts_one_episode() -> None:
    history = overfull_history([(0, "overfull"), (5_000, "overfull"), (9_000, "normal")])
    assert history.count == 1
    assert history.seconds == pytest.approx(9.0)


def test_window_ending_overfull_is_open_and_last_point_adds_no_time() -> None:
    history = overfull_history([(0, "normal"), (1_000, "overfull"), (3_000, "overfull")])
    assert history.episodes == (Episode(1_000, 3_000, open=True),)
    assert history.seconds == pytest.approx(2.0)
    single = overfull_history([(7_000, "overfull")])
    assert single.count == 1
    assert single.seconds == 0.0


def test_episode_order_does_not_matter() -> None:
    points = [(30_000, "normal"), (0, "overfull"), (10_000, "overfull"), (20_000, "normal")]
    history = overfull_history(points)
    assert history.count == 1
    assert history.seconds == pytest.approx(20.0)


def _record(host: str, mount: str, ts: int, used: int, state: str = "normal") -> dict[str, object]:
    return {
        "host": host,
        "mount": mount,
        "ts_ms": ts,
        "total_bytes": 1000,
        "used_bytes": used,
        "available_bytes": 900 - used,
        "kafka_bytes": used // 2,
        "deleted_bytes": 3,
        "flow_state": state,
        "alert_level": 2 if state == "overfull" else 0,
    }


def test_dedup_keeps_one_per_host_mount_ts() -> None:
    a = _record("h", "/d", T0, 10)
    records = [a, dict(a), _record("h", "/d", T0 + 1, 11), _record("h", "/e", T0, 10)]
    assert len(dedup_snapshots(records)) == 3


def test_summarize_disks() -> None:
    hour = int(MS_PER_HOUR)
    records = [
        _record("h1", "/d", T0 + i * hour, 100 + 10 * i, "overfull" if i in (2, 3) else "normal")
        for i in range(6)
    ]
    records.append(dict(records[0]))  # a duplicate delivery
    records.append(_record("h2", "/d", T0, 50))
    summary = summarize_disks(records)
    d1 = summary[("h1", "/d")]
    assert d1.snapshots == 6
    assert d1.growth_bytes_per_hour == pytest.approx(10.0)
    assert d1.available_bytes == 900 - 150
    assert d1.hours_to_full == pytest.approx(75.0)
    assert d1.overfull_episodes == 1
    assert d1.overfull_seconds == pytest.approx(2 * 3600)
    assert d1.deleted_bytes == 18
    assert d1.peak_alert_level == 2
    assert d1.first_overfull_ts_ms == T0 + 2 * hour
    d2 = summary[("h2", "/d")]
    assert d2.growth_bytes_per_hour is None
    assert d2.hours_to_full is None
    assert d2.first_overfull_ts_ms is None


def _disk(host: str, **fields: object) -> dict[str, object]:
    row: dict[str, object] = {
        "host": host,
        "mount": "/data",
        "last_ts_ms": T0,
        "first_overfull_ts_ms": None,
        "hours_to_full": None,
        "forecast_status": "not_enough_data",
    }
    return {**row, **fields}


def test_fill_order_ranks_what_filled_before_what_will() -> None:
    """Went overfull: by the first overfull snapshot, however soon another's forecast says
    it fills; then trusted forecasts (ok, weak fit) soonest first; the rest unranked."""
    disks = [
        _disk("late", first_overfull_ts_ms=T0 + 5000),
        _disk("soon", hours_to_full=1.0, forecast_status="ok"),
        _disk("weak", hours_to_full=0.5, forecast_status="weak_fit"),
        _disk("early", first_overfull_ts_ms=T0 + 1000, hours_to_full=0.1, forecast_status="ok"),
        _disk("noise", hours_to_full=0.01, forecast_status="not_enough_data"),
        _disk("flat", forecast_status="not_growing"),
    ]
    order = fill_order(disks)
    assert [(r.host, r.basis) for r in order.ranks] == [
        ("early", "overfull"),
        ("late", "overfull"),
        ("weak", "forecast"),
        ("soon", "forecast"),
    ]
    assert order.first is not None and order.first.ts_ms == T0 + 1000
    assert order.ranks[3].ts_ms == T0 + int(MS_PER_HOUR)
    summary = order.as_dict()
    assert summary["fills_first"]["host"] == "early"
    assert [d["host"] for d in summary["disks"]] == ["early", "late", "weak", "soon"]
    assert summary["disks"][2]["forecast_status"] == "weak_fit"
    # Nothing filled and nothing forecast: no answer rather than a guess.
    assert fill_order([_disk("noise", hours_to_full=0.01)]).as_dict() == {
        "fills_first": None,
        "disks": [],
    }
    # Ties by host: the same answer whatever the input order.
    tied = [_disk(h, first_overfull_ts_ms=T0) for h in ("b", "a")]
    assert [r.host for r in fill_order(tied).ranks] == ["a", "b"]


def test_fleet_skew_is_against_the_mean_of_hosts() -> None:
    skew = fleet_skew({"a": 0.2, "b": 0.6, "c": None})
    assert skew["a"] == pytest.approx(0.5)
    assert skew["b"] == pytest.approx(1.5)
    assert skew["c"] is None


def test_forecast_and_buckets() -> None:
    assert forecast_full_ts_ms(T0, 2.0) == T0 + 2 * int(MS_PER_HOUR)
    assert forecast_full_ts_ms(T0, None) is None
    assert downsample_bucket(T0, T0, T0 + 1000, 10) == 0
    assert downsample_bucket(T0 + 999, T0, T0 + 1000, 10) == 9
    assert downsample_bucket(T0 + 1000, T0, T0 + 1000, 10) == 9
    assert downsample_bucket(T0, T0, T0, 10) == 0
    with pytest.raises(ValueError):
        downsample_bucket(T0, T0, T0, 0)


def _split_record(
    ts: int, used: int, kafka: int | None, topics: dict[str, int]
) -> dict[str, object]:
    record: dict[str, object] = {
        "ts_ms": ts,
        "used_bytes": used,
        "topics": [{"topic": t, "partitions": 1, "bytes": b} for t, b in topics.items()],
    }
    if kafka is not None:
        record["kafka_bytes"] = kafka
    return record


def test_growth_split_separates_kafka_from_the_rest() -> None:
    # the demo's situation: the disk grows 45 GiB/h, Kafka's topics a few hundred MiB/h
    gib, mib, hour = 1 << 30, 1 << 20, int(MS_PER_HOUR)
    records = []
    for i in range(12):
        orders, clicks = 100 * mib * i, 78 * mib * i
        kafka = 5 * gib + orders + clicks
        other = 45 * gib * i
        records.append(
            _split_record(
                T0 + i * hour // 4,
                20 * gib + kafka + other,
                kafka,
                {"orders": orders, "clicks": clicks},
            )
        )
    split = growth_split(records[::-1])  # order does not matter
    assert split.total == pytest.approx(4 * (45 * gib + 178 * mib))
    assert split.kafka == pytest.approx(4 * 178 * mib)
    assert split.non_kafka == pytest.approx(4 * 45 * gib)
    assert split.kafka + split.non_kafka == pytest.approx(split.total)
    assert [name for name, _ in split.topics] == ["orders", "clicks"]
    assert dict(split.topics)["orders"] == pytest.approx(400 * mib)
    assert dict(split.topics)["clicks"] == pytest.approx(4 * 78 * mib)


def test_growth_split_uses_only_snapshots_that_report_kafka_bytes() -> None:
    hour = int(MS_PER_HOUR)
    records = [_split_record(T0 + i * hour, 1000 + 30 * i, 500 + 10 * i, {}) for i in range(4)]
    records.append(_split_record(T0 + 4 * hour, 1120, None, {}))  # kafka_bytes missing
    split = growth_split(records)
    assert split.kafka == pytest.approx(10.0)
    assert split.non_kafka == pytest.approx(20.0)  # not dragged by a missing kafka_bytes = 0
    assert split.topics == ()


def test_growth_split_of_one_snapshot_has_no_trend() -> None:
    split = growth_split([_split_record(T0, 10, 5, {"a": 5})])
    assert (split.total, split.kafka, split.non_kafka, split.topics) == (None, None, None, ())


def test_line_fit_quality() -> None:
    hour = int(MS_PER_HOUR)
    exact = line_fit([T0 + i * hour for i in range(5)], [10 + 3 * i for i in range(5)])
    assert exact.slope == pytest.approx(3.0)
    assert exact.r2 == pytest.approx(1.0)
    assert exact.residual_bytes == pytest.approx(0.0, abs=1e-9)
    # residuals +1, -1, +1, -1 around y = 0: slope -0.4 by least squares; check by hand
    ys = [1, -1, 1, -1]
    fit = line_fit([T0 + i * hour for i in range(4)], ys)
    assert fit.slope == pytest.approx(-0.4)
    predicted = [0.6 - 0.4 * i for i in range(4)]
    sse = sum((y - p) ** 2 for y, p in zip(ys, predicted, strict=True))
    assert fit.r2 == pytest.approx(1 - sse / 4.0)
    assert fit.residual_bytes == pytest.approx(math.sqrt(sse / 4))
    flat = line_fit([T0, T0 + hour], [7, 7])
    assert (flat.slope, flat.r2, flat.residual_bytes) == (0.0, 1.0, 0.0)
    assert line_fit([T0], [1]) == line_fit([T0, T0], [1, 2])
    assert line_fit([T0], [1]).slope is None


@pytest.mark.parametrize(
    ("growth", "span_ms", "points", "r2", "expected"),
    [
        (1e9, FORECAST_MIN_SPAN_MS, FORECAST_MIN_POINTS, 0.99, FORECAST_OK),
        # the demo: one minute of snapshots, a steep line: not an alarm
        (45e9, 60_000, 60, 0.99, FORECAST_NOT_ENOUGH_DATA),
        (1e9, FORECAST_MIN_SPAN_MS - 1, 500, 0.99, FORECAST_NOT_ENOUGH_DATA),
        (1e9, 10 * FORECAST_MIN_SPAN_MS, FORECAST_MIN_POINTS - 1, 0.99, FORECAST_NOT_ENOUGH_DATA),
        (None, 60_000, 1, None, FORECAST_NOT_ENOUGH_DATA),
        (-5.0, 2 * FORECAST_MIN_SPAN_MS, 100, 0.9, FORECAST_NOT_GROWING),
        (0.0, 2 * FORECAST_MIN_SPAN_MS, 100, 1.0, FORECAST_NOT_GROWING),
        (1e9, 2 * FORECAST_MIN_SPAN_MS, 100, 0.49, FORECAST_WEAK_FIT),
        (1e9, 2 * FORECAST_MIN_SPAN_MS, 100, 0.5, FORECAST_OK),
    ],
)
def test_forecast_trust_rule(
    growth: float | None, span_ms: int, points: int, r2: float | None, expected: str
) -> None:
    assert forecast_status(growth, span_ms, points, r2) == expected


def test_summarize_disk_carries_split_and_basis() -> None:
    hour = int(MS_PER_HOUR)
    records = [_record("h", "/d", T0 + i * hour // 6, 100 + 12 * i) for i in range(12)]
    d = summarize_disks(records)[("h", "/d")]
    # kafka_bytes = used // 2 in _record: half of the 72 B/h each way (integer halves)
    assert d.growth_bytes_per_hour == pytest.approx(72.0)
    assert d.kafka_growth_bytes_per_hour == pytest.approx(36.0)
    assert d.non_kafka_growth_bytes_per_hour == pytest.approx(36.0)
    assert d.growth_r2 == pytest.approx(1.0)
    assert d.forecast_status == FORECAST_OK
    short = summarize_disks(records[:3])[("h", "/d")]
    assert short.forecast_status == FORECAST_NOT_ENOUGH_DATA


def test_valid_values_bounds_timestamps_and_byte_counts() -> None:
    from diskguard.fleet.aggregation import MAX_BYTES, TS_MAX_MS, TS_MIN_MS, valid_values

    good = {"ts_ms": 1_790_000_000_000, "used_bytes": 0, "topics": [{"bytes": 5}]}
    assert valid_values(good)
    assert valid_values({**good, "kafka_bytes": None, "topics": None})
    assert valid_values({**good, "ts_ms": TS_MIN_MS})
    for ts in (TS_MAX_MS, 253_402_214_400_000, 10**17, -5, 0, TS_MIN_MS - 1):
        assert not valid_values({**good, "ts_ms": ts}), ts
    assert valid_values({**good, "total_bytes": MAX_BYTES})
    assert not valid_values({**good, "total_bytes": MAX_BYTES + 1})
    for name in ("used_bytes", "available_bytes", "deleted_bytes", "pending_reclaim_bytes"):
        assert not valid_values({**good, name: -1}), name
    assert not valid_values({**good, "topics": [{"bytes": -1}]})
    assert not valid_values({**good, "topics": [{"bytes": 1, "partitions": -2}]})


def test_format_ts_past_the_calendar() -> None:
    from diskguard.fleet.formatting import format_ts

    assert format_ts(1_790_000_000_000) == "2026-09-21 14:13"
    assert format_ts(10**17) == "after 9999-12-31"
    assert format_ts(-1e3) == "before 1970-01-01"


def test_exact_fit_agrees_with_the_float_fit_and_does_not_depend_on_order() -> None:
    from diskguard.fleet.exactfit import Sums, exact_fit, exact_slope

    rng = __import__("random").Random(3)
    ts = [1_790_000_000_000 + i * 60_000 + rng.randrange(5_000) for i in range(500)]
    used = [10**14 + 7 * 10**9 * i + rng.randrange(10**8) for i in range(500)]
    exact = exact_fit(Sums.of([t - ts[0] for t in ts], used))
    floats = line_fit(ts, used)
    assert exact.slope == pytest.approx(floats.slope, rel=1e-9)
    assert exact.r2 == pytest.approx(floats.r2, rel=1e-9)
    assert exact.residual_bytes == pytest.approx(floats.residual_bytes, rel=1e-6)
    # two halves summed separately, added: the very same numbers
    a = Sums.of([t - ts[0] for t in ts[:200]], used[:200])
    b = Sums.of([t - ts[0] for t in ts[200:]], used[200:])
    both = Sums(*(x + y for x, y in zip(vars(a).values(), vars(b).values(), strict=True)))
    assert exact_fit(both) == exact
    # any origin: shifting x and y changes nothing
    shifted = exact_fit(Sums.of([t - 10**6 for t in ts], [u - 10**13 for u in used]))
    assert shifted == exact
    # a perfect line has no residual at all, however big the disk
    line = exact_fit(Sums.of(list(range(0, 600_000, 60_000)), [2**52 + 3 * i for i in range(10)]))
    assert line.residual_bytes == 0.0 and line.r2 == 1.0
    assert exact_slope(Sums.of([5, 5], [1, 2])) is None
    assert exact_fit(Sums.of([5], [1])).slope is None


def test_manifest_round_trip_and_changed_files() -> None:
    from diskguard.fleet.manifest import (
        Counts,
        DayMark,
        FileMark,
        KafkaMark,
        Manifest,
        ManifestError,
    )

    m = Manifest().successor(
        {"2026-11-26": DayMark("0000000001-ab", 5760, topics=False)},
        files={"/a.jsonl": FileMark(10, 1000, Counts(ok=3, malformed=1))},
        kafka={"kafka://k:9092/t": KafkaMark({0: 5, 1: 7}, Counts(ok=12, out_of_range=2))},
    )
    again = Manifest.from_json(m.to_json())
    assert again == m
    assert again.version == 1 and again.snapshots == 5760
    assert again.totals() == Counts(ok=15, malformed=1, out_of_range=2)
    assert again.changed([("/a.jsonl", 10, 1000), ("/a.jsonl", 11, 1000), ("/b.jsonl", 1, 1)]) == [
        "/a.jsonl",
        "/b.jsonl",
    ]
    for bad in ("", "[]", '{"format": 2}', '{"format": 1, "version": "x"}'):
        with pytest.raises(ManifestError):
            Manifest.from_json(bad)
