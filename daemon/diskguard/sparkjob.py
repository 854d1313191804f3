"""The fleet aggregation Spark job: snapshots in, per-disk / per-topic / per-host facts out.

Runs three ways with the same code: ``diskguard aggregate`` (embedded ``local[*]``), the
tests (a shared local SparkSession), and ``spark-submit daemon/diskguard/sparkjob.py --input
.. --output ..`` on a cluster (see ``docs/aggregate.md``). It imports nothing from the CLI.

Raw snapshots never travel to the driver: everything is Spark SQL (``from_json`` with an
explicit schema, window functions for episodes, ``regr_slope`` for growth). The driver only
collects aggregates: one row per disk / topic / host, the bad-record counts, and for the
report a downsampled series (at most ``points_per_disk`` per chosen disk) and the overfull
episodes. :mod:`diskguard.fleet.aggregation` states the same rules in plain Python; the tests hold
the two to each other.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not __package__:  # pragma: no cover - spark-submit entry
    # spark-submit runs this file as a script: sys.path[0] is this package's directory, whose
    # modules (config, model, ...) must not shadow top-level ones; and a checkout that is not
    # installed still needs `import diskguard` to work on the driver.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    try:
        import diskguard  # noqa: F401
    except ImportError:
        sys.path.insert(0, os.path.dirname(_here))

import argparse
import datetime as dt
import glob
import json
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from diskguard.fleet import aggregation, report
from diskguard.fleet.kafkasource import (
    ERROR_PREFIX,
    SOURCE_NAME,
    KafkaSourceError,
    KafkaTopicSource,
    PartitionRange,
    encode_plan,
    parse_kafka_url,
    plan_offsets,
)

DEFAULT_MASTER = "local[*]"
REPORT_DISKS = 12
POINTS_PER_DISK = 120
REPORT_EPISODES = 2000
EXIT_OK = 0
EXIT_UNREACHABLE = 1
EXIT_BAD_INPUT = 2

TOPIC_SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("partitions", IntegerType()),
        StructField("bytes", LongType()),
    ]
)

# The fields the job reads from a schema-1 snapshot (``log_dirs`` is not needed and not
# parsed). ``_corrupt`` receives lines that are not JSON or whose values have the wrong type.
SNAPSHOT_SCHEMA = StructType(
    [
        StructField("schema", LongType()),
        StructField("host", StringType()),
        StructField("ts_ms", LongType()),
        StructField("mount", StringType()),
        StructField("device", StringType()),
        StructField("total_bytes", LongType()),
        StructField("used_bytes", LongType()),
        StructField("available_bytes", LongType()),
        StructField("kafka_bytes", LongType()),
        StructField("pending_reclaim_bytes", LongType()),
        StructField("deleted_bytes", LongType()),
        StructField("flow_state", StringType()),
        StructField("alert_level", IntegerType()),
        StructField("topics", ArrayType(TOPIC_SCHEMA)),
        StructField("_corrupt", StringType()),
    ]
)
REQUIRED = ("host", "mount", "ts_ms", "total_bytes", "used_bytes", "available_bytes", "flow_state")
STATUS_OK = "ok"
STATUS_MALFORMED = "malformed"
STATUS_UNKNOWN_SCHEMA = "unknown_schema"


class NoInputError(Exception):
    """Nothing to aggregate: no files, an empty topic, or no valid record (exit 2)."""


class SparkJobError(Exception):
    """Spark itself failed (unreadable input, executor lost, ...): one line, exit 1."""


class SourceError(Exception):
    """The SOURCE argument is unusable (exit 2), e.g. a malformed kafka:// URL."""


@dataclass(frozen=True)
class InputSpec:
    """Where snapshots come from: a list of file paths/URIs, or a Kafka topic with its plan."""

    source: str
    paths: tuple[str, ...] = ()
    kafka_bootstrap: str | None = None
    kafka_topic: str | None = None
    kafka_plan: tuple[PartitionRange, ...] = ()


