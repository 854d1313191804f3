"""Values as people read them in the report: sizes, rates, durations, times, escaped names.

Pure functions of plain values and rows. Every name from a snapshot goes through
:func:`escape` before it reaches the page: snapshots are input, not trusted markup.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Mapping
from typing import Any

from diskguard.fleet.aggregation import FORECAST_NOT_ENOUGH_DATA
from diskguard.units import MAX_DATETIME_MS, format_bytes


def escape(value: object) -> str:
    return html.escape(str(value), quote=True)


def format_hours(hours: float | None) -> str:
    """``None`` -> "not growing"; under two days in hours, then days, then years."""
    if hours is None:
        return "not growing"
    if hours < 48:
        return f"{hours:.1f} h"
    if hours < 24 * 730:
        return f"{hours / 24:.1f} d"
    return f"{hours / (24 * 365):.1f} y"


def format_seconds(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return format_hours(seconds / 3600)


def format_ts(ts_ms: int | float) -> str:
    """UTC ``YYYY-MM-DD HH:MM``; a forecast past the calendar's end (a disk that barely grows
    fills in a million years) is said as such rather than raising."""
    if ts_ms > MAX_DATETIME_MS:
        return "after 9999-12-31"
    if ts_ms < 0:
        return "before 1970-01-01"
    return dt.datetime.fromtimestamp(ts_ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M")


def format_rate(bytes_per_hour: float | None) -> str:
    if bytes_per_hour is None:
        return "-"
    if abs(bytes_per_hour) < 0.5:  # a fit's rounding noise must not read as "-0 B/h"
        bytes_per_hour = 0.0
    return f"{format_bytes(bytes_per_hour)}/h"


def used_pct(used: float, available: float) -> float:
    total = used + available
    return 100.0 * used / total if total > 0 else 0.0


def format_span(ms: int | float) -> str:
    """A data window's length for people: ``58 s``, ``12 min``, ``1 h``, ``3.5 h``, ``9.0 d``."""
    seconds = float(ms) / 1000.0
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:.0f} h"
    return format_hours(seconds / 3600)


def forecast_status_of(disk: Mapping[str, Any]) -> str:
    """The row's ``forecast_status``; rows from before it existed count as not enough data."""
    return str(disk.get("forecast_status") or FORECAST_NOT_ENOUGH_DATA)
