"""What is never deleted, and why (issue 11, items 1, 2 and 6), on real log dirs on tmpfs.

Every end-to-end test runs a real retention cycle (``RetentionCycle.run``) over real-format
segments (kafkagen) with ``retention.max_bytes = 1``, so that everything diskguard *may*
delete is chosen: what survives is exactly what is protected. Broker mode runs against an
admin client injected at the confluent-kafka boundary (DescribeConfigs, DeleteRecords); the
KRaft reader runs on a copy of a log dir a real KRaft broker wrote (``/work/shared/fixtures``)
and on metadata logs built here record by record.
"""

from __future__ import annotations

import base64
import concurrent.futures
import gzip
import json
import re
import shutil
import struct
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import crc32c
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import ConfigEntry, DeletedRecords

from diskguard.config import Config, load_config
from diskguard.retention.cycle import RetentionCycle
from support import configs
from support.cli import run_cli
from support.fakes import described_cluster
from support.kafkagen import (
    SegmentSpec,
    encode_batch,
    encode_record,
    topic_id,
    write_checkpoint,
    write_log_dir,
)

FIXTURE = Path("/work/shared/fixtures/kraft-logdir")
MiB = 1024**2
SEG = SegmentSpec(records=10, payload_size=2000, records_per_batch=5)
LEARNED_MS = 1_700_000_000_000


# ----------------------------------------------------------------------------- helpers


def build(log_dir: Path, topics: Iterable[str], partitions: Sequence[int] = (0,)) -> None:
    """Each topic-partition with three segments (two closed) and an empty cleaner checkpoint
    written the way kafkagen writes it (``0`` / ``0``)."""
    write_log_dir(log_dir, {(t, p): [SEG] * 3 for t in topics for p in partitions})


def write_config(
    tmp: Path,
    log_dirs: Sequence[Path],
    mode: str = "offline",
    bootstrap: str | None = None,
    broker: Mapping[str, object] | None = None,
    **retention: object,
) -> Config:
    path = configs.write_config(
        tmp,
        log_dirs,
        broker={"bootstrap_servers": bootstrap or None, **(broker or {})},
        mode=mode,
        max_bytes=1,
        consumer_aware=False,
        **{"assume_delete_policy": None, **retention},
    )
    return load_config(path)


def seed_cache(tmp: Path, policies: Mapping[str, tuple[str, bool]]) -> None:
    """The cache file as an earlier run (broker mode) left it."""
    state = tmp / "state"
    state.mkdir(parents=True, exist_ok=True)
    topics = {
        topic: {
            "cleanup_policy": policy,
            "remote_storage_enable": remote,
            "learned_at_ms": LEARNED_MS,
            "source": "describe-configs",
        }
        for topic, (policy, remote) in policies.items()
    }
    (state / "topic-policies.json").write_text(json.dumps({"version": 1, "topics": topics}))


def segments(log_dir: Path, topic: str, partition: int = 0) -> list[str]:
    return sorted(p.name for p in (log_dir / f"{topic}-{partition}").glob("*.log"))


def deleted_topics(outcome: Any) -> set[str]:
    return {r.deletion.topic for r in outcome.results if r.ok}


def protected(outcome: Any) -> dict[str, str]:
    """topic -> reason, from the plan (what ``plan --json`` shows)."""
    return {t.topic: t.reason for t in outcome.plan.protected}


@pytest.fixture()
def disk(tmpfs: Callable[[int], Path]) -> Path:
    return tmpfs(64 * MiB)


# ----------------------------------------------------------------------------- offline


def test_compacted_topic_known_from_the_cache_is_never_deleted_offline(
    disk: Path, tmp_path: Path
) -> None:
    """Not in any cleaner checkpoint (never cleaned yet): only the cache knows it is compact."""
    log_dir = disk / "kafka"
    build(log_dir, ["orders", "events"])
    seed_cache(tmp_path, {"orders": ("delete", False), "events": ("compact", False)})
    before = segments(log_dir, "events")
    with RetentionCycle(write_config(tmp_path, [log_dir])) as runtime:
        outcome = runtime.enforce()
    assert deleted_topics(outcome) == {"orders"}
    assert segments(log_dir, "events") == before
    assert len(segments(log_dir, "orders")) == 1  # only the active segment is left
    assert "cleanup.policy=compact" in protected(outcome)["events"]


