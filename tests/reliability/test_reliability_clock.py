"""Reliability: clocks. Segment timestamps from 1970 to 2200 (and "no timestamp") must order
by the data, not by the wall clock; a wall-clock jump of a day either way must neither stall
nor rush the daemon's loop (its timers run on ``time.monotonic``).

``faketime`` is not installed on the test machines (and tests may not install packages), so
the jump is made in-process: ``time.time`` is patched to jump by +/-1 day inside a running
``Daemon`` and the cycle cadence is measured on the monotonic clock. A source check keeps
``time.time`` out of the loop's timer code.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from diskguard.config import load_config
from diskguard.daemon import (
    cycles,
    cycleworker,
    filesystems,
    flowcontrol,
    forecast,
    loop,
    schedule,
    snapshot,
    statefile,
    watch,
)
from diskguard.daemon.loop import Daemon
from support.cli import plan_json, run_cli
from support.configs import write_config
from support.disks import over_ceiling
from support.kafkagen import SegmentSpec, write_log_dir

MiB = 1024**2
DAY_S = 86_400
YEAR_2200_MS = 7_258_118_400_000


def spec(ts: int | None = None, timestamps: tuple[int, ...] | None = None) -> SegmentSpec:
    return SegmentSpec(
        records=6,
        payload_size=8000,
        records_per_batch=2,
        first_timestamp_ms=ts or 0,
        timestamp_step_ms=1,
        timestamps_ms=timestamps,
    )


def test_segments_from_1970_to_2200_order_by_their_data(disk: Path, tmp_path: Path) -> None:
    now_ms = int(time.time() * 1000)
    log_dir = disk / "kafka-logs"
    future_active = spec(YEAR_2200_MS + 10_000)
    layout = write_log_dir(
        log_dir,
        {
            ("epoch", 0): [spec(1), spec(2), future_active],  # January 1970
            ("future", 0): [spec(YEAR_2200_MS), future_active],  # year 2200
            ("recent", 0): [spec(now_ms - 3_600_000), future_active],  # an hour ago
            ("nots", 0): [spec(timestamps=(-1,) * 6), future_active],  # "no timestamp" (-1)
        },
    )
    # A -1-only segment has no age in its data: its .log mtime dates it (two hours ago).
    nots = layout.partitions[("nots", 0)].segments[0]
    two_hours_ago = now_ms / 1000 - 7200
    os.utime(nots.log_path, (two_hours_ago, two_hours_ago))

    limit = over_ceiling(disk, cushion=30)
    cfg = write_config(tmp_path, [log_dir], disk_usage_percent=limit, mode="offline")
    plan, _ = plan_json(cfg)
    order = [(d["topic"], d["base_offset"]) for d in plan["deletions"]]
    assert order == [("epoch", 0), ("epoch", 6), ("nots", 0), ("recent", 0), ("future", 0)]
    by = {(d["topic"], d["base_offset"]): d for d in plan["deletions"]}
    assert by[("epoch", 0)]["max_timestamp_ms"] == 6  # 1 + 5 steps: the data's, not 0
    assert by[("future", 0)]["max_timestamp_ms"] == YEAR_2200_MS + 5
    assert by[("nots", 0)]["timestamp_source"] == "mtime"
    assert abs(by[("nots", 0)]["max_timestamp_ms"] - two_hours_ago * 1000) < 1000

    proc = run_cli("enforce", "--once", "-c", str(cfg))
    # Every closed segment goes and the ceiling is still out of reach: exit 1, as documented.
    assert proc.returncode == 1, proc.stdout + proc.stderr
    deleted = [
        (e["topic"], e["base_offset"])
        for e in map(json.loads, filter(None, proc.stdout.splitlines()))
        if e["event"] == "segment_deleted"
    ]
    assert deleted == order
    for part in layout.partitions.values():
        assert part.active.log_path.exists()


def test_the_daemon_loop_uses_no_wall_clock_for_its_timers() -> None:
    """Source check: ``time.time`` appears only where a wall-clock *value* is recorded
    (deletion and snapshot timestamps, the state file), never in the loop's scheduling."""
    modules = (
        loop,
        cycles,
        cycleworker,
        filesystems,
        flowcontrol,
        forecast,
        schedule,
        snapshot,
        statefile,
        watch,
    )
    tree = ast.parse("\n".join(inspect.getsource(module) for module in modules))
    # Stamps: a deletion's time, the partitions set aside until (wall clock, for other
    # processes), a snapshot record's time, the state file's "updated".
    allowed = {"_apply", "_count_deleted", "record", "write_state"}
    offenders = []
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef):
            continue
        for node in ast.walk(func):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "time"
                and isinstance(node.value, ast.Name)
                and node.value.id == "time"
                and func.name not in allowed
            ):
                offenders.append(f"{func.name}:{node.lineno}")
    assert not offenders, f"time.time() in daemon timer code: {offenders}"
    assert "time.monotonic()" in inspect.getsource(Daemon._iteration)
    # The schedule itself reads no clock at all: its caller's ``now`` is all it knows.
    assert "time" not in {
        n.id for n in ast.walk(ast.parse(inspect.getsource(schedule))) if isinstance(n, ast.Name)
    }


