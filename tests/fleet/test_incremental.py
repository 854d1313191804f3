"""Daily summaries kept from run to run (``--summaries``), on real Spark (local[2]).

The contract: folding the input day by day, with duplicates, late snapshots, re-runs and
files that grow, gives the very report a full recompute over all the input gives, and the
same rows to the bit (the days' sums are exact integers).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from diskguard.fleet.aggregation import overfull_history, summarize_disks
from diskguard.fleet.inputs import resolve_input
from diskguard.fleet.job import JobResult, run_aggregation
from diskguard.fleet.store import ConcurrentRunError, NotASummariesDir, SummaryStore
from support.cli import run_cli
from support.fleetgen import DAY0, DAY_MS, DAYS, make_days_fleet

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def days_fleet() -> tuple[list[dict[str, Any]], dict[int, list[str]]]:
    return make_days_fleet()


def _write_days(directory: Path, by_day: dict[int, list[str]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for day, lines in by_day.items():
        half = len(lines) // 2  # two files a day, as rotated spool files
        (directory / f"day{day}-a.jsonl").write_text("\n".join(lines[:half]) + "\n")
        (directory / f"day{day}-b.jsonl").write_text("\n".join(lines[half:]) + "\n")
    return directory


def _run(spark: Any, source: str, out: Path, summaries: Path | None = None, **kw: Any) -> JobResult:
    spec = resolve_input(source, allow_empty=summaries is not None)
    return run_aggregation(spark, spec, out, summaries=summaries, **kw)


def _summary(result: JobResult) -> dict[str, Any]:
    summary = json.loads(Path(result.paths["summary"]).read_text())
    for key in ("generated_at", "source", "summaries"):
        summary.pop(key, None)
    return summary


def _page(result: JobResult) -> str:
    """The report without its first line of metadata (when, and from which input)."""
    page = Path(result.paths["report"]).read_text()
    return re.sub(r'<p class="meta">Generated .*?</p>', "", page, count=1)


def assert_same_report(a: JobResult, b: JobResult) -> None:
    assert a.disks == b.disks  # exactly: the same integer sums, rounded once
    assert a.topics == b.topics
    assert a.hosts == b.hosts
    assert (a.records, a.unique_records, a.duplicates, a.bad) == (
        b.records,
        b.unique_records,
        b.duplicates,
        b.bad,
    )
    assert _summary(a) == _summary(b)
    assert _page(a) == _page(b)


@pytest.fixture(scope="module")
def full_run(
    spark: Any,
    days_fleet: tuple[list[dict[str, Any]], dict[int, list[str]]],
    tmp_path_factory: pytest.TempPathFactory,
) -> JobResult:
    spool = _write_days(tmp_path_factory.mktemp("all"), days_fleet[1])
    return _run(spark, str(spool), tmp_path_factory.mktemp("full"))


@dataclass(frozen=True)
class DayByDay:
    """The spool folded one day a run into ``summaries``; ``after_day0``: a copy of the
    summaries as the first run left them."""

    spool: Path
    summaries: Path
    after_day0: Path
    results: list[JobResult]


@pytest.fixture(scope="module")
def day_by_day(
    spark: Any,
    days_fleet: tuple[list[dict[str, Any]], dict[int, list[str]]],
    tmp_path_factory: pytest.TempPathFactory,
) -> DayByDay:
    """Shared by the tests that start from folded days (a Spark run each costs seconds)."""
    root = tmp_path_factory.mktemp("day-by-day")
    spool = _write_days(root / "spool", days_fleet[1])
    summaries, after_day0 = root / "summaries", root / "after-day0"
    results = []
    for d in range(DAYS):
        results.append(_run(spark, str(spool / f"day{d}-*.jsonl"), root / f"out{d}", summaries))
        if d == 0:
            shutil.copytree(summaries, after_day0)
    return DayByDay(spool, summaries, after_day0, results)


def test_folding_day_by_day_gives_the_full_recompute_report(
    days_fleet: tuple[list[dict[str, Any]], dict[int, list[str]]],
    day_by_day: DayByDay,
    full_run: JobResult,
) -> None:
    records, _ = days_fleet
    results = day_by_day.results
    last = results[-1]
    assert_same_report(last, full_run)
    # day 2 brings late snapshots of day 0: that day is rewritten too
    assert results[0].fold is not None and results[0].fold.days_changed == 1
    assert last.fold is not None and last.fold.days_changed >= 2
    assert last.fold is not None and last.fold.days == DAYS
    assert last.unique_records == len(records)
    assert last.bad.malformed == 2 and last.bad.unknown_schema == 1
    assert last.bad.out_of_range == 1
    # and both hold the plain-Python reference: growth, split, basis, overfull history
    reference = summarize_disks(records)
    disks = {(d["host"], d["mount"]): d for d in last.disks}
    assert set(disks) == set(reference)
    for key, ref in reference.items():
        row = disks[key]
        assert row["snapshots"] == ref.snapshots
        assert (row["first_ts_ms"], row["last_ts_ms"]) == (ref.first_ts_ms, ref.last_ts_ms)
        assert row["used_bytes"] == ref.used_bytes
        assert row["deleted_bytes"] == ref.deleted_bytes
        assert row["overfull_episodes"] == ref.overfull_episodes, key
        assert row["overfull_seconds"] == pytest.approx(ref.overfull_seconds), key
        for name in (
            "growth_bytes_per_hour",
            "kafka_growth_bytes_per_hour",
            "non_kafka_growth_bytes_per_hour",
            "growth_r2",
            "growth_residual_bytes",
        ):
            assert row[name] == pytest.approx(getattr(ref, name), rel=1e-9, abs=1e-3), (key, name)
        assert row["forecast_status"] == ref.forecast_status
    assert disks[("broker-1", "/data1")]["overfull_episodes"] == 2  # one across midnight


def test_the_episodes_timeline_crosses_midnight_and_gaps(
    days_fleet: tuple[list[dict[str, Any]], dict[int, list[str]]], full_run: JobResult
) -> None:
    """The report's episodes are those of the reference, however the days cut them."""
    records, _ = days_fleet
    page = Path(full_run.paths["report"]).read_text()
    expected = 0
    for host, mount in {(r["host"], r["mount"]) for r in records}:
        points = [
            (r["ts_ms"], r["flow_state"])
            for r in records
            if (r["host"], r["mount"]) == (host, mount)
        ]
        expected += overfull_history(points).count
    assert f"{expected} episodes" in page