def test_a_partition_listed_only_in_another_log_dirs_checkpoint_is_protected(
    disk: Path, tmp_path: Path
) -> None:
    """JBOD: events-0 lives in dir a, events-1 in dir b; only b's cleaner has cleaned it."""
    a, b = disk / "a", disk / "b"
    build(a, ["events", "orders"], partitions=(0,))
    build(b, ["events"], partitions=(1,))
    write_checkpoint(b / "cleaner-offset-checkpoint", [("events", 1, 20)])
    seed_cache(tmp_path, {"orders": ("delete", False)})
    config = write_config(tmp_path, [a, b])
    before = segments(a, "events")
    with RetentionCycle(config) as runtime:
        outcome = runtime.enforce()
    assert segments(a, "events") == before
    assert deleted_topics(outcome) == {"orders"}
    assert protected(outcome)["events"] == "compacted: listed in a cleaner-offset-checkpoint"


def test_an_empty_cleaner_checkpoint_is_normal_and_an_unknown_policy_is_protected(
    disk: Path, tmp_path: Path
) -> None:
    """A broker creates cleaner-offset-checkpoint empty (0 bytes) at start-up."""
    log_dir = disk / "kafka"
    build(log_dir, ["orders"])
    (log_dir / "cleaner-offset-checkpoint").write_bytes(b"")
    before = segments(log_dir, "orders")
    with RetentionCycle(write_config(tmp_path, [log_dir])) as runtime:
        outcome = runtime.enforce()
    assert not [w for w in outcome.warnings if "checkpoint" in w], outcome.warnings
    assert outcome.results == ()
    assert segments(log_dir, "orders") == before
    assert protected(outcome)["orders"].startswith("cleanup.policy unknown")


def test_unknown_policy_is_protected_unless_assume_delete_policy_names_the_topic(
    disk: Path, tmp_path: Path
) -> None:
    log_dir = disk / "kafka"
    build(log_dir, ["orders", "clicks"])
    before = segments(log_dir, "clicks")
    config = write_config(tmp_path, [log_dir], assume_delete_policy=["^orders$"])
    with RetentionCycle(config) as runtime:
        outcome = runtime.enforce()
    assert deleted_topics(outcome) == {"orders"}
    assert segments(log_dir, "clicks") == before
    assert "retention.assume_delete_policy" in protected(outcome)["clicks"]
    assert "orders" not in protected(outcome)


def test_compact_delete_is_protected_unless_listed_and_compact_always(
    disk: Path, tmp_path: Path
) -> None:
    log_dir = disk / "kafka"
    build(log_dir, ["both_listed", "both", "compact_listed"])
    seed_cache(
        tmp_path,
        {
            "both_listed": ("compact,delete", False),
            "both": ("delete,compact", False),
            "compact_listed": ("compact", False),
        },
    )
    config = write_config(
        tmp_path, [log_dir], assume_delete_policy=["^both_listed$", "^compact_listed$"]
    )
    with RetentionCycle(config) as runtime:
        outcome = runtime.enforce()
    assert deleted_topics(outcome) == {"both_listed"}
    reasons = protected(outcome)
    assert reasons["both"].startswith("cleanup.policy=compact,delete")
    assert reasons["compact_listed"].startswith("cleanup.policy=compact ")


def test_a_user_protect_topics_list_only_adds_to_the_internal_topics(
    disk: Path, tmp_path: Path
) -> None:
    internal = ["__consumer_offsets", "__cluster_metadata", "_schemas", "_confluent-metrics"]
    log_dir = disk / "kafka"
    build(log_dir, [*internal, "orders", "clicks"])
    seed_cache(tmp_path, {"orders": ("delete", False), "clicks": ("delete", False)})
    before = {t: segments(log_dir, t) for t in internal}
    config = write_config(tmp_path, [log_dir], protect_topics=["^orders$"])
    with RetentionCycle(config) as runtime:
        outcome = runtime.enforce()
    assert deleted_topics(outcome) == {"clicks"}
    assert {t: segments(log_dir, t) for t in internal} == before
    reasons = protected(outcome)
    assert reasons["orders"] == "matches retention.protect_topics '^orders$'"
    assert all(reasons[t].startswith("internal topic") for t in internal)


def test_a_tiered_partition_is_protected_offline(disk: Path, tmp_path: Path) -> None:
    """remote_log_snapshot in the partition dir, or remote.storage.enable=true in the cache."""
    log_dir = disk / "kafka"
    build(log_dir, ["orders", "tiered", "remote"], partitions=(0, 1))
    (log_dir / "tiered-1" / "remote_log_snapshot").mkdir()
    seed_cache(
        tmp_path,
        {"orders": ("delete", False), "tiered": ("delete", False), "remote": ("delete", True)},
    )
    before = {(t, p): segments(log_dir, t, p) for t in ("tiered", "remote") for p in (0, 1)}
    with RetentionCycle(write_config(tmp_path, [log_dir])) as runtime:
        outcome = runtime.enforce()
    chosen = {(r.deletion.topic, r.deletion.partition) for r in outcome.results if r.ok}
    assert chosen == {("orders", 0), ("orders", 1), ("tiered", 0)}
    assert segments(log_dir, "tiered", 1) == before[("tiered", 1)]
    assert segments(log_dir, "remote", 0) == before[("remote", 0)]
    reasons = protected(outcome)
    assert reasons["tiered"].startswith("tiered storage: remote log state")
    assert reasons["remote"].startswith("tiered storage: remote.storage.enable=true")


