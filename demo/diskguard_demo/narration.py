"""What the demo prints: timestamped lines, and one human line per daemon event worth it.

Only the daemon's documented JSON events are read (README, "Daemon events"): the demo tells
what the product says, in the product's words, and never reaches into its internals.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from diskguard.units import format_bytes


class Console:
    """Lines stamped with the seconds since the demo started."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.t0 = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def say(self, text: str) -> None:
        self.out.write(f"{self.elapsed():6.1f}s  {text}\n")
        self.out.flush()

    def plain(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()


@dataclass
class Deletions:
    """Segments deleted (asked of the broker, or removed offline) in the order they went."""

    count: int = 0
    bytes: int = 0
    #: (topic, partition) -> segments, in the order of each partition's first deletion.
    by_partition: dict[tuple[str, int], int] = field(default_factory=dict)

    def add(self, event: dict[str, Any]) -> None:
        self.count += 1
        self.bytes += int(event.get("bytes") or 0)
        key = (str(event.get("topic")), int(event.get("partition") or 0))
        self.by_partition[key] = self.by_partition.get(key, 0) + 1

    def topics(self) -> set[str]:
        return {topic for topic, _p in self.by_partition}

    def summary(self, limit: int = 6) -> str:
        """``payments-0 x5, orders-2 x3, ...``: globally oldest first, as they went."""
        parts = [f"{t}-{p} x{n}" for (t, p), n in self.by_partition.items()]
        more = f", and {len(parts) - limit} more partitions" if len(parts) > limit else ""
        return ", ".join(parts[:limit]) + more


@dataclass
class Tally:
    """What the daemon (or ``enforce --once``) said, as far as the story needs it."""

    started: dict[str, Any] | None = None
    cycles: list[dict[str, Any]] = field(default_factory=list)
    #: Every segment deleted, and the cycles (with their deletions and the records consumer
    #: groups had not read) not told yet: told in one line (``batch_line``).
    deleted: Deletions = field(default_factory=Deletions)
    batch: list[dict[str, Any]] = field(default_factory=list)
    batch_deleted: Deletions = field(default_factory=Deletions)
    batch_unread: dict[str, int] = field(default_factory=dict)
    batch_since: float = 0.0
    swept_bytes: int = 0
    overfull: list[dict[str, Any]] = field(default_factory=list)
    cleared: list[dict[str, Any]] = field(default_factory=list)
    acl_applied: list[dict[str, Any]] = field(default_factory=list)
    acl_removed: list[dict[str, Any]] = field(default_factory=list)
    policies: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def overfull_now(self) -> bool:
        return len(self.overfull) > len(self.cleared)


def percent(value: Any) -> str:
    return f"{float(value):.1f}%" if value is not None else "?"


def limit_names(limit: Any) -> str:
    """``overfull_percent=75,min_free_bytes=...`` -> ``overfull_percent and min_free_bytes``."""
    return " and ".join(part.split("=")[0] for part in str(limit or "").split(",") if part)


def take(t: Tally, event: dict[str, Any], who: str = "daemon") -> str | None:
    """Record ``event`` in ``t``; the line to print for it at once, if any. Retention cycles
    are not told one by one (under a burst there is one per usage poll): they wait in
    ``t.batch`` for ``batch_line``."""
    name = event.get("event")
    if name == "daemon_started":
        t.started = event
        return (
            f"{who}: started in {event.get('mode')} mode ({event.get('partitions')} partitions;"
            f" the broker reclaims every {event.get('reclaim_check_interval_s')} s"
            f" + {event.get('reclaim_delete_delay_s')} s delete delay,"
            f" from {event.get('reclaim_settings_source')})"
        )
    if name == "topic_policy_learned":
        t.policies[str(event.get("topic"))] = str(event.get("cleanup_policy"))
        return None
    if name == "segment_deleted":
        t.deleted.add(event)
        t.batch_deleted.add(event)
        return None
    if name == "unconsumed_data_deleted":
        for group, records in dict(event.get("unconsumed_records") or {}).items():
            t.batch_unread[group] = t.batch_unread.get(group, 0) + int(records)
        return None
    if name == "offline_swept":
        t.swept_bytes += int(event.get("freed_bytes") or 0)
        return None
    if name == "retention_cycle":
        t.cycles.append(event)
        if not t.batch:
            t.batch_since = time.monotonic()
        t.batch.append(event)
        return None
    if name == "overfull":
        t.overfull.append(event)
        why = (
            f"predicted {percent(event.get('predicted_usage_percent'))} when the broker next"
            " frees space"
            if event.get("reason") == "predicted"
            else f"crossed {limit_names(event.get('limit'))}"
        )
        return (
            f"{who}: OVERFULL at {percent(event.get('usage_percent'))} ({why}):"
            f" {event.get('message')}"
        )
    if name == "overfull_cleared":
        t.cleared.append(event)
        return (
            f"{who}: overfull cleared at {percent(event.get('usage_percent'))}"
            f" (under {limit_names(event.get('limit'))}): {event.get('message')}"
        )
    if name == "disk_alert":
        return f"{who}: alert level {event.get('alert_level')}: {event.get('message', 'ok')}"
    if name == "flow_control_applied":
        return f"{who}: {event.get('message')}"
    if name == "acl_applied":
        t.acl_applied.append(event)
        allowed = event.get("allowed") or []
        extra = (
            f"; ALLOW ALL for {event.get('principal')} beside it, so readers and the guard's"
            " own DeleteRecords keep working"
            if allowed
            else ""
        )
        return (
            f"{who}: ACL DENY WRITE for {event.get('principal')} on"
            f" {', '.join(event.get('topics') or [])}{extra}"
        )
    if name == "acl_removed":
        t.acl_removed.append(event)
        return f"{who}: ACLs removed from {', '.join(event.get('topics') or [])}"
    if name == "broker_reclaim_slow":
        return (
            f"{who}: broker_reclaim_slow: at {format_bytes(event.get('growth_bytes_per_s') or 0)}/s"
            f" the broker's {event.get('reclaim_latency_s')} s reclaim latency needs"
            f" {format_bytes(event.get('headroom_needed_bytes') or 0)} above the ceiling, the disk"
            f" has {format_bytes(event.get('headroom_bytes') or 0)}: {event.get('message')}"
        )
    if name == "<text>":
        return f"{who}: {event.get('line')}"
    level = event.get("level")
    if level in ("warning", "error", "critical"):
        details = {
            k: v for k, v in event.items() if k not in ("event", "level", "timestamp", "component")
        }
        line = f"{who} {level}: {name} {json.dumps(details, default=str)[:240]}"
        t.problems.append(line)
        return line
    return None


def batch_line(t: Tally, who: str = "daemon") -> str | None:
    """The retention cycles not told yet, in one line: why they acted, what went, in what
    order (and empties the batch)."""
    cycles, chosen, unread = t.batch, t.batch_deleted, t.batch_unread
    if not cycles:
        return None
    t.batch, t.batch_deleted, t.batch_unread = [], Deletions(), {}
    ceiling = float(cycles[0].get("limit_percent") or 100.0)
    befores = [float(c.get("usage_before") or 0.0) for c in cycles]
    ahead = sum(1 for b in befores if b < ceiling)
    mode = cycles[0].get("mode")
    if len(cycles) == 1 and ahead:
        why = (
            f"at {befores[0]:.1f}%, under the {ceiling:g}% ceiling: the forecast says the disk"
            " would cross it before the broker's next retention check"
        )
    elif len(cycles) == 1:
        why = f"at {befores[0]:.1f}%, over the {ceiling:g}% ceiling"
    else:
        why = (
            f"{len(cycles)} retention cycles at {min(befores):.1f}-{max(befores):.1f}%"
            f" ({len(cycles) - ahead} over the {ceiling:g}% ceiling, {ahead} ahead of it)"
        )
    what = "DeleteRecords for" if mode == "broker" else f"{mode}: deleted"
    if not chosen.count:
        return f"{who}: {why}: nothing deleted"
    groups = "".join(
        f"; group {g} had not read {n} of their records" for g, n in sorted(unread.items())
    )
    return (
        f"{who}: {why}; {what} {chosen.count} segments ({format_bytes(chosen.bytes)}),"
        f" globally oldest first: {chosen.summary()}{groups}"
    )
