"""The rescue, end to end, with a REAL Apache Kafka broker (the newest 4.x unless the
environment names another: ``support.kafka.target``).

A broker (run as nobody) fills its 160 MiB loop ext4 through ordinary produce requests until
it shuts itself down ("Shutdown broker because all log dirs in ... have failed"). Then
``diskguard enforce --once`` — auto mode, ``bootstrap_servers`` configured but the broker
down, ``.lock`` free — deletes offline, and the broker must start again, stay up, accept
writes and serve from the new log start offsets, with no ERROR in its log.

What was deleted is checked against the files themselves, independently of diskguard's
own parsers: only a prefix of closed segments of the delete-policy topic, globally oldest
first (by each segment's largest batch timestamp read from the ``.log``), never the active
segment, never ``__consumer_offsets``, never the compacted topic.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from support import fsfixtures
from support.cli import run_cli
from support.configs import write_config
from support.disks import df_percent
from support.kafka import Target
from support.kafka.broker import fast_retention
from support.kafka.cluster import KafkaCluster, running_broker

pytestmark = pytest.mark.realkafka

ORDERS = "rescue-orders"
COMPACT = "rescue-compact"
CEILING = 85.0


def batch_max_timestamps(log: Path) -> int:
    """The largest ``maxTimestamp`` of the RecordBatch v2 headers in a ``.log`` (-1 if none).

    Header: baseOffset i64, batchLength i32, leaderEpoch i32, magic i8, crc u32,
    attributes i16, lastOffsetDelta i32, firstTimestamp i64, maxTimestamp i64, ...
    """
    data = log.read_bytes()
    pos, best = 0, -1
    while pos + 61 <= len(data):
        length = struct.unpack_from(">i", data, pos + 8)[0]
        if length <= 0:
            break
        best = max(best, struct.unpack_from(">q", data, pos + 35)[0])
        pos += 12 + length
    return best


def files_of(pdir: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in pdir.iterdir() if p.is_file()}


def bases(pdir: Path) -> list[int]:
    return sorted(int(p.name[:-4]) for p in pdir.glob("*.log"))


@dataclass(frozen=True)
class Rescue:
    shutdown_logged: bool
    usage_full: float
    enforce_rc: int
    enforce_output: str
    usage_after: float
    #: partition dir -> {file: size} before and after the rescue.
    before: dict[str, dict[str, int]]
    after: dict[str, dict[str, int]]
    #: (partition, base offset) -> largest batch timestamp, for ORDERS before the rescue.
    timestamps: dict[tuple[int, int], int]
    alive_after_10s: bool
    write_errors: list[str]
    #: partition -> (low watermark, first offset read from there)
    reads: dict[int, tuple[int, int]]
    errors_in_log: list[str]


def fill_until_shutdown(broker: KafkaCluster, topic: str = ORDERS, deadline_s: float = 180) -> None:
    """Produce 1 MB chunks until the broker has shut itself down (or fail)."""
    deadline = time.monotonic() + deadline_s
    settings = {"batch.size": 200_000, "message.timeout.ms": 8000, "linger.ms": 5}
    while broker.alive():
        assert time.monotonic() < deadline, "the broker did not shut down on a full disk"
        broker.produce(topic, 1000, 1000, settings=settings)
    # It halts right after logging; give the JVM a moment to be reaped.
    for _ in range(100):
        if not broker.alive():
            break
        time.sleep(0.2)


def restarted(
    broker: KafkaCluster, topic: str
) -> tuple[bool, list[str], dict[int, tuple[int, int]], list[str]]:
    """Start the rescued broker and see it serve: the write errors of 10 records to
    ``topic`` (acks=all), per partition (low watermark, first offset read from it), alive
    10 s after its start (the writes and reads count towards them), and the ERROR lines it
    logged since this start."""
    broker.start()
    up = time.monotonic()
    write_errors = [
        str(e) for e in broker.produce(topic, 10, 100, partition=0, settings={"acks": "all"})
    ]
    reads = broker.first_offsets(topic, (0, 1))
    time.sleep(max(0.0, up + 10 - time.monotonic()))
    alive = broker.alive()
    errors = [
        line
        for line in broker.log_since_start().splitlines()
        if re.match(r"^\[[^]]+\] ERROR ", line)
    ]
    return alive, write_errors, reads, errors


def rescued(
    broker: KafkaCluster,
    topic: str,
    proc: subprocess.CompletedProcess[str],
    log_before: str,
    usage_full: float,
    before: dict[str, dict[str, int]],
    timestamps: dict[tuple[int, int], int],
) -> Rescue:
    """What the rescue left (``proc``: its ``enforce --once``) and what the broker did when
    started on it (``restarted``)."""
    usage_after = df_percent(broker.log_dir.parent)
    dirs = [broker.log_dir / name for name in before]
    after = {d.name: files_of(d) for d in dirs if d.is_dir()}
    alive, write_errors, reads, errors = restarted(broker, topic)
    return Rescue(
        shutdown_logged="Shutdown broker because all log dirs in" in log_before,
        usage_full=usage_full,
        enforce_rc=proc.returncode,
        enforce_output=proc.stdout[-3000:] + proc.stderr[-3000:],
        usage_after=usage_after,
        before=before,
        after=after,
        timestamps=timestamps,
        alive_after_10s=alive,
        write_errors=write_errors,
        reads=reads,
        errors_in_log=errors,
    )


@pytest.fixture(scope="module")
def rescue(kafka_target: Target, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rescue]:
    state = tmp_path_factory.mktemp("rescue-state")
    with (
        fsfixtures.loop_ext4(160 * fsfixtures.MiB, 0, name="rescue-disk") as mount,
        running_broker(
            kafka_target.release,
            kafka_target.classpath,
            mount / "kafka-logs",
            mode=kafka_target.mode,
            settings=fast_retention(kafka_target.release),
        ) as broker,
    ):
        log_dir = broker.log_dir
        # Oldest data first: a compacted topic the cleaner will not touch yet (so it is in no
        # cleaner-offset-checkpoint, as on a fresh broker), then a committing consumer group
        # (__consumer_offsets), then the delete-policy topic that fills the disk.
        broker.create_topic(
            COMPACT,
            **{
                "cleanup.policy": "compact",
                "segment.bytes": str(1 << 20),
                "min.compaction.lag.ms": "3600000",
            },
        )
        assert (
            broker.produce(
                COMPACT,
                3000,
                1000,
                settings={"batch.size": 200_000},
                key=lambda i: f"key-{i}".encode(),
            )
            == []
        )
        consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": "rescue-readers",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "log_level": 0,
            }
        )
        consumer.subscribe([COMPACT])
        got = 0
        until = time.monotonic() + 60
        while got < 100 and time.monotonic() < until:
            msg = consumer.poll(0.5)
            got += msg is not None and msg.error() is None
        consumer.commit(asynchronous=False)
        consumer.close()
        broker.create_topic(ORDERS, 2, **{"segment.bytes": str(2 << 20)})

        config = write_config(
            state,
            log_dir,
            broker={"bootstrap_servers": broker.bootstrap},
            state_dir=state,
            assume_delete_policy=None,
            disk_usage_percent=CEILING,
        )
        # As in production, diskguard ran beside the broker before the disk filled: one
        # broker-mode cycle learns every topic's cleanup.policy (DescribeConfigs) into the
        # state dir's cache, which is what lets the offline rescue tell delete from compact.
        learn = run_cli("enforce", "--once", "-c", str(config), timeout=120)
        assert learn.returncode == 0, learn.stdout + learn.stderr
        assert (state / "topic-policies.json").exists()

        fill_until_shutdown(broker)
        log_before = broker.log_text()
        usage_full = df_percent(mount)
        pdirs = sorted(p for p in log_dir.iterdir() if p.is_dir())
        before = {p.name: files_of(p) for p in pdirs}
        timestamps = {
            (part, base): batch_max_timestamps(log_dir / f"{ORDERS}-{part}" / f"{base:020d}.log")
            for part in (0, 1)
            for base in bases(log_dir / f"{ORDERS}-{part}")
        }

        proc = run_cli("enforce", "--once", "-c", str(config), timeout=120)
        yield rescued(broker, ORDERS, proc, log_before, usage_full, before, timestamps)


def test_rescue_after_the_broker_died_of_a_full_disk(rescue: Rescue) -> None:
    assert_rescued(rescue, ORDERS, CEILING)


def assert_rescued(rescue: Rescue, topic: str, ceiling: float) -> None:
    """The rescue's whole claim for the delete-policy ``topic`` (two partitions): the broker
    died of the full disk, ``enforce --once`` went offline, exited 0 under ``ceiling``,
    deleted only a per-partition prefix of closed segments, globally oldest first, nothing of
    ``__consumer_offsets``; the broker came back, stayed up, takes writes and serves from the
    new log start offsets, with no ERROR in its log."""
    assert rescue.shutdown_logged, "the broker did not log its full-disk shutdown"
    assert rescue.usage_full > 99.0, rescue.usage_full
    assert rescue.enforce_rc == 0, rescue.enforce_output
    cycles = [
        json.loads(line)
        for line in rescue.enforce_output.splitlines()
        if line.startswith("{") and '"retention_cycle"' in line
    ]
    assert cycles and all(c["mode"] == "offline" for c in cycles), rescue.enforce_output
    assert rescue.usage_after <= ceiling, rescue.usage_after

    # Only a prefix of closed delete-policy segments went, never an active one.
    deleted: list[tuple[int, int]] = []
    kept_closed: list[tuple[int, int]] = []
    for part in (0, 1):
        name = f"{topic}-{part}"
        was = sorted(int(f[:-4]) for f in rescue.before[name] if f.endswith(".log"))
        now = sorted(int(f[:-4]) for f in rescue.after[name] if f.endswith(".log"))
        assert now == was[len(was) - len(now) :], f"{name}: not a prefix: {was} -> {now}"
        assert now and now[-1] == was[-1], f"{name}: the active segment went"
        deleted += [(part, b) for b in was[: len(was) - len(now)]]
        kept_closed += [(part, b) for b in now[:-1]]
    assert deleted, "nothing was deleted"
    print(
        f"rescue: disk {rescue.usage_full:.1f}% -> {rescue.usage_after:.1f}%, deleted "
        f"{len(deleted)} of {len(deleted) + len(kept_closed) + 2} {topic} segments"
    )
    # Globally oldest first: nothing kept (closed) is older than anything deleted.
    newest_deleted = max(rescue.timestamps[s] for s in deleted)
    oldest_kept = min((rescue.timestamps[s] for s in kept_closed), default=newest_deleted)
    assert newest_deleted <= oldest_kept, (deleted, kept_closed)

    # Internal topics untouched.
    for name, files in rescue.before.items():
        if name.startswith("__consumer_offsets-"):
            assert rescue.after[name] == files, name

    # The broker came back, stayed up, takes writes, serves from the new log start.
    assert rescue.alive_after_10s
    assert rescue.write_errors == []
    for part in (0, 1):
        first_kept = min(int(f[:-4]) for f in rescue.after[f"{topic}-{part}"] if f.endswith(".log"))
        assert rescue.reads[part] == (first_kept, first_kept), (part, rescue.reads)
    assert rescue.errors_in_log == [], rescue.errors_in_log[:5]


def test_rescue_keeps_the_compacted_topic(rescue: Rescue) -> None:
    for name, files in rescue.before.items():
        if name.startswith(f"{COMPACT}-"):
            print(f"{name}: {sorted(files)} -> {sorted(rescue.after[name])}")
            assert rescue.after[name] == files, json.dumps(
                {"before": files, "after": rescue.after[name]}
            )


# ----------------------------------------------------- a KRaft broker, no cache from earlier runs

KR_ORDERS, KR_COMPACT = "kr-orders", "kr-compact"
#: Deleted in the cluster while its dir is back in the log dir (the metadata says deleted).
GONE = "kr-gone"
#: Its partition.metadata is gone when the rescue runs.
NOMETA = "kr-nometa"
#: Its partition.metadata is gone before a restart: the broker makes it a ``-stray`` dir.
STRAYED = "kr-strayed"
KR_CEILING = 85.0


def metadata_churn(target: Target) -> dict[str, str]:
    """A metadata log as a long-running 4.x broker has one, in a minute: a snapshot every 2 s,
    a segment every 3 s, older snapshots and segments deleted (renamed ``*.deleted``) at the
    metadata log's cleaning pass (every 60 s); few internal partitions on a small disk."""
    settings = {
        "metadata.log.max.snapshot.interval.ms": "2000",
        "metadata.log.segment.ms": "3000",
        "metadata.max.retention.ms": "1000",
        "transaction.state.log.num.partitions": "2",
    }
    if target.release.version >= (4, 0, 0):
        settings["share.coordinator.state.topic.num.partitions"] = "2"
    return settings


