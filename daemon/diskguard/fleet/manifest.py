"""What the daily summaries hold and what they were made from: the manifest, in plain data.

A summaries directory is versioned: each run that folds new snapshots writes the days it
changed as new directories, then publishes a manifest naming, for every day, the directory
that holds it, and the input folded so far. Only a published manifest makes a run's work
visible, so a run that dies half-way leaves the previous state whole.

Which snapshots are new is known twice over:

- by input watermark, to skip reading what was already read: a file is folded as of its
  size and modification time (a file that changed is read again, whole); a Kafka partition
  up to an offset (the next run starts there);
- by snapshot identity ``(host, mount, ts_ms)``, to never count one twice: the daily
  summaries keep every timestamp, and a snapshot already in them is a duplicate wherever it
  comes from (a file read again, a replay to Kafka, a re-run after a crash).

The counts the report shows (records read, bad records) are kept per file and per Kafka
source, so that a file read again replaces its earlier counts instead of adding to them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

FORMAT = 1
STATUSES = ("ok", "malformed", "unknown_schema", "out_of_range")


class ManifestError(ValueError):
    """A manifest that cannot be read: not JSON, another format, missing fields."""


@dataclass(frozen=True)
class Counts:
    """Records read, by classification (``ok`` = valid, before deduplication)."""

    ok: int = 0
    malformed: int = 0
    unknown_schema: int = 0
    out_of_range: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple(), strict=True)))

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.ok, self.malformed, self.unknown_schema, self.out_of_range)

    def as_dict(self) -> dict[str, int]:
        return dict(zip(STATUSES, self.as_tuple(), strict=True))

    def bad_text(self) -> str:
        return (
            f"{self.malformed} malformed, {self.unknown_schema} unknown schema,"
            f" {self.out_of_range} out of range"
        )

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Counts:
        return cls(*(int(values.get(name, 0)) for name in STATUSES))


@dataclass(frozen=True)
class FileMark:
    """A file as folded: its size and modification time then, and what it held."""

    size: int
    mtime_ms: int
    counts: Counts


@dataclass(frozen=True)
class KafkaMark:
    """A Kafka source (``kafka://bootstrap/topic``) as folded: per partition the next offset
    to read, and what all its records read so far held."""

    offsets: Mapping[int, int]
    counts: Counts


@dataclass(frozen=True)
class DayMark:
    """A summarised day: the version directory that holds it, its unique snapshots, and
    whether any of them listed topics (a day without has no topics directory)."""

    version: str
    snapshots: int
    topics: bool = True


@dataclass(frozen=True)
class Manifest:
    """One published state of a summaries directory (version 0: nothing yet)."""

    version: int = 0
    days: Mapping[str, DayMark] = field(default_factory=dict)
    files: Mapping[str, FileMark] = field(default_factory=dict)
    kafka: Mapping[str, KafkaMark] = field(default_factory=dict)

    @property
    def snapshots(self) -> int:
        """Unique snapshots in all summarised days."""
        return sum(mark.snapshots for mark in self.days.values())

    def totals(self) -> Counts:
        total = Counts()
        for counts in [m.counts for m in self.files.values()] + [
            m.counts for m in self.kafka.values()
        ]:
            total = total + counts
        return total

    def changed(self, files: Iterable[tuple[str, int, int]]) -> list[str]:
        """Of ``(path, size, mtime_ms)``, the paths not folded as they are now."""
        out = []
        for path, size, mtime_ms in files:
            mark = self.files.get(path)
            if mark is None or mark.size != size or mark.mtime_ms != mtime_ms:
                out.append(path)
        return out

    def successor(
        self,
        days: Mapping[str, DayMark],
        files: Mapping[str, FileMark] | None = None,
        kafka: Mapping[str, KafkaMark] | None = None,
    ) -> Manifest:
        """The next version: ``days`` rewritten, marks replaced for the inputs just read."""
        return replace(
            self,
            version=self.version + 1,
            days={**self.days, **days},
            files={**self.files, **(files or {})},
            kafka={**self.kafka, **(kafka or {})},
        )

    def to_json(self) -> str:
        return (
            json.dumps(
                {
                    "format": FORMAT,
                    "version": self.version,
                    "days": {
                        day: {"v": m.version, "snapshots": m.snapshots, "topics": m.topics}
                        for day, m in sorted(self.days.items())
                    },
                    "files": {
                        path: {
                            "size": m.size,
                            "mtime_ms": m.mtime_ms,
                            "counts": m.counts.as_dict(),
                        }
                        for path, m in sorted(self.files.items())
                    },
                    "kafka": {
                        source: {
                            "offsets": {str(p): o for p, o in sorted(m.offsets.items())},
                            "counts": m.counts.as_dict(),
                        }
                        for source, m in sorted(self.kafka.items())
                    },
                },
                indent=1,
            )
            + "\n"
        )

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                found = data.get("format") if isinstance(data, dict) else None
                raise ManifestError(f"format {found!r}, expected {FORMAT}")
            return cls(
                version=int(data["version"]),
                days={
                    str(d): DayMark(str(m["v"]), int(m["snapshots"]), bool(m["topics"]))
                    for d, m in data["days"].items()
                },
                files={
                    str(p): FileMark(int(m["size"]), int(m["mtime_ms"]), Counts.of(m["counts"]))
                    for p, m in data["files"].items()
                },
                kafka={
                    str(s): KafkaMark(
                        {int(p): int(o) for p, o in m["offsets"].items()}, Counts.of(m["counts"])
                    )
                    for s, m in data["kafka"].items()
                },
            )
        except ManifestError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ManifestError(f"unreadable: {exc}") from exc