# ----------------------------------------------------------------------------- broker mode


class PolicyAdmin:
    """A broker at the confluent-kafka AdminClient boundary: topic configs from ``configs``
    (an exception instead of a dict fails that topic's future), DeleteRecords accepted."""

    def __init__(self, configs: Mapping[str, Mapping[str, str] | BaseException]) -> None:
        self.configs = configs
        self.described: list[list[str]] = []
        self.deleted: list[tuple[str, int, int]] = []

    def list_topics(self, *args: Any, **kwargs: Any) -> object:
        return object()

    def describe_cluster(self, **kwargs: Any) -> concurrent.futures.Future[Any]:
        return described_cluster()

    def describe_configs(
        self, resources: list[Any], **kwargs: Any
    ) -> Mapping[Any, concurrent.futures.Future[Any]]:
        from confluent_kafka.admin import ResourceType

        # Topic resources only: the broker's own settings (reclaim latency) are asked too.
        topics = sorted(r.name for r in resources if r.restype == ResourceType.TOPIC)
        if topics:
            self.described.append(topics)
        out: dict[Any, concurrent.futures.Future[Any]] = {}
        for resource in resources:
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            answer = self.configs.get(resource.name, KafkaException(KafkaError(3)))
            if isinstance(answer, BaseException):
                future.set_exception(answer)
            else:
                future.set_result({k: ConfigEntry(k, v) for k, v in answer.items()})
            out[resource] = future
        return out

    def delete_records(
        self, tps: list[TopicPartition], **kwargs: Any
    ) -> Mapping[TopicPartition, concurrent.futures.Future[Any]]:
        out = {}
        for tp in tps:
            self.deleted.append((tp.topic, tp.partition, tp.offset))
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            future.set_result(DeletedRecords(tp.offset))
            out[TopicPartition(tp.topic, tp.partition, tp.offset)] = future
        return out


def broker_runtime(config: Config, admin: PolicyAdmin) -> RetentionCycle:
    from diskguard.broker.client import BrokerClient

    client = BrokerClient("127.0.0.1:1", {}, timeout=2.0, admin=admin)  # type: ignore[arg-type]
    return RetentionCycle(config, broker=client)


DELETE = {"cleanup.policy": "delete", "remote.storage.enable": "false"}


def test_broker_mode_learns_policies_by_describe_configs_and_a_failed_answer_protects(
    disk: Path, tmp_path: Path
) -> None:
    log_dir = disk / "kafka"
    build(log_dir, ["orders", "events", "tiered", "silent"])
    admin = PolicyAdmin(
        {
            "orders": DELETE,
            "events": {"cleanup.policy": "compact", "remote.storage.enable": "false"},
            "tiered": {"cleanup.policy": "delete", "remote.storage.enable": "true"},
            "silent": KafkaException(KafkaError(KafkaError.REQUEST_TIMED_OUT)),
        }
    )
    config = write_config(tmp_path, [log_dir], mode="broker", bootstrap="127.0.0.1:1")
    runtime = broker_runtime(config, admin)
    outcome = runtime.enforce()
    # Asked once, for the topics on the disk (internal ones never need asking).
    assert admin.described == [["events", "orders", "silent", "tiered"]]
    assert {t for t, _p, _o in admin.deleted} == {"orders"}
    reasons = protected(outcome)
    assert reasons["events"].startswith("cleanup.policy=compact (describe-configs)")
    assert reasons["tiered"].startswith("tiered storage: remote.storage.enable=true")
    assert reasons["silent"].startswith("cleanup.policy unknown")
    # The next cycle asks again only what is still unknown, and not before the retry delay.
    runtime.enforce()
    assert len(admin.described) == 1