class _JumpingClock:
    """``time.time`` with an offset that the test moves by a day at a time."""

    def __init__(self) -> None:
        self.offset = 0.0
        self._real = time.time

    def __call__(self) -> float:
        return self._real() + self.offset


def test_a_day_long_wall_clock_jump_keeps_the_cycle_cadence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_dir = tmp_path / "kafka-logs"
    write_log_dir(log_dir, {("orders", 0): [spec(1_700_000_000_000)] * 2})
    cfg_path = write_config(
        tmp_path,
        log_dir,
        snapshots={"interval": "0.7s", "host": "clock-test"},
        assume_delete_policy=None,
        disk_usage_percent=99.9,
        check_interval="0.3s",
        usage_poll_interval="0.05s",
        mode="dry-run",
    )
    config = load_config(cfg_path)
    clock = _JumpingClock()
    monkeypatch.setattr(time, "time", clock)
    monkeypatch.setattr(signal, "signal", lambda *_a: None)  # run() is not in the main thread
    d = Daemon(config)
    cycles: list[tuple[float, bool]] = []
    real_start = d.retention.start

    def counting(full: bool = False, trust: frozenset[str] | None = None) -> Any:
        cycles.append((time.monotonic(), full))
        return real_start(full=full, trust=trust)

    monkeypatch.setattr(d.retention, "start", counting)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(d.run()), daemon=True)
    thread.start()
    try:
        phases = []
        for offset in (0.0, DAY_S, -DAY_S, 0.0):
            clock.offset = offset
            start = time.monotonic()
            time.sleep(1.5)
            phases.append([t for t, _full in cycles if start <= t < start + 1.5])
    finally:
        d.request_stop()
        thread.join(timeout=10)
    assert not thread.is_alive() and result == [0]
    for offset, ticks in zip((0, "+1 day", "-1 day", 0), phases, strict=True):
        # Quiet (well under its limit, nothing changing), the periodic cycle of each 0.3 s
        # check_interval is skipped: the snapshots' every 0.7 s are the cycles, ~2 per 1.5 s;
        # neither stalled (0) nor rushed (dozens).
        assert 1 <= len(ticks) <= 5, (offset, len(ticks))
        gaps = [b - a for a, b in itertools.pairwise(ticks)]
        assert not gaps or max(gaps) < 1.2, (offset, gaps)
    # Snapshots kept coming too, stamped with the (jumped) wall clock they are about.
    spool = tmp_path / "state" / "spool"
    records = [
        json.loads(line)
        for f in sorted(spool.glob("*.jsonl"))
        for line in f.read_text().splitlines()
        if line.strip()
    ]
    assert len(records) >= 5
    assert any(r["ts_ms"] > (time.time() + DAY_S / 2) * 1000 for r in records)
