"""What the broker's log dirs need said, not done (edge): the KRaft metadata log's disk
filling, and a log dir the broker took offline.

The metadata log: a full ``metadata.log.dir`` halts a KRaft broker outright (and a combined
node's controller with it), whatever its other dirs hold; when the filesystem holding it
reaches the first alert level or its ceiling, ``metadata_log_at_risk`` says so, once per
episode. It is never a deletion candidate (internal topic) nor moved (``ladderrun``).

A failed log dir: since 3.8 a JBOD KRaft broker keeps serving its other dirs when one fails
(measured on 4.4: it reports the dir ``KAFKA_STORAGE_ERROR`` and deletes its ``.lock``).
``ladderrun`` keeps deletion out of it while the broker runs; ``log_dir_offline`` says, once,
what the operator can do.
"""

from __future__ import annotations

import os

from diskguard.broker.ladderapi import LogDirInfo
from diskguard.logs import get_logger

log = get_logger("diskguard.ladder")


class MetadataWatch:
    """Says once per episode that the filesystem holding the metadata log is filling."""

    def __init__(self) -> None:
        self._at_risk = False

    def observe(
        self, where: str | None, mount: str | None, level: int, over: bool, usage_percent: float
    ) -> None:
        risky = where is not None and (level >= 1 or over)
        if risky and not self._at_risk:
            log.warning(
                "metadata_log_at_risk",
                metadata_log_dir=where,
                mount=mount,
                alert_level=level,
                usage_percent=round(usage_percent, 3),
                message="the KRaft metadata log shares this filling filesystem: if it fills, "
                "the broker halts (and a combined node's controller with it), whatever its "
                "other log dirs hold. diskguard never deletes or moves it; consider "
                "metadata.log.dir on a disk of its own",
            )
        self._at_risk = risky


class OfflineDirs:
    """The log dirs the broker reports offline (real paths), each said once."""

    def __init__(self) -> None:
        self._offline: set[str] = set()

    def observe(self, dirs: list[LogDirInfo] | None) -> None:
        """Each broker-mode cycle: the dirs the broker reports offline, said once each."""
        if dirs is None:
            return
        now_offline = {os.path.realpath(d.path): d for d in dirs if not d.online}
        for path, info in sorted(now_offline.items()):
            if path in self._offline:
                continue
            self._offline.add(path)
            log.error(
                "log_dir_offline",
                log_dir=info.path,
                error=info.error,
                message="the broker took this log dir offline and serves its other dirs; "
                "its partitions are not served here and diskguard deletes nothing in it "
                "while the broker runs (DeleteRecords cannot reach it). To bring it back: "
                "fix or free the disk (stop the broker, then `diskguard enforce --once` "
                "frees space offline), and restart the broker: a failed log dir returns "
                "only at a restart",
            )
        for path in sorted(self._offline - set(now_offline)):
            self._offline.discard(path)
            log.info("log_dir_online", log_dir=path)