@dataclass(frozen=True)
class KraftRescue:
    rescue: Rescue
    #: ``plan --json`` / ``plan`` of the rescue config, and ``plan --json`` without
    #: broker.server_properties.
    plan: dict[str, object]
    plan_text: str
    plan_without_defaults: dict[str, object]
    #: The metadata dir's listing (name -> size) before and after the rescue.
    metadata_before: dict[str, int]
    metadata_after: dict[str, int]
    #: Top-level files of the log dir (meta.properties, checkpoints): content before, after.
    top_before: dict[str, bytes]
    top_after: dict[str, bytes]
    #: Partition dirs after the broker's restart.
    dirs_after_restart: list[str]
    cache_before: bool


def copy_as_is(src: Path, dest: Path) -> None:
    """``cp -a``: owner (nobody) and times kept, as the broker's own files are."""
    subprocess.run(["cp", "-a", str(src), str(dest)], check=True)


def top_files(log_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in log_dir.iterdir() if p.is_file() and p.name != ".lock"}


def internal_topic_traffic(broker: KafkaCluster, target: Target) -> None:
    """Data in ``__consumer_offsets`` (a committing group), ``__transaction_state`` (one
    transaction) and, where share groups are on by default (4.2+), ``__share_group_state``."""
    from confluent_kafka import Producer

    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "kr-readers",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    consumer.subscribe([KR_COMPACT])
    got, until = 0, time.monotonic() + 60
    while got < 50 and time.monotonic() < until:
        msg = consumer.poll(0.5)
        got += msg is not None and msg.error() is None
    consumer.commit(asynchronous=False)
    consumer.close()
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "transactional.id": "kr-tx", "log_level": 0}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(KR_COMPACT, b"tx", key=b"tx-key")
    producer.commit_transaction(30)
    if target.release.version >= (4, 2, 0):
        from confluent_kafka import ShareConsumer

        share = ShareConsumer(
            {"bootstrap.servers": broker.bootstrap, "group.id": "kr-share", "log_level": 0}
        )
        share.subscribe([KR_COMPACT])
        # A share group starts at the latest offset (share.auto.offset.reset): it reads what
        # is written once it has joined, so a record goes in at every empty poll.
        plain = Producer({"bootstrap.servers": broker.bootstrap, "log_level": 0})
        until = time.monotonic() + 30
        while time.monotonic() < until and not share.poll(1.0):
            plain.produce(KR_COMPACT, b"share", key=b"share-key")
            plain.flush(10)
        share.close()


