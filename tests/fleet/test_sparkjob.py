"""The fleet Spark job, on real Spark (local[2]) and a real Kafka-protocol broker (tansu).

The fleet tests' one SparkSession (conftest); the file-based run is shared by the assertions
on it. The generated fleet has exact linear growth, so the least-squares results have a known truth,
and its overfull episodes are checked against both hand-computed numbers and the pure
reference in ``diskguard.fleet.aggregation``.
"""

from __future__ import annotations

import json
import re
import stat
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

from diskguard.fleet.aggregation import MAX_BYTES, overfull_history, summarize_disks
from diskguard.fleet.inputs import NoInputError, resolve_input
from diskguard.fleet.job import JobResult, run_aggregation
from support.cli import run_cli
from support.fleetgen import (
    DISKS,
    DUPLICATES,
    EXPECTED_EPISODES,
    HOUR,
    MALFORMED_LINES,
    T0,
    UNKNOWN_SCHEMA_LINES,
    Fleet,
    N,
    make_fleet,
    snapshot_ts,
    write_spool,
)
from support.tansu import tansu_broker

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return make_fleet()


@pytest.fixture(scope="module")
def file_run(spark: Any, fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> JobResult:
    state = tmp_path_factory.mktemp("state")
    write_spool(state / "spool", fleet.lines)
    # a state dir with a spool/ below it is accepted as the spool
    return run_aggregation(spark, resolve_input(str(state)), state / "out")


def _by_disk(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["host"], r["mount"]): r for r in rows}


def test_growth_and_hours_to_full_match_the_truth(file_run: JobResult) -> None:
    disks = _by_disk(file_run.disks)
    assert set(disks) == set(DISKS)
    for key, (rate, _) in DISKS.items():
        row = disks[key]
        if rate == 0:
            assert abs(row["growth_bytes_per_hour"]) < 1.0
            assert row["hours_to_full"] is None or row["hours_to_full"] > 1e9
            continue
        assert row["growth_bytes_per_hour"] == pytest.approx(rate, rel=0.01)
        if rate > 0:
            expected = row["available_bytes"] / rate
            assert row["hours_to_full"] == pytest.approx(expected, rel=0.01)
        else:
            assert row["hours_to_full"] is None


def test_disks_match_the_pure_reference(file_run: JobResult, fleet: Fleet) -> None:
    reference = summarize_disks(fleet.records)
    disks = _by_disk(file_run.disks)
    for key, ref in reference.items():
        row = disks[key]
        assert row["snapshots"] == ref.snapshots == N
        assert row["first_ts_ms"] == ref.first_ts_ms
        assert row["last_ts_ms"] == ref.last_ts_ms
        assert row["total_bytes"] == ref.total_bytes
        assert row["used_bytes"] == ref.used_bytes
        assert row["available_bytes"] == ref.available_bytes
        assert row["deleted_bytes"] == ref.deleted_bytes  # duplicates not summed twice
        assert row["peak_alert_level"] == ref.peak_alert_level
        assert row["overfull_episodes"] == ref.overfull_episodes
        assert row["first_overfull_ts_ms"] == ref.first_overfull_ts_ms
        assert row["overfull_seconds"] == pytest.approx(ref.overfull_seconds, abs=1e-6)
        if ref.growth_bytes_per_hour is not None:
            assert row["growth_bytes_per_hour"] == pytest.approx(
                ref.growth_bytes_per_hour, rel=1e-6, abs=1e-3
            )
        _assert_split_and_basis(row, ref)


def _assert_split_and_basis(row: dict[str, Any], ref: Any) -> None:
    """The growth split and the forecast's basis as in the pure reference."""
    for name in ("kafka_growth_bytes_per_hour", "non_kafka_growth_bytes_per_hour", "growth_r2"):
        expected = getattr(ref, name)
        if expected is None:
            assert row[name] is None, name
        else:
            assert row[name] == pytest.approx(expected, rel=1e-6, abs=1e-3), name
    if ref.growth_residual_bytes is None:
        assert row["growth_residual_bytes"] is None
    else:
        # centred residuals: exact to well under a byte even on 1e11-byte disks
        assert row["growth_residual_bytes"] == pytest.approx(
            ref.growth_residual_bytes, rel=1e-6, abs=1e-3
        )
    assert row["forecast_status"] == ref.forecast_status


