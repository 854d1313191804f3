"""Per-disk daily summaries: a day of one disk's snapshots reduced to what the report needs.

A *disk-day* row (``DISK_DAY_SCHEMA``) holds, for one ``(host, mount, day)`` (UTC days):

- order-free facts that merge exactly: the number of snapshots, first/last timestamp, the
  latest snapshot's values, the deleted bytes, the peak alert level, and the exact integer
  sums a least-squares line needs (``n, Σx, Σx², Σy, Σxy, Σy²`` with x = ms since the day's
  start, y = used bytes; the same for Kafka's bytes over the snapshots that report them).
  Sums are ``decimal(38,0)``: exact, so adding a late snapshot's sums to a day gives the same
  row as summing the whole day at once, whatever the order (doubles would not);
- ``points``: each snapshot's ``(ts_ms, used, available, overfull)``, sorted. They are what
  makes folding exact where order matters: a snapshot already folded is recognised by its
  timestamp (at-least-once delivery, re-runs), one arriving late for a summarised day is
  put in its place, and the day's overfull runs are recomputed from them. The report's
  usage charts are drawn from them too;
- the day's overfull runs and overfull time, computed from ``points`` (:func:`with_order`).

A *topic-day* row (``TOPIC_DAY_SCHEMA``) holds a topic's exact sums on one disk that day
and its latest bytes and partitions. The report (:mod:`diskguard.fleet.window`, on the driver)
combines the days of a window; nothing in here depends on more than one day.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from diskguard.fleet import aggregation
from diskguard.fleet.exactsums import EXACT, ExactSums, squared, x_times

DAY_MS = 86_400_000

POINT = StructType(
    [
        StructField("ts_ms", LongType()),
        StructField("used_bytes", LongType()),
        StructField("available_bytes", LongType()),
        StructField("overfull", BooleanType()),
    ]
)
RUN = StructType(
    [
        StructField("start_ts_ms", LongType()),
        # the first normal snapshot after the run, or the day's last snapshot while open
        StructField("end_ts_ms", LongType()),
        StructField("open", BooleanType()),  # still overfull at the day's last snapshot
    ]
)
LAST = StructType(
    [
        StructField("device", StringType()),
        StructField("total_bytes", LongType()),
        StructField("used_bytes", LongType()),
        StructField("available_bytes", LongType()),
        StructField("kafka_bytes", LongType()),
        StructField("pending_reclaim_bytes", LongType()),
        StructField("flow_state", StringType()),
        StructField("alert_level", IntegerType()),
    ]
)
KEY = ("host", "mount", "day")
# the exact sums of a disk-day (x: ms since the day's start; y: used bytes). ``unk_*`` are
# over the snapshots that do not report kafka_bytes (usually none): the Kafka fit's sums
# are the totals minus these, which costs nothing when every snapshot reports it.
DISK_SUMS = (
    "sum_x",
    "sum_xx",
    "sum_y",
    "sum_xy",
    "sum_yy",
    "kafka_snapshots",
    "sum_k",
    "sum_xk",
    "unk_sum_x",
    "unk_sum_xx",
    "unk_sum_y",
    "unk_sum_xy",
    "deleted_bytes",
)
_SUM_TYPES = {"sum_x": LongType(), "kafka_snapshots": LongType(), "unk_sum_x": LongType()}
ORDERED = StructType(
    [
        StructField("first_overfull", BooleanType()),
        StructField("last_overfull", BooleanType()),
        StructField("overfull_ms", LongType()),  # within the day (the gap to the next day: later)
        StructField("inner_episode_starts", IntegerType()),  # runs after a normal snapshot
        StructField("runs", ArrayType(RUN)),
    ]
)
DISK_DAY_SCHEMA = StructType(
    [
        StructField("host", StringType()),
        StructField("mount", StringType()),
        StructField("day", StringType()),
        StructField("snapshots", LongType()),
        StructField("first_ts_ms", LongType()),
        StructField("last_ts_ms", LongType()),
        StructField("last", LAST),
        *[StructField(name, _SUM_TYPES.get(name, EXACT)) for name in DISK_SUMS],
        StructField("min_used", LongType()),
        StructField("peak_alert_level", IntegerType()),
        StructField("points", ArrayType(POINT)),
        *ORDERED.fields,
    ]
)
TOPIC_SUMS = ("snapshots", "sum_x", "sum_xx", "sum_y", "sum_xy")
TOPIC_DAY_SCHEMA = StructType(
    [
        StructField("host", StringType()),
        StructField("mount", StringType()),
        StructField("day", StringType()),
        StructField("topic", StringType()),
        StructField("snapshots", LongType()),
        StructField("sum_x", LongType()),
        StructField("sum_xx", EXACT),
        StructField("sum_y", EXACT),
        StructField("sum_xy", EXACT),
        StructField("min_bytes", LongType()),
        StructField("seen_ts_ms", LongType()),
        StructField("seen_bytes", LongType()),
        StructField("seen_partitions", IntegerType()),
    ]
)

# what the report reads of the rows (all but a disk-day's points: its charts read those of
# a few disks only)
DISK_DAY_COLUMNS = tuple(name for name in DISK_DAY_SCHEMA.fieldNames() if name != "points")
TOPIC_DAY_COLUMNS = tuple(TOPIC_DAY_SCHEMA.fieldNames())


def _zero_if_null(column: Column, name: str) -> Column:
    kind = _SUM_TYPES.get(name, EXACT)
    return F.coalesce(column, F.lit(0).cast(kind)).alias(name)


def with_day(snapshots: DataFrame) -> DataFrame:
    """The snapshot's UTC day (``YYYY-MM-DD``); the session runs in UTC."""
    return snapshots.withColumn(
        "day", F.date_format(F.timestamp_millis(F.col("ts_ms")), "yyyy-MM-dd")
    )


