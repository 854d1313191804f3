"""The report's figures over a window of daily summaries, in plain Python.

The daily summaries (:mod:`diskguard.fleet.daily`) of a window are small next to the
snapshots they stand for (one row per disk and day, one per topic, disk and day), so the
driver computes every figure from them itself: each disk's window (its exact sums shifted
to a common origin and added, overfull time and episodes across midnight), the topics'
growth and the hosts' totals. A full recompute and an incremental run differ only in where
the rows come from (collected from Spark as the fold writes them, or Parquet files read on
the driver); both end here, so their reports are the same by construction.

Pure: columns of plain values in (``Columns``: a name -> a list, one entry per row, as read
from Parquet: :data:`diskguard.fleet.daily.DISK_DAY_COLUMNS` and ``TOPIC_DAY_COLUMNS``),
plain rows out. Sums of integers are exact; sums of doubles (a topic's or a
host's growth) are ``math.fsum``, whose result does not depend on the order of the rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from diskguard.fleet.aggregation import (
    MS_PER_HOUR,
    downsample_bucket,
    fleet_mean_ratio,
    fleet_skew,
)

DAY_MS = 86_400_000
Columns = Mapping[str, Sequence[Any]]

# what disk_windows adds up over a disk's days
_WINDOW_SUMS = (
    *("snapshots", "deleted_bytes", "overfull_ms", "overfull_episodes"),
    *("s_x", "s_xx", "s_y", "s_xy", "s_yy0"),
    *("k_n", "k_x", "k_xx", "k_k", "k_xk", "k_y", "k_xy"),
)


def _day_start(ts_ms: int) -> int:
    return ts_ms - ts_ms % DAY_MS


def by_disk(days: Columns) -> list[tuple[str, str, list[int]]]:
    """Each disk's rows (indices into ``days``), in day order; disks by host and mount."""
    host, mount, day = days["host"], days["mount"], days["day"]
    groups: dict[tuple[str, str], list[int]] = {}
    for i, key in enumerate(zip(host, mount, strict=True)):
        groups.setdefault(key, []).append(i)
    return [(h, m, sorted(rows, key=day.__getitem__)) for (h, m), rows in sorted(groups.items())]


def _max_or_none(values: Sequence[Any]) -> Any:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def disk_windows(days: Columns) -> list[dict[str, Any]]:
    """One row per disk: what :func:`exactfit.disk_row` needs, summed over its days.

    Each day's sums have x from the day's start; shifted here to the disk's first snapshot
    (``a`` = day start - first ts): ``Σ(x+a) = Σx + na``, ``Σ(x+a)² = Σx² + 2aΣx + na²``,
    ``Σ(x+a)y = Σxy + aΣy``. ``s_yy0`` is ``Σ(y − used_origin)²`` with the disk's lowest
    used bytes as origin (squares of the swing, not of whole disks).

    Overfull time and episodes cross midnight: the day's last state holds until the next
    day's first snapshot, and a day that starts overfull starts an episode unless the
    previous day (the previous one with snapshots) ended overfull. The first overfull
    snapshot is the earliest start of any day's runs.
    """
    c = days
    found = []
    for host, mount, rows in by_disk(days):
        first = min(c["first_ts_ms"][i] for i in rows)
        y0 = min(c["min_used"][i] for i in rows)
        w: dict[str, Any] = dict.fromkeys(_WINDOW_SUMS, 0)
        previous_last_overfull = False
        latest = rows[0]
        starts: list[int] = []
        for pos, i in enumerate(rows):
            n = c["snapshots"][i]
            a = _day_start(c["first_ts_ms"][i]) - first
            sx, sxx, sy, sxy = c["sum_x"][i], c["sum_xx"][i], c["sum_y"][i], c["sum_xy"][i]
            kn = c["kafka_snapshots"][i]
            kx, kxx = sx - c["unk_sum_x"][i], sxx - c["unk_sum_xx"][i]
            ky, kxy = sy - c["unk_sum_y"][i], sxy - c["unk_sum_xy"][i]
            sk = c["sum_k"][i]
            w["snapshots"] += n
            w["s_x"] += sx + n * a
            w["s_xx"] += sxx + 2 * a * sx + n * a * a
            w["s_y"] += sy
            w["s_xy"] += sxy + a * sy
            w["s_yy0"] += c["sum_yy"][i] - 2 * y0 * sy + n * y0 * y0
            w["k_n"] += kn
            w["k_x"] += kx + kn * a
            w["k_xx"] += kxx + 2 * a * kx + kn * a * a
            w["k_k"] += sk
            w["k_xk"] += c["sum_xk"][i] + a * sk
            w["k_y"] += ky
            w["k_xy"] += kxy + a * ky
            w["deleted_bytes"] += c["deleted_bytes"][i]
            gap = 0
            if c["last_overfull"][i] and pos + 1 < len(rows):
                gap = c["first_ts_ms"][rows[pos + 1]] - c["last_ts_ms"][i]
            w["overfull_ms"] += c["overfull_ms"][i] + gap
            starts_here = c["first_overfull"][i] and not previous_last_overfull
            w["overfull_episodes"] += c["inner_episode_starts"][i] + (1 if starts_here else 0)
            previous_last_overfull = bool(c["last_overfull"][i])
            if c["last_ts_ms"][i] > c["last_ts_ms"][latest]:
                latest = i
            starts += [r["start_ts_ms"] for r in c["runs"][i] or ()]
        w.update(
            host=host,
            mount=mount,
            first_ts_ms=first,
            last_ts_ms=c["last_ts_ms"][latest],
            last=c["last"][latest],
            peak_alert_level=_max_or_none([c["peak_alert_level"][i] for i in rows]),
            first_overfull_ts_ms=min(starts) if starts else None,
            used_origin=y0,
        )
        found.append(w)
    return found


