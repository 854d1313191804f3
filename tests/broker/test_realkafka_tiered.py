"""Rung 1 of the ladder against a REAL broker with tiered storage (KIP-405): Kafka's own
``LocalTieredStorage`` remote storage manager (``support.kafka.tiered``: a 4.3.1 broker for a
4.4 run, whose test jar Maven Central does not serve; the release itself on 3.9 and 4.0).

Fill a tiered topic, let the broker upload its closed segments, put the disk over its limit:
diskguard lowers the topic's ``local.retention.ms``, the broker drops the uploaded local
segments, and a consumer still reads every record from offset 0 (from remote storage). No
DeleteRecords on the tiered topic, ever; the operator's value comes back once the disk is
under its target, from another process (the state dir knows what was changed).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from diskguard.config import load_config
from diskguard.retention.audit import pair_actions, read_audit
from diskguard.retention.cycle import RetentionCycle
from support import fsfixtures
from support.cli import json_events, run_cli
from support.configs import write_config
from support.disks import ceiling_under, df_percent
from support.kafka import Target
from support.kafka.broker import fast_retention
from support.kafka.cluster import KafkaCluster, running_cluster
from support.kafka.guarded import wait_until
from support.kafka.node import hand_to_user
from support.kafka.tiered import tiered_release, tiered_settings

pytestmark = pytest.mark.realkafka

MiB = 1024 * 1024
SEGMENT = 256 * 1024
PRODUCER = {"batch.size": 32_768, "message.timeout.ms": 120_000}
RECORDS = 20_000  # 1000 bytes each: ~20 MB, ~80 segments over two partitions


@pytest.fixture(scope="module")
def tiered(kafka_target: Target) -> Iterator[KafkaCluster]:
    """One KRaft broker with tiered storage on a 160 MiB loop ext4, as nobody."""
    if kafka_target.mode != "kraft":
        pytest.skip("tiered storage is tested on a KRaft broker (this run: ZooKeeper mode)")
    found = tiered_release(kafka_target.release)
    if isinstance(found, str):
        pytest.skip(found)
    release, jars = found
    root = Path(tempfile.mkdtemp(prefix="diskguard-tiered-"))
    remote = root / "remote"
    remote.mkdir()
    hand_to_user(remote)
    settings = fast_retention(release) | tiered_settings(remote)
    try:
        with (
            fsfixtures.loop_ext4(160 * MiB, 0, name="tiered-disk") as mount,
            running_cluster(
                release, jars, root / "c", [[mount / "kafka-logs"]], settings=settings
            ) as broker,
        ):
            broker.remote = remote  # type: ignore[attr-defined]
            yield broker
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _latest_tiered(broker: KafkaCluster, topic: str, partitions: int) -> dict[int, int]:
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient
    from kafka.protocol.consumer.offsets import OffsetSpec

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        found = admin.list_partition_offsets(
            {TopicPartition(topic, p): OffsetSpec.LATEST_TIERED for p in range(partitions)}
        )
        return {tp.partition: int(v.offset) for tp, v in found.items()}
    finally:
        admin.close()


def _closed_end(broker: KafkaCluster, topic: str, partition: int) -> int:
    bases = sorted(
        int(p.name[:-4]) for p in (broker.log_dir / f"{topic}-{partition}").glob("*.log")
    )
    return bases[-1] - 1


def _uploaded(broker: KafkaCluster, topic: str, partitions: int) -> bool:
    top = _latest_tiered(broker, topic, partitions)
    return all(top[p] >= _closed_end(broker, topic, p) for p in range(partitions))


def _local_bytes(broker: KafkaCluster, topic: str) -> int:
    """Allocated bytes of the topic's partition dirs (files vanish as the broker drops them)."""
    total = 0
    for d in broker.log_dir.glob(f"{topic}-*"):
        for f in d.iterdir():
            try:
                total += f.stat().st_blocks * 512
            except FileNotFoundError:
                continue
    return total