def unique_new(snapshots: DataFrame, stored: DataFrame | None) -> DataFrame:
    """One snapshot per ``(host, mount, ts_ms)``, none of those already in ``stored``.

    ``stored`` are disk-day rows of the days the snapshots fall on; their points' timestamps
    join the snapshots in one window (partitioned by disk-day, ordered by time, a stored
    timestamp first), and a snapshot whose predecessor has its timestamp is a duplicate:
    one shuffle serves both the at-least-once duplicates of this input and the snapshots an
    earlier run already folded.
    """
    rows = snapshots.withColumn("_stored", F.lit(False))
    if stored is not None:
        wanted = snapshots.select(*KEY).distinct()
        markers = (
            stored.join(wanted, list(KEY), "left_semi")
            .select(*KEY, F.explode(F.col("points.ts_ms")).alias("ts_ms"))
            .withColumn("_stored", F.lit(True))
        )
        rows = rows.unionByName(markers, allowMissingColumns=True)
    w = Window.partitionBy(*KEY).orderBy("ts_ms", F.col("_stored").desc())
    previous = F.lag("ts_ms").over(w)
    return (
        rows.withColumn("_previous", previous)
        .where(
            ~F.col("_stored")
            & (F.col("_previous").isNull() | (F.col("_previous") != F.col("ts_ms")))
        )
        .drop("_previous", "_stored")
    )


def disk_day_partials(snapshots: DataFrame) -> DataFrame:
    """The order-free part of a disk-day row from unique snapshots (with ``day``)."""
    ts = F.col("ts_ms")
    x = ts % F.lit(DAY_MS)
    y = F.col("used_bytes")
    k = F.col("kafka_bytes_reported")
    unknown = k.isNull()
    last = F.struct(*[F.col(f.name) for f in LAST.fields])
    point = F.struct(
        ts.alias("ts_ms"),
        y.alias("used_bytes"),
        F.col("available_bytes").alias("available_bytes"),
        (F.col("flow_state") == F.lit(aggregation.OVERFULL)).alias("overfull"),
    )
    exact = ExactSums()
    exact.add("sum_xx", [(x * x, 0)])
    exact.add("sum_y", [(y, 0)])
    exact.add("sum_xy", x_times(x, y))
    exact.add("sum_yy", squared(y))
    exact.add("sum_k", [(k, 0)])
    exact.add("sum_xk", x_times(x, k))
    exact.add("unk_sum_xx", [(x * x, 0)], where=unknown)
    exact.add("unk_sum_y", [(y, 0)], where=unknown)
    exact.add("unk_sum_xy", x_times(x, y), where=unknown)
    exact.add("deleted_bytes", [(F.col("deleted_bytes"), 0)])
    longs = {
        "sum_x": F.sum(x),
        "kafka_snapshots": F.count(k),
        "unk_sum_x": F.sum(F.when(unknown, x)),
    }
    grouped = snapshots.groupBy(*KEY).agg(
        F.count(F.lit(1)).alias("snapshots"),
        F.min(ts).alias("first_ts_ms"),
        F.max(ts).alias("last_ts_ms"),
        F.max_by(last, ts).alias("last"),
        *[longs[name].alias(name) for name in longs],
        *exact.aggregates,
        F.min(y).alias("min_used"),
        F.max("alert_level").alias("peak_alert_level"),
        F.array_sort(F.collect_list(point)).alias("points"),
    )
    return grouped.select(
        *KEY,
        "snapshots",
        "first_ts_ms",
        "last_ts_ms",
        "last",
        *[
            _zero_if_null(F.col(name) if name in longs else exact.total(name), name)
            for name in DISK_SUMS
        ],
        "min_used",
        "peak_alert_level",
        "points",
    )