@dataclass(frozen=True)
class BadRecords:
    malformed: int = 0
    unknown_schema: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"malformed": self.malformed, "unknown_schema": self.unknown_schema}


@dataclass(frozen=True)
class JobResult:
    output: str
    records: int  # valid records before dedup
    unique_records: int
    bad: BadRecords
    disks: list[dict[str, Any]]
    topics: list[dict[str, Any]]
    hosts: list[dict[str, Any]]
    paths: dict[str, str] = field(default_factory=dict)

    @property
    def duplicates(self) -> int:
        return self.records - self.unique_records

    def summary_line(self) -> str:
        return (
            f"aggregated {self.unique_records} snapshots ({self.duplicates} duplicates dropped)"
            f" from {len(self.hosts)} hosts, {len(self.disks)} disks, {len(self.topics)} topics;"
            f" bad records: {self.bad.malformed} malformed, {self.bad.unknown_schema}"
            " unknown schema"
        )


# --------------------------------------------------------------------------- input


_URI = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def resolve_input(source: str) -> InputSpec:
    """Turn SOURCE into concrete inputs, failing fast (before Spark starts) when empty.

    A directory means its ``*.jsonl`` / ``*.jsonl.gz`` files (a state dir with a ``spool/``
    below it is accepted too); anything else local is a glob. Other URI schemes (hdfs://,
    s3a://, ...) go to Spark unchanged. ``kafka://`` topics are planned here: watermarks are
    read once, and an empty topic is reported before any Spark work.
    """
    if source.startswith("kafka://"):
        try:
            url = parse_kafka_url(source)
        except KafkaSourceError as exc:
            raise SourceError(str(exc)) from exc
        plan = plan_offsets({"bootstrap.servers": url.bootstrap, "topic": url.topic})
        if not any(span.end > span.start for span in plan):
            raise NoInputError(
                f"no snapshots: Kafka topic {url.topic!r} on {url.bootstrap} is empty"
            )
        return InputSpec(
            source, kafka_bootstrap=url.bootstrap, kafka_topic=url.topic, kafka_plan=tuple(plan)
        )
    if _URI.match(source) and not source.startswith("file://"):
        return InputSpec(source, paths=(source,))
    local = source[len("file://") :] if source.startswith("file://") else source
    path = Path(local)
    if path.is_dir():
        directory = path / "spool" if (path / "spool").is_dir() else path
        files = sorted(
            str(p)
            for pattern in ("*.jsonl", "*.jsonl.gz")
            for p in directory.glob(pattern)
            if p.is_file()
        )
        if not files:
            raise NoInputError(f"no snapshot files (*.jsonl) in {directory}")
    else:
        files = sorted(p for p in glob.glob(local) if os.path.isfile(p))
        if not files:
            raise NoInputError(f"no snapshot files match {source}")
    if all(os.path.getsize(f) == 0 for f in files):
        raise NoInputError(f"no snapshots: all {len(files)} input files are empty ({source})")
    return InputSpec(source, paths=tuple(files))


_PARSE_OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt"}


def read_records(spark: SparkSession, spec: InputSpec) -> DataFrame:
    """Parsed records, whatever the source: ``r`` (SNAPSHOT_SCHEMA struct) and ``raw``.

    ``raw`` is the unparsed text of a record that failed to parse (null otherwise); it is
    only looked at to tell an unknown schema version from garbage. Files go through Spark's
    JSON reader (it parses straight from the bytes, about twice as fast as text + from_json
    at 1M rows); Kafka values are strings, so they go through ``from_json``. Blank lines and
    Kafka tombstones are skipped either way.
    """
    if spec.kafka_topic is not None:
        spark.dataSource.register(KafkaTopicSource)
        lines = (
            spark.read.format(SOURCE_NAME)
            .option("bootstrap.servers", spec.kafka_bootstrap)
            .option("topic", spec.kafka_topic)
            .option("offsets", encode_plan(spec.kafka_plan))
            .load()
            .select("value")
        )
        return lines.where(F.col("value").isNotNull() & (F.trim(F.col("value")) != "")).select(
            F.from_json(F.col("value"), SNAPSHOT_SCHEMA, _PARSE_OPTIONS).alias("r"),
            F.col("value").alias("raw"),
        )
    df = spark.read.schema(SNAPSHOT_SCHEMA).options(**_PARSE_OPTIONS).json(list(spec.paths))
    return df.select(
        F.struct(*[F.col(f.name) for f in SNAPSHOT_SCHEMA.fields]).alias("r"),
        F.col("_corrupt").alias("raw"),
    )


