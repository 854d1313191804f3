"""Learning the broker's reclaim latency (edge): its settings, and our own deletions watched.

Settings come from the broker itself (``DescribeConfigs`` on this broker's resource), else
from ``server.properties``, else Kafka's defaults. Measurement: every segment diskguard asks
the broker to delete is remembered with the time of the request; when its ``.log`` is seen
renamed ``*.deleted`` that is the moment of a retention check (the phase of the broker's
fixed-rate schedule), and when the files are gone that is one request-to-gone latency. The
daemon feeds inotify events (exact times); every scan also checks the remembered segments
(a fallback when inotify is unavailable or lost events), so nothing depends on one source.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from diskguard.config import Config
from diskguard.kafkalog.model import DELETED_SUFFIX
from diskguard.kafkalog.serverprops import read_properties
from diskguard.logs import get_logger
from diskguard.retention.reclaim import (
    KAFKA_CHECK_INTERVAL_S,
    KAFKA_DELETE_DELAY_S,
    ReclaimModel,
    ReclaimSettings,
)

if TYPE_CHECKING:
    # Types only: status reads reclaim_settings() without importing the planner (start-up).
    from diskguard.retention.planner import Deletion

__all__ = ["INITIAL_DELAY_KEY", "ReclaimWatch", "reclaim_settings", "settings_from_values"]

log = get_logger("diskguard.reclaim")

CHECK_KEY = "log.retention.check.interval.ms"
DELAY_KEY = "log.segment.delete.delay.ms"
#: Kafka 3.8+: the first retention check's delay after start-up (a fixed 30 s before).
INITIAL_DELAY_KEY = "log.initial.task.delay.ms"
#: Drop a remembered request after this long: its files went unseen (partition moved, ...).
_FORGET_AFTER_S = 3600.0


def _ms(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        ms = float(str(value).strip())
    except ValueError:
        return None
    return ms / 1000.0 if ms >= 0 else None


def settings_from_values(values: Mapping[str, str | None], source: str) -> ReclaimSettings | None:
    """Settings from broker config values; None when neither key is there."""
    check, delay = _ms(values.get(CHECK_KEY)), _ms(values.get(DELAY_KEY))
    if check is None and delay is None:
        return None
    return ReclaimSettings(
        check_interval_s=KAFKA_CHECK_INTERVAL_S if check is None else check,
        delete_delay_s=KAFKA_DELETE_DELAY_S if delay is None else delay,
        source=source,
    )


def reclaim_settings(
    config: Config, from_broker: Callable[[], Mapping[str, str | None] | None] | None = None
) -> ReclaimSettings:
    """The broker's answer when it gives one, else server.properties, else Kafka defaults."""
    if from_broker is not None:
        values = from_broker()
        if values:
            found = settings_from_values(values, "broker")
            if found is not None:
                return found
    path = config.broker.server_properties
    if path is not None:
        try:
            found = settings_from_values(read_properties(Path(path)), str(path))
        except OSError:
            found = None
        if found is not None:
            return found
    return ReclaimSettings()


@dataclass
class _Request:
    t: float
    mount: str
    renamed: bool = False


class ReclaimWatch:
    """Remembers the segments we asked the broker for and times what happens to them.

    ``on_event`` may be called from the inotify thread; everything else from the loop.
    Times are ``time.monotonic()`` seconds.
    """

    def __init__(self, settings: ReclaimSettings) -> None:
        self.model = ReclaimModel(settings)
        self._requests: dict[str, _Request] = {}
        self._lock = threading.Lock()

    @property
    def settings(self) -> ReclaimSettings:
        return self.model.settings

    def set_settings(self, settings: ReclaimSettings) -> None:
        self.model.settings = settings

    def requested(self, deletions: Sequence[Deletion], t: float) -> None:
        """DeleteRecords accepted for these segments at ``t``."""
        with self._lock:
            for d in deletions:
                for path in d.files:
                    if path.endswith(".log"):
                        self._requests.setdefault(path, _Request(t, d.mount))
        if deletions:
            self.model.observe_request(t)

    def outstanding(self) -> int:
        with self._lock:
            return len(self._requests)

    def on_event(self, kind: str, src: str, dest: str, t: float) -> None:
        """An inotify event: ``moved`` x.log -> x.log.deleted, or ``deleted`` x.log.deleted."""
        if kind == "moved" and dest.endswith(DELETED_SUFFIX):
            self._renamed(src, t)
        elif kind == "deleted" and src.endswith(".log" + DELETED_SUFFIX):
            self._gone(src.removesuffix(DELETED_SUFFIX), t)
        elif kind == "deleted" and src.endswith(".log"):
            self._gone(src, t)

    def _renamed(self, log_path: str, t: float) -> None:
        with self._lock:
            req = self._requests.get(log_path)
            if req is None or req.renamed:
                return
            req.renamed = True
        self.model.observe_check(t)

    def _gone(self, log_path: str, t: float) -> None:
        with self._lock:
            req = self._requests.pop(log_path, None)
        if req is not None:
            if not req.renamed:  # its rename was missed: a check ran at some moment before
                self.model.observe_renamed_unseen()
            self.model.observe_latency(req.mount, t - req.t)

    def check(self, t: float, exists: Callable[[str], bool] = os.path.lexists) -> None:
        """The scan's fallback: look at each remembered segment's files once.

        A rename seen only here is not used as the check's time (it happened at some unknown
        moment before ``t``); a segment found gone gives a latency no shorter than the truth.
        """
        with self._lock:
            items = list(self._requests.items())
        for path, req in items:
            if t - req.t > _FORGET_AFTER_S:
                with self._lock:
                    self._requests.pop(path, None)
                continue
            if exists(path):
                continue
            if exists(path + DELETED_SUFFIX):
                with self._lock:
                    first_seen, req.renamed = not req.renamed, True
                if first_seen:
                    self.model.observe_renamed_unseen()
                continue
            self._gone(path, t)
