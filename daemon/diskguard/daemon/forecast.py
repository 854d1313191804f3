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
from dataclasses import replace
from typing import Any

from diskguard.config import Config
from diskguard.daemon.statefile import Memory
from diskguard.flow.state import FlowState
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.logs import get_logger
from diskguard.metrics import Metrics
from diskguard.retention.cycle import RetentionCycle
from diskguard.retention.inputs import limits_for, with_forecast
from diskguard.retention.mode import BROKER
from diskguard.retention.outcome import CycleOutcome
from diskguard.retention.planner import Limits, over_ceiling, room_above_ceiling

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

        ``pending`` is measured only by a scan (plus what a cycle asked for); without this the
        forecast would keep subtracting space the broker already gave back, predict too low,
        and ask only once the disk is over its ceiling. What was written meanwhile (rate x
        elapsed) is added back, so a drop during steady writes counts in full.
        """
        for mount, usage in usages.items():
            before = self.memory.usage.get(mount)
            pending = self.memory.pending.get(mount, 0)
            if before is None or not pending or usage.used_bytes >= before.used_bytes:
                continue
            elapsed = max(0.0, now - self._last_poll_at)
            written = (self.runtime.growth_rate(mount) or 0.0) * elapsed
            freed = before.used_bytes - usage.used_bytes + int(written)
            self.memory.pending[mount] = max(0, pending - freed)

    def _broker_mode(self) -> bool:
        last = self._last_outcome
        return last is not None and last.mode.mode == BROKER

    def _forecast_limits(self, mount: str) -> Limits:
        """The retention limits with this filesystem's forecast (broker mode only)."""
        limits = limits_for(self.config, BROKER)
        if not self._broker_mode():
            return limits
        return with_forecast(limits, self.runtime.forecast(mount))

    def _predicted(self, mount: str, usage: FilesystemUsage) -> FilesystemUsage | None:
        """Broker mode: the usage expected when space asked for now is freed, if higher."""
        if not self._broker_mode():
            return None
        grown = self._forecast_limits(mount).growth_bytes - self.memory.pending.get(mount, 0)
        if grown <= 0:
            return None
        return replace(
            usage,
            used_bytes=usage.used_bytes + grown,
            available_bytes=max(0, usage.available_bytes - grown),
        )

    def _over_retention_limit(self, usages: dict[str, FilesystemUsage]) -> bool:
        """Does any filesystem need a retention cycle now (today's usage or the forecast)?"""
        for mount, usage in usages.items():
            pending = self.memory.pending.get(mount, 0)
            if over_ceiling(usage, self._forecast_limits(mount), pending)[0]:
                return True
        return len(usages) < len(self.mounts)

    def _check_reclaim_headroom(self, usages: dict[str, FilesystemUsage]) -> None:
        """``broker_reclaim_slow``: the space between the ceiling and a full disk cannot absorb
        the growth over the broker's worst-case reclaim latency at the current write rate.
        Logged when it begins and every 10 minutes while it lasts."""
        if not self._broker_mode():
            return
        settings = self.runtime.reclaim.settings
        now = time.monotonic()
        for mount, usage in usages.items():
            rate = self.runtime.growth_rate(mount) or 0.0
            needed = int(rate * settings.worst_latency_s)
            room = room_above_ceiling(usage, self.config.retention.disk_usage_percent)
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

    def _reclaim_view(self, mount: str, usage: FilesystemUsage) -> dict[str, Any]:
        """Rate, the broker's reclaim latency (settings and measured) and what they imply."""
        rt = self.runtime
        forecast = rt.forecast(mount)
        view: dict[str, Any] = dict(rt.reclaim.summary([mount])[mount])
        predicted = self._predicted(mount, usage) or usage
        rate = rt.growth_rate(mount)
        view.update(
            growth_bytes_per_s=None if rate is None else round(rate, 1),
            expected_latency_s=round(forecast.latency_s, 3),
            latency_source=forecast.latency_source,
            headroom_needed_bytes=int((rate or 0.0) * rt.reclaim.settings.worst_latency_s),
            predicted_usage_percent=round(predicted.usage_percent, 3),
            broker_mode=self._broker_mode(),
        )
        return view

    def _observe(self, usages: dict[str, FilesystemUsage]) -> None:
        self._check_reclaim_headroom(usages)
        for mount, usage in usages.items():
            view = self._reclaim_view(mount, usage)
            self.memory.reclaim[mount] = view
            self.metrics.observe_forecast(
                usage,
                growth_bytes_per_s=view["growth_bytes_per_s"] or 0.0,
                expected_latency_s=view["expected_latency_s"],
                headroom_needed_bytes=view["headroom_needed_bytes"],
                predicted_usage_percent=view["predicted_usage_percent"],
                latency_p50_s=view["latency_p50_s"],
                latency_max_s=view["latency_max_s"],
            )
            state = self.memory.flow.get(mount, FlowState())
            self.metrics.observe_filesystem(
                usage,
                limit_percent=self.config.retention.disk_usage_percent,
                pending_reclaim_bytes=self.memory.pending.get(mount, 0),
                overfull=bool(state.overfull),
                alert_level=state.alert_level or 0,
                deleted_open_bytes=self.memory.deleted_open.get(mount),
            )
        self.memory.usage = usages
        self._last_poll_at = time.monotonic()
        self.metrics.cycle_done()