def test_overfull_episodes_and_seconds_are_exact(file_run: JobResult) -> None:
    disks = _by_disk(file_run.disks)
    for key, (episodes, _) in EXPECTED_EPISODES.items():
        assert disks[key]["overfull_episodes"] == episodes, key
    # seconds: the generated timestamps are irregular, so compute the step function by hand
    for d, ((host, mount), (_, overfull)) in enumerate(sorted(DISKS.items())):
        seconds = sum(
            (snapshot_ts(d, i + 1) - snapshot_ts(d, i)) / 1000 for i in overfull if i + 1 < N
        )
        assert disks[(host, mount)]["overfull_seconds"] == pytest.approx(seconds, abs=1e-6)
        approx_seconds = EXPECTED_EPISODES[(host, mount)][1]
        assert abs(seconds - approx_seconds) < 0.2 * approx_seconds + 1
        points = [(snapshot_ts(d, i), "overfull" if i in overfull else "normal") for i in range(N)]
        assert overfull_history(points).seconds == pytest.approx(seconds)


def test_dedup_and_bad_record_counts(file_run: JobResult, fleet: Fleet) -> None:
    assert file_run.unique_records == len(fleet.records)
    assert file_run.duplicates == DUPLICATES
    assert file_run.bad.malformed == len(MALFORMED_LINES)
    assert file_run.bad.unknown_schema == len(UNKNOWN_SCHEMA_LINES)
    summary = json.loads(Path(file_run.paths["summary"]).read_text())
    assert summary["bad_records"] == {
        "malformed": len(MALFORMED_LINES),
        "unknown_schema": len(UNKNOWN_SCHEMA_LINES),
        "out_of_range": 0,
    }
    assert summary["disks"] == file_run.disks
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00$", summary["generated_at"])
    assert [t["topic"] for t in summary["topics"]] == ["orders", "logs"]


def test_topics(file_run: JobResult, fleet: Fleet) -> None:
    topics = {t["topic"]: t for t in file_run.topics}
    last = {}
    for r in fleet.records:
        key = (r["host"], r["mount"])
        if key not in last or r["ts_ms"] > last[key]["ts_ms"]:
            last[key] = r
    orders_now = sum(
        next(t["bytes"] for t in r["topics"] if t["topic"] == "orders") for r in last.values()
    )
    assert topics["orders"]["bytes"] == orders_now
    # documented: the fleet growth of a topic is the sum of its per-disk slopes
    expected_growth = sum(rate * 0.5 for rate, _ in DISKS.values())
    assert topics["orders"]["growth_bytes_per_hour"] == pytest.approx(expected_growth, rel=0.01)
    assert topics["logs"]["growth_bytes_per_hour"] == pytest.approx(0.0, abs=1.0)
    assert topics["orders"]["partitions"] == 6 * len(DISKS)
    shares = topics["logs"]["disks"]
    assert len(shares) == len(DISKS)
    assert sum(s["share"] for s in shares) == pytest.approx(1.0)
    assert shares[0]["bytes"] >= shares[-1]["bytes"]


def test_hosts_and_skew(file_run: JobResult) -> None:
    hosts = {h["host"]: h for h in file_run.hosts}
    assert set(hosts) == {"broker-1", "broker-2", "broker-3"}
    disks = file_run.disks
    b1 = [d for d in disks if d["host"] == "broker-1"]
    assert hosts["broker-1"]["used_bytes"] == sum(d["used_bytes"] for d in b1)
    assert hosts["broker-1"]["disks"] == 2
    ratios = {h: r["used_ratio"] for h, r in hosts.items()}
    mean = sum(ratios.values()) / len(ratios)
    for name, row in hosts.items():
        assert row["skew"] == pytest.approx(ratios[name] / mean)


def test_parquet_outputs(spark: Any, file_run: JobResult) -> None:
    disks = spark.read.parquet(file_run.paths["disks"])
    assert disks.count() == len(DISKS)
    assert {"growth_bytes_per_hour", "hours_to_full", "overfull_episodes"} <= set(disks.columns)
    assert spark.read.parquet(file_run.paths["topics"]).count() == 2
    assert spark.read.parquet(file_run.paths["hosts"]).count() == 3


