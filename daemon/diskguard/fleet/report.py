"""The fleet report: one self-contained HTML page (inline CSS and SVG, no script, no network).

Pure: plain rows in, a string out. Self-contained because the page is mailed, attached to
tickets and opened on air-gapped operator desks; a chart library from a CDN would render as
nothing there. Every name that came from a snapshot (host, mount, topic) is escaped: the
snapshots are input, not trusted markup.
"""

from __future__ import annotations

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
)
from diskguard.fleet.chart import (
    AMBER,
    BLUE,
    FORECAST_AXIS_WINDOWS,
    GREY,
    RED,
    episodes_chart,
    topics_chart,
    usage_chart,
)
from diskguard.fleet.fillorder import FILLED, FillOrder, fill_order
from diskguard.fleet.formatting import (
    escape,
    forecast_status_of,
    format_hours,
    format_rate,
    format_seconds,
    format_span,
    format_ts,
)
from diskguard.units import format_bytes, plural

TABLE_ROWS = 20
SPLIT_TOPICS = 3

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
    # the ranking summary.json already holds: ranked once per run, not again for the page
    fill_order: FillOrder | None = None


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
    by_topic = ", ".join(f"{escape(name)} {escape(format_rate(rate))}" for name, rate in named)
    kafka_part = f"Kafka {escape(format_rate(kafka))}" + (f" ({by_topic})" if by_topic else "")
    return (
        f'<p class="why"><b>{escape(growth_verdict(disk))}</b> Growth {escape(format_rate(total))}'
        f" = {kafka_part} + not Kafka {escape(format_rate(other))}.</p>"
    )


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
        return f'<td class="weak">~{escape(format_hours(float(hours)))} (weak fit)</td>'
    cls = ' class="warn"' if float(hours) < 24 else ""
    return f"<td{cls}>{escape(format_hours(float(hours)))}</td>"


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
            f'<tr><td class="l">{escape(d["host"])}</td><td class="l">{escape(d["mount"])}</td>'
            f"<td>{escape(format_bytes(d['used_bytes']))}</td>"
            f"<td>{escape(format_bytes(d['available_bytes']))}</td>"
            f"<td>{'-' if ratio is None else f'{100 * ratio:.1f}%'}</td>"
            f"<td>{escape(format_rate(d.get('growth_bytes_per_hour')))}</td>"
            f"<td>{escape(format_rate(d.get('kafka_growth_bytes_per_hour')))}</td>"
            f"<td>{escape(format_rate(d.get('non_kafka_growth_bytes_per_hour')))}</td>"
            f"{_full_in_cell(d)}"
            f'<td class="basis">{escape(forecast_basis(d, compact=True))}</td>'
            f"<td>{int(d['overfull_episodes'])}</td>"
            f"<td>{escape(format_seconds(float(d['overfull_seconds'])))}</td>"
            f"<td>{escape(format_bytes(d['deleted_bytes']))}</td>"
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
            f'<tr><td class="l">{escape(h["host"])}</td><td>{int(h["disks"])}</td>'
            f"<td>{escape(format_bytes(h['used_bytes']))}</td>"
            f"<td>{escape(format_bytes(h['available_bytes']))}</td>"
            f"<td>{escape(format_bytes(h['kafka_bytes']))}</td>"
            f"<td>{'-' if ratio is None else f'{100 * ratio:.1f}%'}</td>"
            f"<td>{'-' if skew is None else f'{skew:.2f}x'}</td>"
            f"<td>{escape(format_rate(h.get('growth_bytes_per_hour')))}</td></tr>"
        )
    return f"<table>{head}{''.join(body)}</table>"


