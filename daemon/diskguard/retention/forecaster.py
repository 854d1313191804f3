"""The broker-mode forecast of each filesystem: how fast it grows, and how late the broker
frees what it is asked to delete (edge).

In broker mode a deletion frees nothing until the broker's next retention check plus its
delete delay, so the limits look ahead by ``rate x latency`` (``limits.with_forecast``). The
rate comes from the daemon's usage samples (``observe_usage``), or, for a one-shot command
with no history, from what a running daemon measured; the latency from ``ReclaimWatch``
(the broker's settings, then its retention checks seen happening). Thread-safe: the
daemon's loop samples usage while its retention worker plans with the forecast.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from diskguard.config import Config
from diskguard.logs import get_logger
from diskguard.retention.reclaim import Forecast, GrowthEstimator
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
        # Settings now from server.properties/defaults, from the broker itself at the first
        # broker-mode cycle (``refresh_settings``).
        self.reclaim = ReclaimWatch(reclaim_settings(config))
        self._settings_from_broker_at: float | None = None

    def observe_usage(self, mount: str, t: float, used_bytes: int) -> None:
        """One usage sample (the daemon's poll): feeds the filesystem's growth rate."""
        with self._lock:
            self._growth.setdefault(mount, GrowthEstimator()).observe(t, used_bytes)

    def growth_rate(self, mount: str) -> float | None:
        with self._lock:
            estimator = self._growth.get(mount)
            rate = estimator.rate() if estimator is not None else None
        return rate if rate is not None else self._rates.get(mount)

    def forecast(self, mount: str) -> Forecast:
        return self.reclaim.model.forecast(time.monotonic(), self.growth_rate(mount))

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
            log.info(
                "broker_reclaim_settings",
                check_interval_s=settings.check_interval_s,
                delete_delay_s=settings.delete_delay_s,
                source=settings.source,
            )
