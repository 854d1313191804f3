"""The report's SVG charts: usage with its forecast, growing topics, overfull episodes.

Inline SVG with round axis ticks (1-2-5 percent steps, whole UTC minutes/hours/days), so the
page needs no script or chart library. Pure: rows in, markup out.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from typing import Any

from diskguard.fleet.aggregation import (
    FORECAST_OK,
    FORECAST_WEAK_FIT,
    MS_PER_HOUR,
    forecast_full_ts_ms,
)
from diskguard.fleet.formatting import (
    escape,
    forecast_status_of,
    format_rate,
    format_ts,
    used_pct,
)

TOPIC_BARS = 10
TIMELINE_DISKS = 20
# The forecast chart's x axis reaches the forecast, but at most this many data windows past
# the last snapshot: beyond it the data would shrink to a sliver (the date is written instead).
FORECAST_AXIS_WINDOWS = 5

RED, AMBER, GREY, BLUE = "#d13438", "#b86e00", "#8a919e", "#2f6fdf"
_STATUS_COLOR = {FORECAST_OK: RED, FORECAST_WEAK_FIT: AMBER}


def nice_step(raw: float) -> float:
    """The smallest 1-2-5 step (…, 0.5, 1, 2, 5, 10, 20, …) at least ``raw``."""
    if raw <= 0:
        return 1.0
    exponent = math.floor(math.log10(raw))
    for mantissa in (1.0, 2.0, 5.0, 10.0):
        step = mantissa * 10.0**exponent
        if step >= raw * (1 - 1e-9):
            return step
    return 10.0 ** (exponent + 1)


def percent_ticks(lowest: float, most: int = 6) -> list[float]:
    """Round used-% ticks from at or below ``lowest`` up to 100, at most ``most`` of them."""
    lowest = min(max(lowest, 0.0), 99.0)
    step = nice_step((100.0 - lowest) / (most - 1))
    while True:
        bottom = math.floor(lowest / step) * step
        ticks = [bottom + k * step for k in range(round((100.0 - bottom) / step) + 1)]
        if len(ticks) <= most:
            return [round(t, 6) for t in ticks]
        step = nice_step(step * 1.01)


_TIME_STEPS_S = (
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800,
    3600, 7200, 10800, 21600, 43200, 86400, 2 * 86400, 7 * 86400, 14 * 86400, 28 * 86400,
    91 * 86400, 182 * 86400, 364 * 86400,
)  # fmt: skip


def time_ticks(start_ms: int, end_ms: int, most: int = 5) -> list[int]:
    """Round UTC instants (whole 10 s, 5 min, 6 h, days, …) in ``[start, end]``."""
    span_s = max((end_ms - start_ms) / 1000.0, 1.0)
    step_s = next((s for s in _TIME_STEPS_S if span_s / s <= most), _TIME_STEPS_S[-1])
    step_ms = step_s * 1000
    first = -(-start_ms // step_ms) * step_ms
    return list(range(first, end_ms + 1, step_ms))


def format_tick(ts_ms: int, step_ms: int, with_date: bool) -> str:
    """A tick label: seconds only when the step needs them, the date when asked or daily."""
    moment = dt.datetime.fromtimestamp(ts_ms / 1000, tz=dt.UTC)
    if step_ms >= 86_400_000:
        return moment.strftime("%b %d")
    clock = moment.strftime("%H:%M:%S" if step_ms < 60_000 else "%H:%M")
    return f"{moment.strftime('%b %d')} {clock}" if with_date else clock


def usage_chart(
    disk: Mapping[str, Any],
    points: Sequence[tuple[int, float, float]],
    width: int = 460,
    height: int = 200,
) -> str:
    """Used % over time with the least-squares forecast, dashed, from the last snapshot.

    A trusted forecast (``ok``, red; ``weak_fit``, amber) is drawn to 100% and the x axis
    reaches that moment, unless it lies more than :data:`FORECAST_AXIS_WINDOWS` windows
    ahead: then the line runs to the edge and the date is written there. Without enough
    data the line is grey and stops half a window ahead: it is not a prediction.
    """
    left, right, top, bottom = 44, 14, 26, 22
    plot_w, plot_h = width - left - right, height - top - bottom
    first = int(disk["first_ts_ms"])
    last = int(disk["last_ts_ms"])
    span = max(last - first, 1000)
    status = forecast_status_of(disk)
    growth = disk.get("growth_bytes_per_hour")
    full_ts = forecast_full_ts_ms(last, disk.get("hours_to_full"))
    trusted = status in (FORECAST_OK, FORECAST_WEAK_FIT) and full_ts is not None
    x_max = last + span // 2
    beyond = False
    if trusted and full_ts is not None:
        cap = last + FORECAST_AXIS_WINDOWS * span
        beyond = full_ts > cap
        x_max = max(x_max, min(full_ts, cap))

    def x(ts: float) -> float:
        return left + (ts - first) / (x_max - first) * plot_w

    # Zoomed to the band the disk lives in (a 0.1%/h trend is invisible on 0-100%), but
    # always up to 100%: the forecast line has to be able to reach it.
    lowest = min((used_pct(u, a) for _, u, a in points), default=0.0)
    ticks = percent_ticks(max(0.0, lowest - 2.0))
    y_min = ticks[0]

    def y(pct: float) -> float:
        clamped = min(max(pct, y_min), 100.0)
        return top + (1 - (clamped - y_min) / (100.0 - y_min)) * plot_h

    parts = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">']
    for pct in ticks:
        label = f"{pct:g}%"
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(pct):.1f}" y2="{y(pct):.1f}"'
            ' stroke="#e3e6eb"/>'
            f'<text x="{left - 4}" y="{y(pct) + 4:.1f}" text-anchor="end">{label}</text>'
        )
    xt = time_ticks(first, x_max)
    step = xt[1] - xt[0] if len(xt) > 1 else 1000
    day = first // 86_400_000
    for ts in xt:
        this_day = ts // 86_400_000
        label = format_tick(ts, step, this_day != day)
        parts.append(
            f'<line x1="{x(ts):.1f}" x2="{x(ts):.1f}" y1="{top}" y2="{top + plot_h}"'
            ' stroke="#f0f2f5"/>'
            f'<text x="{x(ts):.1f}" y="{top + plot_h + 13}" text-anchor="middle">'
            f"{escape(label)}</text>"
        )
        day = this_day
    day_text = dt.datetime.fromtimestamp(first / 1000, tz=dt.UTC).strftime("%b %d")
    parts.append(
        f'<text class="axis" x="4" y="{top - 12}">used % of the disk (df) · time: UTC,'
        f" from {escape(day_text)}</text>"
    )
    if points:
        coords = " ".join(f"{x(ts):.1f},{y(used_pct(u, a)):.1f}" for ts, u, a in points)
        parts.append(f'<polyline points="{coords}" fill="none" stroke="{BLUE}" stroke-width="2"/>')
        if len(points) == 1 or x(points[-1][0]) - x(points[0][0]) < 4:
            px, py = x(points[-1][0]), y(used_pct(points[-1][1], points[-1][2]))
            parts.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{BLUE}"/>')
    used = float(disk["used_bytes"])
    avail = float(disk["available_bytes"])
    if growth is not None and growth > 0:
        capacity = used + avail
        end_ts = min(full_ts, x_max) if full_ts is not None else x_max
        end_used = used + growth * (end_ts - last) / MS_PER_HOUR
        end_pct = 100.0 * end_used / capacity if capacity > 0 else 100.0
        color = _STATUS_COLOR.get(status, GREY) if trusted else GREY
        parts.append(
            f'<line x1="{x(last):.1f}" y1="{y(used_pct(used, avail)):.1f}" x2="{x(end_ts):.1f}"'
            f' y2="{y(end_pct):.1f}" stroke="{color}" stroke-width="1.6"'
            ' stroke-dasharray="5,4"/>'
        )
        if trusted and full_ts is not None and not beyond:
            # where the dashed line crosses 100% (the heading gives the date)
            parts.append(
                f'<circle cx="{x(full_ts):.1f}" cy="{y(100.0):.1f}" r="3" fill="{color}"/>'
            )
    return "".join(parts) + "</svg>"


def topics_chart(topics: Sequence[Mapping[str, Any]], width: int = 640) -> str:
    """Horizontal bars: the fastest-growing topics, fleet-wide bytes per hour."""
    growing = sorted(
        (t for t in topics if (t.get("growth_bytes_per_hour") or 0) > 0),
        key=lambda t: -float(t["growth_bytes_per_hour"]),
    )[:TOPIC_BARS]
    if not growing:
        return '<p class="meta">No topic is growing.</p>'
    bar_h, gap, label_w, value_w = 18, 6, 180, 110
    height = len(growing) * (bar_h + gap) + gap
    top_rate = float(growing[0]["growth_bytes_per_hour"])
    plot_w = width - label_w - value_w
    parts = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">']
    for i, topic in enumerate(growing):
        rate = float(topic["growth_bytes_per_hour"])
        y = gap + i * (bar_h + gap)
        w = max(plot_w * rate / top_rate, 1.0)
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">'
            f"{escape(topic['topic'])}</text>"
            f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="#2f6fdf"/>'
            f'<text x="{label_w + w + 6:.1f}" y="{y + 13}">{escape(format_rate(rate))}</text>'
        )
    return "".join(parts) + "</svg>"


def episodes_chart(
    episodes: Sequence[Mapping[str, Any]],
    first_ts_ms: int,
    last_ts_ms: int,
    width: int = 900,
) -> str:
    """One row per disk (most recent episodes first), one bar per overfull episode."""
    if not episodes:
        return '<p class="meta">No overfull episode in the window.</p>'
    rows: list[tuple[str, str]] = []
    for ep in sorted(episodes, key=lambda e: -int(e["start_ts_ms"])):
        key = (str(ep["host"]), str(ep["mount"]))
        if key not in rows:
            rows.append(key)
        if len(rows) == TIMELINE_DISKS:
            break
    label_w, row_h, bottom = 220, 20, 22
    plot_w = width - label_w - 10
    height = len(rows) * row_h + bottom
    span = max(last_ts_ms - first_ts_ms, 1)

    def x(ts: int) -> float:
        return label_w + (ts - first_ts_ms) / span * plot_w

    parts = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">']
    for i, (host, mount) in enumerate(rows):
        y = i * row_h
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end">'
            f"{escape(host)}:{escape(mount)}</text>"
            f'<line x1="{label_w}" x2="{label_w + plot_w}" y1="{y + 10}" y2="{y + 10}"'
            ' stroke="#e3e6eb"/>'
        )
    index = {key: i for i, key in enumerate(rows)}
    for ep in episodes:
        row = index.get((str(ep["host"]), str(ep["mount"])))
        if row is None:
            continue
        start, end = int(ep["start_ts_ms"]), int(ep["end_ts_ms"])
        x0, x1 = x(start), x(end)
        color = "#d13438" if ep.get("open") else "#f08a24"
        title = f"{format_ts(start)} - {format_ts(end)}" + (
            " (still overfull)" if ep.get("open") else ""
        )
        parts.append(
            f'<rect x="{x0:.1f}" y="{row * row_h + 3}" width="{max(x1 - x0, 2.0):.1f}" height="14"'
            f' fill="{color}"><title>{escape(title)}</title></rect>'
        )
    parts.append(
        f'<text x="{label_w}" y="{height - 6}">{escape(format_ts(first_ts_ms))} UTC</text>'
        f'<text x="{label_w + plot_w}" y="{height - 6}" text-anchor="end">'
        f"{escape(format_ts(last_ts_ms))} UTC</text>"
    )
    return "".join(parts) + "</svg>"