def classify(parsed: DataFrame) -> DataFrame:
    """Tag every parsed record ``ok`` / ``malformed`` / ``unknown_schema``, keep the fields.

    A record that fails to parse is still an unknown schema when it declares another version
    (a v2 field may well not fit the v1 types).
    """
    r = F.col("r")
    declared = F.get_json_object(F.col("raw"), "$.schema")
    missing: Column = F.lit(False)
    for name in REQUIRED:
        missing = missing | r[name].isNull()
    status = (
        F.when(
            r["_corrupt"].isNotNull(),
            F.when(
                declared.isNotNull() & (declared != F.lit("1")), F.lit(STATUS_UNKNOWN_SCHEMA)
            ).otherwise(F.lit(STATUS_MALFORMED)),
        )
        .when(r["schema"].isNull(), F.lit(STATUS_MALFORMED))
        .when(r["schema"] != F.lit(aggregation.SCHEMA_VERSION), F.lit(STATUS_UNKNOWN_SCHEMA))
        .when(missing, F.lit(STATUS_MALFORMED))
        .when(
            ~r["flow_state"].isin(aggregation.NORMAL, aggregation.OVERFULL), F.lit(STATUS_MALFORMED)
        )
        .otherwise(F.lit(STATUS_OK))
    )
    return parsed.select(
        status.alias("status"),
        r["host"].alias("host"),
        r["mount"].alias("mount"),
        r["ts_ms"].alias("ts_ms"),
        F.coalesce(r["device"], F.lit("")).alias("device"),
        r["total_bytes"].alias("total_bytes"),
        r["used_bytes"].alias("used_bytes"),
        r["available_bytes"].alias("available_bytes"),
        F.coalesce(r["kafka_bytes"], F.lit(0)).alias("kafka_bytes"),
        # null when the snapshot does not report it: the growth split must skip it, not
        # count a missing value as zero Kafka bytes
        r["kafka_bytes"].alias("kafka_bytes_reported"),
        F.coalesce(r["pending_reclaim_bytes"], F.lit(0)).alias("pending_reclaim_bytes"),
        F.coalesce(r["deleted_bytes"], F.lit(0)).alias("deleted_bytes"),
        r["flow_state"].alias("flow_state"),
        F.coalesce(r["alert_level"], F.lit(0)).alias("alert_level"),
        F.coalesce(r["topics"], F.array().cast(ArrayType(TOPIC_SCHEMA))).alias("topics"),
    )


# --------------------------------------------------------------------------- aggregates


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
    """Per-snapshot episode bookkeeping over each disk's time order (see aggregation)."""
    w = Window.partitionBy("host", "mount").orderBy("ts_ms")
    overfull = F.col("flow_state") == F.lit(aggregation.OVERFULL)
    prev_state = F.lag("flow_state").over(w)
    next_ts = F.lead("ts_ms").over(w)
    episode_start = overfull & (prev_state.isNull() | (prev_state != F.lit(aggregation.OVERFULL)))
    # Hours since the disk's first snapshot: the x of the growth fits. Epoch hours (~5e5)
    # cost regr_slope about nine digits; the first ts comes from the same window.
    since_first = (F.col("ts_ms") - F.first("ts_ms").over(w)).cast("double") / F.lit(
        aggregation.MS_PER_HOUR
    )
    return (
        snapshots.withColumn("next_ts_ms", next_ts)
        .withColumn("hours_since_first", since_first)
        .withColumn("episode_start", episode_start.cast("int"))
        .withColumn(
            "overfull_ms",
            F.when(overfull & F.col("next_ts_ms").isNotNull(), F.col("next_ts_ms") - F.col("ts_ms"))
            .otherwise(F.lit(0))
            .cast("long"),
        )
        .withColumn(
            "episode_id",
            F.sum("episode_start").over(
                w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
            ),
        )
    )


