"""The global order of deletion candidates, and the why of each deletion. Pure.

``HeadKey`` orders a partition's oldest remaining candidate on the planner's heap: age first
(largest timestamp), then segments every consumer group has read before those some group
still needs, then partitions this broker leads (``led_elsewhere`` False first: DeleteRecords
trims every replica, and among equal candidates the leader's disk is the one that is full),
then (topic, partition, base offset, log dir) for determinism. Keys are unique (one head per
partition dir), so the heap compares keys only; a NamedTuple is a tuple, compared in C (a
Python ``__lt__`` was ~120k calls per 10k pops).

``Why`` is what the planner knew when it chose a segment: the limit in force, what triggered
the cycle, the excess, the segment's rank in the order and the key field that placed it
before the next candidate. It travels with the deletion into ``plan``, the audit log and the
events, so one line answers "why did this segment go, and why before that one".
"""

from __future__ import annotations

from typing import Any, NamedTuple

#: ``trigger``: today's usage measured over the ceiling.
MEASURED = "usage"
#: ``trigger``: the broker-mode forecast over the ceiling (today's usage is under it).
PREDICTED = "predicted"
#: ``trigger`` and ``rule``: the log dir's Kafka bytes over ``retention.max_bytes``.
MAX_BYTES = "max_bytes"
#: ``rule``: the filesystem over ``retention.disk_usage_percent``.
DISK_USAGE = "disk_usage_percent"


class HeadKey(NamedTuple):
    """The heap key of a partition's oldest remaining candidate (see the module)."""

    max_timestamp_ms: int
    unconsumed: bool
    led_elsewhere: bool
    topic: str
    partition: int
    base_offset: int
    log_dir: str

    @property
    def name(self) -> str:
        """``topic-partition@base_offset``, as ``audit --explain`` takes it."""
        return f"{self.topic}-{self.partition}@{self.base_offset}"


#: How the hot paths make a key or a Why: ``new_named(HeadKey, (...))`` is ``tuple.__new__``
#: in C, half the cost of the NamedTuple's own ``__new__`` (Python), once per head of a plan.
new_named = tuple.__new__

#: What placed a segment before the next candidate, by the first key field they differ in.
TIE_BREAKERS = ("older", "consumed", "led_here", "name", "name", "name", "name")


def tie_breaker(key: HeadKey, following: HeadKey) -> str:
    """Why ``key`` comes before ``following`` in the order: ``older`` (a smaller largest
    timestamp), ``consumed`` (as old, but every consumer group has read it and some group
    still needs the other), ``led_here`` (as old and as consumed, but this broker leads its
    partition), ``name`` (all else equal: topic, partition, base offset, log dir)."""
    if key[0] != following[0]:
        return "older"  # nearly always: checked first, without a loop
    for i in (1, 2):
        if key[i] != following[i]:
            return TIE_BREAKERS[i]
    return "name"


#: What placed a segment before the next candidate (``order.tie_breaker``), in a few words.
TIE_BREAKER_TEXT = {
    "older": "older",
    "consumed": "as old, read by every group",
    "led_here": "as old, led by this broker",
    "name": "as old, by name",
}


def order_text(rank: int, before: str | None, tie_breaker: str | None) -> str:
    """A deletion's place in the global order: ``#3, before orders-1@200 (older)``."""
    if before is None:
        return f"#{rank}, the last candidate"
    return f"#{rank}, before {before} ({TIE_BREAKER_TEXT.get(tie_breaker or '', tie_breaker)})"


class Why(NamedTuple):
    """Why one segment was chosen, and why before the next candidate.

    ``rule``: ``disk_usage_percent`` or ``max_bytes``. ``trigger``: what put the filesystem
    (or log dir) over: ``usage`` (measured), ``predicted`` (the broker-mode forecast) or
    ``max_bytes``. ``limit_percent``/``target_percent``: the ceiling and target in force;
    ``max_bytes``: the log dir's budget (``max_bytes`` rule only). ``usage_percent``: the
    filesystem's measured usage at the plan, ``predicted_usage_percent`` the forecast's (when
    it triggered). ``excess_bytes``: what the rule had to free, net of pending reclaim.
    ``rank``: the segment's place in the filesystem's global order (1 = oldest candidate).
    ``tie_breaker``: the key field that placed it before ``before``, the next candidate in the
    order (None for both when no candidate was left after it). ``rung``: the ladder's rung
    (``ladder``) that frees it.

    A NamedTuple, not a dataclass: a plan of 10,000 deletions makes 10,000 of them, and a
    frozen dataclass's ``__init__`` (and ``asdict`` for the JSON) cost it a tenth of its time.
    """

    rule: str
    trigger: str
    limit_percent: float
    target_percent: float
    usage_percent: float
    excess_bytes: int
    rank: int
    max_bytes: int | None = None
    predicted_usage_percent: float | None = None
    tie_breaker: str | None = None
    before: str | None = None
    #: The ladder's rung that frees it: ``delete`` (the segment's records go), or ``tiered``
    #: (an uploaded segment dropped locally, still read from remote storage).
    rung: str = "delete"

    def fields(self) -> dict[str, Any]:
        """The JSON shape (``plan --json``, the audit line, the events): the fields by name,
        spelled out (``_asdict`` is several times slower, once per deletion)."""
        return {
            "rule": self.rule,
            "trigger": self.trigger,
            "limit_percent": self.limit_percent,
            "target_percent": self.target_percent,
            "usage_percent": self.usage_percent,
            "excess_bytes": self.excess_bytes,
            "rank": self.rank,
            "max_bytes": self.max_bytes,
            "predicted_usage_percent": self.predicted_usage_percent,
            "tie_breaker": self.tie_breaker,
            "before": self.before,
            "rung": self.rung,
        }
