"""The broker-mode forecast the loop steers by, and what it publishes of it each poll.

In broker mode the broker frees deleted segments only after its retention check and delete
delay, so the loop looks ahead: usage once the space asked for is freed (``_predicted``),
whether any filesystem needs a cycle now (``_over_retention_limit``), the reclaim view and
metrics (``_observe``), and ``broker_reclaim_slow`` when the headroom cannot absorb the
writes meanwhile. A mixin of ``Daemon`` (``loop``): it works on the loop's memory and
runtime, declared below, and is split out only to keep the loop readable.
"""

from __future__ import annotations

import time

from diskguard.config import Config
from diskguard.daemon.statefile import Memory
from diskguard.flow.state import FlowState
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.logs import get_logger
from diskguard.metrics import Metrics
from diskguard.retention.cycle import RetentionCycle
from diskguard.retention.daemonstate import ReclaimView
from diskguard.retention.mode import BROKER
from diskguard.retention.outcome import CycleOutcome

log = get_logger("diskguard.daemon")


class ReclaimForecast:
    """Usage as it will be once the broker has freed what it was asked for."""

    config: Config
    runtime: RetentionCycle
    memory: Memory
    metrics: Metrics
    #: mount label -> its log dirs (``Daemon._build``).
    mounts: dict[str, list[str]]
    _last_outcome: CycleOutcome | None
    _last_poll_at: float
    #: mount -> when ``broker_reclaim_slow`` was last logged for it (monotonic).
    _reclaim_slow: dict[str, float]

    def _account_reclaim(self, usages: dict[str, FilesystemUsage], now: float) -> None:
        """Between scans, a drop in usage is pending reclaim the broker has freed.

        Pending is measured only by a scan (plus what a cycle asked for); without this the
        forecast would keep subtracting space the broker already gave back, predict too low,
        and ask only once the disk is over its ceiling. What was written meanwhile (rate x
        elapsed) is added back, so a drop during steady writes counts in full.
        """
        for mount, usage in usages.items():
            before = self.memory.usage.get(mount)
            if before is None or usage.used_bytes >= before.used_bytes:
                continue
            elapsed = max(0.0, now - self._last_poll_at)
            written = (self.runtime.forecaster.growth_rate(mount) or 0.0) * elapsed
            self.runtime.ceilings.freed(mount, before.used_bytes - usage.used_bytes + int(written))

    def _broker_mode(self) -> bool:
        last = self._last_outcome
        return last is not None and last.mode.mode == BROKER

    def _predicted(self, mount: str, usage: FilesystemUsage) -> FilesystemUsage | None:
        """Broker mode: the usage expected when space asked for now is freed, if higher."""
        if not self._broker_mode():
            return None
        return self.runtime.ceilings.predicted(usage, BROKER)

    def _over_retention_limit(self, usages: dict[str, FilesystemUsage]) -> bool:
        """Does any filesystem need a retention cycle now (today's usage or the forecast)?"""
        ceilings = self.runtime.ceilings
        forecast = self._broker_mode()
        for usage in usages.values():
            if ceilings.standing(usage, BROKER, forecast=forecast).over:
                return True
        return len(usages) < len(self.mounts)

    def _check_reclaim_headroom(self, usages: dict[str, FilesystemUsage]) -> None:
        """``broker_reclaim_slow``: the space between the ceiling and a full disk cannot absorb
        the growth over the broker's worst-case reclaim latency at the current write rate.
        Logged when it begins and every 10 minutes while it lasts."""
        if not self._broker_mode():
            return
        settings = self.runtime.forecaster.reclaim.settings
        now = time.monotonic()
        for mount, usage in usages.items():
            rate = self.runtime.forecaster.growth_rate(mount) or 0.0
            needed = int(rate * settings.worst_latency_s)
            room = self.runtime.ceilings.room_above_ceiling(usage)
            last = self._reclaim_slow.get(mount)
            if needed <= room:
                self._reclaim_slow.pop(mount, None)
                continue
            if last is not None and now - last < 600.0:
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

    def _reclaim_view(self, mount: str, usage: FilesystemUsage) -> ReclaimView:
        """Rate, the broker's reclaim latency (settings and measured) and what they imply."""
        forecaster = self.runtime.forecaster
        forecast = forecaster.forecast(mount)
        settings = forecaster.reclaim.settings
        p50, worst, count = forecaster.reclaim.model.observed(mount)
        predicted = self._predicted(mount, usage) or usage
        rate = forecaster.growth_rate(mount)
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
            broker_mode=self._broker_mode(),
        )

    def _observe(self, usages: dict[str, FilesystemUsage]) -> None:
        self._check_reclaim_headroom(usages)
        for mount, usage in usages.items():
            view = self._reclaim_view(mount, usage)
            self.memory.reclaim[mount] = view
            self.metrics.observe_forecast(
                usage,
                growth_bytes_per_s=view.growth_bytes_per_s or 0.0,
                expected_latency_s=view.expected_latency_s or 0.0,
                headroom_needed_bytes=view.headroom_needed_bytes or 0,
                predicted_usage_percent=view.predicted_usage_percent or 0.0,
                latency_p50_s=view.latency_p50_s,
                latency_max_s=view.latency_max_s,
            )
            state = self.memory.flow.get(mount, FlowState())
            self.metrics.observe_filesystem(
                usage,
                limit_percent=self.runtime.ceilings.limit_percent,
                pending_reclaim_bytes=self.runtime.ceilings.pending(mount),
                overfull=bool(state.overfull),
                alert_level=state.alert_level or 0,
                deleted_open_bytes=self.memory.deleted_open.get(mount),
            )
        self.memory.usage = usages
        self._last_poll_at = time.monotonic()
        self.metrics.cycle_done()
