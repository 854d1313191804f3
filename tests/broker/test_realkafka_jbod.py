"""Rungs 2 and 3 of the ladder, the metadata log and a failed log dir, against a REAL KRaft
broker with two log dirs on two loop ext4 filesystems (JBOD, KIP-858; GA in 3.8).

- cordon (KIP-1066, 4.3+): the filling dir gets no new replica; lifted when its alert clears;
  an operator's own cordon is never lifted; before 4.3, ``cordon_unavailable`` once;
- balance: a replica moves whole from the full dir to the roomy one (AlterReplicaLogDirs),
  timed, nothing deleted, every record still there;
- the metadata log (``__cluster_metadata-0``, in the first log dir): never a candidate, said
  where it lives, ``metadata_log_at_risk`` when its disk fills;
- a dir that failed alone (last: it breaks the broker's second dir): the broker keeps
  serving the other, deletes its ``.lock`` (measured), diskguard deletes nothing in it and says
  what to do, and the other dir stays guarded.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from diskguard.config import Config, load_config
from diskguard.retention.cycle import RetentionCycle
from diskguard.retention.ladderstate import LADDER_FILE
from support import fsfixtures
from support.cli import run_cli
from support.configs import write_config
from support.disks import ceiling_under, df_percent, fill
from support.kafka import Target
from support.kafka.broker import fast_retention
from support.kafka.cluster import KafkaCluster, running_cluster
from support.kafka.guarded import wait_until

pytestmark = pytest.mark.realkafka

MiB = 1024 * 1024
SEGMENT = 1024 * 1024
PRODUCER = {"batch.size": 65_536, "message.timeout.ms": 120_000}


@pytest.fixture(scope="module")
def jbod(kafka_target: Target) -> Iterator[KafkaCluster]:
    """One KRaft broker, log dirs A (160 MiB, the metadata log's) and B (96 MiB)."""
    if kafka_target.mode != "kraft":
        pytest.skip("JBOD with KRaft is tested (this run: ZooKeeper mode)")
    if kafka_target.release.version < (3, 8, 0):
        pytest.skip(f"JBOD in KRaft is GA from Kafka 3.8 (KIP-858); this run: {kafka_target}")
    root = Path(tempfile.mkdtemp(prefix="diskguard-jbod-"))
    release = kafka_target.release
    try:
        with (
            fsfixtures.loop_ext4(160 * MiB, 0, name="jbod-a") as a,
            fsfixtures.loop_ext4(96 * MiB, 0, name="jbod-b") as b,
            running_cluster(
                release,
                kafka_target.classpath,
                root / "c",
                [[a / "kafka-logs", b / "kafka-logs"]],
                settings=fast_retention(release),
            ) as broker,
        ):
            yield broker
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _dirs(broker: KafkaCluster) -> tuple[Path, Path]:
    a, b = broker.node.log_dirs
    return a, b


def _log_dirs(broker: KafkaCluster) -> list[dict[str, Any]]:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        (answer,) = admin.describe_log_dirs(brokers=[1])
        return list(answer["log_dirs"])
    finally:
        admin.close()


def _where(broker: KafkaCluster, topic: str, partition: int = 0) -> str | None:
    for entry in _log_dirs(broker):
        for t in entry["topics"]:
            for p in t["partitions"]:
                found = t["name"] == topic and p["partition_index"] == partition
                if found and not p["is_future_key"]:
                    return str(entry["log_dir"])
    return None


def _move(broker: KafkaCluster, topic: str, target: Path) -> None:
    """Put a replica in ``target`` (the test's own setup, by kafka-python directly)."""
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.alter_replica_log_dirs({(topic, 0, 1): str(target)})
    finally:
        admin.close()
    wait_until(lambda: _where(broker, topic) == str(target), 60, f"{topic} in {target}")


def _config(tmp: Path, broker: KafkaCluster, name: str = "diskguard.toml", **kw: Any) -> Config:
    a, b = _dirs(broker)
    return load_config(
        write_config(
            tmp,
            [a, b],
            broker={"bootstrap_servers": broker.bootstrap},
            mode="broker",
            name=name,
            **kw,
        )
    )


def test_a_full_dirs_replica_moves_whole_to_the_roomy_one(
    jbod: KafkaCluster, tmp_path: Path
) -> None:
    broker = jbod
    a, b = _dirs(broker)
    broker.create_topic("bulk", 1, **broker.segment_config(SEGMENT))
    _move(broker, "bulk", a)
    assert broker.produce("bulk", 24_000, 1000, settings=PRODUCER) == []
    # Dir A over its ceiling by 6 MiB (its target 12 MiB lower); B has plenty of room.
    fill(a.parent / "filler", 30 * MiB)
    cfg = _config(
        tmp_path,
        broker,
        disk_usage_percent=round(ceiling_under(a.parent, 6 * MiB), 3),
        target_percent=round(ceiling_under(a.parent, 12 * MiB), 3),
        protect_topics=["^(?!bulk$)"],
    )
    assert df_percent(b.parent) < cfg.retention.effective_target_percent
    with capture_logs() as logs, RetentionCycle(cfg) as cycle:
        cycle.enforce()
        started = [e for e in logs if e["event"] == "replica_move_started"]
        assert [(e["topic"], e["target_dir"]) for e in started] == [("bulk", str(b))], logs
        assert not [e for e in logs if e["event"] in ("segment_deleted", "delete_records")]
        wait_until(lambda: _where(broker, "bulk") == str(b), 60, "the broker moving bulk-0 to B")
        wait_until(lambda: not any(a.glob("bulk-0*")), 30, "the old copy removed from A")
        cycle.enforce()
        done = [e for e in logs if e["event"] == "replica_move_done"]
        assert done and done[0]["seconds"] is not None and done[0]["seconds"] > 0, logs
    # The copy rate is kept for the next plans, and A is back under its ceiling.
    record = json.loads((tmp_path / "state" / LADDER_FILE).read_text())
    assert record["moves"] == {} and record["move_rate"] > 0
    assert df_percent(a.parent) < cfg.retention.disk_usage_percent
    assert broker.read_all("bulk", 24_000) == 24_000
    os.unlink(a.parent / "filler")


def test_the_filling_dir_is_cordoned_and_an_operators_cordon_is_kept(
    jbod: KafkaCluster, tmp_path: Path
) -> None:
    broker = jbod
    a, b = _dirs(broker)
    cfg = _config(tmp_path, broker, disk_usage_percent=99.0)
    mount_a = str(a.parent)
    if broker.release.version < (4, 3, 0):
        with capture_logs() as logs, RetentionCycle(cfg) as cycle:
            for _ in range(2):
                cycle.ladder.alert_levels = {mount_a: 1}
                cycle.enforce()
        unavailable = [e for e in logs if e["event"] == "cordon_unavailable"]
        assert len(unavailable) == 1 and "4.3" in unavailable[0]["error"], logs
        return

    def cordoned() -> dict[str, bool]:
        return {e["log_dir"]: bool(e["is_cordoned"]) for e in _log_dirs(broker)}

    with capture_logs() as logs, RetentionCycle(cfg) as cycle:
        cycle.ladder.alert_levels = {mount_a: 1, str(b.parent): 0}
        cycle.enforce()
        assert [e["log_dirs"] for e in logs if e["event"] == "log_dir_cordoned"] == [[str(a)]]
        wait_until(lambda: cordoned()[str(a)], 10, "A cordoned")
        broker.create_topic("fresh", 4)
        time.sleep(1.0)
        # Every new replica went to B.
        assert {_where(broker, "fresh", p) for p in range(4)} == {str(b)}
        # An operator cordons B too; diskguard lifts only its own (A) when A's alert clears.
        _alter_cordon(broker, str(b), add=True)
        cycle.ladder.alert_levels = {mount_a: 0, str(b.parent): 0}
        cycle.enforce()
        assert [e["log_dirs"] for e in logs if e["event"] == "log_dir_uncordoned"] == [[str(a)]]
        wait_until(lambda: cordoned() == {str(a): False, str(b): True}, 10, "A lifted, B kept")
    _alter_cordon(broker, str(b), add=False)


def _alter_cordon(broker: KafkaCluster, path: str, add: bool) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    op = AlterConfigOpType.APPEND if add else AlterConfigOpType.SUBTRACT
    entry = ConfigEntry("cordoned.log.dirs", path, incremental_operation=op)
    admin = broker.admin()
    resource = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(10)


def test_the_metadata_log_is_said_never_planned_and_watched(
    jbod: KafkaCluster, tmp_path: Path
) -> None:
    broker = jbod
    a, _b = _dirs(broker)
    path = write_config(
        tmp_path,
        list(_dirs(broker)),
        broker={"bootstrap_servers": broker.bootstrap},
        ladder={"cordon": False},  # its alert below would cordon A (the next test moves to it)
        mode="broker",
        disk_usage_percent=1.0,  # everything over: every rung to the top
    )
    proc = run_cli("check-config", "-c", str(path))
    assert f"KRaft metadata log: {a}/__cluster_metadata-0" in proc.stdout, proc.stdout
    status = json.loads(run_cli("status", "--json", "-c", str(path)).stdout)
    assert status["kraft_metadata"]["log_dir"] == str(a)
    assert status["kraft_metadata"]["shares_data_disk"] is True
    plan = json.loads(run_cli("plan", "--json", "-c", str(path)).stdout)
    assert "__cluster_metadata" not in {d["topic"] for d in plan["deletions"]}
    assert "__cluster_metadata" not in {m["topic"] for m in plan["ladder"]["moves"]}
    assert "__cluster_metadata" in {p["topic"] for p in plan["protected"]}
    with capture_logs() as logs, RetentionCycle(load_config(path)) as cycle:
        cycle.ladder.alert_levels = {str(a.parent): 1}
        cycle.plan()  # a dry run says nothing
        cycle.enforce()
        cycle.enforce()  # once per episode
    at_risk = [e for e in logs if e["event"] == "metadata_log_at_risk"]
    assert len(at_risk) == 1 and at_risk[0]["metadata_log_dir"] == f"{a}/__cluster_metadata-0"


def test_a_dir_that_failed_alone_is_left_alone_and_the_other_stays_guarded(
    jbod: KafkaCluster, tmp_path: Path
) -> None:
    """Last in this module: dir B fails for good (its disk filled), as on a real host."""
    broker = jbod
    a, b = _dirs(broker)
    broker.create_topic("spill", 1, **broker.segment_config(SEGMENT))
    _move(broker, "spill", b)
    broker.create_topic("kept", 1, **broker.segment_config(SEGMENT))
    _move(broker, "kept", a)
    assert broker.produce("kept", 6_000, 1000, settings=PRODUCER) == []
    # Fill B through the broker until it takes B offline.
    broker.produce("spill", 150_000, 1000, settings={**PRODUCER, "message.timeout.ms": 20_000})
    wait_until(
        lambda: any(e["log_dir"] == str(b) and e["error_code"] for e in _log_dirs(broker)),
        60,
        "the broker taking B offline",
    )
    time.sleep(2.0)
    assert broker.alive(), "a JBOD broker (3.8+) keeps serving when one log dir fails"
    assert not (b / ".lock").exists(), "measured: the broker deletes the failed dir's .lock"
    spill_segments = sorted(p.name for p in (b / "spill-0").glob("*.log"))
    # A over its ceiling too, by what only deletion can free (one topic, no room elsewhere).
    fill(a.parent / "filler", 20 * MiB)
    cfg = _config(
        tmp_path,
        broker,
        disk_usage_percent=round(ceiling_under(a.parent, 2 * MiB), 3),
        protect_topics=["^(?!kept$|spill$)"],
    )
    with capture_logs() as logs, RetentionCycle(cfg) as cycle:
        cycle.enforce()
    offline = [e for e in logs if e["event"] == "log_dir_offline"]
    assert [e["log_dir"] for e in offline] == [str(b)], logs
    assert "restart the broker" in offline[0]["message"]
    deleted = {(e["topic"], e["log_dir"]) for e in logs if e["event"] == "segment_deleted"}
    assert deleted == {("kept", str(a))}, logs  # the other dir is still guarded
    failed = [e for e in logs if e["event"] == "segment_delete_failed"]
    assert failed == [], "nothing was asked of the offline dir"
    assert sorted(p.name for p in (b / "spill-0").glob("*.log")) == spill_segments
    plan = json.loads(run_cli("plan", "--json", "-c", str(cfg.source)).stdout)
    reasons = {p["topic"]: p["reason"] for p in plan["protected"]}
    assert "log dir offline in the broker" in reasons["spill"]
    os.unlink(a.parent / "filler")
