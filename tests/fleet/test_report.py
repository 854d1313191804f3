"""The fleet report page: the growth split, each forecast's basis, the trust rule, axes.

Pure rendering (no Spark): rows shaped like ``disks.parquet`` / ``topics.parquet`` in, HTML
out, parsed with the standard library's HTML parser. The last test renders the page in a
real headless Chromium (installed by ``make tools``) and checks the screenshot.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from diskguard.fleet import chart, report
from diskguard.fleet.aggregation import MS_PER_HOUR, growth_split, summarize_disk, used_ratio

T0 = 1_795_400_000_000
GIB, MIB, HOUR = 1 << 30, 1 << 20, int(MS_PER_HOUR)


def _record(host: str, ts: int, used: int, kafka: int, topics: dict[str, int]) -> dict[str, Any]:
    return {
        "host": host,
        "mount": "/",
        "ts_ms": ts,
        "total_bytes": 500 * GIB,
        "used_bytes": used,
        "available_bytes": 475 * GIB - used,
        "kafka_bytes": kafka,
        "flow_state": "normal",
        "topics": [{"topic": t, "partitions": 1, "bytes": b} for t, b in topics.items()],
    }


def _fleet() -> dict[str, list[dict[str, Any]]]:
    """The demo's disk (58 s, filling with non-Kafka files) and a disk with a real trend."""
    demo, real = [], []
    for i in range(30):
        ts = T0 + 2 * HOUR + i * 2_000
        orders, clicks = round(100 * MIB * i / 1800), round(78 * MIB * i / 1800)
        kafka = 30 * MIB + orders + clicks
        used = 20 * GIB + kafka + round(45 * GIB * i / 1800)
        demo.append(_record("demo", ts, used, kafka, {"orders": orders, "clickstream": clicks}))
    for i in range(120):  # two hours, Kafka growing 20 GiB/h: full in about 6.5 h
        ts = T0 + i * 60_000
        kafka = 300 * GIB + round(20 * GIB * i / 60)
        real.append(_record("broker-1", ts, kafka + 5 * GIB, kafka, {"orders": kafka}))
    return {"demo": demo, "broker-1": real}


def _report_data(fleet: dict[str, list[dict[str, Any]]]) -> report.ReportData:
    disks, topics = [], {}
    for rows in fleet.values():
        d = dataclasses.asdict(summarize_disk(rows))
        d["used_ratio"] = used_ratio(d["used_bytes"], d["available_bytes"])
        disks.append(d)
        for name, rate in growth_split(rows).topics:
            t = topics.setdefault(name, {"topic": name, "growth_bytes_per_hour": 0.0, "disks": []})
            t["growth_bytes_per_hour"] += rate
            t["disks"].append({"host": d["host"], "mount": "/", "growth_bytes_per_hour": rate})
    return report.ReportData(
        generated_at="2026-11-23T22:00:00+00:00",
        source="test",
        records=sum(len(rows) for rows in fleet.values()),
        duplicates=0,
        bad_records={},
        disks=disks,
        topics=list(topics.values()),
        hosts=[],
        series={
            (rows[0]["host"], "/"): [
                (r["ts_ms"], float(r["used_bytes"]), float(r["available_bytes"])) for r in rows
            ]
            for rows in fleet.values()
        },
        episodes=[],
        episode_total=0,
        report_disks=[("broker-1", "/"), ("demo", "/")],
    )


