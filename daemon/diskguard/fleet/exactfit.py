"""Least-squares lines from exact sums, and a disk's report row from a window of them.

The daily summaries (:mod:`diskguard.fleet.daily`) keep integer sums per disk and day; a
window's sums are their totals, and the fit is finished here in Python integers, rounded
once at the end. Pure: plain numbers in, plain rows out; the rules it applies (time to full,
the forecast trust rule, df's use%) are :mod:`diskguard.fleet.aggregation`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from diskguard.fleet.aggregation import (
    MS_PER_HOUR,
    LineFit,
    forecast_status,
    hours_to_full,
    used_ratio,
)


@dataclass(frozen=True)
class Sums:
    """Exact sums of a series for a least-squares line: ``n, Σx, Σx², Σy, Σxy`` and, when
    the fit's quality is wanted, ``Σy²``; x in ms and y in bytes, each from any origin.

    Integers, so that days summed separately and added give the very same line as the
    whole window at once (the daily summaries' fold, see :mod:`diskguard.fleet.daily`).
    """

    n: int
    sx: int
    sxx: int
    sy: int
    sxy: int
    syy: int = 0

    @classmethod
    def of(cls, ts_ms: Sequence[int], values: Sequence[int]) -> Sums:
        return cls(
            n=len(ts_ms),
            sx=sum(ts_ms),
            sxx=sum(t * t for t in ts_ms),
            sy=sum(values),
            sxy=sum(t * v for t, v in zip(ts_ms, values, strict=True)),
            syy=sum(v * v for v in values),
        )


def exact_slope(sums: Sums) -> float | None:
    """The least-squares slope in bytes per hour from exact sums (``Σy²`` unused)."""
    a = sums.n * sums.sxx - sums.sx * sums.sx
    if sums.n < 2 or a <= 0:
        return None
    b = sums.n * sums.sxy - sums.sx * sums.sy
    return float(Fraction(b * int(MS_PER_HOUR), a))


def exact_fit(sums: Sums) -> LineFit:
    """Slope (bytes per hour), R² and RMS residual from exact sums, rounded once at the end.

    With ``A = nΣx² − (Σx)²``, ``B = nΣxy − ΣxΣy``, ``C = nΣy² − (Σy)²`` (integers): slope
    ``B/A``, R² ``B²/(AC)``, squared residuals ``(AC − B²)/(nA)``. No cancellation can turn a
    near-perfect line's residual into noise, however big the bytes. ``None`` without two
    distinct timestamps.
    """
    slope = exact_slope(sums)
    if slope is None:
        return LineFit(None, None, None)
    n = sums.n
    a = n * sums.sxx - sums.sx * sums.sx
    b = n * sums.sxy - sums.sx * sums.sy
    c = n * sums.syy - sums.sy * sums.sy
    r2 = 1.0 if c == 0 else max(0.0, float(Fraction(b * b, a * c)))
    residual = math.sqrt(float(Fraction(a * c - b * b, n * n * a)))
    return LineFit(slope, r2, residual)


def disk_row(window: Mapping[str, Any]) -> dict[str, Any]:
    """One row of ``disks.parquet`` from a disk's window of daily summaries.

    ``window`` holds what :func:`diskguard.fleet.window.disk_windows` adds up: counts,
    the latest snapshot (``last``), overfull time and episodes, and exact sums (x: ms from
    any origin; y: used bytes, and ``Σ(y − used_origin)²`` so that no sum holds squares of
    whole disks); the line fits, forecast and ratios are computed here, exactly.
    """
    n = int(window["snapshots"])
    origin = int(window["used_origin"])
    sx, sxx = int(window["s_x"]), int(window["s_xx"])
    sy, sxy = int(window["s_y"]), int(window["s_xy"])
    fit = exact_fit(Sums(n, sx, sxx, sy - n * origin, sxy - origin * sx, int(window["s_yy0"])))
    kn, kx, kxx = int(window["k_n"]), int(window["k_x"]), int(window["k_xx"])
    kk, kxk = int(window["k_k"]), int(window["k_xk"])
    kafka = exact_slope(Sums(kn, kx, kxx, kk, kxk))
    other = exact_slope(Sums(kn, kx, kxx, int(window["k_y"]) - kk, int(window["k_xy"]) - kxk))
    last = window["last"]
    first_ts, last_ts = int(window["first_ts_ms"]), int(window["last_ts_ms"])
    return {
        "host": window["host"],
        "mount": window["mount"],
        "device": last["device"],
        "snapshots": n,
        "first_ts_ms": first_ts,
        "last_ts_ms": last_ts,
        "total_bytes": last["total_bytes"],
        "used_bytes": last["used_bytes"],
        "available_bytes": last["available_bytes"],
        "kafka_bytes": last["kafka_bytes"],
        "pending_reclaim_bytes": last["pending_reclaim_bytes"],
        "growth_bytes_per_hour": fit.slope,
        "kafka_growth_bytes_per_hour": kafka,
        "non_kafka_growth_bytes_per_hour": other,
        "overfull_episodes": int(window["overfull_episodes"]),
        "overfull_seconds": int(window["overfull_ms"]) / 1000.0,
        "deleted_bytes": int(window["deleted_bytes"]),
        "peak_alert_level": window["peak_alert_level"],
        "flow_state": last["flow_state"],
        "alert_level": last["alert_level"],
        "hours_to_full": hours_to_full(int(last["available_bytes"]), fit.slope),
        "used_ratio": used_ratio(int(last["used_bytes"]), int(last["available_bytes"])),
        "growth_r2": fit.r2,
        "growth_residual_bytes": fit.residual_bytes,
        "forecast_status": forecast_status(fit.slope, last_ts - first_ts, n, fit.r2),
        "first_overfull_ts_ms": (
            None if window["first_overfull_ts_ms"] is None else int(window["first_overfull_ts_ms"])
        ),
    }