@pytest.fixture(scope="module")
def kraft_rescue(
    kafka_target: Target, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KraftRescue]:
    if kafka_target.mode != "kraft":
        pytest.skip(
            f"{kafka_target}: no KRaft metadata log (__cluster_metadata) in ZooKeeper mode; "
            "an offline rescue there learns policies from the cache "
            "(test_rescue_after_the_broker_died_of_a_full_disk)"
        )
    release = kafka_target.release
    state = tmp_path_factory.mktemp("kraft-rescue-state")
    saved = Path(tempfile.mkdtemp(prefix="diskguard-saved-"))
    with (
        fsfixtures.loop_ext4(128 * fsfixtures.MiB, 0, name="kraft-rescue-disk") as mount,
        running_broker(
            release,
            kafka_target.classpath,
            mount / "kafka-logs",
            mode="kraft",
            settings=fast_retention(release) | metadata_churn(kafka_target),
        ) as broker,
    ):
        log_dir = broker.log_dir
        # Oldest first: what must NOT go is the globally oldest data.
        one_mib = {"segment.bytes": str(1 << 20)}
        for topic in (GONE, NOMETA, STRAYED):
            broker.create_topic(topic, **one_mib)
            assert broker.produce(topic, 3000, 1000, settings={"batch.size": 200_000}) == []
        # The cleaner leaves it alone (it is in no cleaner-offset-checkpoint): only the
        # metadata log can say it is compacted.
        compact = {"cleanup.policy": "compact", "min.compaction.lag.ms": "3600000"}
        broker.create_topic(KR_COMPACT, **compact, **one_mib)
        keyed = broker.produce(
            KR_COMPACT, 2000, 1000, settings={"batch.size": 200_000}, key=lambda i: b"k%d" % i
        )
        assert keyed == []
        internal_topic_traffic(broker, kafka_target)
        broker.stop()
        # The dir of a topic about to be deleted, kept aside (off the disk under test).
        copy_as_is(log_dir / f"{GONE}-0", saved / f"{GONE}-0")
        (log_dir / f"{STRAYED}-0" / "partition.metadata").unlink()

        broker.start()  # sets STRAYED's dir aside: a -stray dir made by Kafka itself
        admin = broker.admin()
        for future in admin.delete_topics([GONE], operation_timeout=30).values():
            future.result(30)
        until = time.monotonic() + 60
        while any(p.name.startswith(f"{GONE}-0") for p in log_dir.iterdir()):
            assert time.monotonic() < until, "the deleted topic's dir was not removed"
            time.sleep(0.2)
        # Back in the log dir: a broker that was down when the topic was deleted. The running
        # broker never looks for new dirs; the metadata log says the topic is deleted.
        copy_as_is(saved / f"{GONE}-0", log_dir / f"{GONE}-0")
        shutil.rmtree(saved)
        broker.create_topic(KR_ORDERS, 2, **{"segment.bytes": str(2 << 20)})
        fill_until_shutdown(broker, KR_ORDERS)
        log_before = broker.log_text()
        usage_full = df_percent(mount)
        (log_dir / f"{NOMETA}-0" / "partition.metadata").unlink()

        base_keys = {"state_dir": state, "assume_delete_policy": None}
        bootstrap = {"bootstrap_servers": broker.bootstrap}
        bare = write_config(state, log_dir, broker=bootstrap, name="bare.toml", **base_keys)
        config = write_config(
            state,
            log_dir,
            broker={**bootstrap, "server_properties": broker.workdir / "server.properties"},
            disk_usage_percent=KR_CEILING,
            **base_keys,
        )
        cache_before = (state / "topic-policies.json").exists()
        without = run_cli("plan", "--json", "-c", str(bare), timeout=120)
        planned = run_cli("plan", "--json", "-c", str(config), timeout=120)
        planned_text = run_cli("plan", "-c", str(config), timeout=120)
        assert without.returncode == 0, without.stdout + without.stderr
        assert planned.returncode == 0 and planned_text.returncode == 0, planned.stderr

        pdirs = sorted(p for p in log_dir.iterdir() if p.is_dir())
        before = {p.name: files_of(p) for p in pdirs}
        meta_dir = log_dir / "__cluster_metadata-0"
        metadata_before = files_of(meta_dir)
        top_before = top_files(log_dir)
        timestamps = {
            (part, base): batch_max_timestamps(log_dir / f"{KR_ORDERS}-{part}" / f"{base:020d}.log")
            for part in (0, 1)
            for base in bases(log_dir / f"{KR_ORDERS}-{part}")
        }

        proc = run_cli("enforce", "--once", "-c", str(config), timeout=120)
        metadata_after = files_of(meta_dir)
        top_after = top_files(log_dir)
        yield KraftRescue(
            rescue=rescued(broker, KR_ORDERS, proc, log_before, usage_full, before, timestamps),
            plan=json.loads(planned.stdout),
            plan_text=planned_text.stdout,
            plan_without_defaults=json.loads(without.stdout),
            metadata_before=metadata_before,
            metadata_after=metadata_after,
            top_before=top_before,
            top_after=top_after,
            dirs_after_restart=sorted(p.name for p in log_dir.iterdir() if p.is_dir()),
            cache_before=cache_before,
        )


