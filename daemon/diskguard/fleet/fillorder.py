"""Which disk of the fleet fills first: the ranking the report and ``summary.json`` give.

Pure: rows of ``disks.parquet`` in, a ranking out. A disk *filled* when its guard said
overfull (the operator's "full": diskguard holds producers back there, so df's 100 % should
never come), so the disks that did are ordered by their first overfull snapshot in the
window; the others by when a forecast worth the name (``ok`` or ``weak_fit``, the rule of
:func:`diskguard.fleet.aggregation.forecast_status`) says they fill. A disk that did neither
is not ranked: nothing says when it fills, and a guess would be read as an answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from diskguard.fleet.aggregation import FORECAST_OK, FORECAST_WEAK_FIT, MS_PER_HOUR


@dataclass(frozen=True)
class FillRank:
    """One disk's place in :class:`FillOrder`: when it filled (``basis`` ``overfull``: its
    first overfull snapshot) or is forecast to (``forecast``: the growth line reaching
    nothing available, with the forecast's status)."""

    host: str
    mount: str
    basis: str
    ts_ms: int
    hours_to_full: float | None = None
    forecast_status: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "mount": self.mount,
            "basis": self.basis,
            "ts_ms": self.ts_ms,
            "hours_to_full": self.hours_to_full,
            "forecast_status": self.forecast_status,
        }


FILLED = "overfull"
FORECAST = "forecast"


@dataclass(frozen=True)
class FillOrder:
    """The order the fleet's disks fill in: those that went overfull in the window, first
    overfull first, then those a trusted forecast says will fill, soonest first. A disk that
    did neither (not growing, too little data) is not ranked: nothing says when it fills."""

    ranks: tuple[FillRank, ...]

    @property
    def first(self) -> FillRank | None:
        """The disk that filled first, else the one forecast to fill first."""
        return self.ranks[0] if self.ranks else None

    def as_dict(self) -> dict[str, Any]:
        """``summary.json``'s ``fill_order``."""
        first = self.first
        return {
            "fills_first": None if first is None else first.as_dict(),
            "disks": [r.as_dict() for r in self.ranks],
        }


def fill_order(disks: Iterable[Mapping[str, Any]]) -> FillOrder:
    """Rank ``disks`` (rows of ``disks.parquet``) by when they filled or will fill.

    Filled before forecast: a disk that went overfull already filled before any disk that
    only will. Ties (the same millisecond) go by host and mount, so the answer is stable.
    """
    filled: list[FillRank] = []
    forecast: list[FillRank] = []
    for disk in disks:
        host, mount = str(disk["host"]), str(disk["mount"])
        first = disk.get("first_overfull_ts_ms")
        status = disk.get("forecast_status")
        hours = disk.get("hours_to_full")
        if first is not None:
            filled.append(FillRank(host, mount, FILLED, int(first)))
        elif hours is not None and status in (FORECAST_OK, FORECAST_WEAK_FIT):
            when = int(int(disk["last_ts_ms"]) + float(hours) * MS_PER_HOUR)
            forecast.append(FillRank(host, mount, FORECAST, when, float(hours), str(status)))
    ordered = sorted(filled, key=lambda r: (r.ts_ms, r.host, r.mount)) + sorted(
        forecast, key=lambda r: (r.ts_ms, r.host, r.mount)
    )
    return FillOrder(tuple(ordered))
