"""The aggregation rules of :mod:`diskguard.fleet.aggregation`, as Spark SQL over DataFrames.

Everything stays in the JVM (window functions for dedup and episodes, ``regr_slope`` for
growth, no Python UDF): these functions only build plans, and the collected results are
small. The tests hold every output to the plain-Python reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from diskguard.fleet import aggregation


def _hours(ts: Column) -> Column:
    return ts.cast("double") / F.lit(aggregation.MS_PER_HOUR)


def dedup(snapshots: DataFrame) -> DataFrame:
    """One record per ``(host, mount, ts_ms)`` (the shipper delivers at least once).

    Done with the same window (partition by disk, order by time) that the history needs
    next, rather than ``dropDuplicates``: one shuffle and one sort serve both, and 1M rows
    carrying topic arrays are not pushed through a second hash aggregation.
    """
    w = Window.partitionBy("host", "mount").orderBy("ts_ms")
    previous = F.lag("ts_ms").over(w)
    return (
        snapshots.withColumn("_previous_ts_ms", previous)
        .where(F.col("_previous_ts_ms").isNull() | (F.col("_previous_ts_ms") != F.col("ts_ms")))
        .drop("_previous_ts_ms")
    )


def with_history(snapshots: DataFrame) -> DataFrame:
    """Per-snapshot episode bookkeeping over each disk's time order (see aggregation).

    Every column comes from one window operator (same partitioning and order, no column
    depending on another), so the rows, topic arrays and all, are buffered once.
    ``episode_id`` tells overfull runs apart ("gaps and islands"): along a run of overfull
    snapshots the row number and the running count of overfull snapshots both grow by one,
    so their difference is constant, and it grows across every normal snapshot in between.
    """
    w = Window.partitionBy("host", "mount").orderBy("ts_ms")
    so_far = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    overfull = F.col("flow_state") == F.lit(aggregation.OVERFULL)
    prev_state = F.lag("flow_state").over(w)
    next_ts = F.lead("ts_ms").over(w)
    episode_start = overfull & (prev_state.isNull() | (prev_state != F.lit(aggregation.OVERFULL)))
    # Hours since the disk's first snapshot: the x of the growth fits. Epoch hours (~5e5)
    # cost regr_slope about nine digits; the first ts comes from the same window.
    since_first = (F.col("ts_ms") - F.first("ts_ms").over(w)).cast("double") / F.lit(
        aggregation.MS_PER_HOUR
    )
    return snapshots.select(
        "*",
        next_ts.alias("next_ts_ms"),
        since_first.alias("hours_since_first"),
        episode_start.cast("int").alias("episode_start"),
        F.when(overfull & next_ts.isNotNull(), next_ts - F.col("ts_ms"))
        .otherwise(F.lit(0))
        .cast("long")
        .alias("overfull_ms"),
        (F.row_number().over(w) - F.sum(overfull.cast("int")).over(so_far)).alias("episode_id"),
    )


def disk_aggregates(history: DataFrame) -> DataFrame:
    """One row per disk: the facts of :func:`aggregation.summarize_disk`, in Spark SQL.

    The growth split and the forecast's basis come along: ``kafka_growth_bytes_per_hour`` /
    ``non_kafka_growth_bytes_per_hour`` (slopes of ``kafka_bytes`` and ``used - kafka`` over
    the snapshots that report ``kafka_bytes``), ``growth_r2``, ``growth_residual_bytes``
    (RMS distance of the snapshots from the line) and ``forecast_status``
    (:func:`aggregation.forecast_status`).

    The residuals need each disk's means and slope first: ``Syy·(1 - regr_r2)`` would cancel
    to noise on a near-perfect line (kilobytes of "spread" on 1e11-byte disks), centred
    residuals do not. The line comes from window aggregates over the whole disk, so that one
    pass over the history (already partitioned and sorted by disk: no shuffle, no sort)
    gives every aggregate; a join of the history with a first aggregation read the history
    three times. x is hours since the disk's first snapshot (see :func:`with_history`). The
    latest snapshot's values come from its own row (a narrow second scan of the history).
    """
    ts = F.col("ts_ms")
    x = F.col("hours_since_first")
    used_d = F.col("used_bytes").cast("double")
    kafka_d = F.col("kafka_bytes_reported").cast("double")
    growth = F.regr_slope(used_d, x)
    whole_disk = Window.partitionBy("host", "mount")
    lined = history.select(
        "*",
        F.avg(x).over(whole_disk).alias("_mean_x"),
        # from the exact long sum: an average of 1e11-byte doubles drifts by a few bytes
        (
            F.sum("used_bytes").over(whole_disk).cast("double") / F.count(F.lit(1)).over(whole_disk)
        ).alias("_mean_y"),
        growth.over(whole_disk).alias("_slope"),
    )
    dy = used_d - F.col("_mean_y")
    dx = x - F.col("_mean_x")
    residual_sq = F.pow(dy - F.col("_slope") * dx, 2)
    facts = lined.groupBy("host", "mount").agg(
        F.count(F.lit(1)).alias("snapshots"),
        F.min(ts).alias("first_ts_ms"),
        growth.alias("growth_bytes_per_hour"),
        F.regr_slope(kafka_d, x).alias("kafka_growth_bytes_per_hour"),
        F.regr_slope(used_d - kafka_d, x).alias("non_kafka_growth_bytes_per_hour"),
        F.sum("episode_start").cast("long").alias("overfull_episodes"),
        (F.sum("overfull_ms") / F.lit(1000.0)).alias("overfull_seconds"),
        F.sum("deleted_bytes").cast("long").alias("deleted_bytes"),
        F.max("alert_level").alias("peak_alert_level"),
        F.sum(residual_sq).alias("_sse"),
        F.sum(F.pow(dy, 2)).alias("_syy"),
    )
    # The latest snapshot's values: its row is the one without a next snapshot (the history
    # is deduplicated, so there is exactly one per disk). Taking them from that row rather
    # than with max_by(..., ts) keeps string buffers out of the aggregation, which can then
    # be a generated hash aggregation instead of an interpreted sort-based one.
    latest = history.where(F.col("next_ts_ms").isNull()).select(
        "host",
        "mount",
        "device",
        ts.alias("last_ts_ms"),
        "total_bytes",
        "used_bytes",
        "available_bytes",
        "kafka_bytes",
        "pending_reclaim_bytes",
        "flow_state",
        F.col("alert_level").alias("_last_alert_level"),
    )
    # a left join (every disk has its latest row) keeps these columns nullable, as max_by's
    disks = facts.join(latest, ["host", "mount"], "left").select(
        "host",
        "mount",
        "device",
        "snapshots",
        "first_ts_ms",
        "last_ts_ms",
        "total_bytes",
        "used_bytes",
        "available_bytes",
        "kafka_bytes",
        "pending_reclaim_bytes",
        "growth_bytes_per_hour",
        "kafka_growth_bytes_per_hour",
        "non_kafka_growth_bytes_per_hour",
        "overfull_episodes",
        "overfull_seconds",
        "deleted_bytes",
        "peak_alert_level",
        "flow_state",
        F.col("_last_alert_level").alias("alert_level"),
        "_sse",
        "_syy",
    )
    used = F.col("used_bytes").cast("double")
    avail = F.col("available_bytes").cast("double")
    growth_col = F.col("growth_bytes_per_hour")
    r2 = F.when(
        growth_col.isNotNull(),
        F.when(F.col("_syy") == 0, F.lit(1.0)).otherwise(
            F.greatest(F.lit(0.0), F.lit(1.0) - F.col("_sse") / F.col("_syy"))
        ),
    )
    residual = F.when(
        growth_col.isNotNull(), F.sqrt(F.col("_sse") / F.col("snapshots").cast("double"))
    )
    span = F.col("last_ts_ms") - F.col("first_ts_ms")
    status = (
        F.when(
            (span < F.lit(aggregation.FORECAST_MIN_SPAN_MS))
            | (F.col("snapshots") < F.lit(aggregation.FORECAST_MIN_POINTS)),
            F.lit(aggregation.FORECAST_NOT_ENOUGH_DATA),
        )
        .when(growth_col.isNull() | (growth_col <= 0), F.lit(aggregation.FORECAST_NOT_GROWING))
        .when(
            F.col("growth_r2").isNull() | (F.col("growth_r2") < F.lit(aggregation.FORECAST_MIN_R2)),
            F.lit(aggregation.FORECAST_WEAK_FIT),
        )
        .otherwise(F.lit(aggregation.FORECAST_OK))
    )
    return (
        disks.withColumn(
            "hours_to_full",
            F.when(growth_col > 0, F.greatest(avail, F.lit(0.0)) / growth_col),
        )
        .withColumn("used_ratio", F.when(used + avail > 0, used / (used + avail)))
        .withColumn("growth_r2", r2)
        .withColumn("growth_residual_bytes", residual)
        .withColumn("forecast_status", status)
        .drop("_sse", "_syy")
    )


def topic_aggregates(snapshots: DataFrame, disks: DataFrame) -> DataFrame:
    """Per topic across the fleet.

    ``bytes``: sum over disks of the topic's bytes in each disk's latest snapshot (0 on a
    disk whose latest snapshot no longer lists it). ``growth_bytes_per_hour``: the SUM OF
    PER-DISK least-squares slopes: snapshots of different hosts are not taken at the same
    instants, so a fleet-wide series would need resampling, while the sum of slopes equals
    the slope of the sum for aligned samples and needs no alignment. ``disks``: one entry
    per disk (host, mount, bytes, share of the topic's bytes, growth), biggest first.
    """
    ts = F.col("ts_ms")
    exploded = snapshots.select("host", "mount", "ts_ms", F.explode("topics").alias("t")).select(
        "host",
        "mount",
        "ts_ms",
        F.col("t.topic").alias("topic"),
        F.coalesce(F.col("t.partitions"), F.lit(0)).alias("partitions"),
        F.coalesce(F.col("t.bytes"), F.lit(0)).alias("bytes"),
    )
    per_disk = (
        exploded.where(F.col("topic").isNotNull())
        .groupBy("host", "mount", "topic")
        .agg(
            F.max(ts).alias("seen_ts_ms"),
            F.max_by("bytes", ts).alias("seen_bytes"),
            F.max_by("partitions", ts).alias("seen_partitions"),
            F.regr_slope(F.col("bytes").cast("double"), _hours(ts)).alias("growth_bytes_per_hour"),
        )
        .join(disks.select("host", "mount", "last_ts_ms"), ["host", "mount"])
    )
    current = F.col("seen_ts_ms") == F.col("last_ts_ms")
    per_disk = per_disk.select(
        "topic",
        "host",
        "mount",
        F.when(current, F.col("seen_bytes")).otherwise(F.lit(0)).cast("long").alias("bytes"),
        F.when(current, F.col("seen_partitions")).otherwise(F.lit(0)).alias("partitions"),
        "growth_bytes_per_hour",
    )
    topics = per_disk.groupBy("topic").agg(
        F.sum("bytes").cast("long").alias("bytes"),
        F.sum("growth_bytes_per_hour").alias("growth_bytes_per_hour"),
        F.sum("partitions").cast("long").alias("partitions"),
        F.sum(F.when(F.col("bytes") > 0, 1).otherwise(0)).cast("long").alias("disk_count"),
        F.sort_array(
            F.collect_list(
                F.struct("bytes", "host", "mount", "growth_bytes_per_hour"),
            ),
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


def overfull_episodes(history: DataFrame, limit: int) -> list[dict[str, Any]]:
    """The most recent ``limit`` overfull episodes, for the report's timeline (same start:
    by host and mount)."""
    rows = (
        history.where(F.col("flow_state") == F.lit(aggregation.OVERFULL))
        .groupBy("host", "mount", "episode_id")
        .agg(
            F.min("ts_ms").alias("start_ts_ms"),
            F.max(F.coalesce(F.col("next_ts_ms"), F.col("ts_ms"))).alias("end_ts_ms"),
            F.max(F.col("next_ts_ms").isNull()).alias("open"),
        )
        # host and mount break ties: fleets snapshot on the same clock, so many episodes
        # start at the same instant and the limit must not pick among them at random
        .orderBy(F.col("start_ts_ms").desc(), "host", "mount")
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