def overfull_episodes(days: Columns, limit: int) -> list[dict[str, Any]]:
    """The most recent ``limit`` overfull episodes (newest first; ties by host and mount).

    Each day's runs are fragments of episodes: a run that starts at a day's first snapshot
    continues the previous day's last run when that day ended overfull. An open run (the day
    ended overfull) ends at the next day's first snapshot when that one is normal, and is
    still open when no day follows.
    """
    c = days
    episodes: list[dict[str, Any]] = []
    for host, mount, rows in by_disk(days):
        if not any(c["runs"][i] for i in rows):
            continue
        current: dict[str, Any] | None = None
        for pos, i in enumerate(rows):
            after = rows[pos + 1] if pos + 1 < len(rows) else None
            continues_day = pos > 0 and bool(c["last_overfull"][rows[pos - 1]])
            for run in c["runs"][i] or ():
                end, still_open = run["end_ts_ms"], False
                if run["open"] and after is None:
                    still_open = True
                elif run["open"] and after is not None and not c["first_overfull"][after]:
                    end = c["first_ts_ms"][after]
                continues = continues_day and run["start_ts_ms"] == c["first_ts_ms"][i]
                if current is not None and continues:
                    current["end_ts_ms"] = max(current["end_ts_ms"], end)
                    current["open"] = still_open
                    continue
                if current is not None:
                    episodes.append(current)
                current = {
                    "host": host,
                    "mount": mount,
                    "start_ts_ms": run["start_ts_ms"],
                    "end_ts_ms": end,
                    "open": still_open,
                }
        if current is not None:
            episodes.append(current)
    episodes.sort(key=lambda e: (-e["start_ts_ms"], e["host"], e["mount"]))
    return episodes[:limit]


def topic_windows(days: Columns) -> list[dict[str, Any]]:
    """Per disk and topic over the window: the latest sighting and the growth slope.

    The slope comes from the days' exact sums, shifted to the first day the disk listed the
    topic and to its lowest bytes (as in :func:`disk_windows`): numerator and denominator
    are exact integers, each rounded once to a double.
    """
    c = days
    groups: dict[tuple[str, str, str], list[int]] = {}
    for i, key in enumerate(zip(c["host"], c["mount"], c["topic"], strict=True)):
        groups.setdefault(key, []).append(i)
    found = []
    for (host, mount, topic), rows in sorted(groups.items()):
        start = min(_day_start(c["seen_ts_ms"][i]) for i in rows)
        y0 = min(c["min_bytes"][i] for i in rows)
        n_all = sx = sxx = sy = sxy = 0
        seen = rows[0]
        for i in rows:
            n, x, y = c["snapshots"][i], c["sum_x"][i], c["sum_y"][i]
            a = _day_start(c["seen_ts_ms"][i]) - start
            n_all += n
            sx += x + n * a
            sxx += c["sum_xx"][i] + 2 * a * x + n * a * a
            sy += y - n * y0
            sxy += c["sum_xy"][i] + a * y - y0 * (x + n * a)
            if c["seen_ts_ms"][i] > c["seen_ts_ms"][seen]:
                seen = i
        denominator = n_all * sxx - sx * sx
        slope = None
        if denominator > 0:
            numerator = n_all * sxy - sx * sy
            slope = float(numerator) / float(denominator) * MS_PER_HOUR
        found.append(
            {
                "host": host,
                "mount": mount,
                "topic": topic,
                "seen_ts_ms": c["seen_ts_ms"][seen],
                "seen_bytes": c["seen_bytes"][seen],
                "seen_partitions": c["seen_partitions"][seen],
                "growth_bytes_per_hour": slope,
            }
        )
    return found