def test_the_policy_cache_survives_a_restart_and_serves_offline_mode(
    disk: Path, tmp_path: Path
) -> None:
    log_dir = disk / "kafka"
    build(log_dir, ["orders", "events"])
    admin = PolicyAdmin(
        {"orders": DELETE, "events": {"cleanup.policy": "compact,delete"}},
    )
    broker_config = write_config(tmp_path, [log_dir], mode="broker", bootstrap="127.0.0.1:1")
    # A broker-mode cycle that learns but does not act; then the broker dies.
    runtime = broker_runtime(broker_config, admin)
    first = runtime.plan()
    runtime.close()
    assert first.plan.deletions and all(d.topic == "orders" for d in first.plan.deletions)
    cache = json.loads((tmp_path / "state" / "topic-policies.json").read_text())
    assert cache["topics"]["events"]["cleanup_policy"] == "compact,delete"
    assert cache["topics"]["events"]["source"] == "describe-configs"
    assert cache["topics"]["orders"]["remote_storage_enable"] is False

    before = segments(log_dir, "events")
    with RetentionCycle(write_config(tmp_path, [log_dir])) as restarted:
        outcome = restarted.enforce()
    assert outcome.mode.mode == "offline"
    assert deleted_topics(outcome) == {"orders"}
    assert segments(log_dir, "events") == before


def test_a_corrupt_cache_file_is_a_warning_and_every_topic_unknown(
    disk: Path, tmp_path: Path
) -> None:
    log_dir = disk / "kafka"
    build(log_dir, ["orders"])
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "topic-policies.json").write_text('{"version": 1, "topics": [')
    with RetentionCycle(write_config(tmp_path, [log_dir])) as runtime:
        outcome = runtime.enforce()
    assert outcome.results == ()
    assert any("topic policy cache unreadable" in w for w in outcome.warnings)


# ----------------------------------------------------------------------------- KRaft metadata


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def cstr(value: str | None) -> bytes:
    if value is None:
        return b"\x00"
    raw = value.encode()
    return uvarint(len(raw) + 1) + raw


def frame(api_key: int, body: bytes) -> bytes:
    return uvarint(1) + uvarint(api_key) + uvarint(0) + body + uvarint(0)


def config_record(topic: str, key: str, value: str | None, resource_type: int = 2) -> bytes:
    return frame(4, bytes([resource_type]) + cstr(topic) + cstr(key) + cstr(value))


def topic_record(topic: str, tid: bytes) -> bytes:
    return frame(2, cstr(topic) + tid)


def remove_topic_record(tid: bytes) -> bytes:
    return frame(9, tid)


def metadata_file(path: Path, batches: Sequence[Sequence[bytes]], first_offset: int = 0) -> None:
    """Record batches of metadata records, a control batch (leader change) first."""
    out = bytearray(encode_batch(first_offset, [LEARNED_MS], [b"\x00" * 8], attributes=0x20))
    offset = first_offset + 1
    for values in batches:
        out += encode_batch(offset, [LEARNED_MS] * len(values), list(values))
        offset += len(values)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(out))


def tid() -> bytes:
    return uuid.uuid4().bytes


def built_tid(topic: str) -> bytes:
    """The topic id kafkagen writes into the partition dirs' ``partition.metadata``."""
    return base64.urlsafe_b64decode(topic_id(topic) + "==")


def test_the_real_kraft_fixture_is_parsed_record_by_record(tmp_path: Path) -> None:
    from diskguard.kafkalog import kraftmeta

    log_dir = tmp_path / "kraft-logdir"
    shutil.copytree(FIXTURE, log_dir)
    meta = kraftmeta.read_metadata(log_dir)
    assert meta is not None and meta.complete, meta and meta.problem
    # The counts the fixtures README gives for this log.
    assert (meta.batches, meta.control_batches) == (4814, 1)
    counts = meta.record_counts
    assert (counts[20], counts[3], counts[5], counts[2], counts[17], counts[4]) == (
        4801,
        54,
        54,
        5,
        3,
        3,
    )
    assert meta.topic_configs["__consumer_offsets"]["cleanup.policy"] == "compact"
    assert "TestTopicPatient" in meta.topics
    policy = kraftmeta.topic_policy(meta, "__consumer_offsets", None, 1, 0)
    assert policy is not None
    assert (policy.cleanup_policy, policy.source) == ("compact", "kraft-metadata")
    # No override and no server.properties: the broker default is unknowable.
    unknown = kraftmeta.topic_policy(meta, "TestTopicPatient", None, 1, 0)
    assert unknown is not None and unknown.cleanup_policy is None