def combine_disk_days(rows: DataFrame) -> DataFrame:
    """Merge partial rows of the same disk-day (a stored row and the new snapshots' one):
    sums add, the latest snapshot wins, the points interleave in time."""
    return rows.groupBy(*KEY).agg(
        F.sum("snapshots").alias("snapshots"),
        F.min("first_ts_ms").alias("first_ts_ms"),
        F.max("last_ts_ms").alias("last_ts_ms"),
        F.max_by("last", "last_ts_ms").alias("last"),
        *[F.sum(name).cast(_SUM_TYPES.get(name, EXACT)).alias(name) for name in DISK_SUMS],
        F.min("min_used").alias("min_used"),
        F.max("peak_alert_level").alias("peak_alert_level"),
        F.array_sort(F.flatten(F.collect_list("points"))).alias("points"),
    )


def with_order(disk_days: DataFrame) -> DataFrame:
    """Add the day's overfull runs and time, from its time-ordered points.

    A run starts at an overfull snapshot whose predecessor (in the day) is normal or absent,
    and ends at the next normal snapshot; the k-th start pairs with the k-th end, and a
    start without one is still open at the day's last snapshot. Overfull time: each
    overfull snapshot's state holds until the next snapshot of the day (the time to the
    next day's first snapshot is added when days are combined).
    """
    p = F.col("points")
    n = F.size(p)
    # Most days of most disks hold no overfull snapshot: for those every ordered fact is
    # known without walking the points one by one (Spark interprets the lambdas below).
    some = F.array_contains(p["overfull"], True)
    none = F.array().cast(ArrayType(IntegerType()))

    def overfull(i: Column) -> Column:
        return p[i]["overfull"]

    starts = F.when(
        some,
        F.filter(
            F.sequence(F.lit(0), n - 1),
            lambda i: overfull(i) & F.when(i == 0, F.lit(True)).otherwise(~overfull(i - 1)),
        ),
    ).otherwise(none)
    ends = F.when(
        some & (n > 1),
        F.filter(F.sequence(F.lit(1), n - 1), lambda i: ~overfull(i) & overfull(i - 1)),
    ).otherwise(none)
    zero = F.lit(0).cast(LongType())
    overfull_ms = F.when(
        some & (n > 1),
        F.aggregate(
            F.sequence(F.lit(0), n - 2),
            zero,
            lambda acc, i: (
                acc + F.when(overfull(i), p[i + 1]["ts_ms"] - p[i]["ts_ms"]).otherwise(zero)
            ),
        ),
    ).otherwise(zero)
    staged = disk_days.withColumn("_starts", starts).withColumn("_ends", ends)
    s, e = F.col("_starts"), F.col("_ends")
    runs = F.transform(
        s,
        lambda start, k: F.struct(
            p[start]["ts_ms"].alias("start_ts_ms"),
            F.when(k < F.size(e), p[e[k]]["ts_ms"]).otherwise(p[n - 1]["ts_ms"]).alias("end_ts_ms"),
            (k >= F.size(e)).alias("open"),
        ),
    )
    return staged.select(
        *[c for c in disk_days.columns if c not in ORDERED.fieldNames()],
        p[0]["overfull"].alias("first_overfull"),
        p[n - 1]["overfull"].alias("last_overfull"),
        overfull_ms.alias("overfull_ms"),
        F.size(F.filter(s, lambda i: i > 0)).alias("inner_episode_starts"),
        runs.cast(ArrayType(RUN)).alias("runs"),
    )


