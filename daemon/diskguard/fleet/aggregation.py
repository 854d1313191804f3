"""Fleet aggregation math on plain Python data: the reference for what the Spark job computes.

The Spark job reduces the snapshots to per-disk daily summaries (:mod:`diskguard.fleet.daily`)
so that raw snapshots never travel to the driver, and the driver computes the report from
them (:mod:`diskguard.fleet.window`, with this module's rules where a rule applies to one
disk or host); this module states the rules once, over raw snapshots, in a form a unit test
can check exactly, and the Spark tests compare the job's results against it.

Conventions shared with the Spark job:

- Growth is the least-squares slope of used bytes over time (bytes per hour), so one noisy
  snapshot or a deletion burst moves the trend far less than a two-point difference would.
- Hours to full is measured from the *last* snapshot: ``available / growth``. "Full" means
  available reaches zero (``df``'s view), not ``used == total``: root-reserved blocks are
  never available to the broker. ``None`` when the disk is not growing.
- Overfull time is a step function: the state seen in a snapshot holds until the next
  snapshot. The last snapshot contributes no time (we do not know how long it lasted).
- An episode is a normal -> overfull transition; a window that *starts* overfull counts the
  first snapshot as the start of an episode (it was overfull before we looked).
- Growth is split into Kafka (slope of ``kafka_bytes``, and per topic) and non-Kafka (slope
  of ``used_bytes - kafka_bytes``): a disk filling because of a heap dump is not a retention
  problem, and the report has to say so.
- A forecast is only as good as what it rests on: the window's span, its number of
  snapshots and how well a straight line fits them (R²). :func:`forecast_status` is the
  rule that decides whether a time to full is worth an alarm.
- Which disk fills first: :mod:`diskguard.fleet.fillorder`, from the rows made here (each
  disk's first overfull snapshot, its forecast and the forecast's status).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION = 1
MS_PER_HOUR = 3_600_000.0
OVERFULL = "overfull"
NORMAL = "normal"

# The trust rule for a time-to-full forecast (see forecast_status and docs/aggregate.md).
FORECAST_MIN_SPAN_MS = 3_600_000  # one hour of history
FORECAST_MIN_POINTS = 10
FORECAST_MIN_R2 = 0.5
FORECAST_OK = "ok"
FORECAST_NOT_ENOUGH_DATA = "not_enough_data"
FORECAST_NOT_GROWING = "not_growing"
FORECAST_WEAK_FIT = "weak_fit"

# What a snapshot's values may be (see valid_values): outside it, the record is counted as
# bad (out of range) instead of bending every fit, chart and date of its disk and host.
TS_MIN_MS = 946_684_800_000  # 2000-01-01 UTC: a clock that was never set reads 1970
TS_MAX_MS = 4_102_444_800_000  # 2100-01-01 UTC (exclusive): a skewed or garbled clock
MAX_BYTES = 2**53  # 8 PiB: no disk is larger, and every sum of them stays exact
BYTE_FIELDS = (
    "total_bytes",
    "used_bytes",
    "available_bytes",
    "kafka_bytes",
    "pending_reclaim_bytes",
    "deleted_bytes",
)


def valid_values(record: Mapping[str, Any]) -> bool:
    """Whether a parsed schema-1 snapshot's numbers are ones a real disk and clock give.

    ``ts_ms`` in [2000-01-01, 2100-01-01) UTC; every byte count (and a topic's partition
    count) in [0, 8 PiB]. One host stamping 9999-12-31 or -5 would otherwise become every
    disk's "latest" snapshot, turn its growth to noise and put dates past the calendar into
    the report. Missing optional values are fine (they default to 0).
    """
    ts = record.get("ts_ms")
    if ts is None or not TS_MIN_MS <= int(ts) < TS_MAX_MS:
        return False
    for name in BYTE_FIELDS:
        value = record.get(name)
        if value is not None and not 0 <= int(value) <= MAX_BYTES:
            return False
    for topic in record.get("topics") or ():
        for name in ("bytes", "partitions"):
            value = topic.get(name)
            if value is not None and not 0 <= int(value) <= MAX_BYTES:
                return False
    return True


def least_squares_slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Slope of the ordinary least-squares line through ``(xs, ys)``.

    Centred sums (two passes) rather than the textbook ``n*Sxy - Sx*Sy`` form: timestamps
    in ms are ~1.7e12 and their squares lose every significant digit in a double. ``None``
    when there are fewer than two distinct x values: no trend can be told from one moment.
    """
    if len(xs) != len(ys):
        raise ValueError(f"xs and ys differ in length ({len(xs)} != {len(ys)})")
    n = len(xs)
    if n < 2:
        return None
    mean_x = sum(xs) / n
    mean_y = sum(ys) / n
    sxx = 0.0
    sxy = 0.0
    for x, y in zip(xs, ys, strict=True):
        dx = x - mean_x
        sxx += dx * dx
        sxy += dx * (y - mean_y)
    if sxx == 0.0:
        return None
    return sxy / sxx


