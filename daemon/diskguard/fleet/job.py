"""The job itself: new snapshots folded into daily summaries, the report computed from them.

Every run has two steps. The *fold* reads only input not folded before, reduces it to
per-disk daily summaries (:mod:`diskguard.fleet.daily`) and publishes them as the next
version of a summaries directory (:mod:`diskguard.fleet.store`). The *report* reads the
summaries of the window (every day, or the last N) and computes every output from them, so
its cost follows the number of disks and days, not of snapshots. Without ``--summaries`` the
summaries are held in Spark's cache for the run (:class:`ScratchStore`): a full
recompute is the same two steps over all the input, which is why both give the same report.

Raw snapshots never travel to the driver: it collects per-disk sums (one row per disk), the
topic and host rows, the bad-record counts and, for the report, a downsampled series of the
chosen disks and the most recent overfull episodes. Outputs go to a local directory or any
URI Hadoop can write; the small text ones (summary.json, report.html) through the same
FileSystem as the Parquet ones.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from diskguard.fleet import daily, exactfit, report
from diskguard.fleet.filesystem import Storage, is_remote, local_path
from diskguard.fleet.fillorder import fill_order
from diskguard.fleet.folding import FoldResult, Store, fold, rows
from diskguard.fleet.inputs import (
    InputSpec,
    NoInputError,
    resolve_input,
)
from diskguard.fleet.manifest import Counts
from diskguard.fleet.session import DEFAULT_MASTER, build_session, spark_errors, stop_session
from diskguard.fleet.store import ScratchStore, SummaryStore
from diskguard.fleet.transforms import (
    disk_windows,
    downsampled_series,
    host_aggregates,
    overfull_episodes,
    topic_aggregates,
    topic_windows,
)

REPORT_DISKS = 12
POINTS_PER_DISK = 120
REPORT_EPISODES = 2000
_DRIVER_BATCH_ROWS = 1000

# disks.parquet: the columns, their order and types are a contract (docs/aggregate.md)
DISKS_SCHEMA = StructType(
    [
        StructField("host", StringType()),
        StructField("mount", StringType()),
        StructField("device", StringType()),
        StructField("snapshots", LongType(), nullable=False),
        *[
            StructField(name, LongType())
            for name in (
                "first_ts_ms",
                "last_ts_ms",
                "total_bytes",
                "used_bytes",
                "available_bytes",
                "kafka_bytes",
                "pending_reclaim_bytes",
            )
        ],
        *[
            StructField(name, DoubleType())
            for name in (
                "growth_bytes_per_hour",
                "kafka_growth_bytes_per_hour",
                "non_kafka_growth_bytes_per_hour",
            )
        ],
        StructField("overfull_episodes", LongType()),
        StructField("overfull_seconds", DoubleType()),
        StructField("deleted_bytes", LongType()),
        StructField("peak_alert_level", IntegerType()),
        StructField("flow_state", StringType()),
        StructField("alert_level", IntegerType()),
        *[
            StructField(name, DoubleType())
            for name in ("hours_to_full", "used_ratio", "growth_r2", "growth_residual_bytes")
        ],
        StructField("forecast_status", StringType(), nullable=False),
        StructField("first_overfull_ts_ms", LongType()),
    ]
)


@dataclass(frozen=True)
class BadRecords:
    """Records skipped: not JSON / not fitting the schema, another schema version, or values
    no disk or clock gives (a timestamp in year 9999, a negative byte count)."""

    malformed: int = 0
    unknown_schema: int = 0
    out_of_range: int = 0

    @classmethod
    def of(cls, counts: Counts) -> BadRecords:
        return cls(counts.malformed, counts.unknown_schema, counts.out_of_range)

    def as_dict(self) -> dict[str, int]:
        return {
            "malformed": self.malformed,
            "unknown_schema": self.unknown_schema,
            "out_of_range": self.out_of_range,
        }

    def text(self) -> str:
        return Counts(0, *vars(self).values()).bad_text()


@dataclass(frozen=True)
class JobResult:
    """What one run produced: the collected aggregates, the counts and the output paths."""

    output: str
    records: int  # valid records before dedup
    unique_records: int
    bad: BadRecords
    disks: list[dict[str, Any]]
    topics: list[dict[str, Any]]
    hosts: list[dict[str, Any]]
    paths: dict[str, str] = field(default_factory=dict)
    duplicates: int = 0
    fold: FoldResult | None = None  # with --summaries: what this run added

    def summary_line(self) -> str:
        return (
            f"aggregated {self.unique_records} snapshots ({self.duplicates} duplicates dropped)"
            f" from {len(self.hosts)} hosts, {len(self.disks)} disks, {len(self.topics)} topics;"
            f" bad records: {self.bad.text()}"
        )

    def lines(self) -> list[str]:
        """What the command prints: the summary, what the fold did, the output paths."""
        head = [self.summary_line()] + ([self.fold.line(), *self.fold.notes] if self.fold else [])
        return head + list(self.paths.values())


def _in_order(df: DataFrame, *order: Column | str) -> DataFrame:
    """A small result sorted in one partition: ``orderBy`` would range-partition it, which
    first runs a sampling job that computes the whole aggregate (and its input) a second
    time. The sort keys are unique per row, so the order is the same."""
    return df.repartition(1).sortWithinPartitions(*order)


def _closest_to_full(disks: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The ``n`` most urgent disks, in the report's order (:func:`report.urgency_key`)."""
    return sorted(disks, key=report.urgency_key)[:n]


