"""The fleet report: one self-contained HTML page (inline CSS and SVG, no script, no network).

Pure: plain rows in, a string out. Self-contained because the page is mailed, attached to
tickets and opened on air-gapped operator desks; a chart library from a CDN would render as
nothing there. Every name that came from a snapshot (host, mount, topic) is escaped: the
snapshots are input, not trusted markup.
"""

from __future__ import annotations

import datetime as dt
import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from diskguard.fleet.aggregation import (
    FORECAST_MIN_POINTS,
    FORECAST_MIN_R2,
    FORECAST_MIN_SPAN_MS,
    FORECAST_NOT_ENOUGH_DATA,
    FORECAST_NOT_GROWING,
    FORECAST_OK,
    FORECAST_WEAK_FIT,
    MS_PER_HOUR,
    forecast_full_ts_ms,
)
from diskguard.units import format_bytes, plural

TABLE_ROWS = 20
TOPIC_BARS = 10
TIMELINE_DISKS = 20
SPLIT_TOPICS = 3
# The forecast chart's x axis reaches the forecast, but at most this many data windows past
# the last snapshot: beyond it the data would shrink to a sliver (the date is written instead).
FORECAST_AXIS_WINDOWS = 5

RED, AMBER, GREY, BLUE = "#d13438", "#b86e00", "#8a919e", "#2f6fdf"
_STATUS_COLOR = {FORECAST_OK: RED, FORECAST_WEAK_FIT: AMBER}

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d2330;
background:#fafbfc}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.meta{color:#5b6475}.bad{color:#a4262c}
table{border-collapse:collapse;background:#fff}
th,td{padding:4px 7px;border-bottom:1px solid #e3e6eb;text-align:right;white-space:nowrap}
th{background:#f0f2f5;white-space:normal}td.l,th.l{text-align:left}
td.basis{white-space:normal;min-width:170px;text-align:left}
.grid{display:flex;flex-wrap:wrap;gap:12px}.card{background:#fff;border:1px solid #e3e6eb;
border-radius:6px;padding:8px}.card h3{font-size:13px;margin:0 0 4px;font-weight:600}
svg text{font-size:11px;fill:#5b6475}.warn{color:#a4262c;font-weight:600}
.muted{color:#8a919e}.weak{color:#b86e00}.basis{font-size:12px;color:#5b6475;margin:2px 0 0}
.why{font-size:12px;margin:4px 0 0;max-width:460px}.card{width:470px}
svg text.axis{fill:#1d2330}
"""


@dataclass(frozen=True)
class ReportData:
    """Everything the page shows; all of it already aggregated (small)."""

    generated_at: str
    source: str
    records: int
    duplicates: int
    bad_records: Mapping[str, int]
    disks: Sequence[Mapping[str, Any]]
    topics: Sequence[Mapping[str, Any]]
    hosts: Sequence[Mapping[str, Any]]
    # (host, mount) -> [(ts_ms, used_bytes, available_bytes)], downsampled, time-ordered
    series: Mapping[tuple[str, str], Sequence[tuple[int, float, float]]]
    episodes: Sequence[Mapping[str, Any]]
    episode_total: int
    report_disks: Sequence[tuple[str, str]] = field(default_factory=tuple)


def _e(value: object) -> str:
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
    return dt.datetime.fromtimestamp(ts_ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M")


def format_rate(bytes_per_hour: float | None) -> str:
    if bytes_per_hour is None:
        return "-"
    if abs(bytes_per_hour) < 0.5:  # a fit's rounding noise must not read as "-0 B/h"
        bytes_per_hour = 0.0
    return f"{format_bytes(bytes_per_hour)}/h"


def _pct(used: float, available: float) -> float:
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


def forecast_status_of(disk: Mapping[str, Any]) -> str:
    """The row's ``forecast_status``; rows from before it existed count as not enough data."""
    return str(disk.get("forecast_status") or FORECAST_NOT_ENOUGH_DATA)


def forecast_basis(disk: Mapping[str, Any], compact: bool = False) -> str:
    """What the forecast rests on: span, snapshots, R² and the spread around the line."""
    span = int(disk["last_ts_ms"]) - int(disk["first_ts_ms"])
    snapshots = int(disk["snapshots"])
    parts = [
        format_span(span) if compact else f"{format_span(span)} of data",
        f"{snapshots} snapshot{'' if snapshots == 1 else 's'}",
    ]
    r2 = disk.get("growth_r2")
    if r2 is not None:
        parts.append(f"R² {float(r2):.2f}")
    residual = disk.get("growth_residual_bytes")
    if residual is not None:
        spread = format_bytes(float(residual))
        parts.append(f"±{spread}" if compact else f"±{spread} around the line (RMS)")
    return ", ".join(parts)


def forecast_text(disk: Mapping[str, Any]) -> str:
    """The short verdict: ``full in 2.8 h``, ``not enough data``, ``weak fit: ~3 d``, …"""
    status = forecast_status_of(disk)
    hours = disk.get("hours_to_full")
    first_ts, last_ts = int(disk["first_ts_ms"]), int(disk["last_ts_ms"])
    if status == FORECAST_NOT_ENOUGH_DATA:
        return "not enough data to forecast"
    if status == FORECAST_NOT_GROWING or hours is None:
        return "not growing"
    when = format_ts(last_ts + float(hours) * MS_PER_HOUR) + " UTC"
    beyond = float(hours) * MS_PER_HOUR > FORECAST_AXIS_WINDOWS * max(last_ts - first_ts, 1000)
    where = f"{when}, beyond the chart" if beyond else when
    if status == FORECAST_WEAK_FIT:
        return f"weak fit: full in ~{format_hours(float(hours))}? ({where})"
    return f"full in {format_hours(float(hours))} ({where})"


def disk_topic_growth(
    topics: Sequence[Mapping[str, Any]], host: str, mount: str
) -> list[tuple[str, float]]:
    """Per-topic growth on one disk (from ``topics.parquet``'s per-disk entries), by size
    of the change, growing or shrinking."""
    found = []
    for topic in topics:
        for entry in topic.get("disks") or ():
            rate = entry.get("growth_bytes_per_hour")
            if entry.get("host") == host and entry.get("mount") == mount and rate is not None:
                found.append((str(topic["topic"]), float(rate)))
    return sorted(found, key=lambda item: (-abs(item[1]), item[0]))


def growth_verdict(disk: Mapping[str, Any]) -> str:
    """One sentence: is this disk's growth Kafka's or something else's?"""
    total = disk.get("growth_bytes_per_hour")
    kafka = disk.get("kafka_growth_bytes_per_hour")
    other = disk.get("non_kafka_growth_bytes_per_hour")
    if total is None:
        return "No trend yet (one snapshot)."
    if kafka is None or other is None:
        return "No split: the snapshots do not report kafka_bytes."
    if total <= 0:
        return "Not growing."
    if other >= kafka:
        return f"Mostly not Kafka: {_share(other, total)} of the growth is outside Kafka's data."
    return f"Mostly Kafka: {_share(kafka, total)} of the growth is Kafka's data."


def _share(part: float, total: float) -> str:
    ratio = part / total
    if 0.995 <= ratio < 1.0:  # 99.98% must not read as "100%": some of it is the other side's
        return f"{math.floor(ratio * 1000) / 10:.1f}%"
    return f"{ratio:.0%}"


def growth_split_html(disk: Mapping[str, Any], topics: Sequence[Mapping[str, Any]]) -> str:
    """``growth 45.5 GiB/h = Kafka 178 MiB/h (orders …) + not Kafka 45.3 GiB/h``."""
    total = disk.get("growth_bytes_per_hour")
    kafka = disk.get("kafka_growth_bytes_per_hour")
    other = disk.get("non_kafka_growth_bytes_per_hour")
    named = disk_topic_growth(topics, str(disk["host"]), str(disk["mount"]))[:SPLIT_TOPICS]
    by_topic = ", ".join(f"{_e(name)} {_e(format_rate(rate))}" for name, rate in named)
    kafka_part = f"Kafka {_e(format_rate(kafka))}" + (f" ({by_topic})" if by_topic else "")
    return (
        f'<p class="why"><b>{_e(growth_verdict(disk))}</b> Growth {_e(format_rate(total))}'
        f" = {kafka_part} + not Kafka {_e(format_rate(other))}.</p>"
    )


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
    lowest = min((_pct(u, a) for _, u, a in points), default=0.0)
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
            f"{_e(label)}</text>"
        )
        day = this_day
    day_text = dt.datetime.fromtimestamp(first / 1000, tz=dt.UTC).strftime("%b %d")
    parts.append(
        f'<text class="axis" x="4" y="{top - 12}">used % of the disk (df) · time: UTC,'
        f" from {_e(day_text)}</text>"
    )
    if points:
        coords = " ".join(f"{x(ts):.1f},{y(_pct(u, a)):.1f}" for ts, u, a in points)
        parts.append(f'<polyline points="{coords}" fill="none" stroke="{BLUE}" stroke-width="2"/>')
        if len(points) == 1 or x(points[-1][0]) - x(points[0][0]) < 4:
            px, py = x(points[-1][0]), y(_pct(points[-1][1], points[-1][2]))
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
            f'<line x1="{x(last):.1f}" y1="{y(_pct(used, avail)):.1f}" x2="{x(end_ts):.1f}"'
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
            f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{_e(topic["topic"])}</text>'
            f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="#2f6fdf"/>'
            f'<text x="{label_w + w + 6:.1f}" y="{y + 13}">{_e(format_rate(rate))}</text>'
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
            f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end">{_e(host)}:{_e(mount)}</text>'
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
            f' fill="{color}"><title>{_e(title)}</title></rect>'
        )
    parts.append(
        f'<text x="{label_w}" y="{height - 6}">{_e(format_ts(first_ts_ms))} UTC</text>'
        f'<text x="{label_w + plot_w}" y="{height - 6}" text-anchor="end">'
        f"{_e(format_ts(last_ts_ms))} UTC</text>"
    )
    return "".join(parts) + "</svg>"


def urgency_key(disk: Mapping[str, Any]) -> tuple[int, float, float]:
    """Sort key, most urgent first: disks with a forecast worth the name by time to full,
    then the rest (not enough data, not growing) by use%. A minute of data that
    extrapolates to "full in 2 h" must not push a disk with a real 3-day trend down."""
    hours = disk.get("hours_to_full")
    ratio = float(disk.get("used_ratio") or 0.0)
    if hours is not None and forecast_status_of(disk) in (FORECAST_OK, FORECAST_WEAK_FIT):
        return (0, float(hours), -ratio)
    return (1, 0.0, -ratio)


def _closest_to_full(disks: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(disks, key=urgency_key)[:TABLE_ROWS]


def _full_in_cell(disk: Mapping[str, Any]) -> str:
    status = forecast_status_of(disk)
    hours = disk.get("hours_to_full")
    if status == FORECAST_NOT_ENOUGH_DATA:
        return '<td class="muted">not enough data</td>'
    if status == FORECAST_NOT_GROWING or hours is None:
        return "<td>not growing</td>"
    if status == FORECAST_WEAK_FIT:
        return f'<td class="weak">~{_e(format_hours(float(hours)))} (weak fit)</td>'
    cls = ' class="warn"' if float(hours) < 24 else ""
    return f"<td{cls}>{_e(format_hours(float(hours)))}</td>"


def disks_table(disks: Sequence[Mapping[str, Any]]) -> str:
    head = (
        '<tr><th class="l">host</th><th class="l">mount</th><th>used</th><th>available</th>'
        "<th>use%</th><th>growth</th><th>Kafka</th><th>not Kafka</th>"
        '<th>full in</th><th class="l">forecast basis</th><th>overfull episodes</th>'
        "<th>overfull time</th><th>deleted</th><th>peak alert</th></tr>"
    )
    body = []
    for d in _closest_to_full(disks):
        ratio = d.get("used_ratio")
        body.append(
            f'<tr><td class="l">{_e(d["host"])}</td><td class="l">{_e(d["mount"])}</td>'
            f"<td>{_e(format_bytes(d['used_bytes']))}</td>"
            f"<td>{_e(format_bytes(d['available_bytes']))}</td>"
            f"<td>{'-' if ratio is None else f'{100 * ratio:.1f}%'}</td>"
            f"<td>{_e(format_rate(d.get('growth_bytes_per_hour')))}</td>"
            f"<td>{_e(format_rate(d.get('kafka_growth_bytes_per_hour')))}</td>"
            f"<td>{_e(format_rate(d.get('non_kafka_growth_bytes_per_hour')))}</td>"
            f"{_full_in_cell(d)}"
            f'<td class="basis">{_e(forecast_basis(d, compact=True))}</td>'
            f"<td>{int(d['overfull_episodes'])}</td>"
            f"<td>{_e(format_seconds(float(d['overfull_seconds'])))}</td>"
            f"<td>{_e(format_bytes(d['deleted_bytes']))}</td>"
            f"<td>{int(d['peak_alert_level'])}</td></tr>"
        )
    return f"<table>{head}{''.join(body)}</table>"


def hosts_table(hosts: Sequence[Mapping[str, Any]]) -> str:
    ranked = sorted(hosts, key=lambda h: -float(h.get("skew") or 0.0))[:TABLE_ROWS]
    head = (
        '<tr><th class="l">host</th><th>disks</th><th>used</th><th>available</th>'
        "<th>kafka</th><th>use%</th><th>skew vs fleet</th><th>growth</th></tr>"
    )
    body = []
    for h in ranked:
        ratio = h.get("used_ratio")
        skew = h.get("skew")
        body.append(
            f'<tr><td class="l">{_e(h["host"])}</td><td>{int(h["disks"])}</td>'
            f"<td>{_e(format_bytes(h['used_bytes']))}</td>"
            f"<td>{_e(format_bytes(h['available_bytes']))}</td>"
            f"<td>{_e(format_bytes(h['kafka_bytes']))}</td>"
            f"<td>{'-' if ratio is None else f'{100 * ratio:.1f}%'}</td>"
            f"<td>{'-' if skew is None else f'{skew:.2f}x'}</td>"
            f"<td>{_e(format_rate(h.get('growth_bytes_per_hour')))}</td></tr>"
        )
    return f"<table>{head}{''.join(body)}</table>"


def full_in(disk: Mapping[str, Any]) -> str:
    return forecast_text(disk)


def render_report(data: ReportData) -> str:
    """The whole page."""
    by_key = {(str(d["host"]), str(d["mount"])): d for d in data.disks}
    cards = []
    for key in data.report_disks:
        disk = by_key.get(key)
        if disk is None:
            continue
        cards.append(
            f'<div class="card"><h3>{_e(key[0])}:{_e(key[1])} — {_e(full_in(disk))}</h3>'
            f"{usage_chart(disk, data.series.get(key, ()))}"
            f'<p class="basis">Forecast basis: {_e(forecast_basis(disk))}.</p>'
            f"{growth_split_html(disk, data.topics)}</div>"
        )
    first = min((int(d["first_ts_ms"]) for d in data.disks), default=0)
    last = max((int(d["last_ts_ms"]) for d in data.disks), default=0)
    bad = data.bad_records
    bad_total = sum(bad.values())
    bad_line = (
        f'<p class="bad">Bad records skipped: {int(bad.get("malformed", 0))} malformed,'
        f" {int(bad.get('unknown_schema', 0))} unknown schema.</p>"
        if bad_total
        else ""
    )
    shown = len(data.episodes)
    episodes_note = plural(data.episode_total, "episode") + (
        f", the {shown} most recent shown" if shown < data.episode_total else ""
    )
    hosts = {str(d["host"]) for d in data.disks}
    return "".join(
        [
            '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
            "<title>diskguard fleet report</title>",
            f"<style>{_CSS}</style></head><body>",
            "<h1>diskguard fleet report</h1>",
            f'<p class="meta">Generated {_e(data.generated_at)} from {_e(data.source)}:'
            f" {plural(data.records, 'snapshot')}"
            f" ({plural(data.duplicates, 'duplicate')} dropped),"
            f" {plural(len(hosts), 'host')}, {plural(len(data.disks), 'disk')},"
            f" {plural(len(data.topics), 'topic')},"
            f" {_e(format_ts(first))} to {_e(format_ts(last))} UTC.</p>",
            bad_line,
            "<h2>Disks closest to full</h2>",
            f'<p class="meta">Growth is the least-squares slope over the whole window, split'
            " into Kafka (the log dirs' bytes, <code>kafka_bytes</code>) and not Kafka"
            " (everything else on the filesystem: used − Kafka). A time to full is only"
            f" forecast from at least {_e(format_span(FORECAST_MIN_SPAN_MS))} of data and"
            f" {FORECAST_MIN_POINTS} snapshots (otherwise: grey, <i>not enough data</i>);"
            f" with R² under {FORECAST_MIN_R2:g} the line fits the data poorly (amber,"
            " <i>weak fit</i>). Red: a forecast under 24 h.</p>",
            disks_table(data.disks),
            "<h2>Usage over time and forecast to 100%</h2>",
            '<p class="meta">'
            f'<span style="color:{BLUE}">━ used % (df)</span> · '
            f'<span style="color:{RED}">╌ least-squares forecast</span> to 100%'
            f' (<span style="color:{AMBER}">amber</span>: weak fit;'
            f' <span style="color:{GREY}">grey</span>: not enough data, the trend of the'
            " data only). Times in UTC.</p>",
            f'<div class="grid">{"".join(cards)}</div>',
            "<h2>Top growing topics</h2>",
            '<p class="meta">Fleet-wide: the sum of each topic\'s growth on every disk;'
            " shrinking topics are not shown.</p>",
            topics_chart(data.topics),
            "<h2>Overfull episodes</h2>",
            f'<p class="meta">{_e(episodes_note)}; red: still overfull at the last snapshot.</p>',
            episodes_chart(data.episodes, first, last),
            "<h2>Hosts by skew</h2>",
            '<p class="meta">Skew: the host\'s use% divided by the fleet mean use%.</p>',
            hosts_table(data.hosts),
            "</body></html>\n",
        ]
    )