def test_offline_policies_from_a_kraft_log_dir_and_server_properties(
    disk: Path, tmp_path: Path
) -> None:
    """Overrides, a reset to default, a deleted-and-recreated topic and the broker default
    from server.properties, applied by a real offline cycle."""
    log_dir = disk / "kafka"
    build(log_dir, ["orders", "events", "reset", "reborn", "ghost", "tiered"])
    ids = {t: built_tid(t) for t in ("orders", "events", "reset", "reborn", "tiered")}
    reborn_old = tid()
    metadata_file(
        log_dir / "__cluster_metadata-0" / "00000000000000000000.log",
        [
            [topic_record(t, i) for t, i in ids.items() if t != "reborn"],
            [
                topic_record("reborn", reborn_old),
                config_record("reborn", "cleanup.policy", "delete"),
            ],
            [config_record("events", "cleanup.policy", "delete")],
            [config_record("events", "cleanup.policy", "compact")],  # later wins
            [config_record("reset", "cleanup.policy", "compact")],
            [config_record("reset", "cleanup.policy", None)],  # back to the default
            [remove_topic_record(reborn_old), topic_record("reborn", ids["reborn"])],
            [config_record("tiered", "remote.storage.enable", "true")],
        ],
    )
    props = tmp_path / "server.properties"
    props.write_text(f"log.dirs={log_dir}\nlog.cleanup.policy=compact\n")
    config = write_config(tmp_path, [log_dir], broker={"server_properties": str(props)})
    with RetentionCycle(config) as runtime:
        outcome = runtime.enforce()
    # Everything without an override uses the broker default: compact here.
    assert deleted_topics(outcome) == set()
    reasons = protected(outcome)
    assert reasons["events"].startswith("cleanup.policy=compact (kraft-metadata)")
    assert reasons["reset"].startswith("cleanup.policy=compact (kraft-metadata)")
    assert reasons["reborn"].startswith("cleanup.policy=compact (kraft-metadata)")
    # Not in the complete metadata: the broker sets its dir aside as a stray at start-up.
    assert reasons["ghost"].startswith("topic not in the KRaft metadata: deleted before"), reasons
    assert reasons["tiered"].startswith("tiered storage: remote.storage.enable=true")

    props.write_text(f"log.dirs={log_dir}\nlog.cleanup.policy=delete\n")
    with RetentionCycle(
        write_config(tmp_path, [log_dir], broker={"server_properties": str(props)})
    ) as rt:
        second = rt.enforce()
    assert deleted_topics(second) == {"orders", "reset", "reborn"}
    assert set(protected(second)) >= {"events", "ghost", "tiered", "__cluster_metadata"}


def test_a_kraft_snapshot_is_read_and_a_log_without_its_start_is_incomplete(
    tmp_path: Path,
) -> None:
    from diskguard.kafkalog import kraftmeta

    log_dir = tmp_path / "kafka"
    meta_dir = log_dir / "__cluster_metadata-0"
    orders, events = tid(), tid()
    metadata_file(
        meta_dir / "00000000000000000010-0000000003.checkpoint",
        [
            [topic_record("orders", orders), topic_record("events", events)],
            [config_record("events", "cleanup.policy", "compact")],
        ],
    )
    metadata_file(
        meta_dir / "00000000000000000010.log",
        [[config_record("orders", "cleanup.policy", "compact,delete")]],
        first_offset=10,
    )
    meta = kraftmeta.read_metadata(log_dir)
    assert meta is not None and meta.complete and meta.snapshot is not None
    assert meta.topic_configs["events"] == {"cleanup.policy": "compact"}
    assert meta.topic_configs["orders"] == {"cleanup.policy": "compact,delete"}

    (meta_dir / "00000000000000000010-0000000003.checkpoint").unlink()
    partial = kraftmeta.read_metadata(log_dir)
    assert partial is not None and not partial.complete
    assert "no snapshot covers" in (partial.problem or "")
    # Incomplete: a compact override still proves compaction; a default is never inferred.
    found = kraftmeta.topic_policy(partial, "orders", "delete", 1, 0)
    assert found is not None and found.cleanup_policy == "compact,delete"
    assert kraftmeta.topic_policy(partial, "events", "delete", 1, 0) is None


def test_a_corrupt_metadata_log_only_adds_protection(tmp_path: Path) -> None:
    from diskguard.kafkalog import kraftmeta

    log_dir = tmp_path / "kafka"
    path = log_dir / "__cluster_metadata-0" / "00000000000000000000.log"
    orders = tid()
    metadata_file(
        path,
        [
            [topic_record("orders", orders), config_record("orders", "cleanup.policy", "compact")],
            [config_record("orders", "cleanup.policy", "delete")],
        ],
    )
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # the last batch's record bytes: its CRC no longer matches
    path.write_bytes(bytes(data))
    meta = kraftmeta.read_metadata(log_dir)
    assert meta is not None and not meta.complete and "CRC32C" in (meta.problem or "")
    found = kraftmeta.topic_policy(meta, "orders", "delete", 1, 0)
    assert found is not None and found.cleanup_policy == "compact"