def topic_day_partials(snapshots: DataFrame) -> DataFrame:
    """A topic-day row per topic a disk's unique snapshots (with ``day``) list that day."""
    ts = F.col("ts_ms")
    exploded = snapshots.select(*KEY, "ts_ms", F.explode("topics").alias("t")).select(
        *KEY,
        "ts_ms",
        F.col("t.topic").alias("topic"),
        F.coalesce(F.col("t.bytes"), F.lit(0)).alias("bytes"),
        F.coalesce(F.col("t.partitions"), F.lit(0)).alias("partitions"),
    )
    x = ts % F.lit(DAY_MS)
    b = F.col("bytes")
    exact = ExactSums()
    exact.add("sum_xx", [(x * x, 0)])
    exact.add("sum_y", [(b, 0)])
    exact.add("sum_xy", x_times(x, b))
    # The latest sighting as one max_by per value, not one of a struct: a struct buffer
    # makes Spark sort the exploded rows for an interpreted aggregation. Every max_by sees
    # the rows in the same order, so all of them pick the same row.
    grouped = (
        exploded.where(F.col("topic").isNotNull())
        .groupBy(*KEY, "topic")
        .agg(
            F.count(F.lit(1)).alias("snapshots"),
            F.sum(x).alias("sum_x"),
            *exact.aggregates,
            F.min(b).alias("min_bytes"),
            F.max(ts).alias("seen_ts_ms"),
            F.max_by(b, ts).alias("seen_bytes"),
            F.max_by("partitions", ts).alias("seen_partitions"),
        )
    )
    return grouped.select(
        *[
            exact.total(c).alias(c) if c in ("sum_xx", "sum_y", "sum_xy") else c
            for c in TOPIC_DAY_SCHEMA.fieldNames()
        ]
    )


def combine_topic_days(rows: DataFrame) -> DataFrame:
    """Merge partial topic-day rows: sums add, the latest sighting wins."""
    return rows.groupBy(*KEY, "topic").agg(
        *[F.sum(name).cast(TOPIC_DAY_SCHEMA[name].dataType).alias(name) for name in TOPIC_SUMS],
        F.min("min_bytes").alias("min_bytes"),
        F.max("seen_ts_ms").alias("seen_ts_ms"),
        *[F.max_by(name, "seen_ts_ms").alias(name) for name in ("seen_bytes", "seen_partitions")],
    )


def fold(
    snapshots: DataFrame,
    stored_disks: DataFrame | None,
    stored_topics: DataFrame | None,
    keep: Callable[[DataFrame], DataFrame] = lambda df: df,
) -> tuple[DataFrame, DataFrame]:
    """The disk-day and topic-day rows of the days ``snapshots`` touch, with the snapshots
    folded in.

    ``snapshots`` are valid, classified records (with duplicates); ``stored_*`` the rows
    already summarised for those days (all of each day: the days are rewritten whole), or
    None when nothing is stored. The new unique snapshots feed both kinds of rows: ``keep``
    (the caller's cache) is applied to them, so that they are computed once.
    """
    fresh = keep(unique_new(with_day(snapshots), stored_disks))
    disks = disk_day_partials(fresh)
    topics = topic_day_partials(fresh)
    if stored_disks is not None or stored_topics is not None:
        # only the days that gain a snapshot are rewritten: a file read again, whose
        # snapshots are all known, changes nothing
        days = [r["day"] for r in fresh.select("day").distinct().collect()]
        changed = F.col("day").isin(days)
        if stored_disks is not None:
            stored = stored_disks.where(changed).drop(*ORDERED.fieldNames())
            disks = combine_disk_days(stored.unionByName(disks))
        if stored_topics is not None:
            topics = combine_topic_days(stored_topics.where(changed).unionByName(topics))
    return with_order(disks), topics
