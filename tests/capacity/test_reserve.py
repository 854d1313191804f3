"""Reserved size (IBM Event Streams method): the pure math, the log-dir and broker sources, and
``diskguard reserve`` end to end against real filesystems and a real tansu broker.

tansu 0.6.0 answers DescribeConfigs for topics but returns only the keys set explicitly at
creation (no defaults, and nothing for BROKER resources); the missing keys come from the
broker defaults, which is what these tests check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from structlog.testing import capture_logs

from diskguard.capacity.reserve import (
    COMPACT_RESERVED_BYTES,
    TopicSettings,
    partition_reserve,
    policy_kind,
    reserve_report,
)
from diskguard.capacity.topicconfigs import (
    KAFKA_DEFAULTS,
    TopicConfigError,
    broker_defaults,
    load_topics,
    local_broker_id,
    topics_from_log_dirs,
)
from diskguard.config import BrokerConfig, parse_config
from support.net import free_port
from support.tansu import run_tansu

KiB, MiB, GiB = 1024, 1024**2, 1024**3
DIAG = Path(sys.executable).parent / "diskguard"


# -- the pure math ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("retention", "segment", "ibm_about_gib", "data", "index", "segments"),
    [
        # IBM example 1: "about 1.5 GB".
        (1 * GiB, 512 * MiB, 1.5, 1536 * MiB, 2 * 10 * MiB * 3, 3),
        # IBM example 2: "about 50.5 GB".
        (50 * GiB, 512 * MiB, 50.5, 50 * GiB + 512 * MiB, 2 * 10 * MiB * 101, 101),
        # IBM example 3: "about 1.1 GB".
        (1 * GiB, 128 * MiB, 1.1, 1152 * MiB, 2 * 10 * MiB * 9, 9),
    ],
)
def test_ibm_examples(
    retention: int, segment: int, ibm_about_gib: float, data: int, index: int, segments: int
) -> None:
    per = partition_reserve("delete", retention, segment, 10 * MiB)
    assert per is not None
    assert (per.data_bytes, per.index_bytes, per.segments) == (data, index, segments)
    # IBM's "about" figures are retention + one segment; they leave the index term out.
    assert per.data_bytes / GiB == pytest.approx(ibm_about_gib, abs=0.05)
    # The full formula, exactly: 1.5586 GiB, 52.4727 GiB, 1.3008 GiB.
    assert per.total_bytes == retention + segment + 2 * 10 * MiB * (retention // segment + 1)


def test_exact_totals_of_the_ibm_examples() -> None:
    totals = [
        partition_reserve("delete", r, s, 10 * MiB)
        for r, s in ((GiB, 512 * MiB), (50 * GiB, 512 * MiB), (GiB, 128 * MiB))
    ]
    assert [t.total_bytes for t in totals if t] == [1596 * MiB, 53732 * MiB, 1332 * MiB]


def test_compact_is_a_flat_gib_and_compact_delete_is_delete() -> None:
    compact = partition_reserve("compact", -1, 100 * MiB, 10 * MiB)
    assert compact is not None
    assert compact.total_bytes == COMPACT_RESERVED_BYTES == GiB
    both = partition_reserve("compact, delete", GiB, 512 * MiB, 10 * MiB)
    assert both is not None and both.total_bytes == 1596 * MiB
    assert partition_reserve("delete,compact", -1, GiB, 10 * MiB) is None
    assert policy_kind("") == "delete"
    with pytest.raises(ValueError, match=r"unknown cleanup\.policy"):
        policy_kind("archive")


def test_report_sums_bounded_lists_unbounded_and_flags_90_percent() -> None:
    topics = [
        TopicSettings("orders", 4, "delete", GiB, 512 * MiB, 10 * MiB),
        TopicSettings("events", 2, "delete", -1, GiB, 10 * MiB),
        TopicSettings("__consumer_offsets", 50, "compact", -1, 100 * MiB, 10 * MiB),
    ]
    report = reserve_report(topics, capacity_bytes=100 * GiB)
    assert [r.settings.topic for r in report.topics] == ["__consumer_offsets", "orders", "events"]
    assert report.total_bytes == 50 * GiB + 4 * 1596 * MiB
    assert [r.settings.topic for r in report.unbounded] == ["events"]
    assert report.unbounded[0].reserved_bytes is None
    assert report.percent == pytest.approx(100 * (50 * GiB + 4 * 1596 * MiB) / (100 * GiB))
    assert not report.over_limit

    exactly_90 = reserve_report([TopicSettings("c", 9, "compact", -1, GiB, 0)], 10 * GiB)
    assert exactly_90.percent == 90.0 and not exactly_90.over_limit
    above = reserve_report([TopicSettings("c", 10, "compact", -1, GiB, 0)], 10 * GiB)
    assert above.over_limit
    assert reserve_report([], 0).percent is None


def test_report_names_the_topic_on_bad_settings() -> None:
    with pytest.raises(ValueError, match=r"topic 'bad': segment\.bytes must be positive"):
        reserve_report([TopicSettings("bad", 1, "delete", GiB, 0, 10 * MiB)], GiB)


# -- from the log dirs and server.properties -----------------------------------------------


def _log_dir(root: Path) -> Path:
    """A log dir as a broker leaves it: live partitions, dirs on their way out, files."""
    log_dir = root / "kafka-logs"
    for name in (
        "orders-0",
        "orders-1",
        "orders-2",
        "events-0",
        "__consumer_offsets-0",
        "__consumer_offsets-1",
        "orders-3.8f1f1e0e2b5c4b4c9d1a2b3c4d5e6f70-delete",
        "orders-4.8f1f1e0e2b5c4b4c9d1a2b3c4d5e6f70-future",
        "lost+found",
    ):
        (log_dir / name).mkdir(parents=True)
    for name in ("meta.properties", "recovery-point-offset-checkpoint", ".lock"):
        (log_dir / name).write_text("")
    (log_dir / "meta.properties").write_text("version=1\nnode.id=7\ncluster.id=abc\n")
    return log_dir


def _server_properties(path: Path, log_dirs: list[Path], extra: str = "") -> Path:
    path.write_text(
        "# a broker config\n"
        f"log.dirs={','.join(str(d) for d in log_dirs)}\n"
        "log.retention.bytes = 1073741824\n"
        "log.segment.bytes: 536870912\n"
        "log.index.size.max.bytes=5242880\n"
        "log.cleanup.policy=delete\n" + extra
    )
    return path


def test_defaults_come_from_server_properties(tmp_path: Path) -> None:
    log_dir = _log_dir(tmp_path)
    props = _server_properties(tmp_path / "server.properties", [log_dir])
    config = parse_config({"broker": {"server_properties": str(props)}}, tmp_path / "d.toml")
    defaults = broker_defaults(config.broker)
    assert (defaults.retention_bytes, defaults.segment_bytes) == (GiB, 512 * MiB)
    # Kafka's broker-level key for segment.index.bytes.
    assert defaults.segment_index_bytes == 5 * MiB
    assert defaults.cleanup_policy == "delete"
    assert local_broker_id(config.broker.log_dirs) == 7

    topics = {t.topic: t for t in topics_from_log_dirs(config.broker.log_dirs, defaults)}
    assert set(topics) == {"orders", "events", "__consumer_offsets"}
    assert topics["orders"].partitions == 3  # -delete and -future dirs are not live
    assert topics["orders"].retention_bytes == GiB
    assert topics["__consumer_offsets"].cleanup_policy == "compact"
    assert topics["events"].source == "defaults"


def test_kafka_defaults_without_server_properties(tmp_path: Path) -> None:
    log_dir = _log_dir(tmp_path)
    defaults = broker_defaults(BrokerConfig(log_dirs=[log_dir]))
    assert defaults.retention_bytes == KAFKA_DEFAULTS.retention_bytes == -1
    inventory = load_topics(BrokerConfig(log_dirs=[log_dir]))
    assert inventory.source == "log-dirs"
    assert all(t.retention_bytes == -1 for t in inventory.topics)


def test_bad_server_properties_value_names_file_and_key(tmp_path: Path) -> None:
    log_dir = _log_dir(tmp_path)
    props = _server_properties(
        tmp_path / "server.properties", [log_dir], "log.retention.bytes=lots\n"
    )
    with pytest.raises(TopicConfigError, match=r"server.properties: log.retention.bytes"):
        broker_defaults(BrokerConfig(log_dirs=[log_dir], server_properties=props))


def test_unreachable_broker_falls_back_and_logs(tmp_path: Path) -> None:
    log_dir = _log_dir(tmp_path)
    port = free_port()  # nothing listens there
    broker = BrokerConfig(log_dirs=[log_dir], bootstrap_servers=f"127.0.0.1:{port}")
    with capture_logs() as logs:
        inventory = load_topics(broker, timeout=1.5)
    assert inventory.source == "log-dirs"
    assert any("broker unavailable" in n for n in inventory.notes)
    assert [e["event"] for e in logs] == ["reserve_broker_unavailable"]
    assert {t.topic for t in inventory.topics} == {"orders", "events", "__consumer_offsets"}


# -- the CLI on a real tmpfs -----------------------------------------------------------------


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(DIAG), *args], capture_output=True, text=True, timeout=120)


def test_cli_json_and_table_below_limit(tmp_path: Path, tmpfs: Callable[[int], Path]) -> None:
    mnt = tmpfs(64 * GiB)  # tmpfs allocates lazily: a big size costs nothing
    log_dir = _log_dir(mnt)
    props = _server_properties(tmp_path / "server.properties", [log_dir])
    config = tmp_path / "diskguard.toml"
    config.write_text(f'[broker]\nserver_properties = "{props}"\n')

    result = _run("reserve", "-c", str(config), "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["source"] == "log-dirs"
    rows = {r["topic"]: r for r in out["topics"]}
    per = GiB + 512 * MiB + 2 * 5 * MiB * 3
    assert rows["orders"]["per_partition_bytes"] == per
    assert rows["orders"]["reserved_bytes"] == 3 * per
    assert rows["__consumer_offsets"]["reserved_bytes"] == 2 * GiB
    assert out["total_reserved_bytes"] == 4 * per + 2 * GiB
    assert out["unbounded_topics"] == []
    st = os.statvfs(mnt)
    assert out["capacity_bytes"] == (st.f_blocks - st.f_bfree + st.f_bavail) * st.f_frsize
    assert [f["mountpoint"] for f in out["filesystems"]] == [str(mnt)]
    assert out["over_limit"] is False
    assert "warning" not in result.stderr

    table = _run("reserve", "-c", str(config))
    assert table.returncode == 0, table.stderr
    text = " ".join(table.stdout.split())  # rich wraps to the terminal width
    assert "orders" in text and "total reserved" in text
    assert "per-topic overrides are unknown" in text


def test_cli_warns_above_90_percent_and_exits_0(
    tmp_path: Path, tmpfs: Callable[[int], Path]
) -> None:
    mnt = tmpfs(4 * GiB)
    log_dir = _log_dir(mnt)  # 4 delete partitions x ~1.56 GiB + 2 compact x 1 GiB > 4 GiB
    props = _server_properties(tmp_path / "server.properties", [log_dir])
    config = tmp_path / "diskguard.toml"
    config.write_text(f'[broker]\nserver_properties = "{props}"\n')
    result = _run("reserve", "-c", str(config), "--json")
    assert result.returncode == 0
    assert json.loads(result.stdout)["over_limit"] is True
    assert "warning: topics may reserve" in result.stderr
    assert "above 90%" in result.stderr


def test_cli_bad_server_properties_is_exit_2_one_line(tmp_path: Path) -> None:
    log_dir = _log_dir(tmp_path)
    props = _server_properties(
        tmp_path / "server.properties", [log_dir], "log.cleanup.policy=archive\n"
    )
    config = tmp_path / "diskguard.toml"
    config.write_text(f'[broker]\nserver_properties = "{props}"\n')
    result = _run("reserve", "-c", str(config))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "server.properties: log.cleanup.policy" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_dead_broker_falls_back_with_json_log_on_stderr(tmp_path: Path) -> None:
    log_dir = _log_dir(tmp_path)
    config = tmp_path / "diskguard.toml"
    config.write_text(
        f'[broker]\nlog_dirs = ["{log_dir}"]\nbootstrap_servers = "127.0.0.1:{free_port()}"\n'
    )
    result = _run("reserve", "-c", str(config), "--json", "--timeout", "1")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["source"] == "log-dirs"  # stdout stays pure JSON
    events = [json.loads(line) for line in result.stderr.splitlines()]
    assert [e["event"] for e in events] == ["reserve_broker_unavailable"]
    assert events[0]["level"] == "warning"


# -- against a real Kafka-protocol broker -----------------------------------------------------


@pytest.fixture(scope="module")
def tansu() -> Iterator[str]:
    with run_tansu() as bootstrap:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        futures = admin.create_topics(
            [
                NewTopic(
                    "orders",
                    3,
                    1,
                    config={"retention.bytes": str(GiB), "segment.bytes": str(512 * MiB)},
                ),
                NewTopic("clicks", 2, 1),
                NewTopic("users", 1, 1, config={"cleanup.policy": "compact"}),
            ]
        )
        for future in futures.values():
            future.result(timeout=15)
        yield bootstrap


def test_describe_configs_from_tansu_merged_with_defaults(tmp_path: Path, tansu: str) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    props = tmp_path / "server.properties"
    props.write_text(f"log.dirs={log_dir}\nlog.retention.bytes=268435456\n")
    broker = BrokerConfig(log_dirs=[log_dir], bootstrap_servers=tansu, server_properties=props)
    inventory = load_topics(broker, timeout=10)
    assert inventory.source == "broker"
    topics = {t.topic: t for t in inventory.topics}
    assert {"orders", "clicks", "users"} <= set(topics)
    orders = topics["orders"]
    assert (orders.partitions, orders.retention_bytes, orders.segment_bytes) == (3, GiB, 512 * MiB)
    assert orders.segment_index_bytes == 10 * MiB  # not returned by tansu: Kafka's default
    assert orders.source == "broker+defaults"
    clicks = topics["clicks"]
    assert (clicks.partitions, clicks.retention_bytes) == (2, 256 * MiB)  # server.properties
    assert clicks.cleanup_policy == "delete"
    assert topics["users"].cleanup_policy == "compact"
    assert any("cluster-wide" in n for n in inventory.notes)


def test_cli_against_tansu(tmp_path: Path, tansu: str) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    config = tmp_path / "diskguard.toml"
    config.write_text(f'[broker]\nlog_dirs = ["{log_dir}"]\nbootstrap_servers = "{tansu}"\n')
    result = _run("reserve", "-c", str(config), "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["source"] == "broker"
    rows = {r["topic"]: r for r in out["topics"]}
    assert rows["orders"]["reserved_bytes"] == 3 * (1596 * MiB)
    assert rows["users"]["reserved_bytes"] == GiB
    assert rows["clicks"]["unbounded"] is True  # retention.bytes -1 by default
    assert "clicks" in out["unbounded_topics"]
