"""The report's aggregation rules as Spark SQL, over a window of daily summaries.

The inputs are the disk-day and topic-day rows of :mod:`diskguard.fleet.daily`; a window is
any run of days (all of them, or the last N). Everything stays in the JVM except the last
step of each disk's line fit: Spark adds the days' exact sums (``decimal(38,0)``) and the
driver finishes the fit in Python integers (:func:`exactfit.disk_row`), one row per
disk. The tests hold every output to the plain-Python reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from diskguard.fleet import aggregation
from diskguard.fleet.daily import DAY_MS, EXACT

DISK = ("host", "mount")


def _day_start(first_ts: Column) -> Column:
    return (first_ts - first_ts % F.lit(DAY_MS)).cast(EXACT)


def _sum(column: Column, name: str) -> Column:
    return F.sum(column).cast(EXACT).alias(name)


def disk_windows(disk_days: DataFrame) -> DataFrame:
    """One row per disk: what :func:`exactfit.disk_row` needs, summed over the days.

    Each day's sums have x from the day's start; shifted here to the disk's first snapshot
    (``a`` = day start - first ts): ``Σ(x+a) = Σx + na``, ``Σ(x+a)² = Σx² + 2aΣx + na²``,
    ``Σ(x+a)y = Σxy + aΣy``, all exact. ``s_yy0`` is ``Σ(y − used_origin)²`` with the disk's
    lowest used bytes as origin: squares of the swing, not of whole disks, so that a year of
    snapshots of an 8 PiB disk still fits 38 digits.

    Overfull time and episodes cross midnight: the day's last state holds until the next
    day's first snapshot, and a day that starts overfull starts an episode unless the
    previous day (the previous one with snapshots) ended overfull. The first overfull
    snapshot is the earliest start of any day's runs (a run that continues the day before
    starts later than that day's).
    """
    by_day = Window.partitionBy(*DISK).orderBy("day")
    whole = Window.partitionBy(*DISK)
    n = F.col("snapshots").cast(EXACT)
    days = disk_days.select(
        *DISK,
        "snapshots",
        "first_ts_ms",
        "last_ts_ms",
        "last",
        "deleted_bytes",
        "peak_alert_level",
        "overfull_ms",
        "inner_episode_starts",
        "first_overfull",
        "last_overfull",
        "runs",
        "min_used",
        *[c for c in disk_days.columns if c.startswith(("sum_", "unk_sum_"))],
        "kafka_snapshots",
        F.lead("first_ts_ms").over(by_day).alias("_next_first_ts"),
        F.lag("last_overfull").over(by_day).alias("_previous_last_overfull"),
        (_day_start(F.col("first_ts_ms")) - F.min("first_ts_ms").over(whole).cast(EXACT)).alias(
            "_a"
        ),
        F.min("min_used").over(whole).alias("used_origin"),
    )
    a = F.col("_a")
    y0 = F.col("used_origin").cast(EXACT)
    gap = F.when(
        F.col("last_overfull") & F.col("_next_first_ts").isNotNull(),
        F.col("_next_first_ts") - F.col("last_ts_ms"),
    ).otherwise(F.lit(0))
    starts_here = F.when(
        F.col("first_overfull") & ~F.coalesce(F.col("_previous_last_overfull"), F.lit(False)),
        F.lit(1),
    ).otherwise(F.lit(0))
    sum_x, sum_xx = F.col("sum_x").cast(EXACT), F.col("sum_xx")
    sum_y, sum_xy = F.col("sum_y"), F.col("sum_xy")
    # the Kafka fit's sums: over the snapshots that report kafka_bytes
    kn = F.col("kafka_snapshots").cast(EXACT)
    kx = sum_x - F.col("unk_sum_x").cast(EXACT)
    kxx = sum_xx - F.col("unk_sum_xx")
    ky = sum_y - F.col("unk_sum_y")
    kxy = sum_xy - F.col("unk_sum_xy")
    return days.groupBy(*DISK).agg(
        F.sum("snapshots").alias("snapshots"),
        F.min("first_ts_ms").alias("first_ts_ms"),
        F.max("last_ts_ms").alias("last_ts_ms"),
        F.max_by("last", "last_ts_ms").alias("last"),
        F.sum("deleted_bytes").alias("deleted_bytes"),
        F.max("peak_alert_level").alias("peak_alert_level"),
        F.sum(F.col("overfull_ms") + gap).alias("overfull_ms"),
        F.sum(F.col("inner_episode_starts") + starts_here).alias("overfull_episodes"),
        # a day's runs are in time order; the earliest day's first run is the first overfull
        F.min(F.array_min(F.transform("runs", lambda r: r["start_ts_ms"]))).alias(
            "first_overfull_ts_ms"
        ),
        F.first("used_origin").alias("used_origin"),
        _sum(sum_x + n * a, "s_x"),
        _sum(sum_xx + 2 * a * sum_x + n * a * a, "s_xx"),
        _sum(sum_y, "s_y"),
        _sum(sum_xy + a * sum_y, "s_xy"),
        _sum(F.col("sum_yy") - 2 * y0 * sum_y + n * y0 * y0, "s_yy0"),
        _sum(kn, "k_n"),
        _sum(kx + kn * a, "k_x"),
        _sum(kxx + 2 * a * kx + kn * a * a, "k_xx"),
        _sum(F.col("sum_k"), "k_k"),
        _sum(F.col("sum_xk") + a * F.col("sum_k"), "k_xk"),
        _sum(ky, "k_y"),
        _sum(kxy + a * ky, "k_xy"),
    )


def overfull_episodes(disk_days: DataFrame, limit: int) -> list[dict[str, Any]]:
    """The most recent ``limit`` overfull episodes (newest first; ties by host and mount).

    Each day's runs are fragments of episodes: a run that starts at a day's first snapshot
    continues the previous day's last run when that day ended overfull. An open run (the day
    ended overfull) ends at the next day's first snapshot when that one is normal, and is
    still open when no day follows.
    """
    by_day = Window.partitionBy(*DISK).orderBy("day")
    framed = disk_days.select(
        *DISK,
        "day",
        "first_ts_ms",
        "runs",
        F.lag("last_overfull").over(by_day).alias("_previous_last_overfull"),
        F.lead("first_ts_ms").over(by_day).alias("_next_first_ts"),
        F.lead("first_overfull").over(by_day).alias("_next_first_overfull"),
    )
    # lag/lead over every day first: a day without runs still ends or starts a chain
    days = framed.where(F.size("runs") > 0)
    run = F.col("r")
    fragments = days.select(
        *DISK,
        "first_ts_ms",
        "_previous_last_overfull",
        "_next_first_ts",
        "_next_first_overfull",
        F.explode("runs").alias("r"),
    ).select(
        *DISK,
        run["start_ts_ms"].alias("start_ts_ms"),
        (
            (run["start_ts_ms"] == F.col("first_ts_ms"))
            & F.coalesce(F.col("_previous_last_overfull"), F.lit(False))
        ).alias("continues"),
        F.when(
            run["open"] & F.col("_next_first_ts").isNotNull() & ~F.col("_next_first_overfull"),
            F.col("_next_first_ts"),
        )
        .otherwise(run["end_ts_ms"])
        .alias("end_ts_ms"),
        (run["open"] & F.col("_next_first_ts").isNull()).alias("open"),
    )
    chain = (
        Window.partitionBy(*DISK)
        .orderBy("start_ts_ms")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    rows = (
        fragments.withColumn(
            "episode", F.sum(F.when(F.col("continues"), 0).otherwise(1)).over(chain)
        )
        .groupBy(*DISK, "episode")
        .agg(
            F.min("start_ts_ms").alias("start_ts_ms"),
            F.max("end_ts_ms").alias("end_ts_ms"),
            F.max_by("open", "start_ts_ms").alias("open"),
        )
        .orderBy(F.col("start_ts_ms").desc(), *DISK)
        .limit(limit)
        .collect()
    )
    return [
        {
            "host": r["host"],
            "mount": r["mount"],
            "start_ts_ms": int(r["start_ts_ms"]),
            "end_ts_ms": int(r["end_ts_ms"]),
            "open": bool(r["open"]),
        }
        for r in rows
    ]


def topic_windows(topic_days: DataFrame) -> DataFrame:
    """Per disk and topic over the window: the latest sighting and the growth slope.

    The slope comes from the days' exact sums, shifted to the first day the disk listed the
    topic and to its lowest bytes (as in :func:`disk_windows`): numerator and denominator
    are exact integers, each rounded once to a double.
    """
    key = (*DISK, "topic")
    whole = Window.partitionBy(*key)
    start = _day_start(F.col("seen_ts_ms"))
    framed = topic_days.select(
        *key,
        *[F.col(c) for c in ("snapshots", "sum_x", "sum_xx", "sum_y", "sum_xy", "seen_ts_ms")],
        "seen_bytes",
        "seen_partitions",
        (start - F.min(start).over(whole)).alias("_a"),
        F.min("min_bytes").over(whole).cast(EXACT).alias("_y0"),
    )
    a, y0 = F.col("_a"), F.col("_y0")
    n = F.col("snapshots").cast(EXACT)
    sum_x = F.col("sum_x").cast(EXACT)
    shifted = framed.groupBy(*key).agg(
        _sum(n, "_n"),
        _sum(sum_x + n * a, "_sx"),
        _sum(F.col("sum_xx") + 2 * a * sum_x + n * a * a, "_sxx"),
        _sum(F.col("sum_y") - n * y0, "_sy"),
        _sum(F.col("sum_xy") + a * F.col("sum_y") - y0 * (sum_x + n * a), "_sxy"),
        F.max("seen_ts_ms").alias("seen_ts_ms"),
        F.max_by(F.struct("seen_bytes", "seen_partitions"), "seen_ts_ms").alias("_seen"),
    )
    n, sx = F.col("_n"), F.col("_sx")
    numerator = n * F.col("_sxy") - sx * F.col("_sy")
    denominator = n * F.col("_sxx") - sx * sx
    slope = F.when(
        denominator > 0,
        numerator.cast("double") / denominator.cast("double") * F.lit(aggregation.MS_PER_HOUR),
    )
    return shifted.select(
        *key,
        "seen_ts_ms",
        F.col("_seen.seen_bytes").alias("seen_bytes"),
        F.col("_seen.seen_partitions").alias("seen_partitions"),
        slope.alias("growth_bytes_per_hour"),
    )


def topic_aggregates(per_disk: DataFrame, disks: DataFrame) -> DataFrame:
    """Per topic across the fleet, from :func:`topic_windows`.

    ``bytes``: sum over disks of the topic's bytes in each disk's latest snapshot (0 on a
    disk whose latest snapshot no longer lists it). ``growth_bytes_per_hour``: the SUM OF
    PER-DISK least-squares slopes: snapshots of different hosts are not taken at the same
    instants, so a fleet-wide series would need resampling, while the sum of slopes equals
    the slope of the sum for aligned samples and needs no alignment. ``disks``: one entry
    per disk (host, mount, bytes, share of the topic's bytes, growth), biggest first.
    """
    joined = per_disk.join(disks.select(*DISK, "last_ts_ms"), list(DISK))
    current = F.col("seen_ts_ms") == F.col("last_ts_ms")
    rows = joined.select(
        "topic",
        *DISK,
        F.when(current, F.col("seen_bytes")).otherwise(F.lit(0)).cast("long").alias("bytes"),
        F.when(current, F.col("seen_partitions")).otherwise(F.lit(0)).alias("partitions"),
        "growth_bytes_per_hour",
    )
    topics = rows.groupBy("topic").agg(
        F.sum("bytes").cast("long").alias("bytes"),
        F.sum("growth_bytes_per_hour").alias("growth_bytes_per_hour"),
        F.sum("partitions").cast("long").alias("partitions"),
        F.sum(F.when(F.col("bytes") > 0, 1).otherwise(0)).cast("long").alias("disk_count"),
        F.sort_array(
            F.collect_list(F.struct("bytes", "host", "mount", "growth_bytes_per_hour")),
            asc=False,
        ).alias("per_disk"),
    )
    share = F.transform(
        F.col("per_disk"),
        lambda d: F.struct(
            d["host"].alias("host"),
            d["mount"].alias("mount"),
            d["bytes"].alias("bytes"),
            F.when(F.col("bytes") > 0, d["bytes"] / F.col("bytes")).alias("share"),
            d["growth_bytes_per_hour"].alias("growth_bytes_per_hour"),
        ),
    )
    return topics.withColumn("disks", share).drop("per_disk")


def host_aggregates(disks: DataFrame) -> DataFrame:
    """Per host totals at the latest snapshot of each of its disks, and skew.

    ``skew`` = the host's used ratio / the fleet mean of host used ratios (mean over hosts,
    so one huge host does not define normal), as in :func:`aggregation.fleet_skew`.
    """
    hosts = disks.groupBy("host").agg(
        F.count(F.lit(1)).alias("disks"),
        F.max("last_ts_ms").alias("last_ts_ms"),
        F.sum("total_bytes").cast("long").alias("total_bytes"),
        F.sum("used_bytes").cast("long").alias("used_bytes"),
        F.sum("available_bytes").cast("long").alias("available_bytes"),
        F.sum("kafka_bytes").cast("long").alias("kafka_bytes"),
        F.sum("growth_bytes_per_hour").alias("growth_bytes_per_hour"),
        F.min("hours_to_full").alias("min_hours_to_full"),
        F.sum("overfull_episodes").cast("long").alias("overfull_episodes"),
    )
    used = F.col("used_bytes").cast("double")
    avail = F.col("available_bytes").cast("double")
    hosts = hosts.withColumn("used_ratio", F.when(used + avail > 0, used / (used + avail)))
    mean = hosts.agg(F.avg("used_ratio").alias("fleet_mean_used_ratio"))
    return hosts.crossJoin(mean).withColumn(
        "skew",
        F.when(
            F.col("fleet_mean_used_ratio") > 0,
            F.col("used_ratio") / F.col("fleet_mean_used_ratio"),
        ),
    )


def downsampled_series(
    snapshots: DataFrame, chosen: Sequence[dict[str, Any]], points: int
) -> dict[tuple[str, str], list[tuple[int, float, float]]]:
    """At most ``points`` (ts_ms, used, available) averages per chosen disk, for the report.

    ``chosen`` are collected disk rows: their first/last timestamps are known on the driver,
    so they become literals instead of a join. The bucket expression is
    :func:`aggregation.downsample_bucket` in SQL.
    """
    if not chosen:
        return {}
    match: Column = F.lit(False)
    first: Column = F.lit(None).cast("long")
    last: Column = F.lit(None).cast("long")
    for disk in chosen:
        this = (F.col("host") == F.lit(disk["host"])) & (F.col("mount") == F.lit(disk["mount"]))
        match = match | this
        first = F.when(this, F.lit(int(disk["first_ts_ms"]))).otherwise(first)
        last = F.when(this, F.lit(int(disk["last_ts_ms"]))).otherwise(last)
    span = last - first
    bucket = F.when(span <= 0, F.lit(0)).otherwise(
        F.least(F.floor((F.col("ts_ms") - first) * F.lit(points) / span), F.lit(points - 1))
    )
    rows = (
        snapshots.where(match)
        .groupBy("host", "mount", bucket.alias("bucket"))
        .agg(
            F.avg("ts_ms").alias("ts_ms"),
            F.avg("used_bytes").alias("used"),
            F.avg("available_bytes").alias("available"),
        )
        .collect()
    )
    series: dict[tuple[str, str], list[tuple[int, float, float]]] = {}
    for row in sorted(rows, key=lambda r: (r["host"], r["mount"], r["bucket"])):
        series.setdefault((row["host"], row["mount"]), []).append(
            (int(row["ts_ms"]), float(row["used"]), float(row["available"]))
        )
    return series
