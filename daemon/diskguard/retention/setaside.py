"""Partitions set aside after a deletion of theirs failed in a way that will recur (pure).

The planner chooses the globally oldest segments. When deleting one of them fails for a
reason that the next try cannot change (the broker denies DeleteRecords on the topic:
``TOPIC_AUTHORIZATION_FAILED``; a file that refuses removal: ``EPERM``), every later plan
would choose the same segments first again, count their bytes as freed, and stop short:
the filesystem stays over its limit while younger segments of other topics could go, and
each cycle writes the same intent and failure to the audit log. So the cycle sets such a
partition aside for ``HOLD_S``: the plans meanwhile treat it as protected, with the error as
the reason (``plan``, ``retention_stuck`` and the audit say why), and it is tried again after
that, or at once after a config reload (a new cycle, a new memory), when an operator who
fixed the ACL sends SIGHUP. Failures that may pass by themselves (a leader moving, a timeout,
a broker down) are not set aside: the next cycle simply tries again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from diskguard.kafkalog.model import Filesystem
from diskguard.retention.planner import DeletionResult

#: How long a partition stays aside before it is tried again (as often as ``retention_stuck``
#: repeats itself): long enough that the audit log is not written every cycle, short enough
#: that a fixed ACL is noticed without a reload.
HOLD_S = 300.0


@dataclass(frozen=True)
class SetAsidePartition:
    """One partition kept out of the plans until ``until`` (the caller's monotonic clock)."""

    topic: str
    partition: int
    error: str
    until: float

    def reason(self, remaining_s: float) -> str:
        """The protection reason the plans show for it. It names no partition: the plans
        give one reason per topic (``planner.protected_topics`` joins the distinct ones), so
        the partitions of a topic set aside together must read the same; the error names
        the partition (a topic's refusal) or the file (offline)."""
        return (
            f"set aside: a deletion failed in a way the next try cannot change ({self.error}); "
            f"tried again in {max(0, round(remaining_s))} s or at a config reload"
        )


class SetAside:
    """The partitions set aside now, keyed by ``(topic, partition)``."""

    def __init__(self, hold_s: float = HOLD_S) -> None:
        self.hold_s = hold_s
        self._entries: dict[tuple[str, int], SetAsidePartition] = {}

    def record(
        self,
        results: Iterable[DeletionResult],
        now: float,
        partitions_of: Callable[[str], Iterable[int]] = lambda _topic: (),
    ) -> list[SetAsidePartition]:
        """Set aside the partitions of failed results marked ``lasting``, and for a refusal
        that is the topic's (``whole_topic``) every partition ``partitions_of`` gives for the
        topic (asked once per such topic): else a topic of many partitions would be found
        refused one partition per cycle while other topics' segments wait. Returns the
        entries newly set aside (each partition once, with its first such error)."""
        added: list[SetAsidePartition] = []

        def add(topic: str, partition: int, error: str) -> None:
            key = (topic, partition)
            if key in self._entries and self._entries[key].until > now:
                return
            entry = SetAsidePartition(topic, partition, error, now + self.hold_s)
            self._entries[key] = entry
            added.append(entry)

        whole: dict[str, str] = {}  # topic -> the one text for all its partitions
        for r in results:
            if r.ok or r.refused or not r.lasting:
                continue
            d = r.deletion
            if not r.whole_topic:
                add(d.topic, d.partition, r.error or "failed")
                continue
            if d.topic in whole:  # its partitions are set aside already, with one text
                add(d.topic, d.partition, whole[d.topic])
                continue
            # The refused partition first, named in the text all of them share.
            why = whole[d.topic] = (
                f"{r.error or 'failed'} (the answer for partition {d.partition}; it holds for "
                "every partition of the topic)"
            )
            for partition in [d.partition, *sorted(set(partitions_of(d.topic)))]:
                add(d.topic, partition, why)
        return added

    def active(self, now: float) -> dict[tuple[str, int], SetAsidePartition]:
        """The entries still in force at ``now`` (expired ones are forgotten)."""
        for key in [k for k, e in self._entries.items() if e.until <= now]:
            del self._entries[key]
        return dict(self._entries)

    def export(self, now: float, wall_now: float) -> list[dict[str, Any]]:
        """The entries in force as plain data for ``state.json``, ``until`` as wall-clock
        seconds: ``plan`` and ``status`` then show what the running daemon set aside."""
        return [
            {
                "topic": e.topic,
                "partition": e.partition,
                "error": e.error,
                "until": round(wall_now + (e.until - now), 3),
            }
            for e in self.active(now).values()
        ]

    def load(self, entries: object, now: float, wall_now: float) -> None:
        """Take over ``export``'s entries (read back from ``state.json``); anything malformed
        or expired is ignored (the partition is then planned as usual)."""
        if not isinstance(entries, list):
            return
        for item in entries:
            if not isinstance(item, dict):
                continue
            topic, partition = item.get("topic"), item.get("partition")
            error, until = item.get("error"), item.get("until")
            if not (
                isinstance(topic, str)
                and isinstance(partition, int)
                and isinstance(error, str)
                and isinstance(until, int | float)
            ):
                continue
            remaining = min(float(until) - wall_now, self.hold_s)
            if remaining > 0:
                key = (topic, partition)
                self._entries[key] = SetAsidePartition(topic, partition, error, now + remaining)

    def apply(self, filesystems: tuple[Filesystem, ...], now: float) -> tuple[Filesystem, ...]:
        """``filesystems`` with the partitions set aside marked protected (their reason the
        error); the very same tuple when nothing is set aside (the common case)."""
        entries = self.active(now)
        if not entries:
            return filesystems
        return tuple(_protect(fs, entries, now) for fs in filesystems)


def _protect(
    fs: Filesystem, entries: dict[tuple[str, int], SetAsidePartition], now: float
) -> Filesystem:
    log_dirs = []
    for log_dir in fs.log_dirs:
        parts = []
        changed = False
        for part in log_dir.partitions:
            entry = entries.get((part.topic, part.partition))
            if entry is not None and not part.protected:
                why = entry.reason(entry.until - now)
                part = replace(part, protected=True, protected_reason=why)
                changed = True
            parts.append(part)
        log_dirs.append(replace(log_dir, partitions=tuple(parts)) if changed else log_dir)
    return replace(fs, log_dirs=tuple(log_dirs))
