"""The daily summaries on disk: Parquet partitioned by day, versioned, named by a manifest.

Layout of a summaries directory::

    _manifest/0000000007.json          the published states; the highest readable one holds
    disks/day=2026-11-26/v=0000000007-1a2b3c4d/part-*.parquet   disk-day rows
    topics/day=2026-11-26/v=0000000007-1a2b3c4d/part-*.parquet  topic-day rows

A run writes the days it changed under a new ``v=`` (its version and a random suffix, so
that two runs never write into one directory), then publishes ``_manifest/<version>.json``
only if nobody published that version first. Readers take the days the newest manifest
names; what no manifest names (a run that died, or lost the race) is removed later.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import chain
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StringType, StructField, StructType

from diskguard.errors import FailedError, UsageError
from diskguard.fleet.columns import (
    POINT_COLUMNS,
    Disk,
    columns_of,
    points_of,
    spark_columns,
    unreadable,
)
from diskguard.fleet.daily import DISK_DAY_SCHEMA, TOPIC_DAY_SCHEMA
from diskguard.fleet.filesystem import Storage, local_path
from diskguard.fleet.manifest import DayMark, Manifest, ManifestError

MANIFESTS = "_manifest"
TABLES = ("disks", "topics")
_SCHEMAS = {"disks": DISK_DAY_SCHEMA, "topics": TOPIC_DAY_SCHEMA}
_KEEP_MANIFESTS = 3
ROW_GROUP_BYTES = 4 << 20


class NotASummariesDir(UsageError):
    """``--summaries`` names a directory that holds something else (exit 2)."""


class ConcurrentRunError(FailedError):
    """Another run published the same version first: nothing of this run counts (exit 1)."""


def _version_of(directory: str) -> int:
    """``v=0000000007-1a2b3c4d`` -> 7 (-1 for a name that is not a version directory)."""
    try:
        return int(directory.removeprefix("v=").split("-", 1)[0])
    except ValueError:
        return -1


def _read_schema(table: str) -> StructType:
    """The table's schema with ``day`` and ``v`` where Spark puts partition columns: last."""
    fields = [f for f in _SCHEMAS[table].fields if f.name != "day"]
    return StructType([*fields, StructField("day", StringType()), StructField("v", StringType())])