def test_a_rerun_over_the_same_input_adds_nothing(
    spark: Any, day_by_day: DayByDay, full_run: JobResult, tmp_path: Path
) -> None:
    """Over the whole spool, every file of which the day-by-day runs folded."""
    spool, summaries = day_by_day.spool, day_by_day.summaries
    again = _run(spark, str(spool), tmp_path / "out2", summaries)
    assert again.fold is not None
    assert (again.fold.read.ok, again.fold.files, again.fold.new_snapshots) == (0, 0, 0)
    assert_same_report(again, day_by_day.results[-1])
    assert_same_report(again, full_run)
    # a file touched (same content, new mtime) is read again; its snapshots are known
    touched = spool / "day1-a.jsonl"
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 10**9))
    third = _run(spark, str(spool), tmp_path / "out3", summaries)
    assert third.fold is not None
    assert third.fold.files == 1 and third.fold.read.ok > 0 and third.fold.new_snapshots == 0
    assert_same_report(third, full_run)


def test_a_growing_spool_file_is_read_again_and_counted_once(
    spark: Any,
    days_fleet: tuple[list[dict[str, Any]], dict[int, list[str]]],
    full_run: JobResult,
    tmp_path: Path,
) -> None:
    """The daemon appends to its newest spool file: each run reads it whole again; its
    snapshots are not counted twice, nor its records and bad lines."""
    lines = [line for day in range(DAYS) for line in days_fleet[1][day]]
    spool = tmp_path / "spool"
    spool.mkdir()
    growing = spool / "00000001.jsonl"
    summaries = tmp_path / "summaries"
    halves = [lines[: len(lines) // 2], lines[len(lines) // 2 :]]
    for i, part in enumerate(halves):
        with growing.open("a") as f:
            f.write("\n".join(part) + "\n")
        result = _run(spark, str(spool), tmp_path / f"out{i}", summaries)
    # the second run read the whole file again: its first half was known
    assert result.fold is not None and result.fold.files == 1
    assert result.fold.read.ok > result.fold.new_snapshots > 0
    # the full run read the same lines in six files: same records, same report
    assert_same_report(result, full_run)


def test_a_window_of_days_reports_on_those_days(
    spark: Any,
    days_fleet: tuple[list[dict[str, Any]], dict[int, list[str]]],
    tmp_path: Path,
) -> None:
    records, by_day = days_fleet
    spool = _write_days(tmp_path / "spool", by_day)
    windowed = _run(spark, str(spool), tmp_path / "out", tmp_path / "summaries", days=2)
    recent = [json.dumps(r) for r in records if r["ts_ms"] >= DAY0 + DAY_MS]
    only = tmp_path / "recent"
    only.mkdir()
    (only / "recent.jsonl").write_text("\n".join(recent) + "\n")
    full = _run(spark, str(only), tmp_path / "full")
    # a full recompute over every day, reporting on the last two, too
    recomputed = _run(spark, str(spool), tmp_path / "recomputed", days=2)
    for result in (windowed, recomputed):
        assert result.disks == full.disks
        assert result.topics == full.topics
        assert result.hosts == full.hosts
    summary = json.loads(Path(windowed.paths["summary"]).read_text())
    assert summary["summaries"]["window"] == ["2026-09-23", "2026-09-24"]
    assert summary["summaries"]["days"] == DAYS


def test_a_run_that_dies_or_loses_a_race_leaves_the_summaries_whole(
    spark: Any,
    day_by_day: DayByDay,
    full_run: JobResult,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spool = day_by_day.spool
    summaries = tmp_path / "summaries"  # as the run of day 0 left them
    shutil.copytree(day_by_day.after_day0, summaries)
    # a run that died after writing its days, before publishing them
    orphan = summaries / "disks" / "day=2026-09-23" / "v=0000000002-deadbeef"
    orphan.mkdir(parents=True)
    (orphan / "part-0.parquet").write_bytes(b"not parquet")
    # a run that loses the race: another publishes version 2 while it works
    real_new_version = SummaryStore.new_version

    def rival(store: SummaryStore) -> str:
        version = real_new_version(store)
        (summaries / "_manifest" / "0000000002.json").write_text(store.manifest.to_json())
        return version

    monkeypatch.setattr(SummaryStore, "new_version", rival)
    with pytest.raises(ConcurrentRunError, match="run it again"):
        _run(spark, str(spool / "day1-*.jsonl"), tmp_path / "lost", summaries)
    monkeypatch.undo()
    (summaries / "_manifest" / "0000000002.json").unlink()
    for day in (1, 2):
        result = _run(spark, str(spool / f"day{day}-*.jsonl"), tmp_path / f"out{day}", summaries)
    assert_same_report(result, full_run)
    assert not orphan.exists()  # unreferenced directories are removed once published
    versions = [p.name for p in (summaries / "disks").glob("day=*/v=*")]
    assert len(versions) == DAYS, versions


def test_summaries_must_be_a_summaries_directory(spark: Any, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    with pytest.raises(NotASummariesDir, match="not a diskguard summaries directory"):
        SummaryStore(spark, str(other))
    assert (other / "precious.txt").read_text() == "keep me"


def test_cli_incremental_and_summaries_options(
    days_fleet: tuple[list[dict[str, Any]], dict[int, list[str]]], tmp_path: Path
) -> None:
    spool = _write_days(tmp_path / "spool", {0: days_fleet[1][0]})
    out = tmp_path / "out"
    proc = run_cli(
        "aggregate", "--input", str(spool), "--output", str(out), "--incremental", timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("aggregated ")
    assert lines[1].startswith(f"summaries {out / 'summaries'}: 1 days; this run read ")
    assert str(out / "summaries") in lines
    assert (out / "summaries" / "_manifest").is_dir()
    bad = tmp_path / "notes"
    bad.mkdir()
    (bad / "x").write_text("x")
    proc = run_cli(
        "aggregate",
        "--input",
        str(spool),
        "--output",
        str(out),
        "--summaries",
        str(bad),
        timeout=600,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "not a diskguard summaries directory" in proc.stderr
    shutil.rmtree(out)


def test_kafka_offsets_are_the_watermark(
    spark: Any,
    days_fleet: tuple[list[dict[str, Any]], dict[int, list[str]]],
    full_run: JobResult,
    tmp_path: Path,
) -> None:
    """Each run reads the topic from where the previous one stopped; a replay of records
    already folded (a shipper delivering again) changes nothing."""
    from confluent_kafka import Producer

    from support.tansu import tansu_broker

    _, by_day = days_fleet
    topic = "diskguard-snapshots"
    summaries = tmp_path / "summaries"
    with tansu_broker() as broker:
        broker.create_topic(topic, partitions=2)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
        source = f"kafka://{broker.bootstrap}/{topic}"

        def send(lines: list[str]) -> None:
            for line in lines:
                producer.produce(topic, value=line.encode())
            assert producer.flush(30) == 0

        send(by_day[0])
        first = _run(spark, source, tmp_path / "out0", summaries)
        assert first.fold is not None and first.fold.read.ok > 0
        again = _run(spark, source, tmp_path / "out1", summaries)  # nothing new
        assert again.fold is not None and again.fold.read == type(again.fold.read)()
        send(by_day[1] + by_day[2])
        last = _run(spark, source, tmp_path / "out2", summaries)
    assert last.fold is not None
    # only what was produced since: days 1 and 2, less their 4 bad lines
    assert last.fold.read.ok == len(by_day[1]) + len(by_day[2]) - 4
    assert_same_report(last, full_run)
    manifest = json.loads(sorted((summaries / "_manifest").glob("*.json"))[-1].read_text())
    (mark,) = manifest["kafka"].values()
    assert sum(mark["offsets"].values()) == sum(len(by_day[d]) for d in range(DAYS))


def _rows(columns: dict[str, list[Any]]) -> list[dict[str, Any]]:
    found = [
        dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)
    ]
    return sorted(found, key=repr)


def test_summaries_read_through_spark_are_the_rows_pyarrow_reads(
    spark: Any, day_by_day: DayByDay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local summaries directory is read on the driver with pyarrow; one on hdfs:// or
    s3a:// through Spark. Both readers give the same columns, points and days."""
    from diskguard.fleet import daily

    store = SummaryStore(spark, str(day_by_day.summaries))
    chosen = [("broker-1", "/data1"), ("broker-2", "/data1")]
    days = sorted(store.manifest.days)[-2:]

    def read_all() -> list[dict[str, list[Any]]]:
        return [
            store.columns("disks", daily.DISK_DAY_COLUMNS),
            store.columns("topics", daily.TOPIC_DAY_COLUMNS, days),
            store.points(chosen),
        ]

    by_pyarrow = read_all()
    monkeypatch.setattr(store.storage, "remote", True)
    by_spark = read_all()
    for local, remote in zip(by_pyarrow, by_spark, strict=True):
        assert local["host"], "nothing read"
        assert _rows(local) == _rows(remote)
    assert set(by_pyarrow[0]["day"]) == set(store.manifest.days)
    assert set(zip(by_pyarrow[2]["host"], by_pyarrow[2]["mount"], strict=True)) == set(chosen)


def test_outputs_written_through_spark_are_those_pyarrow_writes(
    spark: Any, day_by_day: DayByDay, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outputs to a local directory are written by the driver with pyarrow; to hdfs:// or
    s3a:// through Spark: the same tables either way, one part file each."""
    import pyarrow.parquet as pq

    from diskguard.fleet import outputs

    spec = resolve_input(str(day_by_day.spool / "day0-*.jsonl"), allow_empty=True)
    local = run_aggregation(spark, spec, tmp_path / "local", summaries=day_by_day.summaries)
    monkeypatch.setattr(outputs, "is_remote", lambda location: location.startswith(str(tmp_path)))
    remote = run_aggregation(spark, spec, tmp_path / "remote", summaries=day_by_day.summaries)
    for name in ("disks", "topics", "hosts"):
        a, b = Path(local.paths[name]), Path(remote.paths[name])
        assert len(list(a.glob("part-*.parquet"))) == len(list(b.glob("part-*.parquet"))) == 1
        assert pq.read_table(a).to_pylist() == pq.read_table(b).to_pylist(), name
        assert spark.read.parquet(str(a)).schema == spark.read.parquet(str(b)).schema, name


def test_an_unreadable_summaries_file_is_one_line(
    spark: Any, day_by_day: DayByDay, tmp_path: Path
) -> None:
    """The driver reads the summaries itself: a damaged file is named, not a traceback."""
    from diskguard.errors import FailedError

    summaries = tmp_path / "summaries"
    shutil.copytree(day_by_day.summaries, summaries)
    part = next((summaries / "disks").glob("day=2026-09-22/v=*/part-*.parquet"))
    part.write_bytes(b"not parquet")
    with pytest.raises(FailedError, match=r"cannot read the summaries in \S*day=2026-09-22"):
        _run(spark, str(day_by_day.spool / "day0-*.jsonl"), tmp_path / "out", summaries)