def _fsum_or_none(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return math.fsum(known) if known else None


def _sum_or_none(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def topic_rows(
    per_disk: Sequence[Mapping[str, Any]], disks: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Per topic across the fleet (``topics.parquet``), biggest first, from
    :func:`topic_windows` and the disks' rows.

    ``bytes``: sum over disks of the topic's bytes in each disk's latest snapshot (0 on a
    disk whose latest snapshot no longer lists it). ``growth_bytes_per_hour``: the SUM OF
    PER-DISK least-squares slopes: snapshots of different hosts are not taken at the same
    instants, so a fleet-wide series would need resampling, while the sum of slopes equals
    the slope of the sum for aligned samples and needs no alignment. ``disks``: one entry
    per disk (host, mount, bytes, share of the topic's bytes, growth), biggest first.
    """
    last_ts = {(d["host"], d["mount"]): d["last_ts_ms"] for d in disks}
    by_topic: dict[str, list[tuple[int, str, str, float | None, int]]] = {}
    for t in per_disk:
        disk = (t["host"], t["mount"])
        if disk not in last_ts:
            continue
        current = t["seen_ts_ms"] == last_ts[disk]
        sighting = (
            t["seen_bytes"] if current else 0,
            t["host"],
            t["mount"],
            t["growth_bytes_per_hour"],
            t["seen_partitions"] if current else 0,
        )
        by_topic.setdefault(t["topic"], []).append(sighting)
    found = []
    for topic, held in by_topic.items():
        total = sum(h[0] for h in held)
        # biggest first; then host, mount and growth, descending (no growth: last)
        ranked = sorted(
            held,
            key=lambda h: (h[0], h[1], h[2], h[3] is not None, h[3] or 0.0),
            reverse=True,
        )
        found.append(
            {
                "topic": topic,
                "bytes": total,
                "growth_bytes_per_hour": _fsum_or_none([h[3] for h in held]),
                "partitions": sum(h[4] for h in held),
                "disk_count": sum(1 for h in held if h[0] > 0),
                "disks": [
                    {
                        "host": h[1],
                        "mount": h[2],
                        "bytes": h[0],
                        "share": float(h[0]) / float(total) if total > 0 else None,
                        "growth_bytes_per_hour": h[3],
                    }
                    for h in ranked
                ],
            }
        )
    return sorted(found, key=lambda t: (-t["bytes"], t["topic"]))


def host_rows(disks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per host (``hosts.parquet``, by host): totals at the latest snapshot of each of its
    disks, its growth (the sum of its disks' slopes), its most urgent disk, and skew (its
    used ratio over the fleet mean of host ratios: :func:`aggregation.fleet_skew`)."""
    by_host: dict[str, list[Mapping[str, Any]]] = {}
    for d in disks:
        by_host.setdefault(d["host"], []).append(d)
    found = []
    for host, own in sorted(by_host.items()):
        used = _sum_or_none([d["used_bytes"] for d in own])
        available = _sum_or_none([d["available_bytes"] for d in own])
        ratio = None
        if used is not None and available is not None and used + available > 0:
            ratio = float(used) / (float(used) + float(available))
        hours = [d["hours_to_full"] for d in own if d["hours_to_full"] is not None]
        found.append(
            {
                "host": host,
                "disks": len(own),
                "last_ts_ms": max(d["last_ts_ms"] for d in own),
                "total_bytes": _sum_or_none([d["total_bytes"] for d in own]),
                "used_bytes": used,
                "available_bytes": available,
                "kafka_bytes": _sum_or_none([d["kafka_bytes"] for d in own]),
                "growth_bytes_per_hour": _fsum_or_none([d["growth_bytes_per_hour"] for d in own]),
                "min_hours_to_full": min(hours) if hours else None,
                "overfull_episodes": sum(int(d["overfull_episodes"]) for d in own),
                "used_ratio": ratio,
            }
        )
    ratios = {h["host"]: h["used_ratio"] for h in found}
    skew = fleet_skew(ratios)
    mean = fleet_mean_ratio(ratios.values())
    for h in found:
        h["fleet_mean_used_ratio"] = mean
        h["skew"] = skew[h["host"]]
    return found


def downsampled_series(
    points: Columns, chosen: Sequence[Mapping[str, Any]], buckets: int
) -> dict[tuple[str, str], list[tuple[int, float, float]]]:
    """At most ``buckets`` (ts_ms, used, available) averages per chosen disk, for the
    report's charts; ``points``: the chosen disks' snapshots (host, mount, ts_ms,
    used_bytes, available_bytes), in any order. Buckets as :func:`aggregation.downsample_bucket`."""
    spans = {(d["host"], d["mount"]): (d["first_ts_ms"], d["last_ts_ms"]) for d in chosen}
    sums: dict[tuple[str, str, int], list[int]] = {}
    for host, mount, ts, used, available in zip(
        points["host"],
        points["mount"],
        points["ts_ms"],
        points["used_bytes"],
        points["available_bytes"],
        strict=True,
    ):
        span = spans.get((host, mount))
        if span is None:
            continue
        bucket = downsample_bucket(ts, span[0], span[1], buckets)
        acc = sums.setdefault((host, mount, bucket), [0, 0, 0, 0])
        acc[0] += 1
        acc[1] += ts
        acc[2] += used
        acc[3] += available
    series: dict[tuple[str, str], list[tuple[int, float, float]]] = {}
    for (host, mount, _), (n, ts, used, available) in sorted(sums.items()):
        series.setdefault((host, mount), []).append((int(ts / n), used / n, available / n))
    return series
