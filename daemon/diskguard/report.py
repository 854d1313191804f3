"""The fleet report: one self-contained HTML page (inline CSS and SVG, no script, no network).

Pure: plain rows in, a string out. Self-contained because the page is mailed, attached to
tickets and opened on air-gapped operator desks; a chart library from a CDN would render as
nothing there. Every name that came from a snapshot (host, mount, topic) is escaped: the
snapshots are input, not trusted markup.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from diskguard.aggregation import MS_PER_HOUR, forecast_full_ts_ms
from diskguard.units import format_bytes

TABLE_ROWS = 20
TOPIC_BARS = 10
TIMELINE_DISKS = 20

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d2330;
background:#fafbfc}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.meta{color:#5b6475}.bad{color:#a4262c}
table{border-collapse:collapse;background:#fff}
th,td{padding:4px 10px;border-bottom:1px solid #e3e6eb;text-align:right;white-space:nowrap}
th{background:#f0f2f5}td.l,th.l{text-align:left}
.grid{display:flex;flex-wrap:wrap;gap:12px}.card{background:#fff;border:1px solid #e3e6eb;
border-radius:6px;padding:8px}.card h3{font-size:13px;margin:0 0 4px;font-weight:600}
svg text{font-size:11px;fill:#5b6475}.warn{color:#a4262c;font-weight:600}
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
    return f"{format_bytes(bytes_per_hour)}/h"


def _pct(used: float, available: float) -> float:
    total = used + available
    return 100.0 * used / total if total > 0 else 0.0


def usage_chart(
    disk: Mapping[str, Any],
    points: Sequence[tuple[int, float, float]],
    width: int = 420,
    height: int = 170,
) -> str:
    """Used % over time with the least-squares forecast, dashed, from the last snapshot to 100%.

    The x axis runs half a window past the last snapshot; a forecast that reaches 100% later
    is drawn to the edge at the percentage it will have reached there.
    """
    left, right, top, bottom = 34, 10, 10, 22
    plot_w, plot_h = width - left - right, height - top - bottom
    first = int(disk["first_ts_ms"])
    last = int(disk["last_ts_ms"])
    span = max(last - first, 1)
    horizon = last + max(span // 2, int(MS_PER_HOUR))
    x_max = horizon

    def x(ts: float) -> float:
        return left + (ts - first) / (x_max - first) * plot_w

    # Zoomed to the band the disk lives in (a 0.1%/h trend is invisible on 0-100%), but
    # always up to 100%: the forecast line has to be able to reach it.
    lowest = min((_pct(u, a) for _, u, a in points), default=0.0)
    y_min = max(0.0, min(90.0, (lowest - 5.0) // 10 * 10))

    def y(pct: float) -> float:
        clamped = min(max(pct, y_min), 100.0)
        return top + (1 - (clamped - y_min) / (100.0 - y_min)) * plot_h

    parts = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">']
    for pct in [round(y_min + (100 - y_min) * k / 4) for k in range(5)]:
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(pct):.1f}" y2="{y(pct):.1f}"'
            ' stroke="#e3e6eb"/>'
        )
        parts.append(f'<text x="{left - 4}" y="{y(pct) + 4:.1f}" text-anchor="end">{pct}%</text>')
    parts.append(f'<text x="{left}" y="{height - 6}">{_e(format_ts(first))}</text>')
    parts.append(
        f'<text x="{left + plot_w}" y="{height - 6}" text-anchor="end">'
        f"{_e(format_ts(x_max))}</text>"
    )
    if points:
        coords = " ".join(f"{x(ts):.1f},{y(_pct(u, a)):.1f}" for ts, u, a in points)
        parts.append(
            f'<polyline points="{coords}" fill="none" stroke="#2f6fdf" stroke-width="1.6"/>'
        )
    used = float(disk["used_bytes"])
    avail = float(disk["available_bytes"])
    growth = disk.get("growth_bytes_per_hour")
    full_ts = forecast_full_ts_ms(last, disk.get("hours_to_full"))
    if growth is not None and growth > 0 and full_ts is not None:
        capacity = used + avail
        end_ts = min(full_ts, horizon)
        end_used = used + growth * (end_ts - last) / MS_PER_HOUR
        end_pct = 100.0 * end_used / capacity if capacity > 0 else 100.0
        parts.append(
            f'<line x1="{x(last):.1f}" y1="{y(_pct(used, avail)):.1f}" x2="{x(end_ts):.1f}"'
            f' y2="{y(end_pct):.1f}" stroke="#d13438" stroke-width="1.6" stroke-dasharray="5,4"/>'
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
        f'<text x="{label_w}" y="{height - 6}">{_e(format_ts(first_ts_ms))}</text>'
        f'<text x="{label_w + plot_w}" y="{height - 6}" text-anchor="end">'
        f"{_e(format_ts(last_ts_ms))}</text>"
    )
    return "".join(parts) + "</svg>"


def _closest_to_full(disks: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    def key(d: Mapping[str, Any]) -> tuple[int, float, float]:
        hours = d.get("hours_to_full")
        ratio = float(d.get("used_ratio") or 0.0)
        return (0, float(hours), -ratio) if hours is not None else (1, 0.0, -ratio)

    return sorted(disks, key=key)[:TABLE_ROWS]


def disks_table(disks: Sequence[Mapping[str, Any]]) -> str:
    head = (
        '<tr><th class="l">host</th><th class="l">mount</th><th>used</th><th>available</th>'
        "<th>use%</th><th>growth</th><th>full in</th><th>overfull episodes</th>"
        "<th>overfull time</th><th>deleted</th><th>peak alert</th></tr>"
    )
    body = []
    for d in _closest_to_full(disks):
        hours = d.get("hours_to_full")
        cls = ' class="warn"' if hours is not None and hours < 24 else ""
        ratio = d.get("used_ratio")
        body.append(
            f'<tr><td class="l">{_e(d["host"])}</td><td class="l">{_e(d["mount"])}</td>'
            f"<td>{_e(format_bytes(d['used_bytes']))}</td>"
            f"<td>{_e(format_bytes(d['available_bytes']))}</td>"
            f"<td>{'-' if ratio is None else f'{100 * ratio:.1f}%'}</td>"
            f"<td>{_e(format_rate(d.get('growth_bytes_per_hour')))}</td>"
            f"<td{cls}>{_e(format_hours(hours))}</td>"
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
    hours = disk.get("hours_to_full")
    return "not growing" if hours is None else f"full in {format_hours(hours)}"


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
            f"{usage_chart(disk, data.series.get(key, ()))}</div>"
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
    episodes_note = f"{data.episode_total} episodes" + (
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
            f" {data.records} snapshots ({data.duplicates} duplicates dropped),"
            f" {len(hosts)} hosts, {len(data.disks)} disks, {len(data.topics)} topics,"
            f" {_e(format_ts(first))} to {_e(format_ts(last))} UTC.</p>",
            bad_line,
            "<h2>Disks closest to full</h2>",
            disks_table(data.disks),
            "<h2>Usage over time and forecast to 100%</h2>",
            '<p class="meta">Blue: used % (df); dashed red: least-squares growth from the last'
            " snapshot.</p>",
            f'<div class="grid">{"".join(cards)}</div>',
            "<h2>Top growing topics</h2>",
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