def _output_location(output: str | Path) -> str:
    """A local directory (created, absolute) or a remote URI, without a trailing slash."""
    text = str(output)
    if is_remote(text):
        return text.rstrip("/")
    local = Path(local_path(text))
    local.mkdir(parents=True, exist_ok=True)
    return str(local.resolve())


def _driver_frame(
    spark: SparkSession, found: list[dict[str, Any]], schema: StructType
) -> DataFrame:
    """Rows computed on the driver as a DataFrame, handed to the JVM as Arrow batches.

    From a list of dicts Spark would pickle the rows and have Python workers re-serialise
    them each time the frame is computed (the topics' join, the hosts, the write): worker
    start-ups that cost seconds apiece on a busy machine. Arrow data is decoded in the JVM.
    """
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow = to_arrow_schema(schema)
    # one partition per batch: batches small enough that no task carries a megabyte
    batches = [
        pa.RecordBatch.from_pylist(found[i : i + _DRIVER_BATCH_ROWS], schema=arrow)
        for i in range(0, len(found), _DRIVER_BATCH_ROWS)
    ]
    return spark.createDataFrame(pa.Table.from_batches(batches, arrow), schema)


def _disk_rows(disk_days: DataFrame) -> list[dict[str, Any]]:
    found = [exactfit.disk_row(r) for r in rows(disk_windows(disk_days))]
    return sorted(found, key=lambda d: (d["host"], d["mount"]))


def _report(
    spark: SparkSession,
    store: Store,
    spec: InputSpec,
    out: str,
    fold: FoldResult | None,
    days: int | None,
    report_disks: int,
    points_per_disk: int,
) -> JobResult:
    """Every output from the summaries of the window (the last ``days`` days, or all)."""
    manifest = store.manifest
    window = sorted(manifest.days)[-days:] if days else None
    disk_days = store.read("disks", window)
    topic_days = store.read("topics", window)
    totals = manifest.totals()
    bad = BadRecords.of(totals)
    if disk_days is None:
        raise NoInputError(f"no valid snapshot records in {spec.source} ({bad.text()})")
    paths = {
        "disks": f"{out}/disks.parquet",
        "topics": f"{out}/topics.parquet",
        "hosts": f"{out}/hosts.parquet",
        "summary": f"{out}/summary.json",
        "report": f"{out}/report.html",
    }
    disk_rows = _disk_rows(disk_days)
    disks = _driver_frame(spark, disk_rows, DISKS_SCHEMA)
    if topic_days is None:
        topic_days = spark.createDataFrame([], daily.TOPIC_DAY_SCHEMA)
    topics = _in_order(
        topic_aggregates(topic_windows(topic_days), disks), F.col("bytes").desc(), "topic"
    ).persist()
    hosts = _in_order(host_aggregates(disks), "host").persist()
    try:
        topic_rows = rows(topics)
        host_rows = rows(hosts)
        # sorted in one partition: coalesce(1) would ship every batch of the frame to one task
        for name, df in (
            ("disks", _in_order(disks, "host", "mount")),
            ("topics", topics),
            ("hosts", hosts),
        ):
            df.write.mode("overwrite").parquet(paths[name])
    finally:
        topics.unpersist()
        hosts.unpersist()
    unique = sum(int(d["snapshots"]) for d in disk_rows)
    duplicates = totals.ok - manifest.snapshots
    chosen = _closest_to_full(disk_rows, report_disks)
    series = downsampled_series(_points(disk_days, chosen), chosen, points_per_disk)
    episodes = overfull_episodes(disk_days, REPORT_EPISODES)
    episode_total = sum(int(d["overfull_episodes"]) for d in disk_rows)
    generated_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    order = fill_order(disk_rows)
    summary: dict[str, Any] = {
        "generated_at": generated_at,
        "source": spec.source,
        "records": totals.ok,
        "unique_records": unique,
        "duplicates": duplicates,
        "bad_records": bad.as_dict(),
        "disks": disk_rows,
        "topics": topic_rows,
        "hosts": host_rows,
        "fill_order": order.as_dict(),
    }
    source = spec.source
    if fold is not None:
        shown = window or sorted(manifest.days)
        summary["summaries"] = {
            "location": store.location,
            "version": manifest.version,
            "days": len(manifest.days),
            "window": [shown[0], shown[-1]],
        }
        source = f"{spec.source}, folded into {store.location} (report: {shown[0]} to {shown[-1]})"
        paths["summaries"] = store.location
    storage = Storage(spark, out)
    storage.write_text(paths["summary"], json.dumps(summary, indent=1, allow_nan=False) + "\n")
    html = report.render_report(
        report.ReportData(
            generated_at=generated_at,
            source=source,
            records=unique,
            duplicates=duplicates,
            bad_records=bad.as_dict(),
            disks=disk_rows,
            topics=topic_rows,
            hosts=host_rows,
            series=series,
            episodes=episodes,
            episode_total=episode_total,
            report_disks=[(d["host"], d["mount"]) for d in chosen],
            fill_order=order,
        )
    )
    storage.write_text(paths["report"], html)
    return JobResult(
        output=out,
        records=totals.ok,
        unique_records=unique,
        bad=bad,
        disks=disk_rows,
        topics=topic_rows,
        hosts=host_rows,
        paths=paths,
        duplicates=duplicates,
        fold=fold,
    )


