"""The fold: the input not folded before, read once and added to the daily summaries.

What is new is known by input watermark (a file's size and mtime, a Kafka partition's
offset: :mod:`diskguard.fleet.manifest`) and, whatever is read, by snapshot identity (the
days keep every timestamp: :func:`diskguard.fleet.daily.unique_new`). The days it changes
are written as a new version and published (:mod:`diskguard.fleet.store`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from diskguard.fleet import daily
from diskguard.fleet.filesystem import FileStat, Storage, file_key, is_remote
from diskguard.fleet.inputs import STATUS_OK, InputSpec, NoInputError, classify, read_records
from diskguard.fleet.kafkasource import PartitionRange, fetched_high_watermark
from diskguard.fleet.manifest import STATUSES, Counts, FileMark, KafkaMark, Manifest
from diskguard.fleet.store import ScratchStore, SummaryStore

Store = SummaryStore | ScratchStore


def rows(df: DataFrame) -> list[dict[str, Any]]:
    """A small result, collected as plain dicts."""
    return [row.asDict(recursive=True) for row in df.collect()]


@dataclass(frozen=True)
class FoldResult:
    """What one run added to a summaries directory."""

    location: str
    read: Counts = field(default_factory=Counts)  # records this run read, by classification
    files: int = 0  # files read (new, or changed since they were folded)
    new_snapshots: int = 0  # unique snapshots added
    days_changed: int = 0
    days: int = 0  # days summarised in all
    notes: tuple[str, ...] = ()

    def line(self) -> str:
        read = f"{self.read.ok} valid records" + (
            f" from {self.files} new or changed files" if self.files else ""
        )
        return (
            f"summaries {self.location}: {self.days} days; this run read {read},"
            f" {self.new_snapshots} new snapshots into {self.days_changed} days"
        )


def _pending(spec: InputSpec, store: Store) -> tuple[InputSpec, dict[str, FileStat], list[str]]:
    """The part of ``spec`` not folded yet: files new or changed since, Kafka offsets from
    where the last run stopped. Also the files' stats (for their marks) and notes."""
    manifest = store.manifest
    if spec.kafka_topic is not None:
        mark = manifest.kafka.get(spec.kafka_source)
        spans, notes = [], []
        for span in spec.kafka_plan:
            start, end = span.start, span.end
            done = mark.offsets.get(span.partition) if mark else None
            if done is not None and done < span.start:
                notes.append(
                    f"note: {spec.kafka_topic}[{span.partition}] offsets {done}..{span.start - 1}"
                    " were deleted by retention before they were folded"
                )
            elif done is not None and done <= span.end:
                start = done
            elif done is not None:
                # Past the planned end: a broker that undercounts its end (see kafkasource),
                # or a topic recreated since. A fetch tells the true end.
                high = fetched_high_watermark(spec.kafka_options(), span.partition, span.start)
                if high >= done:
                    start, end = done, high
                else:
                    notes.append(
                        f"note: {spec.kafka_topic}[{span.partition}] ends at {max(high, end)},"
                        f" before the offset {done} already folded (the topic was recreated?):"
                        f" read from {span.start}"
                    )
            spans.append(PartitionRange(span.partition, start, end))
        return replace(spec, kafka_plan=tuple(spans)), {}, notes
    if is_remote(spec.source):
        listed = Storage(store.spark, spec.source).glob_files(spec.source)
    else:
        listed = []
        for path in spec.paths:
            st = os.stat(path)
            listed.append(FileStat(file_key(path), st.st_size, st.st_mtime_ns // 1_000_000))
    stats = {f.path: f for f in listed}
    changed = manifest.changed((f.path, f.size, f.mtime_ms) for f in listed)
    return replace(spec, paths=tuple(changed)), {p: stats[p] for p in changed}, []


@dataclass(frozen=True)
class _Tally:
    """The fold's first pass over the new input: counts per origin, days, Kafka offsets."""

    counts: dict[str, Counts]
    days: set[str]
    offsets: dict[int, int]  # Kafka partition -> highest offset read

    @classmethod
    def of(cls, rows: list[dict[str, Any]]) -> _Tally:
        by_origin: dict[str, dict[str, int]] = {}
        days: set[str] = set()
        offsets: dict[int, int] = {}
        for r in rows:
            origin = str(r["origin"])
            tally = by_origin.setdefault(origin, {})
            tally[r["status"]] = tally.get(r["status"], 0) + int(r["count"])
            if r["day"] is not None:
                days.add(str(r["day"]))
            if r["max_offset"] is not None:
                partition = int(origin)
                offsets[partition] = max(offsets.get(partition, -1), int(r["max_offset"]))
        return cls({o: Counts.of(t) for o, t in by_origin.items()}, days, offsets)

    def total(self) -> Counts:
        total = Counts()
        for counts in self.counts.values():
            total = total + counts
        return total


def fold(spark: SparkSession, store: Store, spec: InputSpec) -> FoldResult:
    """Fold what ``spec`` holds that the summaries do not into them; publish the result.

    A persistent directory is folded into with a first pass over the new input (cached):
    which days it touches (those are read and rewritten whole), its counts per file or
    Kafka partition, the offsets read. A run's scratch summaries start empty and need none of
    that: the counts ride along the one pass, as an observed metric.
    """
    manifest = store.manifest
    persistent = isinstance(store, SummaryStore)
    pending, stats, notes = _pending(spec, store) if persistent else (spec, {}, [])
    if not pending.has_input:
        return FoldResult(store.location, days=len(manifest.days), notes=tuple(notes))
    cached: list[DataFrame] = []

    def keep(df: DataFrame) -> DataFrame:
        cached.append(df.persist(StorageLevel.MEMORY_AND_DISK))
        return df

    status = F.col("status")
    version = store.new_version()
    parsed: DataFrame | None = None
    try:
        classified = classify(read_records(spark, pending))
        stored_disks = stored_topics = None
        observation = None
        if isinstance(store, SummaryStore):  # (persistent)
            # parsed once: the first pass below and the fold both read it
            classified = parsed = classified.persist(StorageLevel.MEMORY_AND_DISK)
            day = F.when(status == F.lit(STATUS_OK), F.col("day")).alias("day")
            origin = F.coalesce("origin", F.lit("")).alias("origin")
            tally = _Tally.of(
                rows(
                    daily.with_day(classified)
                    .groupBy(origin, "status", day)
                    .agg(F.count(F.lit(1)).alias("count"), F.max("offset").alias("max_offset"))
                )
            )
            stored_disks = store.read("disks", tally.days)
            stored_topics = store.read("topics", tally.days)
        else:
            observation = Observation("records")
            classified = classified.observe(
                observation,
                *[F.count_if(status == F.lit(s)).alias(s) for s in STATUSES],
            )
        valid = classified.where(status == F.lit(STATUS_OK)).drop("status", "origin", "offset")
        disks, topics = daily.fold(valid, stored_disks, stored_topics, keep)
        store.write("disks", disks, version)
        if parsed is not None:  # the new snapshots are cached by now
            parsed.unpersist()
        store.write("topics", topics, version)
    finally:
        for df in [*cached, *([parsed] if parsed is not None else [])]:
            df.unpersist()
    written = store.written(version)
    if observation is None:
        read = tally.total()
    elif written:
        read = Counts.of(observation.get)
    else:
        # No valid record: adaptive execution replaces the empty plan, observed metrics and
        # all (waiting for them would wait forever), so count again.
        recount = classify(read_records(spark, pending)).groupBy("status").count().collect()
        read = Counts.of({row["status"]: row["count"] for row in recount})
    if read.ok == 0 and not manifest.days:
        raise NoInputError(f"no valid snapshot records in {spec.source} ({read.bad_text()})")
    files: dict[str, FileMark] = {}
    kafka: dict[str, KafkaMark] = {}
    if persistent and pending.kafka_topic is not None:
        kafka[pending.kafka_source] = _kafka_mark(manifest, pending, tally)
    elif persistent:
        for path, stat in stats.items():
            counts = sum(
                (c for origin, c in tally.counts.items() if file_key(origin) == path), Counts()
            )
            files[path] = FileMark(stat.size, stat.mtime_ms, counts)
    elif pending.kafka_topic is not None:
        kafka[pending.kafka_source] = KafkaMark({}, read)
    else:
        files[pending.source] = FileMark(0, 0, read)
    before = sum(manifest.days[d].snapshots for d in written if d in manifest.days)
    store.publish(manifest.successor(written, files=files, kafka=kafka))
    return FoldResult(
        location=store.location,
        read=read,
        files=len(stats),
        new_snapshots=sum(m.snapshots for m in written.values()) - before,
        days_changed=len(written),
        days=len(store.manifest.days),
        notes=tuple(notes),
    )


def _kafka_mark(manifest: Manifest, spec: InputSpec, tally: _Tally) -> KafkaMark:
    """The source's next offsets (past the planned end if the reader went further) and its
    counts so far."""
    old = manifest.kafka.get(spec.kafka_source)
    offsets = dict(old.offsets) if old else {}
    for span in spec.kafka_plan:
        read_up_to = tally.offsets.get(span.partition, -1) + 1
        offsets[span.partition] = max(span.end, read_up_to)
    counts = (old.counts if old else Counts()) + tally.total()
    return KafkaMark(offsets, counts)
