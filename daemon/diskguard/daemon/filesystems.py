"""The filesystems one daemon guards: its log dirs grouped by device, measured as df does.

One entry per device (``st_dev``), whatever mount point leads to it: a bind mount of the
same disk is the same filesystem. Its label is the first mount point seen for the device, as
``scan`` labels it (metrics, ``state.json``, snapshots).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from diskguard.host import fsusage
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.logs import get_logger

log = get_logger("diskguard.daemon")


class Filesystems:
    """label -> the log dirs on it and its device; ``usage`` measures each (one statvfs)."""

    def __init__(self, log_dirs: Iterable[Path]) -> None:
        self.mounts: dict[str, list[str]] = {}
        self.devices: dict[str, str] = {}
        for group in fsusage.group_by_device([str(d) for d in log_dirs]):
            self.mounts.setdefault(group.mount, []).extend(group.paths)
            self.devices[group.mount] = group.device

    def __len__(self) -> int:
        return len(self.mounts)

    def usage(self) -> dict[str, FilesystemUsage]:
        """Each filesystem as df sees it now; one that cannot be measured is left out (and
        said)."""
        out = {}
        for mount, dirs in self.mounts.items():
            try:
                out[mount] = fsusage.usage_of(dirs[0], mount, self.devices[mount])
            except OSError as exc:
                log.error("usage_read_failed", mount=mount, error=exc.strerror or str(exc))
        return out