def test_report_is_self_contained(file_run: JobResult) -> None:
    page = Path(file_run.paths["report"]).read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert "<svg" in page
    assert "<polyline" in page  # usage series
    assert "stroke-dasharray" in page  # a forecast line
    assert not re.search(r"https?://", page)
    assert "<script" not in page
    assert "broker-2" in page and "orders" in page


def test_no_valid_records_is_no_input(spark: Any, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "1.jsonl").write_text("garbage\n" + UNKNOWN_SCHEMA_LINES[0] + "\n")
    with pytest.raises(NoInputError, match="1 malformed, 1 unknown schema"):
        run_aggregation(spark, resolve_input(str(spool)), tmp_path / "out")


def test_resolve_input_errors(tmp_path: Path) -> None:
    with pytest.raises(NoInputError, match="no snapshot files"):
        resolve_input(str(tmp_path))
    with pytest.raises(NoInputError, match="match"):
        resolve_input(str(tmp_path / "*.jsonl"))
    (tmp_path / "a.jsonl").write_text("")
    with pytest.raises(NoInputError, match="empty"):
        resolve_input(str(tmp_path / "*.jsonl"))


def test_kafka_config_is_a_checked_properties_file(tmp_path: Path) -> None:
    """``--kafka-config``: librdkafka settings for a secured cluster, from a file (secrets
    stay off the command line); what the source sets itself, a malformed line, an unknown
    property and a missing file are each one line naming the file (and line)."""
    from diskguard.fleet.inputs import SourceError
    from diskguard.fleet.kafkasource import read_client_settings

    good = tmp_path / "client.properties"
    good.write_text(
        "# the aggregate job's account\n! also a comment\n\nsecurity.protocol = SASL_PLAINTEXT\n"
        "sasl.mechanism=PLAIN\nsasl.username=ops\nsasl.password=s=cret\n"
    )
    assert read_client_settings(str(good)) == {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "ops",
        "sasl.password": "s=cret",
    }
    cases = {
        "group.id=mine\n": r":1: group.id is set by diskguard aggregate itself",
        "security.protocol\n": r":1: expected key=value",
        "no.such.property=1\n": r"No such configuration property",
    }
    for text, error in cases.items():
        bad = tmp_path / "bad.properties"
        bad.write_text(text)
        with pytest.raises(SourceError, match=error):
            resolve_input("kafka://127.0.0.1:9/t", kafka_config=str(bad))
    with pytest.raises(SourceError, match=r"missing\.properties: cannot read it"):
        resolve_input("kafka://127.0.0.1:9/t", kafka_config=str(tmp_path / "missing.properties"))
    (tmp_path / "a.jsonl").write_text("{}\n")
    with pytest.raises(SourceError, match="for a kafka:// source only"):
        resolve_input(str(tmp_path / "a.jsonl"), kafka_config=str(good))
    proc = _cli(
        "aggregate", "--input", "kafka://127.0.0.1:9/t", "--kafka-config", str(bad),
        "--output", str(tmp_path / "out"),
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "bad.properties" in proc.stderr and "Traceback" not in proc.stderr


def test_kafka_config_is_read_as_kafka_reads_a_properties_file(tmp_path: Path) -> None:
    """Kafka's tools read ``--command-config`` with java.util.Properties: ``key: value`` and
    ``key value`` lines and ``\\`` continuations are properties too, and a file that works
    there works here. One reader of that syntax: the broker's own ``server.properties`` is
    read the same way (``kafkalog.serverprops``)."""
    from diskguard.fleet.kafkasource import read_client_settings
    from diskguard.kafkalog.serverprops import read_properties

    java = tmp_path / "command.properties"
    java.write_text(
        "security.protocol: SASL_PLAINTEXT\nsasl.mechanism PLAIN\n"
        "sasl.username = ops\nsasl.password=a-long-\\\n    secret\n"
    )
    expected = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "ops",
        "sasl.password": "a-long-secret",
    }
    assert read_client_settings(str(java)) == expected
    assert read_properties(java) == expected


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=300)