def compressed_batch(base_offset: int, values: Sequence[bytes], codec: int) -> bytes:
    """A v2 batch whose records are compressed (1 gzip; other codecs: body left as is)."""
    records = b"".join(encode_record(i, 0, v) for i, v in enumerate(values))
    body = gzip.compress(records) if codec == 1 else records
    after_crc = struct.pack(
        ">hiqqqhii", codec, len(values) - 1, LEARNED_MS, LEARNED_MS, -1, -1, -1, len(values)
    )
    crc = crc32c.crc32c(after_crc + body)
    length = 4 + 1 + 4 + len(after_crc) + len(body)
    return struct.pack(">qiibI", base_offset, length, 0, 2, crc) + after_crc + body


def test_gzip_metadata_batches_are_read_and_other_codecs_make_the_read_incomplete(
    tmp_path: Path,
) -> None:
    from diskguard.kafkalog import kraftmeta

    log_dir = tmp_path / "kafka"
    path = log_dir / "__cluster_metadata-0" / "00000000000000000000.log"
    path.parent.mkdir(parents=True)
    events = tid()
    values = [topic_record("events", events), config_record("events", "cleanup.policy", "compact")]
    path.write_bytes(compressed_batch(0, values, codec=1))
    meta = kraftmeta.read_metadata(log_dir)
    assert meta is not None and meta.complete, meta and meta.problem
    assert meta.topic_configs == {"events": {"cleanup.policy": "compact"}}
    path.write_bytes(compressed_batch(0, values, codec=4))
    zstd = kraftmeta.read_metadata(log_dir)
    assert zstd is not None and not zstd.complete and "zstd" in (zstd.problem or "")


# ----------------------------------------------------------------------------- the pure rule


def test_the_rule_order_and_reasons() -> None:
    from diskguard.kafkalog.topicpolicy import TopicPolicy, protection_reason

    def reason(topic: str, policy: str | None, **kw: Any) -> str | None:
        known = TopicPolicy(policy, kw.pop("remote", False), 0, "describe-configs")
        return protection_reason(
            topic,
            policy=known if policy is not None else None,
            in_cleaner_checkpoint=kw.pop("checkpoint", False),
            remote_log_state=kw.pop("remote_state", False),
            protect_topics=[re.compile(p) for p in kw.pop("protect", [])],
            assume_delete_policy=[re.compile(p) for p in kw.pop("assume", [])],
        )

    assert reason("orders", "delete") is None
    assert reason("orders", None, assume=["^ord"]) is None
    assert reason("orders", "compact,delete", assume=["^ord"]) is None
    assert reason("orders", "compact", assume=["^ord"]) is not None
    assert reason("orders", "compact,delete", assume=["^ord"], checkpoint=True) is None
    assert reason("orders", "delete", checkpoint=True) is not None
    assert reason("orders", "delete", remote_state=True, assume=[".*"]) is not None
    assert reason("orders", "", assume=[".*"]) is not None  # empty policy: no delete
    assert reason("__consumer_offsets", "delete", assume=[".*"]) is not None
    assert reason("_confluent-command", None, assume=[".*"]) is not None
    assert reason("orders", "delete", protect=["^orders$"]) is not None
    # An unknown remote.storage.enable with a delete policy is not taken as "not tiered".
    no_default = TopicPolicy(None, False, 0, "kraft-metadata")
    assert "broker default is unknown" in (
        protection_reason(
            "orders", policy=no_default, in_cleaner_checkpoint=False, remote_log_state=False
        )
        or ""
    )
    unsure = TopicPolicy("delete", None, 0, "kraft-metadata")
    assert protection_reason(
        "orders", policy=unsure, in_cleaner_checkpoint=False, remote_log_state=False
    )


def test_plan_says_per_topic_what_is_protected_and_why(disk: Path, tmp_path: Path) -> None:
    """``plan --json`` gains a top-level ``protected`` list; the table shows the same."""
    log_dir = disk / "kafka"
    build(log_dir, ["orders", "clicks", "__consumer_offsets"])
    write_config(tmp_path, [log_dir], assume_delete_policy=["^orders$"])
    cfg = tmp_path / "diskguard.toml"
    as_json = run_cli("plan", "--json", "-c", str(cfg))
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert {d["topic"] for d in data["deletions"]} == {"orders"}
    by_topic = {p["topic"]: p["reason"] for p in data["protected"]}
    assert set(by_topic) == {"clicks", "__consumer_offsets"}
    assert by_topic["clicks"].startswith("cleanup.policy unknown")
    table = run_cli("plan", "-c", str(cfg))
    assert table.returncode == 0, table.stderr
    assert "Protected topics" in table.stdout and "clicks" in table.stdout
    # plan is read-only: it wrote no cache.
    assert not (tmp_path / "state" / "topic-policies.json").exists()