def _points(disk_days: DataFrame, chosen: list[dict[str, Any]]) -> DataFrame:
    """The chosen disks' snapshots (time, used, available), from their days' points."""
    match: Column = F.lit(False)
    for disk in chosen:
        match = match | (
            (F.col("host") == F.lit(disk["host"])) & (F.col("mount") == F.lit(disk["mount"]))
        )
    return (
        disk_days.where(match)
        .select("host", "mount", F.explode("points").alias("p"))
        .select("host", "mount", "p.ts_ms", "p.used_bytes", "p.available_bytes")
    )


def summaries_location(output: str, summaries: str | None, incremental: bool) -> str | None:
    """Where ``--summaries`` / ``--incremental`` keep the daily summaries (None: nowhere)."""
    if summaries is not None:
        return summaries
    return f"{str(output).rstrip('/')}/summaries" if incremental else None


def run_aggregation(
    spark: SparkSession,
    spec: InputSpec,
    output: str | Path,
    summaries: str | Path | None = None,
    days: int | None = None,
    report_disks: int = REPORT_DISKS,
    points_per_disk: int = POINTS_PER_DISK,
) -> JobResult:
    """Fold ``spec`` into the daily summaries and write every output into ``output``.

    ``summaries``: a directory that keeps the daily summaries from run to run (only input
    not folded before is read); None for summaries held in Spark's cache, dropped at
    the end (a full recompute). ``days``: report on the last N days summarised (default:
    all). ``output`` is a local directory or any URI Hadoop can write (hdfs://, s3a://).
    """
    out = _output_location(output)
    persistent = summaries is not None
    with spark_errors():
        store: Store = (
            SummaryStore(spark, _output_location(summaries))
            if summaries is not None
            else ScratchStore(spark)
        )
        try:
            folded = fold(spark, store, spec, persistent)
            return _report(
                spark,
                store,
                spec,
                out,
                folded if persistent else None,
                days,
                report_disks,
                points_per_disk,
            )
        finally:
            if isinstance(store, ScratchStore):
                store.destroy()


def aggregate(
    source: str,
    output: str | Path,
    master: str | None = DEFAULT_MASTER,
    quiet: bool = True,
    summaries: str | Path | None = None,
    days: int | None = None,
    kafka_config: str | None = None,
) -> JobResult:
    """The whole job: resolve SOURCE (fails fast when empty), start Spark, run, stop Spark.
    ``kafka_config``: librdkafka settings (a properties file) for a ``kafka://`` SOURCE."""
    spec = resolve_input(source, allow_empty=summaries is not None, kafka_config=kafka_config)
    spark = build_session(master, quiet=quiet)
    try:
        return run_aggregation(spark, spec, output, summaries=summaries, days=days)
    finally:
        stop_session(spark)