class _Page(HTMLParser):
    """Table rows as cell texts (with each cell's class), cards as their text and SVG."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[tuple[str, str]]] = []
        self.cards: list[dict[str, Any]] = []
        self._cell: list[str] | None = None
        self._cell_class = ""
        self._card_depth = 0
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "div":
            self._depth += 1
            if a.get("class") == "card":
                self._card_depth = self._depth
                self.cards.append({"text": [], "elements": []})
        if self._card_depth:
            self.cards[-1]["elements"].append((tag, a))
        if tag == "tr":
            self.rows.append([])
        elif tag == "td":
            self._cell, self._cell_class = [], a.get("class") or ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None:
            self.rows[-1].append(("".join(self._cell).strip(), self._cell_class))
            self._cell = None
        elif tag == "div":
            if self._depth == self._card_depth:
                self._card_depth = 0
            self._depth -= 1

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self._card_depth:
            self.cards[-1]["text"].append(data)


def _parse(page: str) -> _Page:
    parser = _Page()
    parser.feed(page)
    return parser


def _row(parsed: _Page, host: str) -> dict[str, tuple[str, str]]:
    header = [
        "host", "mount", "used", "available", "use%", "growth", "kafka", "not_kafka",
        "full_in", "basis", "episodes", "overfull_time", "deleted", "peak_alert",
    ]  # fmt: skip
    (cells,) = [r for r in parsed.rows if r and r[0][0] == host and len(r) == len(header)]
    return dict(zip(header, cells, strict=True))


def _card(parsed: _Page, title_start: str) -> dict[str, Any]:
    (card,) = [c for c in parsed.cards if "".join(c["text"]).startswith(title_start)]
    return {"text": " ".join("".join(card["text"]).split()), "elements": card["elements"]}


def test_table_splits_growth_into_kafka_and_not_kafka() -> None:
    parsed = _parse(report.render_report(_report_data(_fleet())))
    demo = _row(parsed, "demo")
    assert demo["growth"][0] == "45.2 GiB/h"
    assert demo["kafka"][0] == "178.0 MiB/h"
    assert demo["not_kafka"][0] == "45.0 GiB/h"
    real = _row(parsed, "broker-1")
    assert (real["kafka"][0], real["not_kafka"][0]) == ("20.0 GiB/h", "0 B/h")


def test_card_says_why_the_disk_grows_with_its_topics() -> None:
    parsed = _parse(report.render_report(_report_data(_fleet())))
    demo = _card(parsed, "demo:/")["text"]
    assert "Mostly not Kafka: 99.6% of the growth is outside Kafka's data." in demo
    assert (
        "Growth 45.2 GiB/h = Kafka 178.0 MiB/h (orders 100.0 MiB/h, clickstream 78.0 MiB/h)"
        " + not Kafka 45.0 GiB/h." in demo
    )
    assert "Mostly Kafka" in _card(parsed, "broker-1:/")["text"]


def test_every_forecast_shows_its_basis() -> None:
    parsed = _parse(report.render_report(_report_data(_fleet())))
    assert re.fullmatch(r"58 s, 30 snapshots, R² 1\.00, ±\d B", _row(parsed, "demo")["basis"][0])
    assert re.fullmatch(
        r"2\.0 h, 120 snapshots, R² 1\.00, ±\d+ B", _row(parsed, "broker-1")["basis"][0]
    )
    for title in ("demo:/", "broker-1:/"):
        text = _card(parsed, title)["text"]
        assert re.search(r"Forecast basis: [^,]+ of data, \d+ snapshots, R² \d\.\d\d, ±", text)


def test_a_minute_of_data_is_not_an_alarm() -> None:
    data = _report_data(_fleet())
    demo = next(d for d in data.disks if d["host"] == "demo")
    assert demo["hours_to_full"] is not None and demo["hours_to_full"] < 24  # the raw line
    parsed = _parse(report.render_report(data))
    full_in = _row(parsed, "demo")["full_in"]
    assert full_in == ("not enough data", "muted")
    card = _card(parsed, "demo:/")
    assert card["text"].startswith("demo:/ — not enough data to forecast")
    strokes = {
        a.get("stroke") for tag, a in card["elements"] if tag == "line" and "stroke-dasharray" in a
    }
    assert strokes == {chart.GREY}
    # the disk with a real trend, under 24 h, is the red alarm and is listed first
    assert _row(parsed, "broker-1")["full_in"] == ("6.5 h", "warn")
    listed = [r[0][0] for r in parsed.rows if r and r[0][0] in ("demo", "broker-1")]
    assert listed[:2] == ["broker-1", "demo"]


def test_forecast_axis_reaches_the_forecast_with_round_ticks() -> None:
    data = _report_data(_fleet())
    disk = next(d for d in data.disks if d["host"] == "broker-1")
    svg = chart.usage_chart(disk, data.series[("broker-1", "/")])
    (forecast,) = re.findall(
        r'<line x1="[^"]+" y1="[^"]+" x2="([^"]+)" y2="([^"]+)" stroke="#d13438"', svg
    )
    (dot,) = re.findall(r'<circle cx="([^"]+)" cy="([^"]+)" r="3" fill="#d13438"', svg)
    assert forecast == dot  # the dashed line ends at the marked 100% crossing ...
    assert float(dot[0]) <= 460 - 14 + 0.05  # ... inside the plot
    percents = [int(p) for p in re.findall(r">(\d+)%</text>", svg)]
    assert percents == [60, 70, 80, 90, 100]
    clocks = re.findall(r">(\d\d:\d\d)</text>", svg)
    assert clocks == ["04:00", "06:00", "08:00", "10:00"]  # the forecast's 10:43 is on the axis
    assert "time: UTC" in svg


@pytest.mark.parametrize(
    ("raw", "step"),
    [(0.7, 1.0), (1.0, 1.0), (1.3, 2.0), (3.0, 5.0), (7.0, 10.0), (16, 20), (0.04, 0.05)],
)
def test_nice_step_is_1_2_5(raw: float, step: float) -> None:
    assert chart.nice_step(raw) == pytest.approx(step)


def test_percent_and_time_ticks_are_round() -> None:
    assert chart.percent_ticks(24.1) == [20, 40, 60, 80, 100]
    assert chart.percent_ticks(97.3) == [97, 98, 99, 100]
    assert chart.percent_ticks(0) == [0, 20, 40, 60, 80, 100]
    ticks = chart.time_ticks(T0 + 12_345, T0 + 58_000)
    assert all(t % 10_000 == 0 for t in ticks) and len(ticks) <= 5
    hours = chart.time_ticks(T0 + 1, T0 + 9 * HOUR)
    assert all(t % (2 * HOUR) == 0 for t in hours) and 1 < len(hours) <= 5


# --------------------------------------------------------------------------- in a browser


def _png_pixels(path: Path) -> tuple[int, int, list[bytes], int]:
    """Decode an 8-bit RGB/RGBA non-interlaced PNG (what Chromium writes): rows of pixels."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, []
    width = height = bpp = 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for r in range(height):
        kind = raw[r * (stride + 1)]
        line = bytearray(raw[r * (stride + 1) + 1 : (r + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, rows, bpp


def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is not installed: run `make tools` (make test does)"
    page = tmp_path / "report.html"
    page.write_text(report.render_report(_report_data(_fleet())), encoding="utf-8")
    shot = tmp_path / "report.png"
    subprocess.run(
        [
            chromium, "--headless", "--no-sandbox", "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
            "--window-size=1000,1400", "--hide-scrollbars", page.as_uri(),
        ],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    width, height, rows, bpp = _png_pixels(shot)
    assert (width, height) == (1000, 1400)
    background = bytes([0xFA, 0xFB, 0xFC])
    drawn = blue = red = 0
    for row in rows:
        for i in range(0, len(row), bpp):
            px = row[i : i + 3]
            if px != background:
                drawn += 1
            r, g, b = px
            if abs(r - 0x2F) < 24 and abs(g - 0x6F) < 24 and abs(b - 0xDF) < 24:
                blue += 1
            if abs(r - 0xD1) < 24 and abs(g - 0x34) < 24 and abs(b - 0x38) < 24:
                red += 1
    assert drawn > width * height // 20, f"only {drawn} non-background pixels: a blank page?"
    assert blue > 200, "no usage series drawn"
    assert red > 50, "no red forecast or alarm drawn"


def test_the_report_says_which_disk_filled_first() -> None:
    """The disk whose guard said overfull first is named first, the next one with how much
    later; a disk with only a trusted forecast follows; one with neither is named as not
    ranked, with why."""
    t0 = 1_795_000_000_000
    base = {
        "mount": "/data",
        "first_ts_ms": t0 - 3_600_000,
        "last_ts_ms": t0 + 60_000,
        "snapshots": 20,
        "growth_r2": 0.9,
    }
    disks = [
        {**base, "host": "kafka-1", "first_overfull_ts_ms": t0 + 37_000,
         "forecast_status": "not_enough_data", "hours_to_full": 0.2},
        {**base, "host": "kafka-2", "first_overfull_ts_ms": t0,
         "forecast_status": "not_enough_data", "hours_to_full": 0.1},
        {**base, "host": "kafka-3", "first_overfull_ts_ms": None,
         "forecast_status": "ok", "hours_to_full": 30.0},
        {**base, "host": "kafka-4", "first_overfull_ts_ms": None,
         "forecast_status": "not_growing", "hours_to_full": None},
    ]  # fmt: skip
    html = report.fill_order_html(disks)
    text = " ".join(re.sub(r"<[^>]+>", " ", html).split())
    assert "kafka-2:/data filled first : its guard said overfull at" in text, text
    items = re.findall(r"<li>(.*?)</li>", html)
    assert [i.split(":")[0] for i in items] == ["kafka-2", "kafka-1", "kafka-3"]
    assert "overfull 37 s later" in items[1]
    assert "forecast full in 30.0 h" in items[2]
    assert (
        "Not ranked (never overfull, no forecast worth the name): kafka-4:/data (not growing)"
        in text
    )
    nothing = report.fill_order_html([disks[3]])
    assert "No disk went overfull in this window, and none has a forecast worth the name" in nothing
    future = report.fill_order_html([disks[2]])
    assert "kafka-3:/data will fill first</b>: full in 30.0 h" in future
