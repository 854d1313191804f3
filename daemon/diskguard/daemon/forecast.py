"""The broker-mode forecast the loop steers by, and what it publishes of it each poll.

In broker mode the broker frees deleted segments only after its retention check and delete
delay, so the loop looks ahead (``retention.ceilings``: the usage once the space asked for
is freed, whether a filesystem needs a cycle now). This keeps what only the loop sees: the
usage at the last poll (a drop since is pending reclaim the broker freed), the reclaim view
per filesystem (status, metrics, snapshots), and ``broker_reclaim_slow`` when the headroom
cannot absorb the writes meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from diskguard.kafkalog.model import FilesystemUsage
from diskguard.logs import get_logger
from diskguard.metrics import Metrics
from diskguard.retention.ceilings import Ceilings
from diskguard.retention.daemonstate import ReclaimView
from diskguard.retention.forecaster import Forecaster
from diskguard.retention.mode import BROKER

log = get_logger("diskguard.daemon")

#: ``broker_reclaim_slow`` is repeated this often (seconds) while it lasts.
RECLAIM_SLOW_EVERY_S = 600.0


class BrokerForecast:
    """Usage as it will be once the broker has freed what it was asked for.

    ``broker_mode``: whether the last retention cycle ran in broker mode (the forecast only
    counts then). The ceilings and forecaster are the current retention cycle's (``rewire``
    after a reload)."""

    def __init__(self, ceilings: Ceilings, forecaster: Forecaster, metrics: Metrics) -> None:
        self._metrics = metrics
        self.rewire(ceilings, forecaster)
        self.broker_mode = False
        #: mount -> the usage the last poll (or scan) saw, and when (monotonic).
        self.usage: dict[str, FilesystemUsage] = {}
        self._seen_at = time.monotonic()
        #: mount -> the reclaim view of the last poll.
        self.views: dict[str, ReclaimView] = {}
        #: mount -> when ``broker_reclaim_slow`` was last logged for it (monotonic).
        self._reclaim_slow: dict[str, float] = {}

    def rewire(self, ceilings: Ceilings, forecaster: Forecaster) -> None:
        self._ceilings = ceilings
        self._forecaster = forecaster

    def rebase(self, usages: Mapping[str, FilesystemUsage], now: float) -> None:
        """A scan's usage is the baseline for the drops ``account`` counts next: what was
        freed before the scan is already out of its pending."""
        self.usage.update(usages)
        self._seen_at = now

    def account(self, usages: Mapping[str, FilesystemUsage], now: float) -> None:
        """Between scans, a drop in usage is pending reclaim the broker has freed.

        Pending is measured only by a scan (plus what a cycle asked for); without this the
        forecast would keep subtracting space the broker already gave back, predict too low,
        and ask only once the disk is over its ceiling. What was written meanwhile (rate x
        elapsed) is added back, so a drop during steady writes counts in full.
        """
        elapsed = max(0.0, now - self._seen_at)
        for mount, usage in usages.items():
            before = self.usage.get(mount)
            if before is None or usage.used_bytes >= before.used_bytes:
                continue
            written = (self._forecaster.growth_rate(mount) or 0.0) * elapsed
            self._ceilings.freed(mount, before.used_bytes - usage.used_bytes + int(written))

    def predicted(self, usage: FilesystemUsage) -> FilesystemUsage | None:
        """Broker mode: the usage expected when space asked for now is freed, if higher."""
        return self._ceilings.predicted(usage, BROKER) if self.broker_mode else None

    def over(self, usages: Mapping[str, FilesystemUsage], mounts: int) -> bool:
        """Does any filesystem need a retention cycle now (today's usage or the forecast)?
        One that could not be measured (``usages`` has fewer than ``mounts``) does too."""
        for usage in usages.values():
            if self._ceilings.standing(usage, BROKER, forecast=self.broker_mode).over:
                return True
        return len(usages) < mounts

    def observe(self, usages: Mapping[str, FilesystemUsage], now: float) -> None:
        """Each poll: the reclaim view and metrics of every filesystem, and whether the broker
        frees space too late for the write rate."""
        self._check_reclaim_headroom(usages, now)
        for mount, usage in usages.items():
            view = self._view(mount, usage)
            self.views[mount] = view
            self._metrics.observe_forecast(
                usage,
                growth_bytes_per_s=view.growth_bytes_per_s or 0.0,
                expected_latency_s=view.expected_latency_s or 0.0,
                headroom_needed_bytes=view.headroom_needed_bytes or 0,
                predicted_usage_percent=view.predicted_usage_percent or 0.0,
                latency_p50_s=view.latency_p50_s,
                latency_max_s=view.latency_max_s,
            )
        self.usage = dict(usages)
        self._seen_at = now

    def forget(self, mount: str) -> None:
        self.usage.pop(mount, None)
        self.views.pop(mount, None)
        self._reclaim_slow.pop(mount, None)

    def _check_reclaim_headroom(self, usages: Mapping[str, FilesystemUsage], now: float) -> None:
        """``broker_reclaim_slow``: the space between the ceiling and a full disk cannot absorb
        the growth over the broker's worst-case reclaim latency at the current write rate.
        Logged when it begins and every ``RECLAIM_SLOW_EVERY_S`` while it lasts."""
        if not self.broker_mode:
            return
        settings = self._forecaster.reclaim.settings
        for mount, usage in usages.items():
            # A warning need not wait for the window a deleting forecast needs.
            rate = self._forecaster.recent_rate(mount) or 0.0
            needed = int(rate * settings.worst_latency_s)
            room = self._ceilings.room_above_ceiling(usage)
            last = self._reclaim_slow.get(mount)
            if needed <= room:
                self._reclaim_slow.pop(mount, None)
                continue
            if last is not None and now - last < RECLAIM_SLOW_EVERY_S:
                continue
            self._reclaim_slow[mount] = now
            log.warning(
                "broker_reclaim_slow",
                mount=mount,
                growth_bytes_per_s=round(rate, 1),
                reclaim_latency_s=settings.worst_latency_s,
                headroom_needed_bytes=needed,
                headroom_bytes=room,
                settings_source=settings.source,
                change=settings.settings_to_change(),
                message="the broker frees space too late for this write rate: lower "
                "log.retention.check.interval.ms / log.segment.delete.delay.ms, or lower "
                "retention.disk_usage_percent",
            )

    def _view(self, mount: str, usage: FilesystemUsage) -> ReclaimView:
        """Rate, the broker's reclaim latency (settings and measured) and what they imply."""
        forecast = self._forecaster.forecast(mount)
        settings = self._forecaster.reclaim.settings
        p50, worst, count = self._forecaster.reclaim.model.observed(mount)
        predicted = self.predicted(usage) or usage
        rate = self._forecaster.growth_rate(mount)
        return ReclaimView(
            check_interval_s=settings.check_interval_s,
            delete_delay_s=settings.delete_delay_s,
            settings_source=settings.source,
            latency_p50_s=None if p50 is None else round(p50, 3),
            latency_max_s=None if worst is None else round(worst, 3),
            latency_samples=count,
            growth_bytes_per_s=None if rate is None else round(rate, 1),
            expected_latency_s=round(forecast.latency_s, 3),
            latency_source=forecast.latency_source,
            headroom_needed_bytes=int((rate or 0.0) * settings.worst_latency_s),
            predicted_usage_percent=round(predicted.usage_percent, 3),
            broker_mode=self.broker_mode,
        )
