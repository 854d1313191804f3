"""The broker-mode forecast of each filesystem: how fast it grows, and how late the broker
frees what it is asked to delete (edge).

In broker mode a deletion frees nothing until the broker's next retention check plus its
delete delay, so the limits look ahead by ``rate x latency`` (``limits.with_forecast``). The
rate comes from the daemon's usage samples (``observe_usage``): growth sustained through a
window at least as long as what the forecast predicts (``ReclaimModel.rate_window_s``), so a
one-off write is no rate, and seconds of history after a start or a reload are none either;
for a one-shot command with no history, from what a running daemon measured so. The latency
comes from ``ReclaimWatch`` (the broker's settings, then its retention checks seen
happening). Thread-safe: the daemon's loop samples usage while its retention worker plans
with the forecast.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from diskguard.config import Config
from diskguard.logs import get_logger
from diskguard.retention.growthpeak import GrowthPeak
from diskguard.retention.reclaim import (
    PARTIAL_RATE_WINDOW_S,
    SEND_LEAD_S,
    WARNING_RATE_WINDOW_S,
    Forecast,
    GrowthEstimator,
    ReclaimModel,
)
from diskguard.retention.reclaimwatch import ReclaimWatch, reclaim_settings

log = get_logger("diskguard.retention")


class Forecaster:
    """Growth rates per filesystem and the broker's reclaim latency, for one config.

    ``rates``: mount -> rate a running daemon measured (what a one-shot command starts from).
    """

    def __init__(self, config: Config, rates: Mapping[str, float] | None = None) -> None:
        self._config = config
        self._rates = dict(rates or {})
        self._lock = threading.Lock()
        self._growth: dict[str, GrowthEstimator] = {}
        #: mount -> the fastest growth seen lately (how far from a limit a quiet daemon stays).
        self._peaks: dict[str, GrowthPeak] = {}
        # Settings now from server.properties/defaults, from the broker itself at the first
        # broker-mode cycle (``refresh_settings``). A forecast's requests are sent at least a
        # few polls before the check they feed: the loop notices the window only at a poll.
        self.reclaim = ReclaimWatch(reclaim_settings(config))
        self.reclaim.model.send_lead_s = max(SEND_LEAD_S, 4 * config.retention.usage_poll_interval)
        self._settings_from_broker_at: float | None = None

    @property
    def _model(self) -> ReclaimModel:
        return self.reclaim.model

    def observe_usage(self, mount: str, t: float, used_bytes: int) -> None:
        """One usage sample (the daemon's poll): feeds the filesystem's growth rate."""
        with self._lock:
            estimator = self._growth.get(mount)
            if estimator is None:
                estimator = self._growth[mount] = GrowthEstimator(self._model.rate_window_s)
            estimator.observe(t, used_bytes)
            peak = self._peaks.get(mount)
            if peak is None:
                peak = self._peaks[mount] = GrowthPeak()
            peak.observe(t, used_bytes)

    def peak_rate(self, mount: str) -> float:
        """The fastest growth of ``mount`` seen lately, a burst included (``GrowthPeak``):
        bytes per second, 0 before two samples."""
        with self._lock:
            peak = self._peaks.get(mount)
            return peak.rate() if peak is not None else 0.0

    def adopt_history(self, other: Forecaster) -> None:
        """Take over ``other``'s usage history (a config reload): the disk's growth does not
        start again with a new config, and without it no forecast would run for a whole rate
        window after every reload."""
        with other._lock:
            growth, peaks = dict(other._growth), dict(other._peaks)
        with self._lock:
            for mount, estimator in growth.items():
                estimator.window_s = self._model.rate_window_s
                self._growth.setdefault(mount, estimator)
            for mount, peak in peaks.items():
                self._peaks.setdefault(mount, peak)

    def _rate(self, mount: str, window_s: float) -> float | None:
        with self._lock:
            estimator = self._growth.get(mount)
            return estimator.rate(window_s) if estimator is not None else None

    def growth_rate(self, mount: str) -> float | None:
        """The write rate forecasts use: sustained through the window of the longest forecast
        (``rate_window_s``), None until measured so; else what a running daemon measured."""
        rate = self._rate(mount, self._model.rate_window_s)
        return rate if rate is not None else self._rates.get(mount)

    def recent_rate(self, mount: str) -> float | None:
        """The write rate sustained through a minute (``WARNING_RATE_WINDOW_S``, or the
        forecast's window if shorter): for warnings, which need not wait as long as a forecast
        that deletes (11 minutes with Kafka's defaults)."""
        window = min(WARNING_RATE_WINDOW_S, self._model.rate_window_s)
        rate = self._rate(mount, window)
        return rate if rate is not None else self.growth_rate(mount)

    def forecast(self, mount: str) -> Forecast:
        """The forecast of ``mount`` now: from the rate sustained through the forecast's
        window, or, with less history (after a start) but at least ``PARTIAL_RATE_WINDOW_S``,
        through what there is, looking only as far ahead as that reaches back; else from a
        running daemon's rate."""
        window = self._model.rate_window_s
        with self._lock:
            estimator = self._growth.get(mount)
            measured = (
                estimator.rate_up_to(window, min(window, PARTIAL_RATE_WINDOW_S))
                if estimator
                else None
            )
        now = time.monotonic()
        if measured is not None:
            return self._model.forecast(now, *measured)
        return self._model.forecast(now, self._rates.get(mount))

    def refresh_settings(
        self,
        from_broker: Callable[[], Mapping[str, str | None] | None],
        max_age: float = 600.0,
    ) -> None:
        """Ask the broker for its retention-check settings, at most every ``max_age`` s."""
        now, last = time.monotonic(), self._settings_from_broker_at
        if last is not None and now - last < max_age:
            return
        self._settings_from_broker_at = now
        settings = reclaim_settings(self._config, from_broker)
        if settings != self.reclaim.settings:
            self.reclaim.set_settings(settings)
            with self._lock:
                for estimator in self._growth.values():
                    estimator.window_s = self._model.rate_window_s
            log.info(
                "broker_reclaim_settings",
                check_interval_s=settings.check_interval_s,
                delete_delay_s=settings.delete_delay_s,
                source=settings.source,
            )