def _topic_value(broker: KafkaCluster, topic: str, key: str) -> tuple[str | None, bool]:
    """(value, whether it is the topic's own override)."""
    from confluent_kafka.admin import ConfigResource, ConfigSource, ResourceType

    resource = ConfigResource(ResourceType.TOPIC, topic)
    admin = broker.admin()  # kept referenced until the future resolves
    entries = admin.describe_configs([resource])[resource].result(10)
    entry = entries[key]
    return entry.value, int(entry.source) == ConfigSource.DYNAMIC_TOPIC_CONFIG.value


def test_evicting_what_is_uploaded_frees_the_disk_and_loses_no_record(
    tiered: KafkaCluster, tmp_path: Path
) -> None:
    broker = tiered
    broker.create_topic(
        "evict", 2, **broker.segment_config(SEGMENT), **{"remote.storage.enable": "true"}
    )
    broker.create_topic("plain", 1, **broker.segment_config(SEGMENT))
    assert broker.produce("evict", RECORDS, 1000, settings=PRODUCER) == []
    assert broker.produce("plain", 2_000, 1000, settings=PRODUCER) == []
    wait_until(
        lambda: _uploaded(broker, "evict", 2), 60, "the broker uploading every closed segment"
    )
    local_before = _local_bytes(broker, "evict")
    # Over the ceiling by 4 MiB; the target asks for 10 MiB: half the topic's local bytes.
    mount = broker.log_dir.parent
    target = round(ceiling_under(mount, 10 * MiB), 3)
    cfg = write_config(
        tmp_path,
        broker.log_dir,
        broker={"bootstrap_servers": broker.bootstrap},
        mode="broker",
        disk_usage_percent=round(ceiling_under(mount, 4 * MiB), 3),
        target_percent=target,
    )
    proc = run_cli("enforce", "--once", "--json", "-c", str(cfg), timeout=120)
    events = json_events(proc.stdout)
    names = [e["event"] for e in events]
    assert "tiered_eviction" in names, proc.stdout + proc.stderr
    assert "segment_deleted" not in names and "delete_records" not in names
    # Counted as on its way out: the exit code says the disk will be under its limit.
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (eviction,) = [e for e in events if e["event"] == "tiered_eviction"]
    assert eviction["topic"] == "evict" and eviction["previous"] is None
    cycle = next(e for e in events if e["event"] == "retention_cycle")
    assert [r["rung"] for r in cycle["rungs"]] == ["tiered"]

    # The broker drops the uploaded local segments at its next retention check.
    wait_until(
        lambda: _local_bytes(broker, "evict") < local_before - 8 * MiB,
        30,
        "the broker dropping uploaded local segments",
    )
    # Nothing lost: every record from offset 0, the evicted ones from remote storage.
    assert broker.read_all("evict", RECORDS) == RECORDS
    assert broker.read_all("plain", 2_000) == 2_000
    audit = pair_actions(list(read_audit(tmp_path / "state" / "audit.jsonl")))
    assert [a.first.get("kind") for a in audit] == ["evict"]
    assert audit[0].outcome is not None and audit[0].outcome["phase"] == "done"
    value, override = _topic_value(broker, "evict", "local.retention.ms")
    assert override and value == str(eviction["local_retention_ms"])

    # Another process (a restart): back under its target, it restores the operator's value.
    wait_until(lambda: df_percent(mount) <= target, 10, "the disk at or under its target")
    proc = run_cli("enforce", "--once", "--json", "-c", str(cfg), timeout=120)
    names = [e["event"] for e in json_events(proc.stdout)]
    assert "tiered_retention_restored" in names, proc.stdout + proc.stderr
    assert not _topic_value(broker, "evict", "local.retention.ms")[1]  # no override again
    kinds = [
        a.first.get("kind")
        for a in pair_actions(list(read_audit(tmp_path / "state" / "audit.jsonl")))
    ]
    assert kinds == ["evict", "restore"]


