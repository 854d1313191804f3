"""Topic configs from a KRaft broker's own metadata log, read from its log dir (edge).

With the broker stopped (offline rescue) nobody can be asked which topics are compacted, but
a KRaft broker keeps the whole cluster metadata in ``__cluster_metadata-0``: record batches
(RecordBatch v2, like any partition) whose records are metadata records. A topic's
``cleanup.policy`` and ``remote.storage.enable`` overrides are ``ConfigRecord``s; later
records override earlier ones, a null value resets a key to its default, and a deleted topic
(``RemoveTopicRecord``) loses its configs. A snapshot ``<offset>-<epoch>.checkpoint`` holds
the state of every record below ``offset`` in the same batch format; the log after it holds
the rest.

Encoding (Kafka's ``MetadataRecordSerde``): record value = frame version, api key, record
version (unsigned varints), then the record in the flexible (compact) encoding.
``ConfigRecord`` (api key 4): ResourceType int8 (2 topic, 4 broker), ResourceName compact
string, Name compact string, Value compact nullable string, tagged fields. ``TopicRecord``
(2): Name compact string, TopicId uuid. ``RemoveTopicRecord`` (9): TopicId uuid.

"Complete" means every record from the start of the metadata (offset 0, or a snapshot) to
the end was read: only then is a topic *without* an override known to use the broker
default. An incomplete read can still prove a topic compacted or tiered, never the opposite.

Records between a ``BeginTransactionRecord`` (23) and its ``EndTransactionRecord`` (24) take
effect together at the end; an ``AbortTransactionRecord`` (25), or a log that ends inside the
transaction, discards them (Kafka's metadata loader publishes nothing of a transaction until
it ends). Every record type used here is version 0 up to Kafka 4.4 (checked against its
``kafka-metadata`` jar); a broker's log of many records holds snapshots and rolled segments,
older ones renamed ``*.deleted`` once a newer snapshot covers them (measured on 4.4).

``partition.metadata`` (``version: 0``, ``topic_id: <base64 uuid>``) names the incarnation of
the topic a partition dir belongs to; a KRaft broker sets a dir aside as a stray at start-up
when that id is not in the metadata, or the file is missing (``partition_topic_id``).
"""

from __future__ import annotations

import base64
import os
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from diskguard.host import safeopen
from diskguard.kafkalog import recordbatch
from diskguard.kafkalog.listing import PARTITION_METADATA
from diskguard.kafkalog.model import parse_segment_file
from diskguard.kafkalog.topicpolicy import SOURCE_KRAFT, TopicPolicy, normalize_policy

__all__ = [
    "METADATA_DIR",
    "KraftMetadata",
    "MetadataCorrupt",
    "partition_topic_id",
    "read_metadata",
    "topic_policy",
]

METADATA_DIR = "__cluster_metadata-0"
_SNAPSHOT = re.compile(r"^([0-9]{20})-([0-9]{10})\.checkpoint\Z")

API_TOPIC = 2
API_CONFIG = 4
API_REMOVE_TOPIC = 9
API_BEGIN_TRANSACTION = 23
API_END_TRANSACTION = 24
API_ABORT_TRANSACTION = 25
#: The newest version of each record type read here: all 0 up to Kafka 4.4.
_KNOWN_VERSIONS = {
    API_TOPIC: 0,
    API_CONFIG: 0,
    API_REMOVE_TOPIC: 0,
    API_BEGIN_TRANSACTION: 0,
    API_END_TRANSACTION: 0,
    API_ABORT_TRANSACTION: 0,
}
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4


class MetadataCorrupt(ValueError):
    """Bytes in the metadata log that are not valid records; the message names the place."""