def growth_bytes_per_hour(ts_ms: Sequence[int], used_bytes: Sequence[int]) -> float | None:
    """Least-squares growth of ``used_bytes`` in bytes per hour (x in hours, not ms)."""
    return least_squares_slope([t / MS_PER_HOUR for t in ts_ms], [float(u) for u in used_bytes])


@dataclass(frozen=True)
class LineFit:
    """A least-squares line through a disk's snapshots and how well it fits them.

    ``r2`` is the coefficient of determination (1.0 = every snapshot on the line; 1.0 too
    when the values never change, as Spark's ``regr_r2``); ``residual_bytes`` the root mean
    square distance of the snapshots from the line, in bytes. All None without a trend
    (fewer than two distinct timestamps).
    """

    slope: float | None
    r2: float | None
    residual_bytes: float | None


def line_fit(ts_ms: Sequence[int], values: Sequence[int | float]) -> LineFit:
    """Slope (bytes per hour), R² and RMS residual of ``values`` over ``ts_ms``.

    Relative to the first point (exact integer differences): sums of epoch hours in doubles
    would shift every residual by hundreds of bytes at GiB/h rates.
    """
    if not ts_ms:
        return LineFit(None, None, None)
    xs = [(t - ts_ms[0]) / MS_PER_HOUR for t in ts_ms]
    ys = [float(v - values[0]) for v in values]
    slope = least_squares_slope(xs, ys)
    if slope is None:
        return LineFit(None, None, None)
    n = len(ys)
    mean_x = sum(xs) / n
    mean_y = sum(ys) / n
    syy = sum((y - mean_y) ** 2 for y in ys)
    sse = sum((y - (mean_y + slope * (x - mean_x))) ** 2 for x, y in zip(xs, ys, strict=True))
    r2 = 1.0 if syy == 0.0 else max(0.0, 1.0 - sse / syy)
    return LineFit(slope, r2, (sse / n) ** 0.5)


def forecast_status(
    growth: float | None, span_ms: int | float, points: int, r2: float | None
) -> str:
    """Whether a time-to-full forecast may be shown as one, and if not, why.

    - ``not_enough_data``: under :data:`FORECAST_MIN_SPAN_MS` (1 h) of history or under
      :data:`FORECAST_MIN_POINTS` (10) snapshots. A minute of a disk's life extrapolated to
      "full in 2 hours" is noise, not a warning; checked first, because with too little data
      "not growing" cannot be told either.
    - ``not_growing``: the slope is not positive (no time to full).
    - ``weak_fit``: R² under :data:`FORECAST_MIN_R2` (0.5): the snapshots are mostly not on
      a line (deletion saw-tooth, bursts), so the line's crossing of 100% means little.
    - ``ok``: a forecast worth acting on.
    """
    if span_ms < FORECAST_MIN_SPAN_MS or points < FORECAST_MIN_POINTS:
        return FORECAST_NOT_ENOUGH_DATA
    if growth is None or growth <= 0:
        return FORECAST_NOT_GROWING
    if r2 is None or r2 < FORECAST_MIN_R2:
        return FORECAST_WEAK_FIT
    return FORECAST_OK


@dataclass(frozen=True)
class GrowthSplit:
    """Where a disk's growth comes from, in bytes per hour (least-squares slopes).

    ``kafka`` is the slope of ``kafka_bytes`` and ``non_kafka`` that of ``used_bytes -
    kafka_bytes`` (everything else on the filesystem), both over the snapshots that report
    ``kafka_bytes``; with all of them reporting it, ``kafka + non_kafka == total`` (slopes
    are linear). ``topics``: each topic's slope over the snapshots that list it, biggest
    first; they need not add up to ``kafka`` (checkpoints and indexes belong to no topic).
    """

    total: float | None
    kafka: float | None
    non_kafka: float | None
    topics: tuple[tuple[str, float], ...]