# ------------------------------------------------- KRaft: transactions, strays, not-live dirs


def test_metadata_transactions_take_effect_at_their_end_and_aborted_ones_never(
    tmp_path: Path,
) -> None:
    """Kafka's metadata loader publishes a transaction's records only at its
    EndTransactionRecord; an aborted one, or one the log ends inside, never."""
    from diskguard.kafkalog import kraftmeta

    log_dir = tmp_path / "kafka"
    orders, events, clicks = tid(), tid(), tid()
    begin, end, abort = frame(23, b"\x00"), frame(24, b""), frame(25, b"\x00")
    metadata_file(
        log_dir / "__cluster_metadata-0" / "00000000000000000000.log",
        [
            [begin, topic_record("orders", orders)],
            [config_record("orders", "cleanup.policy", "compact"), end],
            [begin, topic_record("events", events), abort],
            [begin, topic_record("clicks", clicks)],  # the log ends inside it
        ],
    )
    meta = kraftmeta.read_metadata(log_dir)
    assert meta is not None and meta.complete, meta and meta.problem
    assert meta.topics == {"orders"}
    assert meta.topic_configs == {"orders": {"cleanup.policy": "compact"}}
    assert meta.topic_ids == {"orders": kraftmeta.uuid_text(orders)}


def test_a_record_version_newer_than_known_makes_the_read_incomplete(tmp_path: Path) -> None:
    """Every record type read is version 0 up to Kafka 4.4; a newer one may be laid out
    otherwise, so the read stops there: incomplete, which only adds protection."""
    from diskguard.kafkalog import kraftmeta

    log_dir = tmp_path / "kafka"
    orders = tid()
    newer = uvarint(1) + uvarint(4) + uvarint(1) + bytes([2]) + cstr("orders")
    newer += cstr("cleanup.policy") + cstr("delete") + uvarint(0)
    metadata_file(
        log_dir / "__cluster_metadata-0" / "00000000000000000000.log",
        [[topic_record("orders", orders)], [newer]],
    )
    meta = kraftmeta.read_metadata(log_dir)
    assert meta is not None and not meta.complete
    assert "record type 4 version 1 is newer than this reader knows (0)" in (meta.problem or "")
    assert kraftmeta.topic_policy(meta, "orders", "delete", 1, 0) is None


def test_topic_ids_and_removed_topics_as_partition_metadata_writes_them(tmp_path: Path) -> None:
    from diskguard.kafkalog import kraftmeta

    log_dir = tmp_path / "kafka"
    gone, old, new = tid(), tid(), tid()
    metadata_file(
        log_dir / "__cluster_metadata-0" / "00000000000000000000.log",
        [
            [topic_record("gone", gone), topic_record("reborn", old)],
            [remove_topic_record(gone), remove_topic_record(old)],
            [topic_record("reborn", new)],
        ],
    )
    meta = kraftmeta.read_metadata(log_dir)
    assert meta is not None and meta.complete
    assert meta.removed_topics == {"gone"}  # "reborn" exists again
    assert meta.topic_ids == {"reborn": kraftmeta.uuid_text(new)}
    # The text form is Kafka's Uuid.toString(): 22 base64url characters, no padding.
    pdir = tmp_path / "reborn-0"
    pdir.mkdir()
    (pdir / "partition.metadata").write_text(f"version: 0\ntopic_id: {topic_id('reborn')}\n")
    assert kraftmeta.partition_topic_id(pdir) == topic_id("reborn")
    assert len(topic_id("reborn")) == 22 and "=" not in topic_id("reborn")
    assert kraftmeta.partition_topic_id(tmp_path / "nowhere-0") is None


def test_stray_reason_mirrors_what_a_kraft_broker_sets_aside() -> None:
    from diskguard.kafkalog.topicpolicy import KraftTopics, stray_reason

    kraft = KraftTopics({"orders": "A", "events": "B"}, frozenset({"gone"}))
    assert stray_reason("orders", True, "A", kraft) is None
    assert stray_reason("orders", True, None, kraft) is None  # unreadable file: no conclusion
    assert (stray_reason("orders", False, None, kraft) or "").startswith("no partition.metadata")
    assert (stray_reason("orders", True, "Z", kraft) or "").startswith("topic id Z is not")
    assert "deleted (RemoveTopicRecord)" in (stray_reason("gone", True, "G", kraft) or "")
    assert "before the last metadata snapshot" in (stray_reason("x", True, "X", kraft) or "")
    # An incomplete read: only the missing file is sure.
    assert stray_reason("x", True, "X", None) is None
    assert stray_reason("x", False, None, None) is not None
    assert stray_reason("__cluster_metadata", False, None, kraft) is None


