"""Log start offsets diskguard asked the broker for, persisted until the broker acted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from diskguard.host.atomicfile import read_json, write_json_atomic
from diskguard.kafkalog.scan import ScanResult
from diskguard.retention.planner import Deletion


class RequestedLogStart:
    """Log start offsets diskguard asked the broker for, until the broker has acted on them.

    The broker checkpoints its log start offsets only every minute and removes files only at
    its next retention check; without remembering our own requests the next cycle, a second
    later, would see the same bytes still in excess and delete more. Persisted so that
    ``enforce --once`` run from cron behaves the same as the daemon.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        raw: dict[str, dict[str, int]] = read_json(path, {})
        self._by_dir: dict[str, dict[tuple[str, int], int]] = {}
        for log_dir, parts in raw.items():
            for key, offset in parts.items():
                topic, _, partition = key.rpartition("-")
                self._by_dir.setdefault(log_dir, {})[(topic, int(partition))] = int(offset)

    def as_mapping(self) -> Mapping[str, Mapping[tuple[str, int], int]]:
        return self._by_dir

    def record(self, deletions: Sequence[Deletion]) -> None:
        for d in deletions:
            parts = self._by_dir.setdefault(d.log_dir, {})
            key = (d.topic, d.partition)
            parts[key] = max(parts.get(key, 0), d.next_offset)
        self._save()

    def forget(self, topic: str) -> None:
        """Stop counting what was asked of ``topic`` as on its way out (the broker did not
        act on it in time: counting it longer would hide a disk that keeps filling)."""
        live = {
            log_dir: {key: off for key, off in parts.items() if key[0] != topic}
            for log_dir, parts in self._by_dir.items()
        }
        live = {log_dir: parts for log_dir, parts in live.items() if parts}
        if live != self._by_dir:
            self._by_dir = live
            self._save()

    def waiting(self, topic: str) -> bool:
        """Is something asked of ``topic`` not carried out yet?"""
        return any(key[0] == topic for parts in self._by_dir.values() for key in parts)

    def prune(self, result: ScanResult) -> None:
        """Forget requests the broker has carried out (its first segment is past them)."""
        live: dict[str, dict[tuple[str, int], int]] = {}
        for fs in result.filesystems:
            for log_dir in fs.log_dirs:
                wanted = self._by_dir.get(log_dir.path, {})
                for part in log_dir.partitions:
                    offset = wanted.get((part.topic, part.partition))
                    if offset is not None and part.base_offsets and part.base_offsets[0] < offset:
                        live.setdefault(log_dir.path, {})[(part.topic, part.partition)] = offset
        if live != self._by_dir:
            self._by_dir = live
            self._save()

    def _save(self) -> None:
        data = {
            log_dir: {f"{t}-{p}": off for (t, p), off in sorted(parts.items())}
            for log_dir, parts in sorted(self._by_dir.items())
        }
        write_json_atomic(self.path, data)