def disk_aggregates(history: DataFrame) -> DataFrame:
    """One row per disk: the facts of :func:`aggregation.summarize_disk`, in Spark SQL.

    The growth split and the forecast's basis come along: ``kafka_growth_bytes_per_hour`` /
    ``non_kafka_growth_bytes_per_hour`` (slopes of ``kafka_bytes`` and ``used - kafka`` over
    the snapshots that report ``kafka_bytes``), ``growth_r2``, ``growth_residual_bytes``
    (RMS distance of the snapshots from the line) and ``forecast_status``
    (:func:`aggregation.forecast_status`).

    The residuals take a second pass over the (cached) history with each disk's means and
    slope broadcast: ``Syy·(1 - regr_r2)`` would cancel to noise on a near-perfect line
    (kilobytes of "spread" on 1e11-byte disks), centred residuals do not. x is hours since
    the disk's first snapshot (see :func:`with_history`).
    """
    ts = F.col("ts_ms")
    x = F.col("hours_since_first")
    used_d = F.col("used_bytes").cast("double")
    kafka_d = F.col("kafka_bytes_reported").cast("double")
    growth = F.regr_slope(used_d, x)
    disks = history.groupBy("host", "mount").agg(
        F.max_by("device", ts).alias("device"),
        F.count(F.lit(1)).alias("snapshots"),
        F.min(ts).alias("first_ts_ms"),
        F.max(ts).alias("last_ts_ms"),
        F.max_by("total_bytes", ts).alias("total_bytes"),
        F.max_by("used_bytes", ts).alias("used_bytes"),
        F.max_by("available_bytes", ts).alias("available_bytes"),
        F.max_by("kafka_bytes", ts).alias("kafka_bytes"),
        F.max_by("pending_reclaim_bytes", ts).alias("pending_reclaim_bytes"),
        growth.alias("growth_bytes_per_hour"),
        F.regr_slope(kafka_d, x).alias("kafka_growth_bytes_per_hour"),
        F.regr_slope(used_d - kafka_d, x).alias("non_kafka_growth_bytes_per_hour"),
        F.sum("episode_start").cast("long").alias("overfull_episodes"),
        (F.sum("overfull_ms") / F.lit(1000.0)).alias("overfull_seconds"),
        F.sum("deleted_bytes").cast("long").alias("deleted_bytes"),
        F.max("alert_level").alias("peak_alert_level"),
        F.max_by("flow_state", ts).alias("flow_state"),
        F.max_by("alert_level", ts).alias("alert_level"),
        # the line's centre, for the residual pass below: computed in this same pass over
        # the history rather than in a second aggregation of its own
        F.avg(x).alias("_mean_x"),
        # from the exact long sum: an average of 1e11-byte doubles drifts by a few bytes
        (F.sum("used_bytes").cast("double") / F.count(F.lit(1))).alias("_mean_y"),
    )
    used = F.col("used_bytes").cast("double")
    avail = F.col("available_bytes").cast("double")
    growth_col = F.col("growth_bytes_per_hour")
    line = disks.select(
        "host", "mount", "_mean_x", "_mean_y", F.col("growth_bytes_per_hour").alias("_slope")
    )
    dy = used_d - F.col("_mean_y")
    dx = x - F.col("_mean_x")
    residual_sq = F.pow(dy - F.col("_slope") * dx, 2)
    fit = (
        history.join(F.broadcast(line), ["host", "mount"])
        .groupBy("host", "mount")
        .agg(F.sum(residual_sq).alias("_sse"), F.sum(F.pow(dy, 2)).alias("_syy"))
    )
    disks = disks.join(fit, ["host", "mount"]).drop("_mean_x", "_mean_y")
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
    """The most recent ``limit`` overfull episodes, for the report's timeline."""
    rows = (
        history.where(F.col("flow_state") == F.lit(aggregation.OVERFULL))
        .groupBy("host", "mount", "episode_id")
        .agg(
            F.min("ts_ms").alias("start_ts_ms"),
            F.max(F.coalesce(F.col("next_ts_ms"), F.col("ts_ms"))).alias("end_ts_ms"),
            F.max(F.col("next_ts_ms").isNull()).alias("open"),
        )
        .orderBy(F.col("start_ts_ms").desc())
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


# --------------------------------------------------------------------------- the job


def _rows(df: DataFrame) -> list[dict[str, Any]]:
    return [row.asDict(recursive=True) for row in df.collect()]


def _closest_to_full(disks: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The ``n`` most urgent disks, in the report's order (:func:`report.urgency_key`)."""
    return sorted(disks, key=report.urgency_key)[:n]


@contextmanager
def spark_errors() -> Iterator[None]:
    """Turn JVM-wrapped failures (pages of stack trace) into one line.

    A Kafka source failure comes back as its own message (KafkaSourceError); anything else
    from Spark becomes SparkJobError carrying the first line that names an exception.
    """
    try:
        yield
    except Exception as exc:
        if not type(exc).__module__.startswith(("py4j", "pyspark")):
            raise
        text = str(exc)
        match = re.search(re.escape(ERROR_PREFIX) + r"([^\n]*)", text)
        if match:
            raise KafkaSourceError(match.group(1).strip()) from None
        raise SparkJobError(condense_error(text)) from None


def condense_error(text: str) -> str:
    """The most telling line of a Spark/Py4J error message, at most 300 characters."""
    lines = [line.strip().lstrip(": ") for line in text.splitlines() if line.strip()]
    telling = [
        line
        for line in lines
        if re.search(r"(Exception|Error)\b.*:", line) and not line.startswith("at ")
    ]
    best = telling[0] if telling else (lines[0] if lines else "Spark failed")
    return best if len(best) <= 300 else best[:297] + "..."


def _output_location(output: str | Path) -> str:
    """A local directory (created, absolute) or a remote URI, without a trailing slash."""
    text = str(output)
    if _URI.match(text) and not text.startswith("file://"):
        return text.rstrip("/")
    local = Path(text[len("file://") :] if text.startswith("file://") else text)
    local.mkdir(parents=True, exist_ok=True)
    return str(local.resolve())


def write_text(spark: SparkSession, location: str, text: str) -> None:
    """Write a small text file locally, or through Hadoop's FileSystem for a remote URI."""
    if not _URI.match(location):
        Path(location).write_text(text, encoding="utf-8")
        return
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(location)
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    stream = fs.create(path, True)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()


def run_aggregation(
    spark: SparkSession,
    spec: InputSpec,
    output: str | Path,
    report_disks: int = REPORT_DISKS,
    points_per_disk: int = POINTS_PER_DISK,
) -> JobResult:
    """Read, classify, dedup, aggregate and write every output for ``spec`` into ``output``.

    ``output`` is a local directory or any URI Hadoop can write (hdfs://, s3a://): the small
    text outputs then go through the same Hadoop FileSystem as the Parquet ones.
    """
    out = _output_location(output)
    cached: list[DataFrame] = []

    def keep(df: DataFrame) -> DataFrame:
        cached.append(df.persist(StorageLevel.MEMORY_AND_DISK))
        return df

    paths = {
        "disks": f"{out}/disks.parquet",
        "topics": f"{out}/topics.parquet",
        "hosts": f"{out}/hosts.parquet",
        "summary": f"{out}/summary.json",
        "report": f"{out}/report.html",
    }
    with spark_errors():
        try:
            classified = keep(classify(read_records(spark, spec)))
            counts = {
                row["status"]: int(row["count"])
                for row in classified.groupBy("status").count().collect()
            }
            bad = BadRecords(
                malformed=counts.get(STATUS_MALFORMED, 0),
                unknown_schema=counts.get(STATUS_UNKNOWN_SCHEMA, 0),
            )
            records = counts.get(STATUS_OK, 0)
            if records == 0:
                raise NoInputError(
                    f"no valid snapshot records in {spec.source} ({bad.malformed} malformed,"
                    f" {bad.unknown_schema} unknown schema)"
                )
            snapshots = keep(
                dedup(classified.where(F.col("status") == F.lit(STATUS_OK)).drop("status"))
            )
            history = keep(with_history(snapshots.drop("topics")))
            disks = keep(disk_aggregates(history).orderBy("host", "mount"))
            topics = keep(
                topic_aggregates(snapshots, disks).orderBy(F.col("bytes").desc(), "topic")
            )
            hosts = host_aggregates(disks).orderBy("host")
            disk_rows = _rows(disks)
            classified.unpersist()
            topic_rows = _rows(topics)
            host_rows = _rows(hosts)
            for name, df in (("disks", disks), ("topics", topics), ("hosts", hosts)):
                df.coalesce(1).write.mode("overwrite").parquet(f"{out}/{name}.parquet")
            unique = sum(int(d["snapshots"]) for d in disk_rows)
            chosen = _closest_to_full(disk_rows, report_disks)
            series = downsampled_series(snapshots, chosen, points_per_disk)
            episodes = overfull_episodes(history, REPORT_EPISODES)
            episode_total = sum(int(d["overfull_episodes"]) for d in disk_rows)
        finally:
            for df in cached:
                df.unpersist()
    generated_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    summary = {
        "generated_at": generated_at,
        "source": spec.source,
        "records": records,
        "unique_records": unique,
        "duplicates": records - unique,
        "bad_records": bad.as_dict(),
        "disks": disk_rows,
        "topics": topic_rows,
        "hosts": host_rows,
    }
    write_text(spark, paths["summary"], json.dumps(summary, indent=1, allow_nan=False) + "\n")
    html = report.render_report(
        report.ReportData(
            generated_at=generated_at,
            source=spec.source,
            records=unique,
            duplicates=records - unique,
            bad_records=bad.as_dict(),
            disks=disk_rows,
            topics=topic_rows,
            hosts=host_rows,
            series=series,
            episodes=episodes,
            episode_total=episode_total,
            report_disks=[(d["host"], d["mount"]) for d in chosen],
        )
    )
    write_text(spark, paths["report"], html)
    return JobResult(
        output=out,
        records=records,
        unique_records=unique,
        bad=bad,
        disks=disk_rows,
        topics=topic_rows,
        hosts=host_rows,
        paths=paths,
    )


# --------------------------------------------------------------------------- session

_LOG4J = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = spark %p %c{1}: %m%n%ex
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
logger.utils.name = org.apache.spark.util.Utils
logger.utils.level = error
logger.strutils.name = org.apache.spark.sql.catalyst.util.SparkStringUtils
logger.strutils.level = error
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
logger.sink.name = org.apache.spark.sql.execution.streaming.FileStreamSink
logger.sink.level = error
"""

_JVM_NOISE = (
    "WARNING: Using incubator modules",
    "Using Spark's default log4j profile",
    "Setting default log level to",
    "To adjust logging level use sc.setLogLevel",
)


def _forward_filtered(read_fd: int, write_fd: int) -> None:
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        pending = b""
        while chunk := pipe.read(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if not line.decode("utf-8", "replace").startswith(_JVM_NOISE):
                    os.write(write_fd, line + b"\n")
        if pending:
            os.write(write_fd, pending)


@contextmanager
def _jvm_stderr_filtered() -> Iterator[None]:
    """Start the JVM with a stderr that drops its start-up chatter and passes the rest on.

    The JVM inherits fd 2 when it is forked, so fd 2 is swapped for a pipe only around the
    launch; a daemon thread forwards every line except the known banners to the real stderr.
    """
    try:
        real = os.dup(2)
    except OSError:
        yield
        return
    read_fd, write_fd = os.pipe()
    sys.stderr.flush()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    threading.Thread(target=_forward_filtered, args=(read_fd, real), daemon=True).start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(real, 2)


@contextmanager
def private_log4j_config() -> Iterator[Path]:
    """The log4j2 file for one JVM launch, in a fresh private directory removed afterwards.

    Not a fixed path under /tmp: two runs (two users, or two concurrent jobs) would share and
    rewrite one file, and another local user could plant a config there first (log4j2
    configs can name appenders that write anywhere). ``mkdtemp`` makes a 0700 directory; the
    file is created 0600 inside it. Log4j reads the file while the driver JVM starts, which
    is over when ``getOrCreate`` returns, so the directory goes at the end of this block.
    """
    directory = tempfile.mkdtemp(prefix="diskguard-spark-log4j-")
    try:
        path = Path(directory) / "log4j2.properties"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(_LOG4J)
        yield path
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def build_session(
    master: str | None = DEFAULT_MASTER,
    app_name: str = "diskguard-aggregate",
    quiet: bool = True,
    driver_memory: str = "4g",
) -> SparkSession:
    """A SparkSession with the job's settings: UTC, WARN logs, few shuffle partitions locally.

    ``master=None`` keeps whatever spark-submit chose. Local mode also pins the Python
    workers to this interpreter (so they see the same packages) and binds to loopback.
    """
    launched_by_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    builder = (
        builder.config("spark.sql.session.timeZone", "UTC")
        # Spark's own stage progress bar on a terminal, nothing in logs and pipes.
        .config("spark.ui.showConsoleProgress", "true" if sys.stderr.isatty() else "false")
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.sql.debug.maxToStringFields", "200")
    )
    local = (master or "").startswith("local")
    if local:
        builder = (
            builder.config("spark.sql.shuffle.partitions", "4")
            .config("spark.default.parallelism", "4")
            .config("spark.ui.enabled", "false")
            .config("spark.pyspark.python", sys.executable)
            .config("spark.pyspark.driver.python", sys.executable)
        )
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        if not launched_by_spark_submit:
            builder = builder.config("spark.driver.memory", driver_memory)
    if quiet and not launched_by_spark_submit:
        with private_log4j_config() as log4j:
            builder = builder.config(
                "spark.driver.extraJavaOptions", f"-Dlog4j.configurationFile=file:{log4j}"
            )
            with _jvm_stderr_filtered():
                spark = builder.getOrCreate()
    else:
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def aggregate(
    source: str, output: str | Path, master: str | None = DEFAULT_MASTER, quiet: bool = True
) -> JobResult:
    """The whole job: resolve SOURCE (fails fast when empty), start Spark, run, stop Spark."""
    spec = resolve_input(source)
    spark = build_session(master, quiet=quiet)
    try:
        return run_aggregation(spark, spec, output)
    finally:
        spark.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit entry: same contract and exit codes as ``diskguard aggregate``."""
    parser = argparse.ArgumentParser(
        prog="sparkjob.py", description="diskguard fleet aggregation (Spark)"
    )
    parser.add_argument(
        "--input", required=True, help="spool dir, glob, or kafka://host:port/topic"
    )
    parser.add_argument("--output", required=True, help="output directory or hdfs:// / s3a:// URI")
    parser.add_argument(
        "--master",
        default=None,
        help="Spark master (default: spark-submit's, or local[*] when run with plain python)",
    )
    args = parser.parse_args(argv)
    master = args.master
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        master = DEFAULT_MASTER
    try:
        result = aggregate(args.input, args.output, master)
    except (NoInputError, SourceError) as exc:
        print(f"diskguard aggregate: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (KafkaSourceError, SparkJobError) as exc:
        print(f"diskguard aggregate: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    print(result.summary_line())
    for path in result.paths.values():
        print(path)
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