def growth_split(records: Sequence[Mapping[str, Any]]) -> GrowthSplit:
    """The growth split of one disk's (deduplicated) snapshots."""
    ordered = sorted(records, key=lambda r: int(r["ts_ms"]))
    total = growth_bytes_per_hour(
        [int(r["ts_ms"]) for r in ordered], [int(r["used_bytes"]) for r in ordered]
    )
    known = [r for r in ordered if r.get("kafka_bytes") is not None]
    known_ts = [int(r["ts_ms"]) for r in known]
    kafka = growth_bytes_per_hour(known_ts, [int(r["kafka_bytes"]) for r in known])
    non_kafka = growth_bytes_per_hour(
        known_ts, [int(r["used_bytes"]) - int(r["kafka_bytes"]) for r in known]
    )
    per_topic: dict[str, tuple[list[int], list[int]]] = {}
    for r in ordered:
        for t in r.get("topics") or ():
            if t.get("topic") is None:
                continue
            xs, ys = per_topic.setdefault(str(t["topic"]), ([], []))
            xs.append(int(r["ts_ms"]))
            ys.append(int(t.get("bytes") or 0))
    topics = []
    for name, (xs, ys) in per_topic.items():
        slope = growth_bytes_per_hour(xs, ys)
        if slope is not None:
            topics.append((name, slope))
    topics.sort(key=lambda item: (-item[1], item[0]))
    return GrowthSplit(total, kafka, non_kafka, tuple(topics))


def hours_to_full(available_bytes: int | float, growth: float | None) -> float | None:
    """Hours until ``available_bytes`` is used up at ``growth`` bytes/hour; None if not growing."""
    if growth is None or growth <= 0:
        return None
    return max(float(available_bytes), 0.0) / growth


def used_ratio(used_bytes: int | float, available_bytes: int | float) -> float | None:
    """``df``'s Use%: used / (used + available to non-root); None for an empty filesystem."""
    denominator = float(used_bytes) + float(available_bytes)
    if denominator <= 0:
        return None
    return float(used_bytes) / denominator


@dataclass(frozen=True)
class Episode:
    """One overfull stretch: from the first overfull snapshot to the first snapshot after it
    that is normal (or to the last snapshot, when the window ends overfull)."""

    start_ts_ms: int
    end_ts_ms: int
    open: bool  # still overfull at the last snapshot

    @property
    def seconds(self) -> float:
        return (self.end_ts_ms - self.start_ts_ms) / 1000.0


@dataclass(frozen=True)
class OverfullHistory:
    episodes: tuple[Episode, ...]
    seconds: float

    @property
    def count(self) -> int:
        return len(self.episodes)


def overfull_history(points: Iterable[tuple[int, str]]) -> OverfullHistory:
    """Episodes and total overfull seconds from ``(ts_ms, flow_state)`` snapshots of one disk.

    Points may come in any order (a spool replay or a Kafka partition need not be sorted);
    duplicates of the same timestamp must already be removed.
    """
    ordered = sorted(points, key=lambda p: p[0])
    episodes: list[Episode] = []
    seconds = 0.0
    start: int | None = None
    for i, (ts, state) in enumerate(ordered):
        overfull = state == OVERFULL
        if overfull and start is None:
            start = ts
        elif not overfull and start is not None:
            episodes.append(Episode(start, ts, open=False))
            start = None
        if overfull and i + 1 < len(ordered):
            seconds += (ordered[i + 1][0] - ts) / 1000.0
    if start is not None:
        episodes.append(Episode(start, ordered[-1][0], open=True))
    return OverfullHistory(tuple(episodes), seconds)


@dataclass(frozen=True)
class DiskSummary:
    """One row of ``disks.parquet``, computed the slow, obvious way."""

    host: str
    mount: str
    snapshots: int
    first_ts_ms: int
    last_ts_ms: int
    total_bytes: int
    used_bytes: int
    available_bytes: int
    kafka_bytes: int
    growth_bytes_per_hour: float | None
    hours_to_full: float | None
    overfull_episodes: int
    overfull_seconds: float
    deleted_bytes: int
    peak_alert_level: int
    kafka_growth_bytes_per_hour: float | None = None
    non_kafka_growth_bytes_per_hour: float | None = None
    growth_r2: float | None = None
    growth_residual_bytes: float | None = None
    forecast_status: str = FORECAST_NOT_ENOUGH_DATA
    #: The first overfull snapshot in the window (None: never overfull in it).
    first_overfull_ts_ms: int | None = None


