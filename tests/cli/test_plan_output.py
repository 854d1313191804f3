"""What ``diskguard plan`` tells a person, on real-format log dirs on a real filesystem.

- timestamps past year 9999 (producers sending microseconds) are shown, flagged, and ordered
  by their raw value as Kafka's time retention orders them (issue 11 item 11);
- a filesystem over its limit that the plan leaves over it is never reported as "within its
  limit": plan says what blocks it (issue 12 item 8).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diskguard.commands.plan import render_plan
from diskguard.retention.planner import Deletion, FilesystemPlan, Plan
from diskguard.retention.report import plan_json
from diskguard.units import MAX_DATETIME_MS, format_timestamp_ms
from support import cli
from support.configs import write_config
from support.disks import ceiling_under
from support.fsfixtures import fill
from support.kafkagen import SegmentSpec, hold_lock, write_log_dir

MiB = 1024**2
BASE_TS_MS = 1_700_000_000_000  # 2023-11-14 22:13:20 UTC
BASE_TS_US = BASE_TS_MS * 1000  # the same instant in µs, which Kafka reads as ms: year 55,841


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    # Wide enough that rich never wraps a table cell the assertions look for.
    return cli.run_cli(*args, env={"COLUMNS": "250"})


def segments(first_ts: int, step: int, count: int = 3) -> list[SegmentSpec]:
    return [
        SegmentSpec(
            records=20,
            payload_size=2000,
            first_timestamp_ms=first_ts + s * 100 * step,
            timestamp_step_ms=step,
            records_per_batch=5,
        )
        for s in range(count)
    ]


def test_microsecond_timestamps_are_shown_flagged_and_youngest(
    tmpfs: Callable[[int], Path], tmp_path: Path
) -> None:
    mount = tmpfs(64 * MiB)
    log_dir = mount / "kafka-logs"
    # "metrics" producers send µs; "orders" ms. The µs segments are written *earlier* in real
    # time, but Kafka compares the raw numbers, so for it they are 53,000 years younger.
    layout = write_log_dir(
        log_dir,
        {
            ("metrics", 0): segments(BASE_TS_US - 3_600_000_000, 1000),
            ("orders", 0): segments(BASE_TS_MS, 1),
        },
    )
    # Over any limit: every closed segment is chosen, in the planner's (Kafka's) order.
    cfg = write_config(tmp_path, log_dir, disk_usage_percent=0.01, mode="dry-run")

    proc = run_cli("plan", "-c", str(cfg), "--json")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    plan = json.loads(proc.stdout)
    chosen = [(d["topic"], d["base_offset"], d["max_timestamp_ms"]) for d in plan["deletions"]]
    expected = [
        (topic, seg.base_offset, seg.max_timestamp_ms)
        for topic in ("orders", "metrics")
        for seg in layout.partitions[(topic, 0)].closed
    ]
    assert chosen == expected, "not ordered by the raw largest timestamp"
    assert all(ts > 253_402_300_799_999 for t, _, ts in chosen if t == "metrics")

    proc = run_cli("plan", "-c", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    out = proc.stdout
    # Rows by their topic-partition column (the why column names the next candidate too).
    rows = [line for line in out.splitlines() if "│ metrics-0 " in line]
    assert len(rows) == 2, out
    for row in rows:
        assert "+55" in row and "looks like µs" in row, row
    # The µs reading of the first metrics segment's newest record: 2023-11-14 21:1x.
    assert "2023-11-14 21:" in rows[0], rows[0]
    orders = [line for line in out.splitlines() if "│ orders-0 " in line]
    assert len(orders) == 2 and all("2023-11-14 22:1" in r and "µs" not in r for r in orders)
    # ... and plan says how it ordered them.
    assert "past year 9999" in out and "youngest" in out, out


@given(st.integers(-62_135_596_800_000, MAX_DATETIME_MS))
def test_format_timestamp_ms_matches_datetime_where_datetime_can(ms: int) -> None:
    when = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=ms)
    assert format_timestamp_ms(ms) == when.isoformat(sep=" ", timespec="seconds")[:19]


def test_format_timestamp_ms_past_year_9999() -> None:
    assert format_timestamp_ms(MAX_DATETIME_MS) == "9999-12-31 23:59:59"
    assert format_timestamp_ms(MAX_DATETIME_MS + 1) == (
        "+10000-01-01 00:00:00 (timestamp looks like µs: 1978-01-11 21:31:40)"
    )
    # Oracle: the Gregorian calendar repeats every 400 years (146,097 days).
    cycles = 134
    shifted = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(
        milliseconds=BASE_TS_US - cycles * 146_097 * 86_400_000
    )
    assert format_timestamp_ms(BASE_TS_US) == (
        f"+{shifted.year + cycles * 400}{shifted.strftime('-%m-%d %H:%M:%S')} "
        "(timestamp looks like µs: 2023-11-14 22:13:20)"
    )
    assert format_timestamp_ms(BASE_TS_US * 1000).endswith(
        "(timestamp looks like ns: 2023-11-14 22:13:20)"
    )
    assert format_timestamp_ms(2**63 - 1).endswith("(timestamp looks like ns: 2262-04-11 23:47:16)")
    assert format_timestamp_ms((MAX_DATETIME_MS + 1) * 1000**2).endswith("(past year 9999)")
    assert format_timestamp_ms(-1) == "1969-12-31 23:59:59"
    assert format_timestamp_ms(-(2**63)).startswith("-")


# -- what blocks a filesystem over its limit ---------------------------------------------------

WITHIN = "every filesystem is within its limit"


def plan_text(cfg: Path) -> str:
    proc = run_cli("plan", "-c", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout


def sentence(out: str, mount: Path) -> str:
    """The line(s) plan prints about ``mount`` after the tables, joined."""
    lines = [line for line in out.splitlines() if line.startswith(f"{mount}: ")]
    assert lines, out
    return " ".join(lines)


def test_only_active_segments_left(tmpfs: Callable[[int], Path], tmp_path: Path) -> None:
    mount = tmpfs(64 * MiB)
    log_dir = mount / "kafka-logs"
    write_log_dir(log_dir, {("orders", 0): segments(BASE_TS_MS, 1, count=1)})
    out = plan_text(write_config(tmp_path, log_dir, disk_usage_percent=0.01, mode="dry-run"))
    assert WITHIN not in out, out
    text = sentence(out, mount)
    assert "nothing can be deleted" in text and "only active segments" in text, text
    assert "protected" not in text, text


def test_only_protected_topics_left(tmpfs: Callable[[int], Path], tmp_path: Path) -> None:
    mount = tmpfs(64 * MiB)
    log_dir = mount / "kafka-logs"
    write_log_dir(
        log_dir,
        {
            ("orders", 0): segments(BASE_TS_MS, 1, count=1),
            ("__consumer_offsets", 0): segments(BASE_TS_MS, 1),
        },
    )
    out = plan_text(write_config(tmp_path, log_dir, disk_usage_percent=0.01, mode="dry-run"))
    assert WITHIN not in out, out
    text = sentence(out, mount)
    assert "nothing can be deleted" in text and "protected topics (__consumer_offsets)" in text


def test_excess_already_pending_reclaim(tmpfs: Callable[[int], Path], tmp_path: Path) -> None:
    mount = tmpfs(64 * MiB)
    log_dir = mount / "kafka-logs"
    write_log_dir(log_dir, {("orders", 0): segments(BASE_TS_MS, 1)})
    # A segment the broker renamed for deletion and has not removed yet: 2 MiB pending.
    fill(log_dir / "orders-0" / "00000000000000000000.log.deleted", 2 * MiB)
    limit = ceiling_under(mount, 1 * MiB)  # 1 MiB over: less than what is pending
    out = plan_text(write_config(tmp_path, log_dir, disk_usage_percent=limit, mode="dry-run"))
    assert WITHIN not in out, out
    text = sentence(out, mount)
    assert "pending reclaim" in text and "covers the excess" in text, text


def test_refused_while_lock_is_held_says_nothing_will_be_deleted(
    tmpfs: Callable[[int], Path], tmp_path: Path
) -> None:
    mount = tmpfs(64 * MiB)
    log_dir = mount / "kafka-logs"
    write_log_dir(log_dir, {("orders", 0): segments(BASE_TS_MS, 1)})
    cfg = write_config(tmp_path, log_dir, disk_usage_percent=0.01, mode="auto")
    with hold_lock(log_dir):
        out = plan_text(cfg)
    assert "Would delete" in out, out
    text = sentence(out, mount)
    assert "nothing will be deleted" in text and ".lock" in text, text


def test_dry_run_says_nothing_will_be_deleted(tmpfs: Callable[[int], Path], tmp_path: Path) -> None:
    mount = tmpfs(64 * MiB)
    log_dir = mount / "kafka-logs"
    write_log_dir(log_dir, {("orders", 0): segments(BASE_TS_MS, 1)})
    out = plan_text(write_config(tmp_path, log_dir, disk_usage_percent=0.01, mode="dry-run"))
    assert "Would delete" in out, out
    text = sentence(out, mount)
    assert "nothing will be deleted" in text and "dry-run" in text, text


def test_within_limit_still_says_so(tmpfs: Callable[[int], Path], tmp_path: Path) -> None:
    mount = tmpfs(64 * MiB)
    log_dir = mount / "kafka-logs"
    write_log_dir(log_dir, {("orders", 0): segments(BASE_TS_MS, 1)})
    out = plan_text(write_config(tmp_path, log_dir, disk_usage_percent=99.0, mode="dry-run"))
    assert f"Nothing to delete: {WITHIN}." in out, out
    assert not [line for line in out.splitlines() if line.startswith(f"{mount}: ")], out


# -- consumer groups without a committed offset (issue 12 item 6) ------------------------------


def test_plan_names_groups_without_committed_offset(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    d = Deletion(
        log_dir="/d/k",
        topic="orders",
        partition=1,
        base_offset=0,
        next_offset=100,
        max_timestamp_ms=BASE_TS_MS,
        bytes=MiB,
        files=(),
        mount="/d",
        unconsumed_records={"billing": 100, "audit": 40},
        groups_without_offset=("billing",),
    )
    fs = FilesystemPlan(
        "/d", "/dev/x", ("/d/k",), 100 * MiB, 99 * MiB, MiB, 99.0, 98.0, 98.0, 0, MiB, MiB, 1
    )
    chosen = Plan((fs,), (d,))
    render_plan(chosen, "broker", "auto: broker reachable", [])
    row = next(line for line in capsys.readouterr().out.splitlines() if "orders-1" in line)
    assert "UNCONSUMED by audit: 40, billing: no committed offset" in row, row
    data = plan_json(chosen)["deletions"][0]
    assert data["unconsumed_records"] == {"billing": 100, "audit": 40}  # shape unchanged
    assert data["groups_without_offset"] == ["billing"]
