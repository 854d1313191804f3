"""Reserved disk size per topic, IBM Event Streams' method (pure).

Event Streams refuses a topic or partition change once the space its topics could grow to
passes 90% of the storage; running that arithmetic against a self-managed broker's disks
shows *before* anything fills which topics can, by their own settings, outgrow the disk —
and which can grow without bound (``retention.bytes = -1``, Kafka's default), for which
only time retention or diskguard's KIP-61 limit stands between the broker and a full disk.

Per partition of a ``delete`` (or ``compact,delete``) topic::

    retention.bytes + segment.bytes + 2 × segment.index.bytes × (floor(retention.bytes /
    segment.bytes) + 1)

— retention is enforced a whole segment at a time, so one extra segment beyond
``retention.bytes`` exists, and each segment carries an offset and a time index. The index
term is a ceiling: only the active segment's indexes are preallocated to
``segment.index.bytes``; Kafka trims closed segments' indexes to their entries.

A ``compact`` topic reserves a flat 1 GB per partition (its size depends on the key space,
not on a setting). IBM writes "GB" while treating 512 MB as half of 1 GB, so it is read here
as 1 GiB (2**30 bytes), the larger, safer reading.

IBM's worked examples ("about 1.5 GB" for 1 GB retention / 512 MB segments, "about 50.5 GB"
for 50 GB / 512 MB, "about 1.1 GB" for 1 GB / 128 MB) are retention + one segment only; the
formula, with the default 10 MiB indexes, gives 1.56, 52.47 and 1.30 GiB. The formula is
what this module computes; the data part is kept separate (``data_bytes``) so both are shown.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "COMPACT_RESERVED_BYTES",
    "RESERVED_LIMIT_PERCENT",
    "PartitionReserve",
    "ReserveReport",
    "TopicReserve",
    "TopicSettings",
    "partition_reserve",
    "policy_kind",
    "reserve_report",
]

#: Flat reservation per partition of a ``cleanup.policy=compact`` topic (IBM: "1 GB").
COMPACT_RESERVED_BYTES = 1024**3
#: IBM rejects growth beyond this share of the storage; diskguard warns above it.
RESERVED_LIMIT_PERCENT = 90.0

Policy = Literal["delete", "compact"]


def policy_kind(cleanup_policy: str) -> Policy:
    """``"compact"`` alone -> compact; ``"delete"``, ``"compact,delete"``, ``""`` -> delete.

    A topic that also deletes is bounded by its retention settings, so IBM sizes it like a
    delete topic. Raises ValueError for anything Kafka would not accept.
    """
    parts = {p.strip().lower() for p in cleanup_policy.split(",") if p.strip()}
    unknown = parts - {"delete", "compact"}
    if unknown:
        raise ValueError(
            f"unknown cleanup.policy {cleanup_policy!r} (expected delete, compact or both)"
        )
    return "compact" if parts == {"compact"} else "delete"


@dataclass(frozen=True)
class TopicSettings:
    """What the reservation depends on, for one topic, wherever it was read from."""

    topic: str
    partitions: int
    cleanup_policy: str
    #: Negative = unlimited (Kafka's default ``-1``).
    retention_bytes: int
    segment_bytes: int
    segment_index_bytes: int
    #: Where the settings came from: "broker", "broker+defaults" or "defaults".
    source: str = "defaults"


@dataclass(frozen=True)
class PartitionReserve:
    """One partition's reservation, split so a report can show where it comes from."""

    #: retention.bytes + one segment (compact: the flat 1 GiB).
    data_bytes: int
    #: 2 × segment.index.bytes × segments (compact: 0).
    index_bytes: int
    #: floor(retention / segment) + 1 (compact: 0).
    segments: int

    @property
    def total_bytes(self) -> int:
        return self.data_bytes + self.index_bytes


def partition_reserve(
    cleanup_policy: str, retention_bytes: int, segment_bytes: int, segment_index_bytes: int
) -> PartitionReserve | None:
    """The reservation of one partition; None when a delete topic's retention is unlimited."""
    if policy_kind(cleanup_policy) == "compact":
        return PartitionReserve(data_bytes=COMPACT_RESERVED_BYTES, index_bytes=0, segments=0)
    if retention_bytes < 0:
        return None
    if segment_bytes <= 0:
        raise ValueError(f"segment.bytes must be positive, got {segment_bytes}")
    if segment_index_bytes < 0:
        raise ValueError(f"segment.index.bytes must not be negative, got {segment_index_bytes}")
    segments = retention_bytes // segment_bytes + 1
    return PartitionReserve(
        data_bytes=retention_bytes + segment_bytes,
        index_bytes=2 * segment_index_bytes * segments,
        segments=segments,
    )


@dataclass(frozen=True)
class TopicReserve:
    settings: TopicSettings
    policy: Policy
    #: None = unbounded (delete policy, retention.bytes < 0).
    per_partition: PartitionReserve | None

    @property
    def unbounded(self) -> bool:
        return self.per_partition is None

    @property
    def reserved_bytes(self) -> int | None:
        if self.per_partition is None:
            return None
        return self.per_partition.total_bytes * self.settings.partitions


@dataclass(frozen=True)
class ReserveReport:
    """All topics' reservations against the capacity of the disks under the log dirs."""

    topics: tuple[TopicReserve, ...]
    #: Sum over bounded topics; unbounded topics are listed, never summed.
    total_bytes: int
    capacity_bytes: int
    limit_percent: float = RESERVED_LIMIT_PERCENT

    @property
    def percent(self) -> float | None:
        """Reserved share of capacity; None when the capacity is unknown (zero)."""
        return 100.0 * self.total_bytes / self.capacity_bytes if self.capacity_bytes else None

    @property
    def over_limit(self) -> bool:
        percent = self.percent
        return percent is not None and percent > self.limit_percent

    @property
    def unbounded(self) -> tuple[TopicReserve, ...]:
        return tuple(t for t in self.topics if t.unbounded)

    @property
    def bounded(self) -> tuple[TopicReserve, ...]:
        return tuple(t for t in self.topics if not t.unbounded)


def reserve_report(
    topics: Iterable[TopicSettings],
    capacity_bytes: int,
    limit_percent: float = RESERVED_LIMIT_PERCENT,
) -> ReserveReport:
    """Reservations for every topic, largest first, unbounded ones last (by name).

    Raises ValueError (naming the topic) for settings Kafka itself would reject.
    """
    rows: list[TopicReserve] = []
    for settings in topics:
        if settings.partitions < 0:
            raise ValueError(f"topic {settings.topic!r}: negative partition count")
        try:
            per_partition = partition_reserve(
                settings.cleanup_policy,
                settings.retention_bytes,
                settings.segment_bytes,
                settings.segment_index_bytes,
            )
            policy = policy_kind(settings.cleanup_policy)
        except ValueError as exc:
            raise ValueError(f"topic {settings.topic!r}: {exc}") from None
        rows.append(TopicReserve(settings, policy, per_partition))
    rows.sort(key=lambda r: (r.unbounded, -(r.reserved_bytes or 0), r.settings.topic))
    total = sum(r.reserved_bytes or 0 for r in rows)
    return ReserveReport(tuple(rows), total, capacity_bytes, limit_percent)
