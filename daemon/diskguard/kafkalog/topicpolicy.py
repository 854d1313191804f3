"""Which topics may lose segments, and why not. Pure: plain data in, a reason (or None) out.

Deleting a segment of a compacted topic loses the only copy of keys that are never written
again, deleting a tiered partition's segments through DeleteRecords deletes the remote copy
too, and Kafka's internal topics are the cluster's own state. So a partition may go only when
everything below says it may; whenever a fact is unknown the partition is kept and the
reason says what is missing. The facts are gathered at the edges (``scan``: cleaner
checkpoints and ``remote_log_snapshot`` entries; ``policystore``: the broker's
DescribeConfigs answers, their durable cache and the KRaft metadata log) and handed here as
plain values, so every rule is testable without a disk or a broker.

Order of the rules (the first that applies is the reason):

1. internal topics (``__*``, ``_schemas``, ``_confluent-*``): always;
2. ``retention.protect_topics`` regexes: only ever add protection;
3. tiered storage (remote log state in the partition dir, or ``remote.storage.enable=true``),
   unless the topic matches ``ladder.delete_tiered_topics`` (the operator accepts that
   DeleteRecords deletes its remote copy too; the rules below still apply);
4. compaction: listed in any log dir's ``cleaner-offset-checkpoint`` (proof the cleaner ran);
   ``cleanup.policy`` without ``delete``; ``compact,delete`` unless the topic matches
   ``retention.assume_delete_policy``;
5. ``cleanup.policy`` unknown: protected unless it matches ``retention.assume_delete_policy``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

__all__ = [
    "ALWAYS_COMPACTED",
    "INTERNAL_TOPIC_PATTERNS",
    "KraftTopics",
    "ProtectionRule",
    "TopicPolicy",
    "is_internal",
    "normalize_policy",
    "policies_from_json",
    "policies_to_json",
    "protection_reason",
    "stray_reason",
]

#: Topics Kafka and its ecosystem always create compacted, whatever log.cleanup.policy says;
#: from the log dirs alone their policy is otherwise unknowable. ``__cluster_metadata`` is
#: KRaft's snapshot-trimmed metadata log: sized like a compacted topic.
ALWAYS_COMPACTED = frozenset(
    {
        "__consumer_offsets",
        "__transaction_state",
        "__share_group_state",
        "__cluster_metadata",
        "_schemas",
    }
)

#: Topics the cluster and its ecosystem keep for themselves (Kafka's ``__`` topics, Schema
#: Registry, Confluent's own): never deleted, whatever ``protect_topics`` says.
INTERNAL_TOPIC_PATTERNS: tuple[str, ...] = (r"^__", r"^_schemas$", r"^_confluent-")
_INTERNAL = tuple(re.compile(p) for p in INTERNAL_TOPIC_PATTERNS)

#: Where a policy was learned, as shown in reasons and stored in the cache.
SOURCE_BROKER = "describe-configs"
SOURCE_KRAFT = "kraft-metadata"

CACHE_VERSION = 1


def is_internal(topic: str) -> bool:
    return any(p.search(topic) for p in _INTERNAL)


def normalize_policy(value: str | None) -> str | None:
    """``"Delete, compact"`` / ``"[compact,delete]"`` -> ``"compact,delete"``; None stays None.

    Kafka's value is a comma-separated list; sorting makes equal policies compare equal.
    """
    if value is None:
        return None
    tokens = {t.strip().lower() for t in value.strip().strip("[]").split(",")}
    return ",".join(sorted(t for t in tokens if t))


@dataclass(frozen=True)
class TopicPolicy:
    """What is known of one topic's retention-relevant configs.

    ``cleanup_policy`` None = unknown (normalized otherwise); ``remote_storage_enable`` None =
    unknown. ``learned_at_ms`` is wall-clock ms; ``source`` says who told us.
    """

    cleanup_policy: str | None
    remote_storage_enable: bool | None
    learned_at_ms: int
    source: str


def _deletable_policy(policy: str) -> bool:
    return policy == "delete"


def protection_reason(
    topic: str,
    *,
    policy: TopicPolicy | None,
    in_cleaner_checkpoint: bool,
    remote_log_state: bool,
    protect_topics: Iterable[re.Pattern[str]] = (),
    assume_delete_policy: Iterable[re.Pattern[str]] = (),
    delete_tiered: Iterable[re.Pattern[str]] = (),
) -> str | None:
    """Why the partition of ``topic`` must not lose segments, or None when it may.

    ``remote_log_state``: the partition dir holds tiered-storage state. The rule order is the
    module docstring's; each reason is one phrase an operator can act on.
    """
    if is_internal(topic):
        if topic in ALWAYS_COMPACTED:
            return "internal topic, compacted by Kafka (always protected)"
        return "internal topic (always protected)"
    for pattern in protect_topics:
        if pattern.search(topic):
            return f"matches retention.protect_topics {pattern.pattern!r}"
    tiered_deletable = any(p.search(topic) for p in delete_tiered)
    if remote_log_state and not tiered_deletable:
        return (
            "tiered storage: remote log state in the partition dir; what is uploaded is "
            "unknown and DeleteRecords would delete the remote copy too"
        )
    if policy is not None and policy.remote_storage_enable and not tiered_deletable:
        return (
            f"tiered storage: remote.storage.enable=true ({policy.source}); DeleteRecords "
            "would delete the remote copy too"
        )
    assumed = next((p.pattern for p in assume_delete_policy if p.search(topic)), None)
    known = policy.cleanup_policy if policy is not None else None
    if in_cleaner_checkpoint and not (known == "compact,delete" and assumed):
        return "compacted: listed in a cleaner-offset-checkpoint"
    if known is None:
        if assumed is not None:
            return None
        if policy is not None:
            return (
                f"cleanup.policy unknown: no override ({policy.source}) and the broker default "
                "is unknown (set broker.server_properties, or list the topic in "
                "retention.assume_delete_policy)"
            )
        return (
            "cleanup.policy unknown (no broker answer, cache or KRaft metadata); "
            "list the topic in retention.assume_delete_policy if it is a delete topic"
        )
    assert policy is not None
    if _deletable_policy(known) or (known == "compact,delete" and assumed is not None):
        if policy.remote_storage_enable is None and assumed is None:
            return f"remote.storage.enable unknown ({policy.source}): may be a tiered topic"
        return None
    if known == "compact,delete":
        return (
            f"cleanup.policy=compact,delete ({policy.source}); list the topic in "
            "retention.assume_delete_policy to let its oldest segments go"
        )
    return f"cleanup.policy={known or '(empty)'} ({policy.source}): not a delete topic"


#: The end of every reason a KRaft broker's stray-to-be partition dir is kept for.
_STRAY_AT_START = (
    "a KRaft broker sets this dir aside as a stray at start-up and serves nothing from it; "
    "Kafka keeps strays for an operator to decide, and so does diskguard"
)


@dataclass(frozen=True)
class KraftTopics:
    """What a complete read of a KRaft metadata log says exists, for telling live partition
    dirs from ones the broker will set aside as strays at start-up."""

    #: topic -> topic id (as ``partition.metadata`` writes it).
    ids: Mapping[str, str]
    #: Topics a RemoveTopicRecord in the records read removed (not created again).
    removed: frozenset[str] = frozenset()


def stray_reason(
    topic: str,
    has_partition_metadata: bool,
    dir_topic_id: str | None,
    kraft: KraftTopics | None,
) -> str | None:
    """Why a live-named partition dir of a KRaft broker is one the broker will not serve, or
    None. Kafka 3.7.1+ (``LogManager.isStrayKraftReplica``, measured on 4.4) renames such a
    dir ``-stray`` at start-up and keeps it: no ``partition.metadata``, or a topic id the
    metadata does not have (the topic was deleted, or deleted and created again).

    ``kraft`` None: the metadata was not read completely, so only the missing file counts.
    ``dir_topic_id`` None with the file present: unreadable, so nothing is concluded.
    """
    if topic == "__cluster_metadata":
        return None  # the metadata log itself: KRaft's, not a partition the metadata lists
    if not has_partition_metadata:
        return f"no partition.metadata: {_STRAY_AT_START}"
    if kraft is None:
        return None
    known = kraft.ids.get(topic)
    if known is None:
        how = (
            "deleted (RemoveTopicRecord)"
            if topic in kraft.removed
            else "deleted before the last metadata snapshot, or never created"
        )
        return f"topic not in the KRaft metadata: {how}; {_STRAY_AT_START}"
    if dir_topic_id is not None and dir_topic_id != known:
        return (
            f"topic id {dir_topic_id} is not the metadata's {known} (the topic was deleted and "
            f"created again): {_STRAY_AT_START}"
        )
    return None


@dataclass(frozen=True)
class ProtectionRule:
    """Everything the scan needs to decide each partition's protection, as plain data.

    ``policies`` holds the topics whose configs are known (unknown topics are simply
    absent); ``compacted`` the topics any log dir's ``cleaner-offset-checkpoint`` lists.
    ``kraft``: the log dirs are a stopped KRaft broker's (its metadata log was read offline),
    so live partition dirs the broker will set aside as strays are kept (``stray_reason``);
    ``kraft_topics`` is that metadata when it was read completely.
    """

    protect_topics: tuple[str, ...] = ()
    assume_delete_policy: tuple[str, ...] = ()
    policies: Mapping[str, TopicPolicy] = field(default_factory=dict)
    compacted: frozenset[str] = frozenset()
    kraft: bool = False
    kraft_topics: KraftTopics | None = None
    #: Tiered topics the operator lets deletion take (``ladder.delete_tiered_topics``).
    delete_tiered: tuple[str, ...] = ()

    @cached_property
    def _protect(self) -> tuple[re.Pattern[str], ...]:
        return tuple(re.compile(p) for p in self.protect_topics)

    @cached_property
    def _assume(self) -> tuple[re.Pattern[str], ...]:
        return tuple(re.compile(p) for p in self.assume_delete_policy)

    def with_compacted(self, topics: Iterable[str]) -> ProtectionRule:
        extra = frozenset(topics) - self.compacted
        return replace(self, compacted=self.compacted | extra) if extra else self

    @cached_property
    def _delete_tiered(self) -> tuple[re.Pattern[str], ...]:
        return tuple(re.compile(p) for p in self.delete_tiered)

    @cached_property
    def _reasons(self) -> dict[tuple[str, bool], str | None]:
        return {}

    def reason(self, topic: str, remote_log_state: bool = False) -> str | None:
        """Memoized per rule (a rule is immutable; a changed policy makes a new rule): a
        scan asks once per partition, and a topic has many partitions."""
        key = (topic, remote_log_state)
        try:
            return self._reasons[key]
        except KeyError:
            pass
        reason = self._reasons[key] = protection_reason(
            topic,
            policy=self.policies.get(topic),
            in_cleaner_checkpoint=topic in self.compacted,
            remote_log_state=remote_log_state,
            protect_topics=self._protect,
            assume_delete_policy=self._assume,
            delete_tiered=self._delete_tiered,
        )
        return reason


def policies_to_json(policies: Mapping[str, TopicPolicy]) -> dict[str, Any]:
    """The cache file's shape: ``{"version": 1, "topics": {topic: {...}}}``."""
    return {
        "version": CACHE_VERSION,
        "topics": {
            topic: {
                "cleanup_policy": p.cleanup_policy,
                "remote_storage_enable": p.remote_storage_enable,
                "learned_at_ms": p.learned_at_ms,
                "source": p.source,
            }
            for topic, p in sorted(policies.items())
        },
    }


def policies_from_json(data: Any) -> dict[str, TopicPolicy]:
    """Inverse of ``policies_to_json``; raises ValueError on anything else (the caller
    then starts from an empty cache: every topic unknown, hence protected)."""
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        raise ValueError("not a version 1 topic policy cache")
    topics = data.get("topics")
    if not isinstance(topics, dict):
        raise ValueError("'topics' is not an object")
    out: dict[str, TopicPolicy] = {}
    for topic, entry in topics.items():
        if not isinstance(entry, dict):
            raise ValueError(f"topic {topic!r}: not an object")
        policy = entry.get("cleanup_policy")
        remote = entry.get("remote_storage_enable")
        learned = entry.get("learned_at_ms")
        source = entry.get("source")
        if (
            not (policy is None or isinstance(policy, str))
            or not (remote is None or isinstance(remote, bool))
            or not isinstance(learned, int)
            or not isinstance(source, str)
        ):
            raise ValueError(f"topic {topic!r}: malformed entry")
        out[topic] = TopicPolicy(normalize_policy(policy), remote, learned, source)
    return out