class SummaryStore:
    """One summaries directory: its newest manifest, its days, and writing the next version."""

    def __init__(self, spark: SparkSession, location: str) -> None:
        self.spark = spark
        self.location = location.rstrip("/")
        self.storage = Storage(spark, self.location)
        names = self.storage.listdir(self.location)
        if names and MANIFESTS not in names:
            raise NotASummariesDir(
                f"{self.location} is not a diskguard summaries directory (no {MANIFESTS}/,"
                f" but {', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
            )
        self.manifest = self._newest_manifest()
        self._ahead: dict[tuple[str, tuple[str, ...], str, str], Future[dict[str, list[Any]]]] = {}

    def _newest_manifest(self) -> Manifest:
        names = [
            n for n in self.storage.listdir(f"{self.location}/{MANIFESTS}") if n.endswith(".json")
        ]
        for name in sorted(names, reverse=True):
            text = self.storage.read_text(f"{self.location}/{MANIFESTS}/{name}")
            try:
                return Manifest.from_json(text)
            except ManifestError as exc:
                raise NotASummariesDir(f"{self.location}/{MANIFESTS}/{name}: {exc}") from None
        return Manifest()

    def read(self, table: str, days: Collection[str] | None = None) -> DataFrame | None:
        """The rows of ``days`` (all when None) as published; None when there are none."""
        marks = self.manifest.days
        chosen = sorted(marks if days is None else set(days) & set(marks))
        if table == "topics":
            chosen = [d for d in chosen if marks[d].topics]
        if not chosen:
            return None
        base = f"{self.location}/{table}"
        paths = [f"{base}/day={d}/v={self.manifest.days[d].version}" for d in chosen]
        df = self.spark.read.schema(_read_schema(table)).option("basePath", base).parquet(*paths)
        return df.select(*_SCHEMAS[table].fieldNames())

    def _files(self, table: str, days: Collection[str] | None) -> tuple[str, list[str]]:
        """The base directory and the Parquet files of ``days`` (all when None), local."""
        marks = self.manifest.days
        chosen = sorted(marks if days is None else set(days) & set(marks))
        base = local_path(f"{self.location}/{table}")
        files = []
        for day in chosen:
            directory = f"{base}/day={day}/v={marks[day].version}"
            if table == "topics" and not marks[day].topics:
                continue
            with unreadable(directory):
                files += [
                    f"{directory}/{name}"
                    for name in sorted(os.listdir(directory))
                    if name.endswith(".parquet") and not name.startswith(("_", "."))
                ]
        return base, files

    def _day_columns(
        self, table: str, names: tuple[str, ...], day: str, version: str
    ) -> dict[str, list[Any]]:
        """One day's columns (``day`` among them if asked for), read with pyarrow."""
        import pyarrow.dataset as ds

        directory = local_path(f"{self.location}/{table}/day={day}/v={version}")
        with unreadable(directory):
            table_read = ds.dataset(directory, format="parquet").to_table(
                columns=[n for n in names if n != "day"]
            )
        found = columns_of(table_read)
        if "day" in names:
            found["day"] = [day] * table_read.num_rows
        return found

    def read_ahead(self, wanted: Mapping[str, Sequence[str]], last: int | None = None) -> None:
        """Start reading ``wanted`` (table -> columns) of every day published so far, in a
        thread of the driver's, which otherwise waits on Spark while the fold runs: the
        report reads them after it (:meth:`columns`). A day the fold rewrites is read again
        then (its version changed); a read-ahead nobody asks for is dropped. ``last``: only
        the last N days (the report's window)."""
        if self.storage.remote or not self.manifest.days:
            return
        pool = ThreadPoolExecutor(1, thread_name_prefix="diskguard-read-ahead")
        for table, names in wanted.items():
            for day, mark in sorted(self.manifest.days.items())[-last if last else 0 :]:
                if table == "topics" and not mark.topics:
                    continue
                key = (table, tuple(names), day, mark.version)
                self._ahead[key] = pool.submit(self._day_columns, *key)
        pool.shutdown(wait=False)

    def drop_read_ahead(self) -> None:
        """Forget (and cancel what has not started of) the read-ahead."""
        for future in self._ahead.values():
            future.cancel()
        self._ahead.clear()

    def columns(
        self, table: str, names: Sequence[str], days: Collection[str] | None = None
    ) -> dict[str, list[Any]]:
        """Columns of the rows of ``days`` (all when None), in day order, on the driver.

        A local directory is read with pyarrow, no Spark job at all: a window's summaries
        (not their points) are a few MB. Elsewhere (hdfs://, s3a://) through Spark.
        """
        if self.storage.remote:
            return spark_columns(self.read(table, days), names)
        marks = self.manifest.days
        parts = []
        for day in sorted(marks if days is None else set(days) & set(marks)):
            if table == "topics" and not marks[day].topics:
                continue
            key = (table, tuple(names), day, marks[day].version)
            ahead = self._ahead.pop(key, None)
            parts.append(ahead.result() if ahead is not None else self._day_columns(*key))
        return {name: list(chain.from_iterable(p[name] for p in parts)) for name in names}

    def points(
        self, chosen: Sequence[Disk], days: Collection[str] | None = None
    ) -> dict[str, list[Any]]:
        """The chosen disks' snapshots in ``days`` (``POINT_COLUMNS``), on the driver.

        The day files are sorted by disk in small row groups: a local read skips the row
        groups of other disks by their statistics.
        """
        if not chosen:
            return {name: [] for name in POINT_COLUMNS}
        if self.storage.remote:
            disk_days = self.read("disks", days)
            if disk_days is None:
                return {name: [] for name in POINT_COLUMNS}
            return spark_columns(points_of(disk_days, chosen), POINT_COLUMNS)
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        base, files = self._files("disks", days)
        if not files:
            return {name: [] for name in POINT_COLUMNS}
        match = None
        for host, mount in chosen:
            this = (ds.field("host") == host) & (ds.field("mount") == mount)
            match = this if match is None else match | this
        with unreadable(base):
            found = ds.dataset(files, format="parquet").to_table(
                columns=["host", "mount", "points"], filter=match
            )
        points = found.column("points").combine_chunks()
        parents = pc.list_parent_indices(points)
        flat = pc.list_flatten(points)
        exploded = pa.table(
            {
                "host": pc.take(found.column("host"), parents),
                "mount": pc.take(found.column("mount"), parents),
                **{name: pc.struct_field(flat, name) for name in POINT_COLUMNS[2:]},
            }
        )
        return columns_of(exploded)

    def new_version(self) -> str:
        """The directory name (``v=`` value) for this run's days."""
        return f"{self.manifest.version + 1:010d}-{uuid.uuid4().hex[:8]}"

    def write(self, table: str, rows: DataFrame, version: str) -> None:
        """Write ``rows`` as new day directories of ``version`` (nothing published yet)."""
        from pyspark.sql import functions as F

        (
            rows.withColumn("v", F.lit(version))
            # sorted by disk in small row groups: the report reads the points of a dozen
            # disks, and the row groups' min/max let it skip the rest
            .sortWithinPartitions("host", "mount")
            .write.mode("append")
            .option("parquet.block.size", ROW_GROUP_BYTES)
            .partitionBy("day", "v")
            .parquet(f"{self.location}/{table}")
        )

    def written(self, version: str) -> dict[str, DayMark]:
        """The days ``version`` wrote, with their unique snapshots (a narrow read)."""
        from pyspark.sql import functions as F

        def days_of(table: str) -> list[str]:
            base = f"{self.location}/{table}"
            return [
                name.removeprefix("day=")
                for name in self.storage.listdir(base)
                if name.startswith("day=")
                and f"v={version}" in self.storage.listdir(f"{base}/{name}")
            ]

        base = f"{self.location}/disks"
        days = days_of("disks")
        if not days:
            return {}
        with_topics = set(days_of("topics"))
        if not self.storage.remote:  # read on the driver: a Spark job costs more than this
            import pyarrow.dataset as ds

            def snapshots(day: str) -> int:
                table = ds.dataset(local_path(f"{base}/day={day}/v={version}")).to_table(
                    ["snapshots"]
                )
                return sum(columns_of(table)["snapshots"])

            return {d: DayMark(version, snapshots(d), d in with_topics) for d in days}
        paths = [f"{base}/day={day}/v={version}" for day in days]
        rows = (
            self.spark.read.schema(_read_schema("disks"))
            .option("basePath", base)
            .parquet(*paths)
            .groupBy("day")
            .agg(F.sum("snapshots").alias("snapshots"))
            .collect()
        )
        return {
            str(r["day"]): DayMark(version, int(r["snapshots"]), str(r["day"]) in with_topics)
            for r in rows
        }

    def publish(self, manifest: Manifest) -> None:
        """Make ``manifest`` the newest state, unless another run got its version first."""
        name = f"{self.location}/{MANIFESTS}/{manifest.version:010d}.json"
        if not self.storage.create_exclusive(name, manifest.to_json()):
            raise ConcurrentRunError(
                f"another aggregate run updated {self.location} at the same time (version"
                f" {manifest.version}); this run's snapshots were not added: run it again"
            )
        self.manifest = manifest
        self._collect_garbage()

    def _collect_garbage(self) -> None:
        """Remove day directories no manifest names any more, and old manifests.

        Only versions up to the published one: a higher one belongs to a run still going.
        """
        current = self.manifest.version
        for table in TABLES:
            base = f"{self.location}/{table}"
            for day_dir in self.storage.listdir(base):
                if not day_dir.startswith("day="):
                    continue
                day = day_dir.removeprefix("day=")
                for version_dir in self.storage.listdir(f"{base}/{day_dir}"):
                    version = _version_of(version_dir)
                    mark = self.manifest.days.get(day)
                    keep = mark is not None and mark.version == version_dir.removeprefix("v=")
                    if 0 <= version <= current and not keep:
                        self.storage.delete(f"{base}/{day_dir}/{version_dir}")
        manifests = sorted(self.storage.listdir(f"{self.location}/{MANIFESTS}"))
        for name in manifests[:-_KEEP_MANIFESTS]:
            if name.endswith(".json") and _version_of(name.removesuffix(".json")) < current:
                self.storage.delete(f"{self.location}/{MANIFESTS}/{name}")