def test_a_kraft_broker_rescued_with_no_cache_from_earlier_runs(kraft_rescue: KraftRescue) -> None:
    """No topic-policies.json: every topic's policy comes from the broker's own metadata log
    (snapshots, rolled and deleted segments), and the rescue is the same as with a cache."""
    assert not kraft_rescue.cache_before
    assert kraft_rescue.plan["mode"] == "offline", kraft_rescue.plan["mode_reason"]
    assert_rescued(kraft_rescue.rescue, KR_ORDERS, KR_CEILING)
    chosen = {d["topic"] for d in kraft_rescue.plan["deletions"]}  # type: ignore[union-attr]
    assert chosen == {KR_ORDERS}, chosen
    # The metadata log was read from a snapshot, as a long-running broker's is.
    assert any(
        n.endswith(".checkpoint") and not n.startswith("0" * 20)
        for n in kraft_rescue.metadata_before
    )


def test_the_kraft_rescue_never_touches_metadata_checkpoints_or_internal_topics(
    kraft_rescue: KraftRescue,
) -> None:
    rescue = kraft_rescue.rescue
    assert kraft_rescue.metadata_after == kraft_rescue.metadata_before
    assert kraft_rescue.top_after == kraft_rescue.top_before  # meta.properties, checkpoints
    for name, files in rescue.before.items():
        if name.startswith(f"{KR_ORDERS}-"):
            continue
        assert rescue.after[name] == files, name  # compacted, internal, strays, partition.metadata
    internal = {n.rsplit("-", 1)[0] for n in rescue.before if n.startswith("__")}
    assert {"__consumer_offsets", "__transaction_state"} <= internal, internal
    protected = {p["topic"]: p["reason"] for p in kraft_rescue.plan["protected"]}  # type: ignore[union-attr]
    assert protected[KR_COMPACT].startswith("cleanup.policy=compact (kraft-metadata)"), protected
    for topic in internal - {"__cluster_metadata"}:
        assert protected[topic].startswith("internal topic"), (topic, protected[topic])