def test_offline_kraft_strays_are_kept_and_plan_says_so(disk: Path, tmp_path: Path) -> None:
    """A stopped KRaft broker's log dir: a topic deleted while it was down (RemoveTopicRecord),
    a deleted-and-created-again topic's old dir, a partition dir without partition.metadata,
    a ``-stray`` and a ``-future`` dir. Nothing of any of them is deleted (the broker sets the
    first three aside as strays at start-up and keeps them; the last two are not live): the
    live delete topic pays, and ``plan`` (JSON and text) says why for each."""
    log_dir = disk / "kafka"
    build(log_dir, ["orders", "gone", "reborn", "nometa", "events"])
    (log_dir / "nometa-0" / "partition.metadata").unlink()
    (log_dir / "meta.properties").write_text("version=1\nnode.id=1\ncluster.id=x\n")
    shutil.copytree(
        log_dir / "events-0", log_dir / "events-0.0123456789abcdef0123456789abcdef-stray"
    )
    shutil.copytree(
        log_dir / "orders-0", log_dir / "orders-0.fedcba9876543210fedcba9876543210-future"
    )
    ids = {t: built_tid(t) for t in ("orders", "gone", "nometa", "events")}
    metadata_file(
        log_dir / "__cluster_metadata-0" / "00000000000000000000.log",
        [
            [topic_record(t, i) for t, i in ids.items()],
            [topic_record("reborn", tid())],  # not the id in reborn-0/partition.metadata
            [remove_topic_record(ids["gone"])],
        ],
    )
    props = tmp_path / "server.properties"
    props.write_text(f"log.dirs={log_dir}\n")  # log.cleanup.policy: Kafka's default, delete
    write_config(tmp_path, [log_dir], broker={"server_properties": str(props)})
    cfg = tmp_path / "diskguard.toml"

    proc = run_cli("plan", "--json", "-c", str(cfg))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["mode"] == "offline"
    assert {d["topic"] for d in data["deletions"]} == {"orders", "events"}
    reasons = {p["topic"]: p["reason"] for p in data["protected"]}
    assert reasons["gone"].startswith(
        "topic not in the KRaft metadata: deleted (RemoveTopicRecord)"
    )
    assert reasons["reborn"].startswith("topic id ")
    assert reasons["nometa"].startswith("no partition.metadata")
    for topic in ("gone", "reborn", "nometa"):
        assert "sets this dir aside as a stray at start-up" in reasons[topic], reasons[topic]
    not_live = {(d["topic"], d["kind"]): d for d in data["not_live"]}
    assert set(not_live) == {("events", "stray"), ("orders", "future")}
    stray = not_live[("events", "stray")]
    assert stray["bytes"] > 0 and stray["path"].endswith("-stray")
    assert "Kafka never deletes it" in stray["reason"]

    text = run_cli("plan", "-c", str(cfg))
    assert text.returncode == 0, text.stderr
    assert "Partition dirs that are not live" in text.stdout
    assert "events-0.0123456789abcdef0123456789abcdef-stray" in text.stdout

    before = {p.name: sorted(q.name for q in p.iterdir()) for p in log_dir.iterdir() if p.is_dir()}
    with RetentionCycle(load_config(cfg)) as runtime:
        outcome = runtime.enforce()
    assert deleted_topics(outcome) == {"orders", "events"}
    after = {p.name: sorted(q.name for q in p.iterdir()) for p in log_dir.iterdir() if p.is_dir()}
    for name in (
        "gone-0",
        "reborn-0",
        "nometa-0",
        "events-0.0123456789abcdef0123456789abcdef-stray",
        "orders-0.fedcba9876543210fedcba9876543210-future",
        "__cluster_metadata-0",
    ):
        assert after[name] == before[name], name


def test_a_zookeeper_log_dir_without_partition_metadata_is_not_a_stray(
    disk: Path, tmp_path: Path
) -> None:
    """Only a KRaft broker sets such dirs aside; a ZooKeeper-mode one (meta.properties
    version 0) writes partition.metadata itself when it is missing."""
    log_dir = disk / "kafka"
    build(log_dir, ["orders"])
    (log_dir / "orders-0" / "partition.metadata").unlink()
    (log_dir / "meta.properties").write_text("version=0\nbroker.id=1\ncluster.id=x\n")
    with RetentionCycle(write_config(tmp_path, [log_dir], assume_delete_policy=[".*"])) as rt:
        outcome = rt.enforce()
    assert deleted_topics(outcome) == {"orders"}
