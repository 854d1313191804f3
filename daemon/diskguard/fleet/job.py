"""The job itself: inputs through the transforms to every output, and the result it reports.

Raw snapshots never travel to the driver: it only collects aggregates (one row per disk /
topic / host, the bad-record counts) and, for the report, a downsampled series of the chosen
disks and the most recent overfull episodes. Outputs go to a local directory or any URI
Hadoop can write; the small text ones (summary.json, report.html) through the same
FileSystem as the Parquet ones.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from diskguard.fleet import report
from diskguard.fleet.inputs import (
    STATUS_MALFORMED,
    STATUS_OK,
    STATUS_OUT_OF_RANGE,
    STATUS_UNKNOWN_SCHEMA,
    InputSpec,
    NoInputError,
    classify,
    is_remote,
    local_path,
    read_records,
    resolve_input,
)
from diskguard.fleet.session import DEFAULT_MASTER, build_session, spark_errors, stop_session
from diskguard.fleet.transforms import (
    dedup,
    disk_aggregates,
    downsampled_series,
    host_aggregates,
    overfull_episodes,
    topic_aggregates,
    with_history,
)

REPORT_DISKS = 12
POINTS_PER_DISK = 120
REPORT_EPISODES = 2000


@dataclass(frozen=True)
class BadRecords:
    """Records skipped: not JSON / not fitting the schema, another schema version, or values
    no disk or clock gives (a timestamp in year 9999, a negative byte count)."""

    malformed: int = 0
    unknown_schema: int = 0
    out_of_range: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "malformed": self.malformed,
            "unknown_schema": self.unknown_schema,
            "out_of_range": self.out_of_range,
        }

    def text(self) -> str:
        return (
            f"{self.malformed} malformed, {self.unknown_schema} unknown schema,"
            f" {self.out_of_range} out of range"
        )


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

    @property
    def duplicates(self) -> int:
        return self.records - self.unique_records

    def summary_line(self) -> str:
        return (
            f"aggregated {self.unique_records} snapshots ({self.duplicates} duplicates dropped)"
            f" from {len(self.hosts)} hosts, {len(self.disks)} disks, {len(self.topics)} topics;"
            f" bad records: {self.bad.text()}"
        )


def _rows(df: DataFrame) -> list[dict[str, Any]]:
    return [row.asDict(recursive=True) for row in df.collect()]


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


def write_text(spark: SparkSession, location: str, text: str) -> None:
    """Write a small text file locally, or through Hadoop's FileSystem for a remote URI."""
    if not is_remote(location):
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
            # The status counts ride along the one pass that parses the input (an observed
            # metric), so the parsed records, topic arrays and all, are never cached whole.
            observation = Observation("records")
            status = F.col("status")
            observed = classify(read_records(spark, spec)).observe(
                observation,
                F.count_if(status == F.lit(STATUS_OK)).alias(STATUS_OK),
                F.count_if(status == F.lit(STATUS_MALFORMED)).alias(STATUS_MALFORMED),
                F.count_if(status == F.lit(STATUS_UNKNOWN_SCHEMA)).alias(STATUS_UNKNOWN_SCHEMA),
                F.count_if(status == F.lit(STATUS_OUT_OF_RANGE)).alias(STATUS_OUT_OF_RANGE),
            )
            # One cache of the deduplicated, time-ordered snapshots with their history
            # columns; the columnar cache reads only the columns each output needs.
            history = keep(
                with_history(dedup(observed.where(status == F.lit(STATUS_OK)).drop("status")))
            )
            disks = keep(_in_order(disk_aggregates(history), "host", "mount"))
            disk_rows = _rows(disks)
            if disk_rows:
                counts = observation.get
            else:
                # No valid record: adaptive execution replaces the empty plan, observed
                # metrics and all, so count again (the input holds only bad records).
                counts = {
                    row["status"]: row["count"]
                    for row in classify(read_records(spark, spec))
                    .groupBy("status")
                    .count()
                    .collect()
                }
            bad = BadRecords(
                malformed=int(counts.get(STATUS_MALFORMED, 0)),
                unknown_schema=int(counts.get(STATUS_UNKNOWN_SCHEMA, 0)),
                out_of_range=int(counts.get(STATUS_OUT_OF_RANGE, 0)),
            )
            records = int(counts.get(STATUS_OK, 0))
            if records == 0:
                raise NoInputError(f"no valid snapshot records in {spec.source} ({bad.text()})")
            topics = keep(
                _in_order(topic_aggregates(history, disks), F.col("bytes").desc(), "topic")
            )
            hosts = keep(_in_order(host_aggregates(disks), "host"))
            topic_rows = _rows(topics)
            host_rows = _rows(hosts)
            for name, df in (("disks", disks), ("topics", topics), ("hosts", hosts)):
                df.coalesce(1).write.mode("overwrite").parquet(f"{out}/{name}.parquet")
            unique = sum(int(d["snapshots"]) for d in disk_rows)
            chosen = _closest_to_full(disk_rows, report_disks)
            series = downsampled_series(history, chosen, points_per_disk)
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


def aggregate(
    source: str, output: str | Path, master: str | None = DEFAULT_MASTER, quiet: bool = True
) -> JobResult:
    """The whole job: resolve SOURCE (fails fast when empty), start Spark, run, stop Spark."""
    spec = resolve_input(source)
    spark = build_session(master, quiet=quiet)
    try:
        return run_aggregation(spark, spec, output)
    finally:
        stop_session(spark)