def dedup_snapshots(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Keep the first record per ``(host, mount, ts_ms)``: the shipper delivers at least once."""
    seen: set[tuple[str, str, int]] = set()
    unique: list[Mapping[str, Any]] = []
    for record in records:
        key = (str(record["host"]), str(record["mount"]), int(record["ts_ms"]))
        if key not in seen:
            seen.add(key)
            unique.append(record)
    return unique


def summarize_disk(records: Sequence[Mapping[str, Any]]) -> DiskSummary:
    """The summary of one disk's (deduplicated) snapshots; raises ValueError when empty."""
    if not records:
        raise ValueError("no snapshots for this disk")
    ordered = sorted(records, key=lambda r: int(r["ts_ms"]))
    last = ordered[-1]
    ts = [int(r["ts_ms"]) for r in ordered]
    fit = line_fit(ts, [int(r["used_bytes"]) for r in ordered])
    growth = fit.slope
    split = growth_split(ordered)
    history = overfull_history((int(r["ts_ms"]), str(r["flow_state"])) for r in ordered)
    return DiskSummary(
        host=str(last["host"]),
        mount=str(last["mount"]),
        snapshots=len(ordered),
        first_ts_ms=ts[0],
        last_ts_ms=ts[-1],
        total_bytes=int(last["total_bytes"]),
        used_bytes=int(last["used_bytes"]),
        available_bytes=int(last["available_bytes"]),
        kafka_bytes=int(last.get("kafka_bytes") or 0),
        growth_bytes_per_hour=growth,
        hours_to_full=hours_to_full(int(last["available_bytes"]), growth),
        overfull_episodes=history.count,
        overfull_seconds=history.seconds,
        deleted_bytes=sum(int(r.get("deleted_bytes") or 0) for r in ordered),
        peak_alert_level=max(int(r.get("alert_level") or 0) for r in ordered),
        kafka_growth_bytes_per_hour=split.kafka,
        non_kafka_growth_bytes_per_hour=split.non_kafka,
        growth_r2=fit.r2,
        growth_residual_bytes=fit.residual_bytes,
        forecast_status=forecast_status(growth, ts[-1] - ts[0], len(ordered), fit.r2),
        first_overfull_ts_ms=history.episodes[0].start_ts_ms if history.episodes else None,
    )


def summarize_disks(records: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], DiskSummary]:
    """Deduplicate, group by ``(host, mount)`` and summarize each disk."""
    by_disk: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for record in dedup_snapshots(records):
        by_disk.setdefault((str(record["host"]), str(record["mount"])), []).append(record)
    return {key: summarize_disk(rows) for key, rows in sorted(by_disk.items())}


def fleet_mean_ratio(ratios: Iterable[float | None]) -> float | None:
    """The mean of the hosts' used ratios (None without any); ``math.fsum``, so that it does
    not depend on the order the hosts come in."""
    known = [r for r in ratios if r is not None]
    return math.fsum(known) / len(known) if known else None


def fleet_skew(ratios: Mapping[str, float | None]) -> dict[str, float | None]:
    """Each host's used ratio divided by the fleet mean ratio (1.0 = average, 2.0 = twice).

    The mean is over hosts, not bytes: one huge host must not define "normal" for the rest.
    """
    mean = fleet_mean_ratio(ratios.values()) or 0.0
    return {host: (r / mean if r is not None and mean > 0 else None) for host, r in ratios.items()}


def forecast_full_ts_ms(last_ts_ms: int, hours: float | None) -> int | None:
    """When the disk fills, as epoch ms, or None when it is not growing."""
    if hours is None:
        return None
    return int(last_ts_ms + hours * MS_PER_HOUR)


def downsample_bucket(ts_ms: int, first_ts_ms: int, last_ts_ms: int, buckets: int) -> int:
    """Which of ``buckets`` equal time slices of ``[first, last]`` holds ``ts_ms``.

    The Spark job computes the same expression in SQL to bound the points per disk it sends
    to the driver for the report; this is the reference for it.
    """
    if buckets < 1:
        raise ValueError(f"buckets must be at least 1, got {buckets}")
    span = last_ts_ms - first_ts_ms
    if span <= 0:
        return 0
    return min(int((ts_ms - first_ts_ms) * buckets // span), buckets - 1)