def test_the_kraft_rescue_keeps_strays_and_says_so(kraft_rescue: KraftRescue) -> None:
    """A topic deleted while the broker was down, a partition dir without partition.metadata
    and a ``-stray`` dir: kept, each with its reason in ``plan`` (JSON and text), and the
    broker then does what diskguard said it would: sets the first two aside as strays."""
    protected = {p["topic"]: p["reason"] for p in kraft_rescue.plan["protected"]}  # type: ignore[union-attr]
    assert protected[GONE].startswith("topic not in the KRaft metadata: deleted"), protected[GONE]
    assert protected[NOMETA].startswith("no partition.metadata"), protected[NOMETA]
    for topic in (GONE, NOMETA):
        assert "sets this dir aside as a stray at start-up" in protected[topic]
    not_live = kraft_rescue.plan["not_live"]
    assert [(d["topic"], d["kind"]) for d in not_live] == [(STRAYED, "stray")], not_live  # type: ignore[index]
    assert not_live[0]["bytes"] > 2_000_000  # type: ignore[index]
    text = kraft_rescue.plan_text
    assert "Partition dirs that are not live" in text and f"{STRAYED}-0." in text, text
    assert "no partition.metadata" in text and "topic not in the KRaft" in text, text
    # What the broker did at its start after the rescue: strays, kept.
    after = kraft_rescue.dirs_after_restart
    for topic in (GONE, NOMETA, STRAYED):
        assert any(n.startswith(f"{topic}-0.") and n.endswith("-stray") for n in after), after
    assert f"{GONE}-0" not in after


def test_without_server_properties_topics_with_no_override_stay_unknown(
    kraft_rescue: KraftRescue,
) -> None:
    """The metadata log holds overrides only: a topic without one uses the broker's static
    default, which only server.properties says. Without it, such topics are kept."""
    plan = kraft_rescue.plan_without_defaults
    protected = {p["topic"]: p["reason"] for p in plan["protected"]}  # type: ignore[union-attr]
    assert "broker default is unknown (set broker.server_properties" in protected[KR_ORDERS]
    assert protected[KR_COMPACT].startswith("cleanup.policy=compact (kraft-metadata)")