def fill_order_html(disks: Sequence[Mapping[str, Any]], order: FillOrder | None = None) -> str:
    """Which disk filled first (its guard said overfull first), or will (the soonest trusted
    forecast), then the rest in order; the disks nothing ranks are named with why.
    ``order``: ``fill_order(disks)`` when the caller has it already."""
    if order is None:
        order = fill_order(disks)
    first = order.first
    if first is None:
        head = "No disk went overfull in this window, and none has a forecast worth the name."
    elif first.basis == FILLED:
        head = (
            f"<b>{escape(first.host)}:{escape(first.mount)} filled first</b>: its guard said"
            f" overfull at {escape(format_ts(first.ts_ms))} UTC."
        )
    else:
        head = (
            f"<b>{escape(first.host)}:{escape(first.mount)} will fill first</b>: full in"
            f" {escape(format_hours(first.hours_to_full))}"
            f" ({escape(format_ts(first.ts_ms))} UTC); no disk went overfull in this window."
        )
    items = []
    for rank in order.ranks[:TABLE_ROWS]:
        name = f"{escape(rank.host)}:{escape(rank.mount)}"
        if rank.basis == FILLED:
            after = rank.ts_ms - order.ranks[0].ts_ms
            when = "first" if rank is first else f"{escape(format_span(after))} later"
            items.append(f"<li>{name}: overfull {when} ({escape(format_ts(rank.ts_ms))} UTC)</li>")
        else:
            weak = " (weak fit)" if rank.forecast_status == FORECAST_WEAK_FIT else ""
            items.append(
                f"<li>{name}: forecast full in {escape(format_hours(rank.hours_to_full))}"
                f"{weak} ({escape(format_ts(rank.ts_ms))} UTC)</li>"
            )
    more = len(order.ranks) - TABLE_ROWS
    ranked = {(r.host, r.mount) for r in order.ranks}
    unranked = [
        f"{escape(d['host'])}:{escape(d['mount'])} ({escape(forecast_text(d))})"
        for d in sorted(disks, key=lambda d: (str(d["host"]), str(d["mount"])))
        if (str(d["host"]), str(d["mount"])) not in ranked
    ]
    if len(unranked) > TABLE_ROWS:
        unranked = [*unranked[:TABLE_ROWS], f"and {len(unranked) - TABLE_ROWS} more"]
    return "".join(
        [
            f'<p class="first">{head}</p>',
            f"<ol>{''.join(items)}</ol>" if items else "",
            f'<p class="meta">and {more} more.</p>' if more > 0 else "",
            (
                '<p class="meta">Not ranked (never overfull, no forecast worth the name): '
                f"{', '.join(unranked)}.</p>"
                if unranked
                else ""
            ),
        ]
    )


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
            f'<div class="card"><h3>{escape(key[0])}:{escape(key[1])}'
            f" — {escape(full_in(disk))}</h3>"
            f"{usage_chart(disk, data.series.get(key, ()))}"
            f'<p class="basis">Forecast basis: {escape(forecast_basis(disk))}.</p>'
            f"{growth_split_html(disk, data.topics)}</div>"
        )
    first = min((int(d["first_ts_ms"]) for d in data.disks), default=0)
    last = max((int(d["last_ts_ms"]) for d in data.disks), default=0)
    bad = data.bad_records
    bad_total = sum(bad.values())
    bad_line = (
        f'<p class="bad">Bad records skipped: {int(bad.get("malformed", 0))} malformed,'
        f" {int(bad.get('unknown_schema', 0))} unknown schema,"
        f" {int(bad.get('out_of_range', 0))} out of range.</p>"
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
            f'<p class="meta">Generated {escape(data.generated_at)} from {escape(data.source)}:'
            f" {plural(data.records, 'snapshot')}"
            f" ({plural(data.duplicates, 'duplicate')} dropped),"
            f" {plural(len(hosts), 'host')}, {plural(len(data.disks), 'disk')},"
            f" {plural(len(data.topics), 'topic')},"
            f" {escape(format_ts(first))} to {escape(format_ts(last))} UTC.</p>",
            bad_line,
            "<h2>Which disk fills first</h2>",
            '<p class="meta">A disk filled when its guard said overfull (the limit where'
            " flow control holds producers back, well before df's 100%); the others by when"
            " their forecast (ok or weak fit, by the rule below) says they fill.</p>",
            fill_order_html(data.disks, data.fill_order),
            "<h2>Disks closest to full</h2>",
            f'<p class="meta">Growth is the least-squares slope over the whole window, split'
            " into Kafka (the log dirs' bytes, <code>kafka_bytes</code>) and not Kafka"
            " (everything else on the filesystem: used − Kafka). A time to full is only"
            f" forecast from at least {escape(format_span(FORECAST_MIN_SPAN_MS))} of data and"
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
            f'<p class="meta">{escape(episodes_note)};'
            " red: still overfull at the last snapshot.</p>",
            episodes_chart(data.episodes, first, last),
            "<h2>Hosts by skew</h2>",
            '<p class="meta">Skew: the host\'s use% divided by the fleet mean use%.</p>',
            hosts_table(data.hosts),
            "</body></html>\n",
        ]
    )