class ScratchStore:
    """Daily summaries of one run, a full recompute (no ``--summaries``): the same calls as
    :class:`SummaryStore`, without the round trip through Parquet files and a manifest
    nobody will read again.

    Each table is collected onto the driver as Arrow the moment it is written (one Spark job
    each, while the new snapshots it is computed from are still cached), but for the
    disk-days' points: those stay in Spark's cache (on disk), and only the charted disks' are
    read.
    Counting the days and reading the report's columns then need no further Spark job.
    """

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.location = "(this run only)"
        self.manifest = Manifest()
        self._tables: dict[str, Any] = {}  # table -> pyarrow.Table (no points)
        self._points: DataFrame | None = None  # the disk-days, cached, for their points

    def _rows(self, table: str, days: Collection[str] | None) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        found = self._tables.get(table)
        if found is None or days is None:
            return found
        return found.filter(pc.is_in(found.column("day"), pa.array(sorted(days), pa.string())))

    def columns(
        self, table: str, names: Sequence[str], days: Collection[str] | None = None
    ) -> dict[str, list[Any]]:
        rows = self._rows(table, days)
        if rows is None:
            return {name: [] for name in names}
        return columns_of(rows.select(list(names)))

    def points(
        self, chosen: Sequence[Disk], days: Collection[str] | None = None
    ) -> dict[str, list[Any]]:
        from pyspark.sql import functions as F

        disk_days = self._points
        if disk_days is None or not chosen:
            return {name: [] for name in POINT_COLUMNS}
        if days is not None:
            disk_days = disk_days.where(F.col("day").isin(sorted(days)))
        return spark_columns(points_of(disk_days, chosen), POINT_COLUMNS)

    def new_version(self) -> str:
        return f"{self.manifest.version + 1:010d}"

    def write(self, table: str, rows: DataFrame, version: str) -> None:
        from pyspark import StorageLevel

        if table == "disks":
            # The points stay in Spark's cache; collecting the other columns computes it. On
            # disk only: a month of a large fleet's points is gigabytes in a few blocks, and
            # a block that is also allowed memory is read back whole into the heap (a ~1 GB
            # block per task ran a 4 GiB driver out of memory); off disk it is streamed.
            self._points = rows.persist(StorageLevel.DISK_ONLY)
            rows = self._points.drop("points")
        self._tables[table] = rows.toArrow()

    def written(self, version: str) -> dict[str, DayMark]:
        disks = self._tables.get("disks")
        if disks is None:
            return {}
        import pyarrow.compute as pc

        # In Arrow, not Python: a full recompute's tables hold a row per disk-day and per
        # disk-topic-day, millions of them for a large fleet's month, for a few dozen days.
        topics = self._tables.get("topics")
        with_topics = (
            set(pc.unique(topics.column("day")).to_pylist()) if topics is not None else set()
        )
        by_day = disks.group_by("day").aggregate([("snapshots", "sum")])
        snapshots = zip(
            by_day.column("day").to_pylist(),
            by_day.column("snapshots_sum").to_pylist(),
            strict=True,
        )
        return {d: DayMark(version, int(n), d in with_topics) for d, n in snapshots}

    def publish(self, manifest: Manifest) -> None:
        self.manifest = manifest

    def destroy(self) -> None:
        if self._points is not None:
            self._points.unpersist()
            self._points = None
        self._tables.clear()