@dataclass(frozen=True)
class KraftMetadata:
    """What the metadata log says, as far as it could be read."""

    #: topic -> config key -> value, the overrides in effect at the end of the log.
    topic_configs: Mapping[str, Mapping[str, str]]
    #: Topics that exist (a TopicRecord, not removed since).
    topics: frozenset[str]
    #: broker resource name ("" = cluster-wide default, else a node id) -> key -> value.
    broker_configs: Mapping[str, Mapping[str, str]]
    complete: bool
    #: Why the read is incomplete (None when complete).
    problem: str | None = None
    batches: int = 0
    control_batches: int = 0
    #: metadata record api key -> records seen (log and snapshot).
    record_counts: Mapping[int, int] = field(default_factory=dict)
    snapshot: str | None = None
    #: topic -> its topic id as ``partition.metadata`` writes it (base64url, no padding).
    topic_ids: Mapping[str, str] = field(default_factory=dict)
    #: Topics a ``RemoveTopicRecord`` in the records read removed, not created again since
    #: (a topic deleted before the snapshot is simply absent).
    removed_topics: frozenset[str] = frozenset()


class _Buf:
    def __init__(self, data: bytes, where: str) -> None:
        self.data = data
        self.pos = 0
        self.where = where

    def _need(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.data):
            raise MetadataCorrupt(f"{self.where}: record ends early")

    def uvarint(self) -> int:
        shift = result = 0
        while True:
            self._need(1)
            byte = self.data[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise MetadataCorrupt(f"{self.where}: varint too long")

    def varint(self) -> int:
        raw = self.uvarint()
        return (raw >> 1) ^ -(raw & 1)

    def take(self, n: int) -> bytes:
        self._need(n)
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def int8(self) -> int:
        return int.from_bytes(self.take(1), "big", signed=True)

    def compact_string(self, nullable: bool = False) -> str | None:
        length = self.uvarint()
        if length == 0:
            if nullable:
                return None
            raise MetadataCorrupt(f"{self.where}: null in a non-nullable string")
        try:
            return self.take(length - 1).decode("utf-8")
        except UnicodeDecodeError:
            raise MetadataCorrupt(f"{self.where}: string is not UTF-8") from None


def _records(body: bytes, base_offset: int, count: int, where: str) -> Iterator[tuple[int, bytes]]:
    """``(offset, value)`` of each record of an uncompressed v2 batch body."""
    buf = _Buf(body, where)
    for _ in range(count):
        length = buf.varint()
        rec = _Buf(buf.take(length), where)
        rec.int8()  # attributes
        rec.varint()  # timestamp delta
        offset_delta = rec.varint()
        key_len = rec.varint()
        if key_len > 0:
            rec.take(key_len)
        value_len = rec.varint()
        value = rec.take(value_len) if value_len >= 0 else b""
        yield base_offset + offset_delta, value


def _decompress(codec: int, data: bytes, where: str) -> bytes:
    if codec == 1:
        import gzip  # only for a gzip batch (rare in the metadata log): not at every start-up
        import zlib

        try:
            return gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise MetadataCorrupt(f"{where}: bad gzip data: {exc}") from None
    names = {2: "snappy", 3: "lz4", 4: "zstd"}
    raise MetadataCorrupt(f"{where}: {names.get(codec, codec)}-compressed batch not readable")


def _iter_file_records(path: str, state: _State) -> Iterator[tuple[int, bytes]]:
    """Every data record of a file of record batches; control batches are skipped."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        for header in recordbatch.iter_batches(path):
            where = f"{path}: batch at position {header.position}"
            state.batches += 1
            raw = os.pread(
                fd,
                header.size_in_bytes - recordbatch.CRC_START,
                header.position + recordbatch.CRC_START,
            )
            if recordbatch.checksum(raw) != header.crc:
                raise MetadataCorrupt(f"{where}: CRC32C mismatch")
            if header.is_control:
                state.control_batches += 1
                continue
            body = raw[recordbatch.HEADER_SIZE - recordbatch.CRC_START :]
            if header.compression:
                body = _decompress(header.compression, body, where)
            yield from _records(body, header.base_offset, header.record_count, where)
    finally:
        os.close(fd)


class _State:
    def __init__(self) -> None:
        self.configs: dict[tuple[int, str], dict[str, str]] = {}
        self.topic_ids: dict[bytes, str] = {}
        self.removed: set[str] = set()
        self.batches = 0
        self.control_batches = 0
        self.counts: Counter[int] = Counter()
        #: Records of an open metadata transaction, applied at its end (None: none open).
        self.pending: list[tuple[int, _Buf]] | None = None

    def apply(self, value: bytes, where: str) -> None:
        buf = _Buf(value, where)
        frame = buf.uvarint()
        if frame != 1:
            raise MetadataCorrupt(f"{where}: metadata frame version {frame} is not 1")
        api_key = buf.uvarint()
        version = buf.uvarint()
        self.counts[api_key] += 1
        if version > _KNOWN_VERSIONS.get(api_key, version):
            # A later Kafka may lay the record out otherwise: read no further (incomplete,
            # which only ever adds protection) rather than guess.
            raise MetadataCorrupt(
                f"{where}: metadata record type {api_key} version {version} is newer than "
                f"this reader knows ({_KNOWN_VERSIONS[api_key]})"
            )
        if api_key == API_BEGIN_TRANSACTION:
            self.pending = []
        elif api_key in (API_END_TRANSACTION, API_ABORT_TRANSACTION):
            done, self.pending = self.pending or [], None
            if api_key == API_END_TRANSACTION:
                for key, body in done:
                    self._apply(key, body)
        elif self.pending is not None:
            self.pending.append((api_key, buf))
        else:
            self._apply(api_key, buf)

    def _apply(self, api_key: int, buf: _Buf) -> None:
        if api_key == API_CONFIG:
            rtype = buf.int8()
            rname = buf.compact_string() or ""
            name = buf.compact_string() or ""
            val = buf.compact_string(nullable=True)
            configs = self.configs.setdefault((rtype, rname), {})
            if val is None:
                configs.pop(name, None)
            else:
                configs[name] = val
        elif api_key == API_TOPIC:
            name = buf.compact_string() or ""
            self.topic_ids[buf.take(16)] = name
            self.removed.discard(name)
        elif api_key == API_REMOVE_TOPIC:
            removed = self.topic_ids.pop(buf.take(16), None)
            if removed is not None:
                self.configs.pop((RESOURCE_TOPIC, removed), None)
                self.removed.add(removed)


def _listing(meta_dir: Path) -> tuple[list[tuple[int, str]], list[tuple[int, int, str]]]:
    segments: list[tuple[int, str]] = []
    snapshots: list[tuple[int, int, str]] = []
    for entry in os.scandir(meta_dir):
        if not entry.is_file(follow_symlinks=False):
            continue
        parsed = parse_segment_file(entry.name)
        if parsed is not None and parsed[1] == ".log":
            segments.append((parsed[0], entry.path))
            continue
        match = _SNAPSHOT.match(entry.name)
        if match:
            snapshots.append((int(match[1]), int(match[2]), entry.path))
    return sorted(segments), sorted(snapshots)


def identity(log_dir: str | os.PathLike[str]) -> tuple[tuple[str, int, int, int], ...] | None:
    """(path, inode, size, mtime) of every file the read depends on; None without a metadata
    dir. Equal identities mean an earlier read still holds (the daemon reads it once)."""
    meta_dir = Path(log_dir) / METADATA_DIR
    try:
        segments, snapshots = _listing(meta_dir)
    except (FileNotFoundError, NotADirectoryError):
        return None
    out = []
    for path in [p for _b, p in segments] + [p for _o, _e, p in snapshots]:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        out.append((path, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def read_metadata(log_dir: str | os.PathLike[str]) -> KraftMetadata | None:
    """The metadata in ``<log_dir>/__cluster_metadata-0``; None when the dir has none (a
    ZooKeeper-mode broker, or a KRaft broker whose metadata lives elsewhere). Never raises
    for bad content: the result is then incomplete and ``problem`` says why; OSError for an
    unreadable dir."""
    meta_dir = Path(log_dir) / METADATA_DIR
    try:
        segments, snapshots = _listing(meta_dir)
    except (FileNotFoundError, NotADirectoryError):
        return None
    state = _State()
    problem: str | None = None
    start = 0
    snapshot_name: str | None = None
    try:
        if snapshots:
            start, _epoch, snap_path = snapshots[-1]
            snapshot_name = os.path.basename(snap_path)
            for _offset, value in _iter_file_records(snap_path, state):
                state.apply(value, snap_path)
        if not segments:
            if not snapshots:
                problem = f"{meta_dir}: no metadata log segment"
        elif segments[0][0] > start:
            problem = (
                f"{meta_dir}: the log starts at offset {segments[0][0]} and no snapshot covers "
                f"the records before it"
            )
        for _base, path in segments:
            for offset, value in _iter_file_records(path, state):
                if offset >= start:
                    state.apply(value, path)
    except (recordbatch.CorruptLog, MetadataCorrupt) as exc:
        problem = str(exc)
    topic_configs = {
        name: dict(values)
        for (rtype, name), values in state.configs.items()
        if rtype == RESOURCE_TOPIC and values
    }
    broker_configs = {
        name: dict(values)
        for (rtype, name), values in state.configs.items()
        if rtype == RESOURCE_BROKER and values
    }
    return KraftMetadata(
        topic_configs=topic_configs,
        topics=frozenset(state.topic_ids.values()),
        broker_configs=broker_configs,
        complete=problem is None,
        problem=problem,
        batches=state.batches,
        control_batches=state.control_batches,
        record_counts=dict(state.counts),
        snapshot=snapshot_name,
        topic_ids={name: uuid_text(raw) for raw, name in state.topic_ids.items()},
        removed_topics=frozenset(state.removed - set(state.topic_ids.values())),
    )


def uuid_text(raw: bytes) -> str:
    """A topic id as Kafka prints it (``Uuid.toString``): base64url, no padding."""
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def partition_topic_id(partition_dir: str | os.PathLike[str]) -> str | None:
    """The ``topic_id`` in a partition dir's ``partition.metadata``; None when the file is
    missing, unreadable or malformed (a FIFO or a dir there is never opened for reading)."""
    try:
        text = safeopen.read_text(Path(partition_dir) / PARTITION_METADATA, errors="replace")
    except (OSError, ValueError):
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "topic_id" and value.strip():
            return value.strip()
    return None


def topic_policy(
    meta: KraftMetadata,
    topic: str,
    static_default: str | None,
    node_id: int | None,
    learned_at_ms: int,
) -> TopicPolicy | None:
    """What ``meta`` says of ``topic``, or None when it says nothing usable.

    A topic without a ``cleanup.policy`` override uses the broker default: a dynamic one from
    the metadata (this node's, else the cluster-wide one), else ``static_default`` (from
    server.properties; None when not known). That inference needs a complete read. An
    incomplete read is used only when it adds protection (compact, tiered).
    """
    overrides = meta.topic_configs.get(topic, {})
    exists = meta.complete and topic in meta.topics
    policy: str | None = overrides.get("cleanup.policy")
    if policy is None and exists:
        own = meta.broker_configs.get(str(node_id), {}) if node_id is not None else {}
        policy = own.get("log.cleanup.policy") or meta.broker_configs.get("", {}).get(
            "log.cleanup.policy", static_default
        )
    remote_raw = overrides.get("remote.storage.enable")
    remote: bool | None = remote_raw.strip().lower() == "true" if remote_raw is not None else None
    if remote is None and exists:
        remote = False
    normalized = normalize_policy(policy)
    if not meta.complete and not (remote or (normalized and "compact" in normalized.split(","))):
        return None
    if normalized is None and remote is None:
        return None
    return TopicPolicy(normalized, remote, learned_at_ms, SOURCE_KRAFT)
