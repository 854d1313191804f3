"""The job itself: new snapshots folded into daily summaries, the report computed from them.

Every run has two steps. The *fold* reads only input not folded before, reduces it to
per-disk daily summaries (:mod:`diskguard.fleet.daily`) and publishes them as the next
version of a summaries directory (:mod:`diskguard.fleet.store`). The *report* reads the
summaries of the window (every day, or the last N) and computes every output from them, so
its cost follows the number of disks and days, not of snapshots. Without ``--summaries`` the
summaries are held for the run only (:class:`ScratchStore`, on the driver): a full
recompute is the same two steps over all the input, which is why both give the same report.

Raw snapshots never travel to the driver: it reads the window's summaries (not their points:
a row per disk and day, one per topic, disk and day) and the points of the dozen disks the
report charts, and computes every output itself (:mod:`diskguard.fleet.window`): no Spark
job for the report. Outputs go to a local directory or any URI Hadoop can write
(:mod:`diskguard.fleet.outputs`); the small text ones (summary.json, report.html) through
the same FileSystem as the Parquet ones.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from diskguard.fleet import daily, exactfit, report, window
from diskguard.fleet.filesystem import Storage, is_remote, local_path
from diskguard.fleet.fillorder import fill_order
from diskguard.fleet.folding import FoldResult, Store, fold
from diskguard.fleet.inputs import (
    InputSpec,
    NoInputError,
    resolve_input,
)
from diskguard.fleet.manifest import Counts
from diskguard.fleet.outputs import DISKS_SCHEMA, HOSTS_SCHEMA, TOPICS_SCHEMA, write_parquet
from diskguard.fleet.session import DEFAULT_MASTER, build_session, spark_errors, stop_session
from diskguard.fleet.store import ScratchStore, SummaryStore

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
    """Every output from the summaries of the window (the last ``days`` days, or all).

    The window's rows (not their points) are read onto the driver and every figure is
    computed there (:mod:`diskguard.fleet.window`): a few MB for thousands of disks and
    weeks, where Spark spent a dozen jobs and their JIT warm-up. Only the chosen disks'
    points are read besides, for the charts.
    """
    manifest = store.manifest
    shown_days = sorted(manifest.days)[-days:] if days else None
    totals = manifest.totals()
    bad = BadRecords.of(totals)
    disk_days = store.columns("disks", daily.DISK_DAY_COLUMNS, shown_days)
    if not disk_days["host"]:
        raise NoInputError(f"no valid snapshot records in {spec.source} ({bad.text()})")
    topic_days = store.columns("topics", daily.TOPIC_DAY_COLUMNS, shown_days)
    paths = {
        "disks": f"{out}/disks.parquet",
        "topics": f"{out}/topics.parquet",
        "hosts": f"{out}/hosts.parquet",
        "summary": f"{out}/summary.json",
        "report": f"{out}/report.html",
    }
    disk_rows = [exactfit.disk_row(w) for w in window.disk_windows(disk_days)]
    topic_rows = window.topic_rows(window.topic_windows(topic_days), disk_rows)
    host_rows = window.host_rows(disk_rows)
    for name, found, schema in (
        ("disks", disk_rows, DISKS_SCHEMA),
        ("topics", topic_rows, TOPICS_SCHEMA),
        ("hosts", host_rows, HOSTS_SCHEMA),
    ):
        write_parquet(spark, paths[name], found, schema)
    unique = sum(int(d["snapshots"]) for d in disk_rows)
    duplicates = totals.ok - manifest.snapshots
    chosen = _closest_to_full(disk_rows, report_disks)
    points = store.points([(d["host"], d["mount"]) for d in chosen], shown_days)
    series = window.downsampled_series(points, chosen, points_per_disk)
    episodes = window.overfull_episodes(disk_days, REPORT_EPISODES)
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
        shown = shown_days or sorted(manifest.days)
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
    not folded before is read); None for summaries held for this run only, dropped at
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
        if isinstance(store, SummaryStore):
            # The report's window only: the summaries keep every day (``--days`` bounds the
            # report), and the read-ahead goes oldest first.
            store.read_ahead(
                {"disks": daily.DISK_DAY_COLUMNS, "topics": daily.TOPIC_DAY_COLUMNS}, last=days
            )
        try:
            folded = fold(spark, store, spec)
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
            else:
                store.drop_read_ahead()


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