def test_cli_empty_dir_exits_2_with_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "spool"
    empty.mkdir()
    proc = _cli("aggregate", "--input", str(empty), "--output", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert "no snapshot files" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_end_to_end(tmp_path: Path, fleet: Fleet) -> None:
    spool = tmp_path / "spool"
    write_spool(spool, fleet.lines[:300], files=1)
    out = tmp_path / "out"
    proc = _cli("aggregate", "--input", str(spool / "*.jsonl"), "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("aggregated ")
    for name in ("disks.parquet", "topics.parquet", "hosts.parquet", "summary.json", "report.html"):
        assert (out / name).exists()
        assert str(out / name) in lines
    summary = json.loads((out / "summary.json").read_text())
    assert summary["bad_records"] == {
        "malformed": sum(line in MALFORMED_LINES for line in fleet.lines[:300]),
        "unknown_schema": sum(line in UNKNOWN_SCHEMA_LINES for line in fleet.lines[:300]),
        "out_of_range": 0,
    }
    # the JVM's start-up chatter is filtered out
    assert "Using incubator modules" not in proc.stderr
    assert "log4j" not in proc.stderr


def test_kafka_source_equals_file_run(
    spark: Any, fleet: Fleet, file_run: JobResult, tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    topic = "diskguard-snapshots"
    with tansu_broker() as broker:
        broker.create_topic(topic, partitions=3)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
        for line in fleet.lines:
            try:
                key = json.loads(line).get("host")
            except (ValueError, AttributeError):
                key = None
            producer.produce(topic, key=str(key) if key else None, value=line.encode())
        assert producer.flush(30) == 0
        spec = resolve_input(f"kafka://{broker.bootstrap}/{topic}")
        assert sum(s.end > s.start for s in spec.kafka_plan) >= 1
        result = run_aggregation(spark, spec, tmp_path / "out")
    assert result.records == file_run.records
    assert result.unique_records == file_run.unique_records
    assert result.bad == file_run.bad
    assert result.disks == file_run.disks
    assert result.topics == file_run.topics
    assert result.hosts == file_run.hosts


def test_kafka_empty_topic_is_no_input() -> None:
    with tansu_broker() as broker:
        broker.create_topic("empty", partitions=2)
        with pytest.raises(NoInputError, match="is empty"):
            resolve_input(f"kafka://{broker.bootstrap}/empty")


def test_kafka_unreachable_is_one_line_error(capfd: pytest.CaptureFixture[str]) -> None:
    from diskguard.fleet.kafkasource import KafkaSourceError, plan_offsets
    from support.net import free_port

    options = {"bootstrap.servers": f"127.0.0.1:{free_port()}", "topic": "x"}
    with pytest.raises(KafkaSourceError, match=r"cannot reach Kafka at 127\.0\.0\.1:"):
        plan_offsets(options, timeout_s=1.0)
    assert "FAIL" not in capfd.readouterr().err  # librdkafka's reconnect chatter is off


def test_kafka_url_must_name_a_topic() -> None:
    from diskguard.fleet.inputs import SourceError

    with pytest.raises(SourceError, match=r"kafka://host:port/topic"):
        resolve_input("kafka://127.0.0.1:9092")


def test_tansu_helper_pause_and_restart_on_the_same_port() -> None:
    from confluent_kafka.admin import AdminClient

    with tansu_broker() as broker:
        port = broker.port
        broker.pause()
        broker.resume()
        broker.create_topic("t1")
        broker.restart()
        assert broker.port == port
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        assert "t1" not in admin.list_topics(timeout=10).topics  # memory storage: gone


def test_spark_failure_is_one_line(spark: Any, tmp_path: Path) -> None:
    from diskguard.fleet.inputs import InputSpec
    from diskguard.fleet.session import SparkJobError

    gone = str(tmp_path / "vanished.jsonl")
    with pytest.raises(SparkJobError) as caught:
        run_aggregation(spark, InputSpec(gone, paths=(gone,)), tmp_path / "out")
    message = str(caught.value)
    assert "\n" not in message
    assert "vanished.jsonl" in message


def test_optional_fields_may_be_missing(spark: Any, tmp_path: Path) -> None:
    """Only the fields the math needs are required; topics, alert level etc. default."""
    spool = tmp_path / "spool"
    spool.mkdir()
    lines = [
        json.dumps(
            {
                "schema": 1,
                "host": "h",
                "mount": "/m",
                "ts_ms": T0 + i * HOUR,
                "total_bytes": 1000,
                "used_bytes": 100 + 10 * i,
                "available_bytes": 800 - 10 * i,
                "flow_state": "normal",
                "topics": None,
            }
        )
        for i in range(3)
    ]
    (spool / "1.jsonl").write_text("\n".join(lines) + "\n")
    result = run_aggregation(spark, resolve_input(str(spool)), tmp_path / "out")
    (disk,) = result.disks
    assert disk["growth_bytes_per_hour"] == pytest.approx(10.0)
    assert disk["hours_to_full"] == pytest.approx(78.0)
    assert disk["peak_alert_level"] == 0
    assert disk["deleted_bytes"] == 0
    assert result.topics == []


def test_growth_split_and_forecast_basis_match_the_reference(spark: Any, tmp_path: Path) -> None:
    """The demo's case (a minute of snapshots, the disk filling with non-Kafka files), a
    disk whose snapshots sometimes lack kafka_bytes, and a saw-tooth that no line fits."""
    gib, mib = 1 << 30, 1 << 20
    records: list[dict[str, Any]] = []

    def add(host: str, ts: int, used: int, kafka: int | None, topics: dict[str, int]) -> None:
        record: dict[str, Any] = {
            "schema": 1,
            "host": host,
            "mount": "/",
            "ts_ms": ts,
            "total_bytes": 200 * gib,
            "used_bytes": used,
            "available_bytes": 190 * gib - used,
            "flow_state": "normal",
            "topics": [{"topic": t, "partitions": 1, "bytes": b} for t, b in topics.items()],
        }
        if kafka is not None:
            record["kafka_bytes"] = kafka
        records.append(record)

    for i in range(30):  # one snapshot every 2 s: 58 s of data
        ts = T0 + i * 2_000
        orders, clicks = round(100 * mib * i / 1800), round(78 * mib * i / 1800)
        kafka = 30 * mib + orders + clicks
        add(
            "demo",
            ts,
            20 * gib + kafka + round(45 * gib * i / 1800),
            kafka,
            {"orders": orders, "clicks": clicks},
        )
    for i in range(20):  # three hours, every fourth snapshot without kafka_bytes
        used = 50 * gib + i * 100 * mib
        add("gaps", T0 + i * 600_000, used, None if i % 4 == 3 else used - 10 * gib, {})
    for i in range(40):  # a saw-tooth: retention frees what was written every 4 snapshots
        add("saw", T0 + i * 300_000, 60 * gib + (i % 4) * gib + i * mib, 30 * gib, {})
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "1.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    result = run_aggregation(spark, resolve_input(str(spool)), tmp_path / "out")
    reference = summarize_disks(records)
    rows = _by_disk(result.disks)
    for key, ref in reference.items():
        _assert_split_and_basis(rows[key], ref)
    demo = rows[("demo", "/")]
    assert demo["forecast_status"] == "not_enough_data"
    assert demo["non_kafka_growth_bytes_per_hour"] == pytest.approx(45 * gib, rel=1e-3)
    assert demo["kafka_growth_bytes_per_hour"] == pytest.approx(178 * mib, rel=1e-3)
    assert rows[("gaps", "/")]["non_kafka_growth_bytes_per_hour"] == pytest.approx(0, abs=1.0)
    assert rows[("gaps", "/")]["forecast_status"] == "ok"
    assert rows[("saw", "/")]["forecast_status"] == "weak_fit"
    page = Path(result.paths["report"]).read_text()
    assert "not enough data" in page
    assert "not Kafka" in page


def test_log4j_config_is_private_and_per_run() -> None:
    """Two concurrent launches get their own 0700 directory and 0600 file, gone afterwards."""
    from diskguard.fleet.session import _LOG4J, private_log4j_config

    barrier = threading.Barrier(2, timeout=30)
    seen: list[tuple[Path, int, int, str]] = []
    errors: list[BaseException] = []

    def launch() -> None:
        try:
            with private_log4j_config() as path:
                barrier.wait()  # both inside at once: two runs in flight
                seen.append(
                    (
                        path,
                        stat.S_IMODE(path.parent.stat().st_mode),
                        stat.S_IMODE(path.stat().st_mode),
                        path.read_text(),
                    )
                )
                barrier.wait()
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=launch) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(seen) == 2
    (a, a_dir, a_file, a_text), (b, b_dir, b_file, b_text) = seen
    assert a != b and a.parent != b.parent
    assert a_dir == b_dir == 0o700
    assert a_file == b_file == 0o600  # nobody else can read it, let alone rewrite it
    assert a_text == b_text == _LOG4J
    assert not a.parent.exists() and not b.parent.exists()


def test_session_log4j_config_was_used_and_removed(spark: Any) -> None:
    """The running JVM loaded its log4j config from a private per-run file, now removed."""
    options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions")
    match = re.search(r"-Dlog4j\.configurationFile=file:(\S+)", options or "")
    assert match, options
    path = Path(match.group(1))
    assert path != Path(tempfile.gettempdir()) / "diskguard-spark-log4j2.properties"
    assert path.parent.name.startswith("diskguard-spark-log4j-")
    assert not path.parent.exists()
    jvm = spark.sparkContext._jvm
    context = jvm.org.apache.logging.log4j.LogManager.getContext(False)
    location = context.getConfiguration().getConfigurationSource().getLocation()
    assert Path(str(location)) == path


def _skewed(record: dict[str, Any], **changes: Any) -> str:
    return json.dumps({**record, **changes})


def _topics(p: int = 6, b: int = 5) -> list[dict[str, Any]]:
    """A topic in range and one with ``p`` partitions and ``b`` bytes."""
    return [
        {"topic": "orders", "partitions": 6, "bytes": 5},
        {"topic": "payments", "partitions": p, "bytes": b},
    ]


def test_a_skewed_host_is_counted_bad_and_the_report_is_written(
    spark: Any, fleet: Fleet, file_run: JobResult, tmp_path: Path
) -> None:
    """Timestamps a clock never shows (9999-12-31, 1e17 ms, negative) and negative byte
    counts are bad records, counted; the other hosts' report is the same as without them."""
    base = fleet.records[0]
    topics = [{"topic": "orders", "partitions": 6, "bytes": -1}]
    skewed = [
        _skewed(base, ts_ms=253_402_214_400_000),  # 9999-12-31
        _skewed(base, host="skewed", ts_ms=253_402_214_400_000),
        _skewed(base, host="skewed", ts_ms=253_402_214_400_000 + 60_000),
        _skewed(base, ts_ms=10**17),
        _skewed(base, ts_ms=-5),
        _skewed(base, ts_ms=base["ts_ms"] + 7, used_bytes=-1),
        _skewed(base, ts_ms=base["ts_ms"] + 8, available_bytes=-10),
        _skewed(base, ts_ms=base["ts_ms"] + 9, deleted_bytes=-1000),
        _skewed(base, ts_ms=base["ts_ms"] + 10, topics=topics),
        # one topic of several out of range, beside a null entry; or past 8 PiB
        _skewed(base, ts_ms=base["ts_ms"] + 11, topics=[None, *_topics(p=-1)]),
        _skewed(base, ts_ms=base["ts_ms"] + 12, topics=_topics(b=MAX_BYTES + 1)),
    ]
    spool = tmp_path / "spool"
    write_spool(spool, fleet.lines + skewed)
    result = run_aggregation(spark, resolve_input(str(spool)), tmp_path / "out")
    assert result.bad.out_of_range == len(skewed)
    assert result.bad.malformed == file_run.bad.malformed
    assert result.disks == file_run.disks
    assert result.topics == file_run.topics
    summary = json.loads(Path(result.paths["summary"]).read_text())
    assert summary["bad_records"]["out_of_range"] == len(skewed)
    assert f"{len(skewed)} out of range" in result.summary_line()
    page = Path(result.paths["report"]).read_text()
    assert f"{len(skewed)} out of range" in page
    assert ">skewed<" not in page and "skewed:" not in page  # the host is not shown


def test_a_forecast_past_year_9999_is_written(spark: Any, tmp_path: Path) -> None:
    """A disk that barely grows fills in a million years: the report says so, it does not
    stop at the calendar's end."""
    lines = [
        json.dumps(
            {
                "schema": 1,
                "host": "slow",
                "mount": "/m",
                "ts_ms": T0 + i * 600_000,
                "total_bytes": 10**13,
                "used_bytes": 10**12 + i + (7 if i % 2 else 0),
                "available_bytes": 9 * 10**12 - i,
                "flow_state": "normal",
            }
        )
        for i in range(20)
    ]
    spool = tmp_path / "spool"
    write_spool(spool, lines, files=1)
    result = run_aggregation(spark, resolve_input(str(spool)), tmp_path / "out")
    (disk,) = result.disks
    assert disk["hours_to_full"] > 1e9
    page = Path(result.paths["report"]).read_text()
    assert "after 9999-12-31" in page