def test_a_tiered_topic_is_never_deleted_unless_listed(
    tiered: KafkaCluster, tmp_path: Path
) -> None:
    """The plan evicts what is uploaded, deletes only from the plain topic, and lists the
    tiered one as protected; listed in ``delete_tiered_topics``, it may be deleted too."""
    broker = tiered
    broker.create_topic(
        "keep", 1, **broker.segment_config(SEGMENT), **{"remote.storage.enable": "true"}
    )
    broker.create_topic("trim", 1, **broker.segment_config(SEGMENT))
    assert broker.produce("keep", 6_000, 1000, settings=PRODUCER) == []
    assert broker.produce("trim", 6_000, 1000, settings=PRODUCER) == []
    wait_until(lambda: _uploaded(broker, "keep", 1), 60, "uploads")
    common = {
        "broker": {"bootstrap_servers": broker.bootstrap},
        "mode": "broker",
        # Far more than the topics hold: every rung is climbed to the top.
        "disk_usage_percent": 1.0,
        "protect_topics": ["^(?!keep$|trim$)"],
    }
    proc = run_cli("plan", "--json", "-c", str(write_config(tmp_path, broker.log_dir, **common)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert {e["topic"] for e in data["ladder"]["evictions"]} == {"keep"}
    assert {d["topic"] for d in data["deletions"]} == {"trim"}
    assert "keep" in {p["topic"] for p in data["protected"]}
    # Listed: what is evicted is not deleted as well (it is all of keep's closed segments)...
    listed = {"delete_tiered_topics": ["^keep$"]}
    cfg = write_config(tmp_path, broker.log_dir, ladder=listed, name="b.toml", **common)
    data = json.loads(run_cli("plan", "--json", "-c", str(cfg)).stdout)
    assert {d["topic"] for d in data["deletions"]} == {"trim"}
    assert "keep" not in {p["topic"] for p in data["protected"]}
    # ... and without eviction, the listed tiered topic is deleted like any other.
    no_eviction = {**listed, "tiered_eviction": False}
    cfg = write_config(tmp_path, broker.log_dir, ladder=no_eviction, name="c.toml", **common)
    data = json.loads(run_cli("plan", "--json", "-c", str(cfg)).stdout)
    assert data["ladder"]["evictions"] == []
    assert {d["topic"] for d in data["deletions"]} == {"keep", "trim"}


def test_a_stalled_upload_is_an_alert(tiered: KafkaCluster, tmp_path: Path) -> None:
    """The remote storage refuses writes: closed segments wait, the highest remote offset
    does not move, and after ``upload_stall_after`` diskguard says so; then it resumes."""
    broker = tiered
    # LocalTieredStorage writes below <dir>/kafka-tiered-storage/, one dir per partition.
    remote: Path = broker.remote / "kafka-tiered-storage"  # type: ignore[attr-defined]
    broker.create_topic(
        "stall", 1, **broker.segment_config(SEGMENT), **{"remote.storage.enable": "true"}
    )
    cfg = load_config(
        write_config(
            tmp_path,
            broker.log_dir,
            broker={"bootstrap_servers": broker.bootstrap},
            ladder={"upload_stall_after": "2s"},
            mode="broker",
            disk_usage_percent=99.0,
        )
    )
    os.chmod(remote, 0o555)  # the broker (nobody) can no longer write remote segments
    try:
        assert broker.produce("stall", 3_000, 1000, settings=PRODUCER) == []
        with capture_logs() as logs, RetentionCycle(cfg) as cycle:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not any(
                e["event"] == "tiered_upload_stalled" for e in logs
            ):
                cycle.ladder._uploaded = None  # ask again now, not every 10 s
                cycle.plan()
                time.sleep(0.5)
            stalled = [e for e in logs if e["event"] == "tiered_upload_stalled"]
            assert stalled and stalled[0]["topic"] == "stall", logs
            assert stalled[0]["segments_waiting"] > 0
            os.chmod(remote, 0o755)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not any(
                e["event"] == "tiered_upload_resumed" for e in logs
            ):
                cycle.ladder._uploaded = None
                cycle.plan()
                time.sleep(0.5)
            assert any(e["event"] == "tiered_upload_resumed" for e in logs), logs
    finally:
        os.chmod(remote, 0o755)
