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

import uuid
from collections.abc import Collection

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StringType, StructField, StructType

from diskguard.errors import FailedError, UsageError
from diskguard.fleet.daily import DISK_DAY_SCHEMA, TOPIC_DAY_SCHEMA
from diskguard.fleet.filesystem import Storage
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
        paths = [f"{base}/day={day}/v={version}" for day in days_of("disks")]
        if not paths:
            return {}
        with_topics = set(days_of("topics"))
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
    """Daily summaries held in Spark's cache for one run: a full recompute (no
    ``--summaries``). The same calls as :class:`SummaryStore`, without the round trip
    through Parquet files and a manifest nobody will read again."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.location = "(this run only)"
        self.manifest = Manifest()
        self._tables: dict[str, DataFrame] = {}

    def read(self, table: str, days: Collection[str] | None = None) -> DataFrame | None:
        from pyspark.sql import functions as F

        df = self._tables.get(table)
        if df is None or days is None:
            return df
        return df.where(F.col("day").isin(sorted(days)))

    def new_version(self) -> str:
        return f"{self.manifest.version + 1:010d}"

    def write(self, table: str, rows: DataFrame, version: str) -> None:
        from pyspark import StorageLevel

        kept = rows.persist(StorageLevel.MEMORY_AND_DISK)
        kept.count()  # computed now, while what it is computed from is still cached
        self._tables[table] = kept

    def written(self, version: str) -> dict[str, DayMark]:
        from pyspark.sql import functions as F

        disks = self._tables.get("disks")
        topics = self._tables.get("topics")
        if disks is None:
            return {}
        with_topics = (
            {r["day"] for r in topics.select("day").distinct().collect()} if topics else set()
        )
        rows = disks.groupBy("day").agg(F.sum("snapshots").alias("snapshots")).collect()
        return {
            str(r["day"]): DayMark(version, int(r["snapshots"]), r["day"] in with_topics)
            for r in rows
        }

    def publish(self, manifest: Manifest) -> None:
        self.manifest = manifest

    def destroy(self) -> None:
        for df in self._tables.values():
            df.unpersist()
        self._tables.clear()
